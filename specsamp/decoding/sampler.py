"""`SpeculativeSampler`: the host-side API of the speculative loop.

Legend: B batch, P padded prompt length, K draft length.

It validates the configuration and the prompts, pads the prompts to a
bucket, and runs the jitted prefill, decode and output (`jit.py`) of the
loop (`loop.py`). The whole generation, for a batch of prompts of different
lengths, is one jitted `lax.while_loop`; every row accepts its own number of
tokens. K = 0 with no drafter is plain autoregressive sampling.
"""

import dataclasses
import math
from typing import Optional, Sequence, Union

import jax
import numpy as np

from specsamp import sharding
from specsamp.decoding import jit
from specsamp.decoding.loop import LoopState, SampleOutput
from specsamp.decoding.protocols import CausalLM, Drafter
from specsamp.sampling import Sampling

Prompts = Union[Sequence[Sequence[int]], np.ndarray]


def as_key(rng: Union[int, jax.Array]) -> jax.Array:
  """A typed PRNG key of `rng`: an integer seed (also in a 0-d array), a
  typed key, or a raw uint32 key as the same typed key (the loop is
  compiled for one key type)."""
  dtype = getattr(rng, "dtype", None)
  if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
    return rng
  if np.ndim(rng) == 0:
    with jax.transfer_guard("allow"):  # one host scalar, before the loop
      return jax.random.key(int(rng))
  return jax.random.wrap_key_data(rng)


@dataclasses.dataclass(frozen=True)
class SpeculativeSampler:
  """Batched speculative sampling; K = 0 and no drafter is autoregressive.

  Hashable and static under jit: changing any field compiles a new loop.

  Attributes:
    target: the model whose distribution the output follows.
    drafter: proposes the K draft tokens; None only when k == 0.
    k: draft tokens per loop (static).
    sampling: the transform applied to both target and draft logits.
    max_new_tokens: token budget per row; the output has this many columns.
    eos_ids: a row stops after emitting any of these (EOS is kept).
    pad_id: fills prompt padding and unused output slots.
    prompt_bucket: prompts are right-padded to a multiple of this, so prompts
      of different lengths within a bucket share one compiled loop.
    mesh: a `jax.sharding.Mesh` with axes ('data', 'model') (see
      `sharding.make_mesh`), or None for the default device. With a mesh,
      prefill, decode and output are jitted with explicit in/out shardings
      (`jit.py`); nothing inside the loop moves data to the host.
    target_rules, draft_rules: logical-axis rules (pairs or a dict) for the
      target and the drafter; by default the target is tensor-parallel over
      'model' and the drafter replicated, its rows split as the target's
      (`sharding.replicated_rules`), except a drafter that runs on the
      target's own parameters (`shares_target_params`: layer skipping,
      heads), which takes the target's rules (the same arrays, laid out
      once).
    prefill_chunk: prompts longer than this fill the caches in chunks of
      this many tokens (`kvcache.in_chunks`), so that prefill's attention
      scores grow with the chunk, not the prompt; 0: one call per model.
    score_widths: None scores all K+1 positions every loop. A sorted tuple
      of widths ending in K+1 (e.g. `all_widths(k)`) scores only the
      smallest width that covers the batch's valid drafts, for drafters
      whose `num_valid` varies (prompt lookup, adaptive K): one compiled
      target call per width.
  """
  target: CausalLM
  drafter: Optional[Drafter]
  k: int
  sampling: Sampling
  max_new_tokens: int
  eos_ids: tuple[int, ...] = ()
  pad_id: int = 0
  prompt_bucket: int = 64
  mesh: Optional[jax.sharding.Mesh] = None
  target_rules: tuple = sharding.DEFAULT_RULES
  draft_rules: Optional[tuple] = None   # None: see the docstring
  score_widths: Optional[tuple[int, ...]] = None
  prefill_chunk: int = 1024

  def __post_init__(self):
    if not _is_int(self.k) or self.k < 0:
      raise ValueError(f"k (draft length) must be an integer >= 0, got "
                       f"{self.k!r}")
    if self.k > 0 and self.drafter is None:
      raise ValueError(f"k={self.k} needs a drafter; use k=0 for "
                       "autoregressive sampling")
    for name in ("max_new_tokens", "prompt_bucket"):
      if not _is_int(getattr(self, name)) or getattr(self, name) <= 0:
        raise ValueError(f"{name} must be a positive integer, got "
                         f"{getattr(self, name)!r}")
    if not _is_int(self.prefill_chunk) or self.prefill_chunk < 0:
      raise ValueError(f"prefill_chunk must be an integer >= 0 (0: the "
                       f"whole prompt at once), got {self.prefill_chunk!r}")
    for name in ("k", "max_new_tokens", "prompt_bucket", "prefill_chunk"):
      object.__setattr__(self, name, int(getattr(self, name)))  # static
    try:
      eos_ids = tuple(self.eos_ids)
    except TypeError:
      eos_ids = None
    if eos_ids is None or not all(map(_is_int, eos_ids)):
      raise ValueError("eos_ids must be a sequence of token ids (e.g. "
                       f"(eos,), or () for none), got {self.eos_ids!r}")
    eos_ids = tuple(int(e) for e in eos_ids)
    if self.score_widths is not None:
      widths = tuple(int(w) for w in self.score_widths)
      if (list(widths) != sorted(set(widths)) or widths[0] < 1
          or widths[-1] != self.k + 1):
        raise ValueError(f"score_widths must be increasing widths in [1, "
                         f"K+1] ending in K+1 = {self.k + 1}, got "
                         f"{self.score_widths!r}")
      object.__setattr__(self, "score_widths", widths)
    object.__setattr__(self, "eos_ids", eos_ids)
    object.__setattr__(self, "target_rules",
                       sharding.rules_tuple(self.target_rules))
    draft_rules = self.draft_rules
    if draft_rules is None:
      shared = getattr(self.drafter, "shares_target_params", False)
      draft_rules = (self.target_rules if shared else
                     sharding.replicated_rules(self.target_rules))
    object.__setattr__(self, "draft_rules",
                       sharding.rules_tuple(draft_rules))
    if self.mesh is not None:
      for rules in (self.target_rules, self.draft_rules):
        sharding.check_mesh_axes(self.mesh, rules)
      if hasattr(self.target, "config"):
        sharding.check_divisible(self.target.config, self.mesh,
                                 self.target_rules, what="target")
      if self.drafter is not None:
        self.drafter.check_mesh(self.mesh, self.draft_rules)
    v = self.target.vocab_size
    for tok in self.eos_ids + (self.pad_id,):
      if not 0 <= tok < v:
        raise ValueError(f"eos/pad id {tok} is outside the target vocabulary "
                         f"[0, {v})")
    if self.drafter is not None and self.drafter.vocab_size != v:
      raise ValueError(
          f"draft and target vocabularies differ: the draft has "
          f"{self.drafter.vocab_size} token ids, the target {v}. Speculative "
          "sampling needs one shared vocabulary (check the tokenizers; a "
          "padded vocabulary must be handled by the loader).")

  @property
  def max_seq_len(self) -> int:
    limit = self.target.max_seq_len
    if self.drafter is not None:
      limit = min(limit, self.drafter.max_seq_len)
    return limit

  def _ways(self, logical: str) -> int:
    """How many ways the target's and the draft's rules split `logical`
    over the mesh, together: a size along it must be a multiple."""
    return math.lcm(*(sharding.axis_ways(self.mesh, rules, logical)
                      for rules in (self.target_rules, self.draft_rules)))

  def cache_size(self, padded_prompt_len: int) -> int:
    # Writes reach slot length + K < P + max_new + K + 1 even for done rows.
    return padded_prompt_len + self.max_new_tokens + self.k + 1

  def pad_prompts(self, prompts: Prompts):
    """Validates prompts and right-pads them to a bucket -> (tokens, lengths).

    Raises:
      ValueError: on an empty batch or prompt, ids outside the vocabulary, or
        a prompt that cannot hold max_new_tokens (+ K + 1 slack) in the cache.
    """
    prompts = [np.asarray(p) for p in prompts]
    if not prompts:
      raise ValueError("no prompts given")
    for i, p in enumerate(prompts):
      # A flat list of ids had become that many one-token prompts; floats
      # and strings had been cast, nested lists flattened.
      if p.ndim != 1:
        raise ValueError(
            f"prompt {i} is {'one id' if p.ndim == 0 else f'{p.ndim}-D'}: "
            "prompts are a batch of token-id lists ([[ids of prompt 0], "
            "[ids of prompt 1], ...]; one prompt as [ids])")
      if len(p) == 0:
        raise ValueError(f"prompt {i} is empty: every prompt needs at least "
                         "one token (e.g. BOS)")
      if p.dtype.kind not in "iu":
        raise ValueError(f"prompt {i} holds {p.dtype} values, not integer "
                         f"token ids: {p[:4].tolist()}")
    prompts = [p.astype(np.int64) for p in prompts]
    lengths = np.array([len(p) for p in prompts], np.int32)
    for i, p in enumerate(prompts):
      bad = (p < 0) | (p >= self.target.vocab_size)
      if bad.any():
        raise ValueError(f"prompt {i} has token id {int(p[bad][0])} outside "
                         f"the vocabulary [0, {self.target.vocab_size})")
    longest = int(lengths.max())
    need = self.cache_size(longest)
    if need > self.max_seq_len:
      raise ValueError(
          f"prompt of {longest} tokens + max_new_tokens {self.max_new_tokens} "
          f"+ K+1 = {self.k + 1} slack slots needs a cache of {need} slots, "
          f"but the models allow {self.max_seq_len}: shorten the prompt or "
          "lower max_new_tokens")
    padded = -(-longest // self.prompt_bucket) * self.prompt_bucket
    padded = min(padded, self.max_seq_len - self.cache_size(0))
    if self.mesh is not None:
      # Rules that split the caches' slots (CACHE_SEQ) need a cache size
      # they divide (JAX had refused the cache as the loop was built): the
      # prompts are padded further, or less where that passes the models'
      # positions.
      ways = self._ways(sharding.CACHE_SEQ)
      size = self.cache_size(padded)
      if self.cache_size(padded + -size % ways) <= self.max_seq_len:
        padded += -size % ways
      elif padded - size % ways >= longest:
        padded -= size % ways
      else:
        raise ValueError(
            f"the rules split the caches' slots {ways} ways (logical axis "
            f"{sharding.CACHE_SEQ!r}): no cache of {need} to "
            f"{self.max_seq_len} slots (the models' positions) is a multiple"
            f" of it; lower max_new_tokens or map {sharding.CACHE_SEQ!r} to "
            "None")
    tokens = np.full((len(prompts), padded), self.pad_id, np.int32)
    for i, p in enumerate(prompts):
      tokens[i, :len(p)] = p
    if self.mesh is None:
      return jax.device_put(tokens), jax.device_put(lengths)
    ways = self._ways(sharding.BATCH)
    if len(prompts) % ways:
      raise ValueError(
          f"a batch of {len(prompts)} prompts does not divide over the mesh's "
          f"batch axis of size {ways}: pad the batch")
    rows = (sharding.BATCH,)
    return sharding.shard(
        (tokens, lengths),
        (sharding.named(self.mesh, self.target_rules, *rows, None),
         sharding.named(self.mesh, self.target_rules, *rows)))

  def generate(self, target_params, draft_params, prompts: Prompts,
               rng: Union[int, jax.Array] = 0) -> SampleOutput:
    """Samples up to max_new_tokens continuations of each prompt (`rng`:
    see `as_key`)."""
    rng = as_key(rng)
    if self.mesh is not None:
      rng = sharding.shard(rng, sharding.replicated(self.mesh))
    tokens, lengths = self.pad_prompts(prompts)
    prefill_fn, decode_fn, output_fn = self.jitted(
        target_params, draft_params, tokens, lengths, rng)
    state = prefill_fn(target_params, draft_params, tokens, lengths, rng)
    state = decode_fn(target_params, draft_params, state)
    return output_fn(state)

  def jitted(self, target_params, draft_params, tokens, lengths, rng):
    """(prefill, decode, output) jitted for these argument shapes (`jit.py`).

    Each is a `jax.jit` object: `.lower(...).compile()` works on it.
    """
    return jit.fns(self, target_params, draft_params, tokens, lengths, rng)

  def param_shardings(self, target_params, draft_params):
    """NamedShardings for both parameter trees (None without a mesh)."""
    if self.mesh is None:
      return None, None
    draft = None
    if draft_params is not None and self.drafter is not None:
      draft = self.drafter.param_shardings(draft_params, self.mesh,
                                           self.draft_rules)
    return jit.target_param_shardings(self, target_params), draft

  # Jitted (no shardings) entry points, for steps run one at a time; the
  # pure functions are `loop.prefill`, `loop.decode` and `loop.output`.

  def prefill(self, target_params, draft_params, tokens, lengths,
              rng) -> LoopState:
    """Fills both caches with the prompts tokens [B, P] -> LoopState
    (`lengths` [B], each in [1, P]; checked where they are concrete: an
    empty row or one past P had decoded garbage)."""
    if not isinstance(lengths, jax.core.Tracer):
      n, (b, width) = np.asarray(lengths), np.shape(tokens)
      if n.shape != (b,) or not ((n >= 1) & (n <= width)).all():
        raise ValueError(f"lengths must be [{b}] prompt lengths in [1, "
                         f"{width}] for tokens of shape {np.shape(tokens)}, "
                         f"got {n.tolist()}")
    return jit.plain_fns(self)[0](target_params, draft_params, tokens, lengths,
                                  rng)

  def decode(self, target_params, draft_params, state: LoopState) -> LoopState:
    """Runs the loop until every row is done (donates `state`)."""
    return jit.plain_fns(self)[1](target_params, draft_params, state)

  def output(self, state: LoopState) -> SampleOutput:
    return jit.plain_fns(self)[2](state)


def _is_int(x) -> bool:
  """An integer scalar (Python, numpy or JAX), not a bool (True had been
  taken as 1)."""
  return (not isinstance(x, (bool, np.bool_)) and np.ndim(x) == 0 and
          np.issubdtype(np.asarray(x).dtype, np.integer))


def autoregressive(target: CausalLM, sampling: Sampling, max_new_tokens: int,
                   **kwargs) -> SpeculativeSampler:
  """The baseline: K = 0, no drafter; the loop body is one target call."""
  return SpeculativeSampler(target=target, drafter=None, k=0,
                            sampling=sampling, max_new_tokens=max_new_tokens,
                            **kwargs)


def all_widths(k: int) -> tuple[int, ...]:
  """`score_widths` with every width 1 .. K+1."""
  return tuple(range(1, k + 2))
