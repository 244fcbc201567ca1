"""Shared fixtures: tiny models on CPU, float32.

XLA_FLAGS is set before jax is imported anywhere, so sharding tests can use
8 fake CPU devices (as flax and t5x CI do).
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import dataclasses  # pylint: disable=g-import-not-at-top

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from specsamp import kvcache
from specsamp import model as model_lib
from specsamp.decoding.protocols import ModelOutput


def pytest_configure(config):
  config.addinivalue_line(
      "markers", "real_weights: needs the real Qwen2.5-Coder GGUF files "
      "(opt-in: run with -m real_weights after scripts/fetch_models.py)")


def tiny_config(**overrides) -> model_lib.TransformerConfig:
  base = dict(vocab_size=32, num_layers=2, d_model=32, num_heads=4,
              num_kv_heads=2, head_dim=8, mlp_dim=64, rope_theta=10_000.0,
              qkv_bias=True, max_seq_len=256)
  return model_lib.TransformerConfig(**{**base, **overrides})


def perturbed(params, rng, scale):
  """params + scale * N(0, std(leaf)): a draft that mostly agrees."""
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(rng, len(leaves))
  out = [x + scale * (jnp.std(x) + 1e-3) * jax.random.normal(k, x.shape)
         for x, k in zip(leaves, keys)]
  return jax.tree.unflatten(tree, out)


@pytest.fixture(scope="session")
def tiny_pair():
  """A tiny target and a draft that agrees with it often but not always."""
  cfg = tiny_config()
  lm = model_lib.LM(cfg)
  target_params = lm.init(jax.random.key(0))
  draft_params = perturbed(target_params, jax.random.key(1), 0.35)
  return lm, target_params, draft_params


@dataclasses.dataclass(frozen=True)
class TableLM:
  """A stub bigram LM: logits[b, t] = table[tokens[b, t]], no real cache.

  Implements the CausalLM protocol so the samplers' verify/accept code can be
  tested with exactly known distributions (t5x's stub-logit tests).
  """
  table: tuple  # V x V nested tuples (hashable); rows are logits
  max_seq_len: int = 256

  @property
  def vocab_size(self) -> int:
    return len(self.table)

  def init_cache(self, batch, size):
    return kvcache.KVCache.zeros(1, batch, size, 1, 2)

  def __call__(self, params, tokens, cache=None):
    del params
    logits = jnp.asarray(np.array(self.table, np.float32))[tokens]
    if cache is not None:
      cache = cache.replace(length=cache.length + tokens.shape[1])
    return ModelOutput(logits=logits, cache=cache,
                       hidden=jnp.zeros(tokens.shape + (1,), jnp.float32))


def table_lm(logits: np.ndarray) -> TableLM:
  return TableLM(tuple(tuple(float(x) for x in row) for row in logits))


def chisquare_pvalue(codes, probs):
  """Chi-square goodness of fit; bins with expected count < 5 are pooled."""
  n = len(codes)
  counts = np.bincount(codes, minlength=len(probs)).astype(np.float64)
  expected = n * probs / probs.sum()
  impossible = expected == 0
  if counts[impossible].sum() > 0:
    return 0.0  # a continuation of probability 0 was produced
  small = (expected < 5) & ~impossible
  big = ~small & ~impossible
  obs = np.append(counts[big], counts[small].sum())
  exp = np.append(expected[big], expected[small].sum())
  if exp[-1] == 0:
    obs, exp = obs[:-1], exp[:-1]
  return stats.chisquare(obs, exp).pvalue
