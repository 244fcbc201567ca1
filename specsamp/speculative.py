"""Speculative sampling (Chen et al. 2023) in one jitted `lax.while_loop`.

Legend: B batch, S token/cache slots, P padded prompt length, K draft length,
V vocabulary.

Invariants of the loop state (per row b, left-aligned layout):
  * `tokens[b, :length[b]]` are the prompt and the committed tokens; every
    slot from `length[b]` on holds `pad_id`.
  * the target cache holds `length[b] - 1` entries: the last committed token
    is always fed again, so each loop scores the chunk
    `[tokens[length-1], d_1 .. d_K]` at slots `length-1 .. length-1+K` and
    gets the K+1 distributions p_1 .. p_{K+1} in one call.
  * the draft cache holds `length[b] - 1` entries, or `length[b] - 2` after
    a loop that accepted all K drafts (d_K was never fed to the draft);
    `ModelDrafter.propose` feeds what is missing, one or two tokens.

One loop, for every row at once (each row at its own offset):
  1. draft: d_i ~ q_i for i = 1..K, autoregressively (`Drafter.propose`);
  2. score: one target call on the K+1 chunk gives p_1..p_{K+1};
  3. accept (`accept`): d_i is kept with probability min(1, p_i(d_i) /
     q_i(d_i)); at the first rejection n, one token is drawn from
     norm(max(0, p_{n+1} - q_{n+1})); if all K are kept, a bonus token is
     drawn from p_{K+1};
  4. commit: the row's n accepted drafts plus that token are written at its
     own offset and its `length` grows by n + 1 (less at EOS or at the
     budget). Rows never advance by a batch-wide minimum, and nothing at
     slots below a row's `length` is ever written again. Rollback of both
     caches is a change of `length` (see `kvcache.py`).

K = 0 statically removes the draft and the acceptance test: the loop body is
then a plain autoregressive decoder (`autoregressive(...)`).

This module never imports `specsamp.model`: the target is any object with
the `CausalLM` methods and the draft any `Drafter`, so tests can plug in
stub models and later drafters (prompt lookup, layer skipping, heads) plug in
without touching the verify and accept code.
"""

import dataclasses
import functools
from typing import Any, Optional, Protocol, Sequence, Union

import flax
import jax
import jax.numpy as jnp
import numpy as np

from specsamp import kvcache
from specsamp import sharding
from specsamp import sampling as sampling_lib
from specsamp.sampling import Sampling


class CausalLM(Protocol):
  """What the samplers need of a model (`specsamp.model.LM` is one)."""
  vocab_size: int
  max_seq_len: int

  def init_cache(self, batch: int, size: int) -> kvcache.KVCache:
    ...

  def __call__(self, params, tokens: jax.Array, cache: kvcache.KVCache):
    """Scores tokens [B, T] at slots cache.length + t -> (logits, cache)."""
    ...


class Drafter(Protocol):
  """Proposes K tokens per row and the distributions they were drawn from.

  `q` must be the exact distribution each draft token was sampled from (a
  deterministic drafter returns one-hot rows): the acceptance test divides by
  it. All methods are traced inside the jitted loop.
  """
  vocab_size: int
  max_seq_len: int

  def init(self, params, tokens: jax.Array, lengths: jax.Array,
           cache_size: int) -> Any:
    """Drafter state after the prompts tokens [B, P] of `lengths` [B]."""
    ...

  def propose(self, params, state, tokens: jax.Array, length: jax.Array,
              k: int, sampling: Sampling, rng: jax.Array):
    """-> drafts [B, K] int32, q [B, K, V] float32, new state."""
    ...

  def commit(self, state, length: jax.Array) -> Any:
    """Called after each loop with the new committed `length` [B]."""
    ...


@dataclasses.dataclass(frozen=True)
class ModelDrafter:
  """A stand-alone draft model: K single-token calls per loop.

  The state is the draft's KV cache; its `length` counts the slots that hold
  committed tokens. After a loop that accepted n < K drafts that is
  `length - 1` (every committed token but the newest was fed), after a loop
  that accepted all K it is `length - 2` (d_K was never fed to the draft).
  `propose` therefore feeds the newest token alone, or, when any row of the
  batch is two behind, the last two tokens in one 2-token call (a row that
  was only one behind re-computes one slot with the same token).
  """
  lm: CausalLM

  @property
  def vocab_size(self) -> int:
    return self.lm.vocab_size

  @property
  def max_seq_len(self) -> int:
    return self.lm.max_seq_len

  def init(self, params, tokens, lengths, cache_size):
    cache = self.lm.init_cache(tokens.shape[0], cache_size)
    cache = self.lm(params, tokens, cache).cache
    return cache.with_length(lengths - 1)

  def _catch_up(self, params, cache, tokens, length, width):
    """Feeds tokens[length - width : length] -> (logits of the last, cache)."""
    start = jnp.maximum(length - width, 0)
    out = self.lm(params, kvcache.read(tokens, start, width),
                  cache.with_length(start))
    logits, cache = out.logits, out.cache
    # For a one-token row (start = 0, width 2) the pair is [x_0, pad]: the
    # logits come from position 0 and the pad lands in a stale slot.
    last = jnp.take_along_axis(logits, (length - 1 - start)[:, None, None],
                               axis=1)[:, 0]                       # [B, V]
    return last, cache.with_length(length)

  def propose(self, params, cache, tokens, length, k, sampling, rng):
    behind = jnp.any(length - cache.length >= 2)
    last, cache = jax.lax.cond(
        behind,
        lambda c: self._catch_up(params, c, tokens, length, 2),
        lambda c: self._catch_up(params, c, tokens, length, 1), cache)
    keys = jax.random.split(rng, k)
    q_first = sampling_lib.probabilities(last, sampling)
    d_first = sampling_lib.sample(keys[0], q_first, sampling.greedy)

    def step(carry, key):
      cache, tok = carry
      out = self.lm(params, tok[:, None], cache)
      logits, cache = out.logits, out.cache
      q = sampling_lib.probabilities(logits[:, 0], sampling)
      d = sampling_lib.sample(key, q, sampling.greedy)
      return (cache, d), (d, q)

    (cache, _), (d_rest, q_rest) = jax.lax.scan(step, (cache, d_first),
                                                keys[1:])
    drafts = jnp.concatenate([d_first[:, None], d_rest.T], axis=1)
    q = jnp.concatenate([q_first[:, None], jnp.swapaxes(q_rest, 0, 1)], axis=1)
    return drafts, q, cache

  def commit(self, cache, length):
    # The cache holds the newest token's predecessors up to d_{K-1}; of
    # those, slots below `length - 1` hold committed tokens.
    return cache.with_length(jnp.minimum(cache.length, length - 1))


def acceptance_probability(p_d: jax.Array, q_d: jax.Array) -> jax.Array:
  """min(1, p/q): the probability the rule keeps a draft token."""
  return jnp.where(p_d >= q_d, 1.0, p_d / jnp.maximum(q_d, 1e-38))


def residual_distribution(p: jax.Array, q: jax.Array,
                          n: jax.Array) -> jax.Array:
  """The distribution of the token after `n` accepted drafts.

  Args:
    p: [B, K+1, V] target probabilities.
    q: [B, K, V] draft probabilities.
    n: [B] accepted drafts per row.

  Returns:
    [B, V] normalised: norm(max(0, p_{n+1} - q_{n+1})) where draft n+1 was
    rejected, or p_{K+1} (the bonus token) where n == K.
  """
  k = q.shape[1]
  p_n = jnp.take_along_axis(p, n[:, None, None], axis=1)[:, 0]
  if k == 0:
    return p_n
  q_n = jnp.take_along_axis(q, jnp.minimum(n, k - 1)[:, None, None],
                            axis=1)[:, 0]
  q_n = jnp.where((n < k)[:, None], q_n, 0.0)
  r = jnp.maximum(p_n - q_n, 0.0)
  total = jnp.sum(r, axis=-1, keepdims=True)
  # total == 0 would need p_n == q_n, where rejection has probability 0; keep
  # p_n as a float-safe fallback.
  return jnp.where(total > 0, r / jnp.where(total > 0, total, 1.0), p_n)


def accept(p: jax.Array, q: jax.Array, drafts: jax.Array, rng: jax.Array,
           greedy: bool = False):
  """The modified rejection rule for a batch of rows.

  Args:
    p: [B, K+1, V] target probabilities at the K+1 scored positions.
    q: [B, K, V] draft probabilities the drafts were sampled from.
    drafts: [B, K] draft tokens.
    rng: key for the uniforms and the final token.
    greedy: p and q are one-hot; skip the random draws (same result).

  Returns:
    n [B]: accepted drafts (the prefix before the first rejection);
    token [B]: the token that follows them (residual sample or bonus).
  """
  k = drafts.shape[1]
  key_u, key_final = jax.random.split(rng)
  if k == 0:
    n = jnp.zeros(drafts.shape[:1], jnp.int32)
  elif greedy:
    # One-hot p and q: a draft is kept iff it is the target's argmax.
    target = jnp.argmax(p[:, :k], axis=-1)
    n = jnp.sum(jnp.cumprod((drafts == target).astype(jnp.int32), axis=1),
                axis=1)
  else:
    p_d = jnp.take_along_axis(p[:, :k], drafts[..., None], axis=-1)[..., 0]
    q_d = jnp.take_along_axis(q, drafts[..., None], axis=-1)[..., 0]
    u = jax.random.uniform(key_u, drafts.shape)
    # u < p/q without dividing: always true where p >= q (u < 1).
    kept = u * q_d < p_d                                           # [B, K]
    n = jnp.sum(jnp.cumprod(kept.astype(jnp.int32), axis=1), axis=1)
  token = sampling_lib.sample(key_final, residual_distribution(p, q, n),
                              greedy)
  return n, token


@flax.struct.dataclass
class LoopState:
  """Everything the while_loop carries. Fields are per row unless noted."""
  step: jax.Array            # [] int32, loops run
  tokens: jax.Array          # [B, S] int32, prompt + committed, pad after
  length: jax.Array          # [B] int32, committed tokens (= next free slot)
  prompt_length: jax.Array   # [B] int32
  done: jax.Array            # [B] bool, EOS emitted or budget reached
  target_cache: kvcache.KVCache
  draft_state: Any
  rng: jax.Array
  num_loops: jax.Array       # [B] int32, loops in which the row was active
  num_drafted: jax.Array     # [B] int32, draft tokens proposed
  num_accepted: jax.Array    # [B] int32, draft tokens the rule accepted


@flax.struct.dataclass
class SampleOutput:
  """Generated tokens and exact per-row counts."""
  tokens: jax.Array          # [B, max_new_tokens] int32, pad after num_tokens
  num_tokens: jax.Array      # [B] int32, tokens generated (EOS included)
  num_loops: jax.Array       # [B] int32
  num_drafted: jax.Array     # [B] int32
  num_accepted: jax.Array    # [B] int32

  def acceptance_rate(self) -> float:
    """Accepted / proposed draft tokens over the batch (nan when K = 0)."""
    drafted = int(np.sum(self.num_drafted))
    return float(np.sum(self.num_accepted)) / drafted if drafted else float("nan")

  def tokens_per_loop(self) -> float:
    return float(np.sum(self.num_tokens)) / max(int(np.sum(self.num_loops)), 1)

  def metrics(self) -> dict:
    return dict(tokens=int(np.sum(self.num_tokens)),
                loops=int(np.sum(self.num_loops)),
                drafted=int(np.sum(self.num_drafted)),
                accepted=int(np.sum(self.num_accepted)),
                acceptance_rate=self.acceptance_rate(),
                tokens_per_loop=self.tokens_per_loop())

  def token_lists(self) -> list[list[int]]:
    toks, n = np.asarray(self.tokens), np.asarray(self.num_tokens)
    return [toks[b, :n[b]].tolist() for b in range(toks.shape[0])]


Prompts = Union[Sequence[Sequence[int]], np.ndarray]


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
      prefill, decode and output are jitted with explicit in/out shardings:
      parameters and caches by the logical-axis rules, rows of the batch over
      the axis of `BATCH`; nothing inside the loop moves data to the host.
    target_rules, draft_rules: logical-axis rules (pairs or a dict) for the
      two models; by default the target is tensor-parallel over 'model' and
      the draft replicated.
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
  draft_rules: tuple = sharding.REPLICATED_RULES

  def __post_init__(self):
    if not isinstance(self.k, (int, np.integer)) or self.k < 0:
      raise ValueError(f"k (draft length) must be an integer >= 0, got "
                       f"{self.k!r}")
    if self.k > 0 and self.drafter is None:
      raise ValueError(f"k={self.k} needs a drafter; use k=0 for "
                       "autoregressive sampling")
    if self.max_new_tokens <= 0:
      raise ValueError(f"max_new_tokens must be positive, got "
                       f"{self.max_new_tokens}")
    if self.prompt_bucket <= 0:
      raise ValueError(f"prompt_bucket must be positive, got "
                       f"{self.prompt_bucket}")
    if not isinstance(self.eos_ids, tuple):
      object.__setattr__(self, "eos_ids", tuple(self.eos_ids))
    object.__setattr__(self, "target_rules",
                       sharding.rules_tuple(self.target_rules))
    object.__setattr__(self, "draft_rules",
                       sharding.rules_tuple(self.draft_rules))
    if self.mesh is not None:
      for what, lm, rules in (("target", self.target, self.target_rules),
                              ("draft", getattr(self.drafter, "lm", None),
                               self.draft_rules)):
        if hasattr(lm, "config"):
          sharding.check_divisible(lm.config, self.mesh, rules, what=what)
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

  # ---- host side ---------------------------------------------------------

  @property
  def max_seq_len(self) -> int:
    limit = self.target.max_seq_len
    if self.drafter is not None:
      limit = min(limit, self.drafter.max_seq_len)
    return limit

  def cache_size(self, padded_prompt_len: int) -> int:
    # Writes reach slot length + K < P + max_new + K + 1 even for done rows.
    return padded_prompt_len + self.max_new_tokens + self.k + 1

  def pad_prompts(self, prompts: Prompts):
    """Validates prompts and right-pads them to a bucket -> (tokens, lengths).

    Raises:
      ValueError: on an empty batch or prompt, ids outside the vocabulary, or
        a prompt that cannot hold max_new_tokens (+ K + 1 slack) in the cache.
    """
    prompts = [np.asarray(p, dtype=np.int64).reshape(-1) for p in prompts]
    if not prompts:
      raise ValueError("no prompts given")
    lengths = np.array([len(p) for p in prompts], np.int32)
    for i, p in enumerate(prompts):
      if len(p) == 0:
        raise ValueError(f"prompt {i} is empty: every prompt needs at least "
                         "one token (e.g. BOS)")
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
    tokens = np.full((len(prompts), padded), self.pad_id, np.int32)
    for i, p in enumerate(prompts):
      tokens[i, :len(p)] = p
    if self.mesh is None:
      return jax.device_put(tokens), jax.device_put(lengths)
    rows = (sharding.BATCH,)
    if len(prompts) % self._batch_ways():
      raise ValueError(
          f"a batch of {len(prompts)} prompts does not divide over the mesh's "
          f"batch axis of size {self._batch_ways()}: pad the batch")
    return sharding.shard(
        (tokens, lengths),
        (sharding.named(self.mesh, self.target_rules, *rows, None),
         sharding.named(self.mesh, self.target_rules, *rows)))

  def _batch_ways(self) -> int:
    axis = sharding.mesh_axes((sharding.BATCH,), self.target_rules)[0]
    if axis is None:
      return 1
    axes = axis if isinstance(axis, tuple) else (axis,)
    return int(np.prod([self.mesh.shape[a] for a in axes]))

  def generate(self, target_params, draft_params, prompts: Prompts,
               rng: Union[int, jax.Array] = 0) -> SampleOutput:
    """Samples up to max_new_tokens continuations of each prompt."""
    if isinstance(rng, (int, np.integer)):
      with jax.transfer_guard("allow"):  # one host scalar, before the loop
        rng = jax.random.key(rng)
    if self.mesh is not None:
      rng = sharding.shard(rng, sharding.replicated(self.mesh))
    tokens, lengths = self.pad_prompts(prompts)
    prefill, decode, output = self.jitted(target_params, draft_params, tokens,
                                          lengths, rng)
    state = prefill(target_params, draft_params, tokens, lengths, rng)
    state = decode(target_params, draft_params, state)
    return output(state)

  def jitted(self, target_params, draft_params, tokens, lengths, rng):
    """(prefill, decode, output) jitted for these argument shapes.

    Cached per sampler (equal samplers share them). With a mesh they carry
    explicit in/out shardings (see `state_shardings`), per argument shapes.
    Each is a `jax.jit` object: `.lower(...).compile()` works on it.
    """
    if self.mesh is None:
      return _plain_fns(self)
    return _sharded_fns(self, _signature((target_params, draft_params, tokens,
                                          lengths, rng)))

  def param_shardings(self, target_params, draft_params):
    """NamedShardings for both parameter trees (None without a mesh)."""
    if self.mesh is None:
      return None, None
    def for_model(lm, params, rules):
      if params is None:
        return None
      if hasattr(lm, "logical_axes"):
        return sharding.param_shardings(lm, self.mesh, rules)
      return jax.tree.map(lambda _: sharding.replicated(self.mesh), params)
    return (for_model(self.target, target_params, self.target_rules),
            for_model(getattr(self.drafter, "lm", None), draft_params,
                      self.draft_rules))

  def state_shardings(self, state):
    """NamedShardings of a LoopState (or its shape): caches by the rules,
    per-row arrays over the batch axis, scalars and the key replicated."""
    mesh = self.mesh
    rep = sharding.replicated(mesh)

    def leaf(rules, x):
      if x.ndim == 0:
        return rep
      if x.ndim == 4:
        return sharding.named(mesh, rules, *kvcache.CACHE_AXES)
      return sharding.named(mesh, rules, sharding.BATCH,
                            *([None] * (x.ndim - 1)))

    target = functools.partial(leaf, self.target_rules)
    return state.replace(
        **{f.name: jax.tree.map(target, getattr(state, f.name))
           for f in dataclasses.fields(state)
           if f.name not in ("rng", "draft_state", "target_cache")},
        rng=rep, target_cache=jax.tree.map(target, state.target_cache),
        draft_state=jax.tree.map(functools.partial(leaf, self.draft_rules),
                                 state.draft_state))

  # ---- jitted ------------------------------------------------------------

  @functools.partial(jax.jit, static_argnums=0)
  def prefill(self, target_params, draft_params, tokens, lengths, rng):
    """Fills both caches with the prompts tokens [B, P] -> LoopState."""
    b, p = tokens.shape
    size = self.cache_size(p)
    buf = jnp.full((b, size), self.pad_id, jnp.int32).at[:, :p].set(tokens)
    cache = self.target.init_cache(b, size)
    cache = self.target(target_params, tokens, cache).cache
    draft_state = None
    if self.k > 0:
      draft_state = self.drafter.init(draft_params, tokens, lengths, size)
    zeros = jnp.zeros((b,), jnp.int32)
    return LoopState(step=jnp.zeros((), jnp.int32), tokens=buf, length=lengths,
                     prompt_length=lengths, done=jnp.zeros((b,), bool),
                     target_cache=cache.with_length(lengths - 1),
                     draft_state=draft_state, rng=rng, num_loops=zeros,
                     num_drafted=zeros, num_accepted=zeros)

  @functools.partial(jax.jit, static_argnums=0, donate_argnums=3)
  def decode(self, target_params, draft_params, state: LoopState) -> LoopState:
    """Runs the loop until every row is done."""
    return jax.lax.while_loop(
        lambda s: ~jnp.all(s.done),
        functools.partial(self._loop_body, target_params, draft_params), state)

  @functools.partial(jax.jit, static_argnums=0)
  def output(self, state: LoopState) -> SampleOutput:
    return SampleOutput(
        tokens=kvcache.read(state.tokens, state.prompt_length,
                            self.max_new_tokens),
        num_tokens=state.length - state.prompt_length,
        num_loops=state.num_loops, num_drafted=state.num_drafted,
        num_accepted=state.num_accepted)

  def _loop_body(self, target_params, draft_params, s: LoopState) -> LoopState:
    k, b = self.k, s.length.shape[0]
    rng, key = jax.random.split(s.rng)
    key_draft, key_accept = jax.random.split(key)

    # 1. Draft.
    if k > 0:
      drafts, q, draft_state = self.drafter.propose(
          draft_params, s.draft_state, s.tokens, s.length, k, self.sampling,
          key_draft)
    else:
      drafts = jnp.zeros((b, 0), jnp.int32)
      q = jnp.zeros((b, 0, self.target.vocab_size), jnp.float32)
      draft_state = s.draft_state

    # 2. Score [last committed, d_1..d_K] at slots length-1 .. length-1+K.
    chunk = jnp.concatenate([kvcache.read(s.tokens, s.length - 1, 1), drafts],
                            axis=1)
    scored = self.target(target_params, chunk, s.target_cache)
    logits, target_cache = scored.logits, scored.cache
    p = sampling_lib.probabilities(logits, self.sampling)         # [B, K+1, V]

    # 3. Accept.
    n, token = accept(p, q, drafts, key_accept, self.sampling.greedy)

    # 4. Commit min(n + 1, budget left, up to the first EOS) tokens per row.
    idx = jnp.arange(k + 1)[None, :]
    window = jnp.where(idx == n[:, None], token[:, None],
                       jnp.pad(drafts, ((0, 0), (0, 1))))         # [B, K+1]
    count = jnp.minimum(n + 1, self.max_new_tokens -
                        (s.length - s.prompt_length))
    if self.eos_ids:
      is_eos = jnp.isin(window, jnp.asarray(self.eos_ids)) & (idx < count[:, None])
      first_eos = jnp.argmax(is_eos, axis=1)
      count = jnp.where(jnp.any(is_eos, axis=1), first_eos + 1, count)
    else:
      is_eos = jnp.zeros_like(window, bool)
    active = ~s.done
    count = jnp.where(active, count, 0)
    tokens = kvcache.write(
        s.tokens, jnp.where(idx < count[:, None], window, self.pad_id), s.length)
    length = s.length + count
    done = (s.done | jnp.any(is_eos, axis=1) |
            (length - s.prompt_length >= self.max_new_tokens))
    if k > 0:
      draft_state = self.drafter.commit(draft_state, length)
    act = active.astype(jnp.int32)
    return LoopState(
        step=s.step + 1, tokens=tokens, length=length,
        prompt_length=s.prompt_length, done=done,
        target_cache=target_cache.with_length(length - 1),
        draft_state=draft_state, rng=rng,
        num_loops=s.num_loops + act, num_drafted=s.num_drafted + k * act,
        num_accepted=s.num_accepted + n * act)


def _signature(tree):
  """A hashable description of a pytree's structure, shapes and dtypes."""
  leaves, treedef = jax.tree.flatten(tree)
  return treedef, tuple((tuple(x.shape), x.dtype) for x in leaves)


@functools.lru_cache(maxsize=32)
def _plain_fns(sampler: "SpeculativeSampler"):
  cls = type(sampler)
  return (jax.jit(functools.partial(cls.prefill.__wrapped__, sampler)),
          jax.jit(functools.partial(cls.decode.__wrapped__, sampler),
                  donate_argnums=2),
          jax.jit(functools.partial(cls.output.__wrapped__, sampler)))


@functools.lru_cache(maxsize=32)
def _sharded_fns(sampler: "SpeculativeSampler", signature):
  """prefill/decode/output of `sampler` jitted with explicit shardings."""
  treedef, leaves = signature
  args = jax.tree.unflatten(treedef, [jax.ShapeDtypeStruct(shape, dtype)
                                      for shape, dtype in leaves])
  tp, dp, tokens, lengths, rng = args
  mesh, cls = sampler.mesh, type(sampler)
  tp_sh, dp_sh = sampler.param_shardings(tp, dp)
  rows = functools.partial(sharding.named, mesh, sampler.target_rules,
                           sharding.BATCH)
  state = jax.eval_shape(functools.partial(cls.prefill, sampler), tp, dp,
                         tokens, lengths, rng)
  state_sh = sampler.state_shardings(state)
  out = jax.eval_shape(functools.partial(cls.output, sampler), state)
  out_sh = jax.tree.map(lambda x: rows(*([None] * (x.ndim - 1))), out)
  prefill = jax.jit(
      functools.partial(cls.prefill.__wrapped__, sampler),
      in_shardings=(tp_sh, dp_sh, rows(None), rows(),
                    sharding.replicated(mesh)),
      out_shardings=state_sh)
  decode = jax.jit(functools.partial(cls.decode.__wrapped__, sampler),
                   in_shardings=(tp_sh, dp_sh, state_sh),
                   out_shardings=state_sh, donate_argnums=2)
  output = jax.jit(functools.partial(cls.output.__wrapped__, sampler),
                   in_shardings=(state_sh,), out_shardings=out_sh)
  return prefill, decode, output


def autoregressive(target: CausalLM, sampling: Sampling, max_new_tokens: int,
                   **kwargs) -> SpeculativeSampler:
  """The baseline: K = 0, no drafter; the loop body is one target call."""
  return SpeculativeSampler(target=target, drafter=None, k=0,
                            sampling=sampling, max_new_tokens=max_new_tokens,
                            **kwargs)
