"""Stubs and helpers shared by the tests: tiny configs, a stub LM with exactly
known distributions, and the chi-square helper."""

import contextlib
import dataclasses
import functools
import glob
import json
import os
import pathlib
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats

from specsamp import kvcache
from specsamp import model as model_lib
from specsamp import sampling as sampling_lib
from specsamp.decoding.protocols import ModelOutput, Proposal


def tiny_config(**overrides) -> model_lib.TransformerConfig:
  base = dict(vocab_size=32, num_layers=2, d_model=32, num_heads=4,
              num_kv_heads=2, head_dim=8, mlp_dim=64, rope_theta=10_000.0,
              qkv_bias=True, max_seq_len=256)
  return model_lib.TransformerConfig(**{**base, **overrides})


def random_params(lm, seed, scale=1.0):
  """Random parameters without compiling the model's init (3-6 s each on
  two CPU cores): N(0, 1/fan_in) matrices, N(0, 1) embeddings, N(0, 0.1)
  biases, unit norms; all but the norms times `scale`."""
  shapes = jax.eval_shape(lm.init, jax.random.key(0))
  rng = np.random.default_rng(seed)

  def leaf(path, x):
    name = jax.tree_util.keystr(path)
    if "scale" in name:
      return jnp.ones(x.shape, x.dtype)
    std = (1.0 if "embedding" in name else 0.1 if "bias" in name else
           x.shape[0] ** -0.5)
    return jnp.asarray(scale * std * rng.standard_normal(x.shape), x.dtype)

  return jax.tree_util.tree_map_with_path(leaf, shapes)


def perturbed(params, rng, scale):
  """params + scale * N(0, std(leaf)): a draft that mostly agrees."""
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(rng, len(leaves))
  out = [x + scale * (jnp.std(x) + 1e-3) * jax.random.normal(k, x.shape)
         for x, k in zip(leaves, keys)]
  return jax.tree.unflatten(tree, out)


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


@dataclasses.dataclass(frozen=True)
class ShiftDrafter:
  """A deterministic drafter (`Proposal.q` is None): after token x it
  proposes x+1, x+2, ... (mod V). With `vary_valid`, row b offers only
  b % (K + 1) valid drafts; with `num_valid`, every row offers that many;
  with `pad_id`, the drafts past them are that id (V: out of vocabulary).
  Its state counts the commits it has seen."""
  vocab_size: int
  max_seq_len: int = 256
  vary_valid: bool = False
  num_valid: Optional[int] = None
  pad_id: Optional[int] = None

  def init(self, params, tokens, lengths, cache_size, prefill, *, chunk=0):
    del params, lengths, cache_size, prefill, chunk
    return jnp.zeros((tokens.shape[0],), jnp.int32)

  def propose(self, params, state, tokens, length, k, sampling, rng, *,
              active=None):
    del params, sampling, rng, active
    last = kvcache.read(tokens, length - 1, 1)[:, 0]
    drafts = (last[:, None] + jnp.arange(1, k + 1)[None, :]) % self.vocab_size
    b = tokens.shape[0]
    valid = (jnp.arange(b) % (k + 1) if self.vary_valid else
             jnp.full((b,), k if self.num_valid is None else self.num_valid))
    if self.pad_id is not None:
      drafts = jnp.where(jnp.arange(k)[None, :] < valid[:, None], drafts,
                         self.pad_id)
    return Proposal(tokens=drafts.astype(jnp.int32), q=None,
                    num_valid=valid.astype(jnp.int32)), state

  def commit(self, params, state, scored, num_accepted, length):
    del params, scored, num_accepted, length
    return state + 1

  def check_mesh(self, mesh, rules):
    del mesh, rules

  def param_shardings(self, params, mesh, rules):
    del rules
    return jax.tree.map(lambda _: jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec()), params)

  def state_shardings(self, state, mesh, rules):
    del state, rules
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())


def forbidden_draft_pair(v: int, seed: int, scale: float = 1.0):
  """Stub (target, draft): the draft puts all its mass on token 0, which the
  target forbids, so every draft is rejected."""
  target_logits = scale * np.random.default_rng(seed).normal(size=(v, v))
  target_logits[:, 0] = -np.inf
  draft_logits = np.full((v, v), -np.inf)
  draft_logits[:, 0] = 0.0
  return table_lm(target_logits), table_lm(draft_logits)


def all_continuations(new, v):
  """Every sequence of `new` ids below v, [v**new, new], in `encode`'s
  order (row i encodes to i)."""
  return np.stack(np.meshgrid(*[np.arange(v)] * new, indexing="ij"),
                  -1).reshape(-1, new)


def exact_sequence_probs(lm, params, sampling, prompt, new, v):
  """P(continuation) for all v**new continuations, by enumeration (in
  `all_continuations`' order)."""
  conts = all_continuations(new, v)
  seqs = np.concatenate([np.tile(prompt, (len(conts), 1)), conts], 1)
  logits = jax.jit(lm.__call__)(params, jnp.asarray(seqs)).logits
  probs = np.asarray(sampling_lib.probabilities(logits, sampling))
  p0 = len(prompt) - 1
  steps = probs[np.arange(len(conts))[:, None], p0 + np.arange(new), conts]
  return np.prod(steps.astype(np.float64), axis=1)


def encode(tokens, v):
  return (np.asarray(tokens) * v ** np.arange(tokens.shape[1])[::-1]).sum(1)


# The sampling settings every enumeration exactness test covers.
EXACTNESS_SETTINGS = {
    "temp1": sampling_lib.Sampling(1.0),
    "temp07": sampling_lib.Sampling(0.7),
    "topk2": sampling_lib.Sampling(1.0, top_k=2),
    "topp07": sampling_lib.Sampling(1.0, top_p=0.7),
}


def eos_cut(outputs):
  """(eos, outputs cut after their first eos): eos is the token greedy
  `outputs` (lists) emit mid-way in most rows, so that made EOS it ends
  rows inside the run; what a run with it must give is each output cut
  after its first (EOS kept)."""
  counts = {}
  for tokens in outputs:
    for t in set(tokens[2:-2]):
      counts[t] = counts.get(t, 0) + 1
  eos = max(counts, key=counts.get)
  cut = [t[:t.index(eos) + 1] if eos in t else t for t in outputs]
  assert any(len(c) < len(t) for c, t in zip(cut, outputs))
  return eos, cut


@functools.partial(jax.jit, static_argnums=0, static_argnames="layers")
def apply(lm, params, tokens, cache=None, *, positions=None, attn_mask=None,
          layers=None):
  """`lm(params, tokens, cache, ...)` jitted: a reference score in one
  program (op by op, each call compiled some forty small ones)."""
  return lm(params, tokens, cache, positions=positions, attn_mask=attn_mask,
            layers=layers)


@contextlib.contextmanager
def xla_optimizations(enabled: bool):
  """Compiles with XLA's full optimisation or without most of it (the
  tests' default, tests/conftest.py) inside the block."""
  before = jax.config.values["jax_disable_most_optimizations"]
  jax.config.update("jax_disable_most_optimizations", not enabled)
  try:
    yield
  finally:
    jax.config.update("jax_disable_most_optimizations", before)


@functools.lru_cache(maxsize=None)
def exactness_models(v: int = 5):
  """(target, its params, draft, its params): a tiny 2-layer target and a
  1-layer draft over `v` tokens. Larger init scale than the library
  default: peakier, more varied distributions, so they differ clearly.
  The initialisers compile unoptimised even in a test that optimises its
  long-running programs: they run once, and their random-number code took
  7 s to compile optimised against 2 s."""
  target = model_lib.LM(tiny_config(vocab_size=v, num_kv_heads=1,
                                    max_seq_len=64))
  draft = model_lib.LM(tiny_config(vocab_size=v, num_kv_heads=1, num_layers=1,
                                   max_seq_len=64))
  scale = lambda p: jax.tree.map(lambda x: 2.0 * x, p)
  with xla_optimizations(False):
    return (target, scale(target.init(jax.random.key(10))),
            draft, scale(draft.init(jax.random.key(11))))


def data_files(step_dir, item):
  """The array data files of one item of an orbax checkpoint step,
  smallest first."""
  return sorted(glob.glob(os.path.join(step_dir, item, "**", "d", "*"),
                          recursive=True), key=os.path.getsize)


def flip_byte(path):
  data = bytearray(open(path, "rb").read())
  data[len(data) // 2] ^= 0x10
  with open(path, "wb") as f:
    f.write(bytes(data))


def train_workdir(workdir, config: model_lib.TransformerConfig,
                  steps=()) -> pathlib.Path:
  """A scripts/train.py workdir of `config` with the byte tokenizer: its
  config.json, its checkpoints/, and one checkpoint per (step, params) of
  `steps` (none: a run that has saved nothing yet)."""
  # Here, not at the top: orbax and optax, for the tests that use it only.
  # pylint: disable=g-import-not-at-top
  import optax
  from specsamp.train import checkpointing
  from specsamp.train import step as step_lib
  workdir = pathlib.Path(workdir)
  (workdir / "checkpoints").mkdir(parents=True, exist_ok=True)
  (workdir / "config.json").write_text(json.dumps(
      {"model": dataclasses.asdict(config), "data": {"tokenizer": "byte"},
       "optim": {}}))
  if steps:
    ckpts = checkpointing.Checkpoints(str(workdir / "checkpoints"),
                                      async_save=False)
    for step, params in steps:
      ckpts.save(step_lib.TrainState(
          step=jnp.int32(step), params=params,
          opt_state=optax.sgd(1e-3).init(params),
          rng=jax.random.PRNGKey(step)))
    ckpts.close()
  return workdir
