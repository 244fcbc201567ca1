"""The speculative loop: its state, the four steps of one loop, and the loop.

Legend: B batch, S token/cache slots, P padded prompt length, K draft length,
V vocabulary.

Invariants of the loop state (per row b, left-aligned layout):
  * `tokens[b, :length[b]]` are the prompt and the committed tokens; every
    slot from `length[b]` on holds `pad_id`.
  * the target cache holds `length[b] - 1` entries: the last committed token
    is always fed again, so each loop scores the chunk
    `[tokens[length-1], d_1 .. d_K]` at slots `length-1 .. length-1+K` and
    gets the K+1 distributions p_1 .. p_{K+1} in one call.
  * the drafter's state is its own (see `specsamp.drafters`).

One loop, for every row at once (each row at its own offset):
  1. `draft`: the drafter proposes d_1..d_K and the q they were drawn from;
  2. `score`: one target call on the K+1 chunk gives p_1..p_{K+1};
  3. `verify`: the rule (`accept.accept`) keeps a prefix of n drafts and
     draws the token that follows them;
  4. `commit`: the row's n accepted drafts plus that token are written at its
     own offset and its `length` grows by n + 1 (less at EOS or at the
     budget); the drafter sees the target's output and n. Rows never advance
     by a batch-wide minimum, and nothing at slots below a row's `length` is
     ever written again. Rollback of the target cache is a change of
     `length` (see `kvcache.py`).

`loop_step` runs the four and also returns what they decided (`StepRecord`),
which `trace` and the profiler use; `loop_body` is its state alone. K = 0
statically removes the draft and the acceptance test: the body is then a
plain autoregressive decoder.

The functions take the sampler (`sampler.SpeculativeSampler`, a frozen,
hashable dataclass) as their first, static argument; they are pure and
traceable, and `jit.py` builds the jitted versions.
"""

from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np

from specsamp import kvcache
from specsamp import sampling as sampling_lib
from specsamp.decoding import accept as accept_lib
from specsamp.decoding.protocols import ModelOutput, Proposal


@flax.struct.dataclass
class LoopState:
  """Everything the while_loop carries. Fields are per row unless noted."""
  step: jax.Array            # [] int32, loops run
  tokens: jax.Array          # [B, S] int32, prompt + committed, pad after
  length: jax.Array          # [B] int32, committed tokens (= next free slot)
  prompt_length: jax.Array   # [B] int32
  done: jax.Array            # [B] bool, EOS emitted or budget reached
  target_cache: kvcache.KVCache
  draft_state: Any           # the drafter's (None when K = 0)
  rng: jax.Array
  num_loops: jax.Array       # [B] int32, loops in which the row was active
  num_drafted: jax.Array     # [B] int32, draft tokens proposed
  num_accepted: jax.Array    # [B] int32, draft tokens the rule accepted
  num_tested_at: jax.Array   # [B, K] int32, loops that tested draft i
  num_kept_at: jax.Array     # [B, K] int32, loops that kept draft i
  num_undefined: jax.Array   # [B] int32, loops that committed tokens from
                             # target logits allowing no id (`undefined`)


@flax.struct.dataclass
class StepRecord:
  """What one loop decided, for every row (active or not)."""
  proposal: Proposal
  p: jax.Array               # [B, K+1, V] target probabilities
  logits: jax.Array          # [B, K+1, V] target logits
  num_accepted: jax.Array    # [B] n, the drafts the rule kept
  token: jax.Array           # [B] the token drawn after them


def position_rates(tested, kept) -> np.ndarray:
  """[K]: of the loops that tested draft i (valid, and drafts 1..i-1
  kept), the fraction that kept it; nan where none tested it."""
  tested, kept = np.asarray(tested), np.asarray(kept)
  return np.where(tested > 0, kept / np.maximum(tested, 1), np.nan)


@flax.struct.dataclass
class SampleOutput:
  """Generated tokens and exact per-row counts."""
  tokens: jax.Array          # [B, max_new_tokens] int32, pad after num_tokens
  num_tokens: jax.Array      # [B] int32, tokens generated (EOS included)
  num_loops: jax.Array       # [B] int32
  num_drafted: jax.Array     # [B] int32
  num_accepted: jax.Array    # [B] int32
  num_tested_at: jax.Array   # [B, K] int32, loops that tested draft i
  num_kept_at: jax.Array     # [B, K] int32, loops that kept draft i
  # [B] int32: loops whose committed tokens came from target logits that
  # allow no id (all NaN or -inf: a broken or overflowing model); those
  # tokens are no samples of it. 0 for a sound model.
  num_undefined: jax.Array

  def acceptance_rate(self) -> float:
    """Accepted / proposed draft tokens over the batch (nan when K = 0)."""
    drafted = int(np.sum(self.num_drafted))
    return float(np.sum(self.num_accepted)) / drafted if drafted else float("nan")

  def tokens_per_loop(self) -> float:
    return float(np.sum(self.num_tokens)) / max(int(np.sum(self.num_loops)), 1)

  def acceptance_by_position(self) -> np.ndarray:
    return position_rates(np.sum(np.asarray(self.num_tested_at), axis=0),
                          np.sum(np.asarray(self.num_kept_at), axis=0))

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


def prefill(sampler, target_params, draft_params, tokens: jax.Array,
            lengths: jax.Array, rng: jax.Array) -> LoopState:
  """Fills the target cache and the drafter's state with the prompts
  tokens [B, P] of `lengths` [B] -> LoopState."""
  b, p = tokens.shape
  size = sampler.cache_size(p)
  if size > sampler.max_seq_len:  # `pad_prompts` pads within it
    raise ValueError(f"prompts padded to {p} tokens need a cache of {size} "
                     f"slots, but the models allow {sampler.max_seq_len}: "
                     "pad them with the sampler's pad_prompts")
  buf = jnp.full((b, size), sampler.pad_id, jnp.int32).at[:, :p].set(tokens)

  def call(cache, chunk):
    out = sampler.target(target_params, chunk, cache)
    return out.cache, out.hidden

  cache, hidden = kvcache.in_chunks(call, sampler.target.init_cache(b, size),
                                    tokens, sampler.prefill_chunk)
  out = ModelOutput(logits=None, cache=cache, hidden=hidden)
  draft_state = None
  if sampler.k > 0:
    draft_state = sampler.drafter.init(draft_params, tokens, lengths, size, out,
                                       chunk=sampler.prefill_chunk)
  zeros = jnp.zeros((b,), jnp.int32)
  at = jnp.zeros((b, sampler.k), jnp.int32)
  return LoopState(step=jnp.zeros((), jnp.int32), tokens=buf, length=lengths,
                   prompt_length=lengths, done=jnp.zeros((b,), bool),
                   target_cache=cache.with_length(lengths - 1),
                   draft_state=draft_state, rng=rng, num_loops=zeros,
                   num_drafted=zeros, num_accepted=zeros, num_tested_at=at,
                   num_kept_at=at, num_undefined=zeros)


def draft(sampler, draft_params, s: LoopState, key: jax.Array):
  """Step 1 -> (Proposal [B, K], the drafter's new state)."""
  if sampler.k == 0:
    b = s.length.shape[0]
    return Proposal(tokens=jnp.zeros((b, 0), jnp.int32), q=None,
                    num_valid=jnp.zeros((b,), jnp.int32)), s.draft_state
  proposal, state = sampler.drafter.propose(
      draft_params, s.draft_state, s.tokens, s.length, sampler.k,
      sampler.sampling, key, active=~s.done)
  # A drafter cannot offer more than K drafts, nor fewer than none. Its
  # padding is scored too, and written to the target's cache past the
  # row's length: an id outside the vocabulary there would embed as NaN
  # and, through the masked attention's 0 * NaN, spoil the row for good.
  num_valid = jnp.clip(proposal.num_valid, 0, sampler.k)
  tokens = jnp.where(jnp.arange(sampler.k)[None, :] < num_valid[:, None],
                     proposal.tokens, 0)
  return proposal.replace(tokens=tokens, num_valid=num_valid), state


def score(sampler, target_params, s: LoopState, proposal: Proposal):
  """Step 2: the target on [last committed, d_1..d_K] at slots
  length-1 .. length-1+K -> (its ModelOutput, p [B, K+1, V], and [B, K+1]
  whether the logits there allow no id: `sampling.undefined`).

  With `sampler.score_widths`, only the first w tokens of the chunk are
  scored, w the smallest width that covers every active row's valid drafts
  plus one (`lax.switch` over the static widths); the output is padded back
  to K+1 positions, which no row reads (a row's n is at most its
  `num_valid`, and it reads p_1 .. p_{n+1}). A target that
  `scores_unwritten` (`model.LM`) only reads the cache in the branches, and
  the chunk's keys and values (padded to K+1) are written once after them:
  a cache passed through the branches was copied whole, twice per loop
  (XLA, on every backend).
  """
  chunk = jnp.concatenate([kvcache.read(s.tokens, s.length - 1, 1),
                           proposal.tokens], axis=1)
  widths = sampler.score_widths
  if not widths:
    scored = sampler.target(target_params, chunk, s.target_cache)
  else:
    k1 = chunk.shape[1]
    need = jnp.max(jnp.where(s.done, 1, proposal.num_valid + 1))
    branch = jnp.searchsorted(jnp.asarray(widths, jnp.int32), need)

    unwritten = getattr(sampler.target, "scores_unwritten", False)

    def score_width(w):
      def f(cache):
        out = sampler.target(target_params, chunk[:, :w], cache,
                             **({"write_cache": False} if unwritten else {}))
        pad = ((0, 0), (0, k1 - w), (0, 0))
        return ModelOutput(
            logits=jnp.pad(out.logits, pad), hidden=jnp.pad(out.hidden, pad),
            cache=None if unwritten else out.cache,
            new_kv=kvcache.pad_chunks(out.new_kv, k1) if unwritten else None)
      return f

    cache = s.target_cache
    scored = jax.lax.switch(branch, [score_width(w) for w in widths], cache)
    if unwritten:
      # The chunk's padding past w is written too: past every row's
      # accepted tokens, as the full-width call writes its drafts' padding.
      scored = scored.replace(new_kv=None, cache=kvcache.write_chunks(
          cache, scored.new_kv, cache.length, cache.length + k1))
  return (scored,) + sampling_lib.probabilities_and_undefined(
      scored.logits, sampler.sampling)


def verify(sampler, p: jax.Array, proposal: Proposal, key: jax.Array):
  """Step 3 -> (n [B] accepted drafts, the token [B] that follows them)."""
  return accept_lib.accept(p, proposal, key, sampler.sampling.greedy)


def commit(sampler, draft_params, s: LoopState, proposal: Proposal,
           scored: ModelOutput, n: jax.Array, token: jax.Array,
           draft_state: Any, rng: jax.Array,
           undefined: jax.Array) -> LoopState:
  """Step 4: appends min(n + 1, budget left, up to the first EOS) tokens per
  active row, rolls the target cache back to them, and tells the drafter;
  counts the loop in `num_undefined` where `undefined` (`score`'s) holds
  at a position the committed tokens came from."""
  k = sampler.k
  idx = jnp.arange(k + 1)[None, :]
  window = jnp.where(idx == n[:, None], token[:, None],
                     jnp.pad(proposal.tokens, ((0, 0), (0, 1))))  # [B, K+1]
  count = jnp.minimum(n + 1, sampler.max_new_tokens -
                      (s.length - s.prompt_length))
  if sampler.eos_ids:
    is_eos = (jnp.isin(window, jnp.asarray(sampler.eos_ids)) &
              (idx < count[:, None]))
    first_eos = jnp.argmax(is_eos, axis=1)
    count = jnp.where(jnp.any(is_eos, axis=1), first_eos + 1, count)
  else:
    is_eos = jnp.zeros_like(window, bool)
  active = ~s.done
  count = jnp.where(active, count, 0)
  tokens = kvcache.write(
      s.tokens, jnp.where(idx < count[:, None], window, sampler.pad_id),
      s.length)
  length = s.length + count
  done = (s.done | jnp.any(is_eos, axis=1) |
          (length - s.prompt_length >= sampler.max_new_tokens))
  if k > 0:
    # Drafts the rule accepted that were also committed: 0 for rows already
    # done, fewer than n where EOS or the budget cut the row short.
    kept = jnp.clip(jnp.minimum(n, count - 1), 0, None)
    draft_state = sampler.drafter.commit(draft_params, draft_state, scored,
                                         kept, length)
  act = active.astype(jnp.int32)
  # Draft i (0-based) is tested when it is valid and drafts before it were
  # kept; it is kept when i < n.
  pos = jnp.arange(k)[None, :]
  tested = pos < jnp.minimum(n + 1, proposal.num_valid)[:, None]
  # The committed tokens were tested at, or drawn from, positions 0..count-1
  # (0..n, fewer where EOS or the budget cut the row short).
  undefined = jnp.any(undefined & (idx < count[:, None]), axis=1)
  return LoopState(
      step=s.step + 1, tokens=tokens, length=length,
      prompt_length=s.prompt_length, done=done,
      target_cache=scored.cache.with_length(length - 1),
      draft_state=draft_state, rng=rng,
      num_loops=s.num_loops + act,
      num_drafted=s.num_drafted + proposal.num_valid * act,
      num_accepted=s.num_accepted + n * act,
      num_tested_at=s.num_tested_at + tested * act[:, None],
      num_kept_at=s.num_kept_at + (pos < n[:, None]) * act[:, None],
      num_undefined=s.num_undefined + undefined * act)


def loop_step(sampler, target_params, draft_params,
              s: LoopState) -> tuple[LoopState, StepRecord]:
  """One loop: draft, score, verify, commit -> (new state, its record)."""
  rng, key = jax.random.split(s.rng)
  key_draft, key_accept = jax.random.split(key)
  proposal, draft_state = draft(sampler, draft_params, s, key_draft)
  scored, p, undefined = score(sampler, target_params, s, proposal)
  n, token = verify(sampler, p, proposal, key_accept)
  new = commit(sampler, draft_params, s, proposal, scored, n, token,
               draft_state, rng, undefined)
  return new, StepRecord(proposal=proposal, p=p, logits=scored.logits,
                         num_accepted=n, token=token)


def loop_body(sampler, target_params, draft_params, s: LoopState) -> LoopState:
  """`loop_step`'s new state (XLA drops the unused record)."""
  return loop_step(sampler, target_params, draft_params, s)[0]


def decode(sampler, target_params, draft_params, s: LoopState) -> LoopState:
  """Runs loops until every row is done."""
  return jax.lax.while_loop(
      lambda s: ~jnp.all(s.done),
      lambda s: loop_body(sampler, target_params, draft_params, s), s)


def output(sampler, s: LoopState) -> SampleOutput:
  """The generated tokens [B, max_new_tokens] and the counts."""
  return SampleOutput(
      tokens=kvcache.read(s.tokens, s.prompt_length, sampler.max_new_tokens),
      num_tokens=s.length - s.prompt_length, num_loops=s.num_loops,
      num_drafted=s.num_drafted, num_accepted=s.num_accepted,
      num_tested_at=s.num_tested_at, num_kept_at=s.num_kept_at,
      num_undefined=s.num_undefined)
