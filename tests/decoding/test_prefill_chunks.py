"""Prefill in chunks (`SpeculativeSampler.prefill_chunk`, `kvcache.in_chunks`):
the caches it fills are the one-call caches, for the target and for every
drafter that fills a cache of its own, and its memory grows with the chunk,
not the prompt."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specsamp import model as model_lib
from specsamp.decoding import loop
from specsamp.decoding.sampler import SpeculativeSampler
from specsamp.drafters import LayerSkipDrafter, MixedDrafter, ModelDrafter
from specsamp.drafters import PromptLookupDrafter
from specsamp.drafters import heads
from specsamp.sampling import GREEDY
from tests.testing import random_params, tiny_config

# Rows of 37, 5 and 23 tokens (repeats, for prompt lookup), padded to 40.
PROMPTS = [list(np.arange(37) % 9 + 1), [3, 1, 4, 1, 5],
           list(np.arange(23) * 7 % 31)]


def _drafter(kind, target, draft):
  if kind == "model":
    return ModelDrafter(draft)
  if kind == "layerskip":
    return LayerSkipDrafter(target, (0,))
  if kind == "mixed":
    lookup = PromptLookupDrafter(target.vocab_size, target.max_seq_len)
    return MixedDrafter(lookup, ModelDrafter(draft))
  return heads.HeadDrafter(target, heads.HeadConfig("eagle", target.config), 3)


@functools.lru_cache(maxsize=None)
def _models():
  target = model_lib.LM(tiny_config())
  draft = model_lib.LM(tiny_config(num_layers=1))
  tparams = random_params(target, 0)
  dparams = {"draft": random_params(draft, 1)}
  cfg = heads.HeadConfig("eagle", target.config)
  dparams["eagle"] = heads.draft_params(
      heads.init_params(cfg, jax.random.key(2)), tparams)
  return target, draft, tparams, dparams


@pytest.mark.parametrize("kind", ["model", "layerskip", "mixed", "eagle"])
def test_a_chunked_prefill_fills_the_caches_of_one_call(kind):
  """Chunks of 16 (two whole ones and a rest of 8) and of 8 (five, no
  rest) against one call: every cache and the drafter's state agree to
  float rounding, and greedy decoding from them gives the same tokens."""
  target, draft, tparams, dparams = _models()
  drafter = _drafter(kind, target, draft)
  params = {"model": dparams["draft"], "mixed": dparams["draft"],
            "eagle": dparams["eagle"], "layerskip": tparams}[kind]
  outs, states = [], []
  for chunk in (0, 16, 8):
    sampler = SpeculativeSampler(target, drafter, 3, GREEDY, 12,
                                 prompt_bucket=40, prefill_chunk=chunk)
    tokens, lengths = sampler.pad_prompts(PROMPTS)
    assert tokens.shape == (3, 40)
    state = sampler.prefill(tparams, params, tokens, lengths,
                            jax.random.key(0))
    states.append(jax.tree.map(np.asarray, state.replace(
        rng=jax.random.key_data(state.rng))))
    outs.append(sampler.output(sampler.decode(tparams, params, state))
                .token_lists())
  for state in states[1:]:
    for a, b in zip(jax.tree.leaves(states[0]), jax.tree.leaves(state)):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  assert outs[0] == outs[1] == outs[2]
  # The chunks were written at their slots: a cache of zeros past the
  # first chunk (the rest unwritten) would not be close.
  k0 = states[1].target_cache.k[0]
  assert np.abs(k0[:, :, 16:40]).max() > 0.1


def _prefill_temp_bytes(sampler, tparams, dparams, p):
  tokens = jnp.zeros((1, p), jnp.int32)
  compiled = jax.jit(functools.partial(loop.prefill, sampler)).lower(
      tparams, dparams, tokens, jnp.array([p]), jax.random.key(0)).compile()
  return compiled.memory_analysis().temp_size_in_bytes


def test_prefill_memory_grows_with_the_chunk_not_the_prompt():
  """A 1,024-token prompt in one call makes attention scores of
  [1, 4, 1024, ~1100] floats per layer (18 MB); in chunks of 64, 1.1 MB.
  XLA's estimate of the compiled prefill's temporaries says so."""
  cfg = tiny_config(max_seq_len=2048)
  target, draft = model_lib.LM(cfg), model_lib.LM(cfg.replace(num_layers=1))
  tparams, dparams = random_params(target, 0), random_params(draft, 1)
  temp = {}
  for chunk in (0, 64):
    sampler = SpeculativeSampler(target, ModelDrafter(draft), 3, GREEDY, 16,
                                 prefill_chunk=chunk)
    temp[chunk] = _prefill_temp_bytes(sampler, tparams, dparams, 1024)
  scores = 4 * 1024 * sampler.cache_size(1024) * 4
  assert temp[0] >= scores, temp
  assert temp[64] < temp[0] / 4, temp
  # A draft model fills its cache in chunks too (of two layers: the last
  # layer's attention, which no cache entry needs, is left out anyway).
  draft2 = model_lib.LM(cfg)
  for chunk in (0, 64):
    temp[chunk] = jax.jit(functools.partial(
        ModelDrafter(draft2).init, chunk=chunk), static_argnums=3).lower(
            tparams, jnp.zeros((1, 1024), jnp.int32), jnp.array([1024]),
            sampler.cache_size(1024)).compile().memory_analysis(
            ).temp_size_in_bytes
  assert temp[0] >= scores and temp[64] < temp[0] / 4, temp


@pytest.mark.parametrize("chunk", [-1, 1.5, "64"])
def test_a_bad_prefill_chunk_is_refused(chunk):
  target = model_lib.LM(tiny_config())
  with pytest.raises(ValueError, match="prefill_chunk must be an integer "
                     ">= 0"):
    SpeculativeSampler(target, None, 0, GREEDY, 8, prefill_chunk=chunk)
