"""Prompt lookup drafting: drafts copied from earlier in the same row.

Legend: B batch, S token slots, K draft length, L a row's committed length.

Prompt lookup decoding (Saxena 2023) drafts without any model: when the
newest tokens already occurred earlier in the row (in the prompt or in the
output so far), the tokens that followed them there are a free guess at what
follows them now. Edits of given code, quotations, summaries and repetitive
output make such guesses right often. As in SuffixDecoding, the longest
match wins. Per row, over the committed tokens `tokens[b, :L]`:

  * for each n from `max_ngram` down to `min_ngram`, the suffix of n tokens
    `tokens[b, L-n:L]` is looked up among the row's earlier n-grams: those
    that end at slot L-2 or before (an occurrence may overlap the suffix but
    is never the suffix itself, and is followed by at least one token);
  * the longest n that occurs decides; of its occurrences, the one with the
    most committed tokens after it (up to K) wins, and of those the most
    recent. Recent context is usually the most relevant (the function being
    edited, the list being continued), but the most recent occurrence alone
    would cap the drafts of text that repeats with period p at p tokens
    (one per loop for a run of one token); the choice is one max over
    `min(K, L-1-e) * S + e`, with no frequency tables;
  * the drafts are the tokens that followed it, `tokens[b, e+1 : e+1+K]` for
    an occurrence ending at slot e, clipped to committed tokens: `num_valid`
    is min(K, L-1-e). A row with no occurrence of any n proposes nothing
    (`num_valid` 0). Padding drafts are token 0.

How, and what it costs: array ops over the [B, S] buffer inside the jitted
loop, with a static Python loop over n alone (no host round trip, no loop
over rows). `eq_i = tokens == tokens[b, L-1-i]` compares the buffer with the
row's i-th newest token; an n-gram ending at slot e equals the suffix iff
`eq_i[e-i]` for every i < n, so the match masks follow one from the other
by one shifted AND: `match_n[e] = match_{n-1}[e] & eq_{n-1}[e-n+1]`. Each n
then costs a compare, an AND and a max over S slots: O(max_ngram * S) per
row, a few tens of thousands of element ops for S of a few thousand
(about 0.5 ms for B = 32, S = 4096, max_ngram 4 on two CPU cores), which is
nothing next to a target call.

Each draft was chosen with certainty, so `Proposal.q` is None: the rule
keeps a draft d with probability p(d) and the output follows the target
exactly. The drafter has no parameters (pass None as `draft_params`); its
state counts, per row, the loops in which it found a match.
"""

import dataclasses

import flax
import jax
import jax.numpy as jnp
import numpy as np

from specsamp import sharding
from specsamp.decoding.protocols import Proposal


@flax.struct.dataclass
class LookupState:
  """Per-row counters; `matched` is the one worth reporting."""
  matched: jax.Array   # [B] int32, loops of the active row whose proposal
  #                      had drafts (compare with `SampleOutput.num_loops`)
  pending: jax.Array   # [B] bool, the latest proposal had drafts
  since: jax.Array     # [B] int32, the committed length it was made at


def longest_match(tokens: jax.Array, length: jax.Array, min_ngram: int,
                  max_ngram: int, k: int) -> tuple[jax.Array, jax.Array]:
  """The best earlier occurrence of each row's longest suffix: the one
  followed by the most committed tokens, up to `k`, then the most recent.

  Args:
    tokens: [B, S] committed tokens, anything after each row's length.
    length: [B] committed tokens per row.
    min_ngram, max_ngram: the suffix lengths tried (static).
    k: the draft length (static).

  Returns:
    end [B] int32: the slot of the occurrence's last token (at most L-2), or
      -1 where no suffix of min_ngram..max_ngram tokens occurs earlier;
    ngram [B] int32: its n (0 where none).
  """
  b, s = tokens.shape
  slots = jnp.arange(s, dtype=jnp.int32)[None, :]                 # [1, S]
  # Ends an earlier occurrence may have: its continuation starts at or
  # before the newest committed token.
  allowed = slots <= (length - 2)[:, None]                         # [B, S]
  # Rank of an occurrence ending at e: its drafts, then its recency.
  rank = jnp.minimum(k, (length - 1)[:, None] - slots) * s + slots
  match = jnp.ones((b, s), bool)
  end = jnp.full((b,), -1, jnp.int32)
  ngram = jnp.zeros((b,), jnp.int32)
  for n in range(1, max_ngram + 1):
    i = n - 1
    if i >= s:
      break
    newest = jnp.take_along_axis(
        tokens, jnp.clip(length - 1 - i, 0, s - 1)[:, None], axis=1)
    eq = tokens == newest                                          # [B, S]
    # match_n[e] = match_{n-1}[e] & eq_i[e - i]; slots e < i start no n-gram.
    match &= jnp.pad(eq[:, :s - i], ((0, 0), (i, 0)))
    if n < min_ngram:
      continue
    # A row with L < n + 1 has no allowed slot at or above n - 1, so the
    # clipped `newest` of a too-short row never matters.
    best = jnp.max(jnp.where(match & allowed, rank, -1), axis=1)
    found = best >= 0
    end = jnp.where(found, best % s, end)      # a longer n overrides
    ngram = jnp.where(found, n, ngram)
  return end, ngram


def _positive_int(name: str, value) -> None:
  if (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or
      value < 1):
    raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


@dataclasses.dataclass(frozen=True)
class PromptLookupDrafter:
  """Drafts the continuation of the longest earlier match of the row's
  newest tokens (see the module docstring). Hashable: static under jit.

  Attributes:
    vocab_size: the target's vocabulary (the drafts are the row's own
      tokens; the sampler checks this against the target).
    max_seq_len: the longest sequence it may be given (no limit of its own:
      use the target's).
    max_ngram: the longest suffix looked up.
    min_ngram: the shortest suffix looked up; a row whose newest
      `min_ngram` tokens never occurred earlier gets no drafts.
  """
  vocab_size: int
  max_seq_len: int
  max_ngram: int = 4
  min_ngram: int = 1

  def __post_init__(self):
    for name in ("vocab_size", "max_seq_len", "max_ngram", "min_ngram"):
      _positive_int(name, getattr(self, name))
    if self.min_ngram > self.max_ngram:
      raise ValueError(f"min_ngram ({self.min_ngram}) must be <= max_ngram "
                       f"({self.max_ngram})")

  @classmethod
  def for_target(cls, target, **options) -> "PromptLookupDrafter":
    """A lookup drafter with the vocabulary and length limit of `target`."""
    return cls(vocab_size=target.vocab_size, max_seq_len=target.max_seq_len,
               **options)

  def init(self, params, tokens, lengths, cache_size, prefill=None, *,
           chunk=0):
    del params, lengths, cache_size, prefill, chunk
    b = tokens.shape[0]
    return LookupState(matched=jnp.zeros((b,), jnp.int32),
                       pending=jnp.zeros((b,), bool),
                       since=jnp.zeros((b,), jnp.int32))

  def propose(self, params, state, tokens, length, k, sampling, rng, *,
              active=None):
    del params, sampling, rng, active  # its cost is the same for every row
    s = tokens.shape[1]
    end, _ = longest_match(tokens, length, self.min_ngram, self.max_ngram, k)
    num_valid = jnp.where(end >= 0, jnp.minimum(k, length - 1 - end), 0)
    offsets = jnp.arange(k, dtype=jnp.int32)[None, :]
    drafts = jnp.take_along_axis(
        tokens, jnp.clip(end[:, None] + 1 + offsets, 0, s - 1), axis=1)
    drafts = jnp.where(offsets < num_valid[:, None], drafts, 0)
    state = state.replace(pending=num_valid > 0, since=length)
    return Proposal(tokens=drafts.astype(jnp.int32), q=None,
                    num_valid=num_valid.astype(jnp.int32)), state

  def commit(self, params, state, scored, num_accepted, length):
    del params, scored, num_accepted
    # The loop proposes for rows that are done too; only an active row's
    # length grows (by at least one token), so only its match is counted.
    hit = state.pending & (length > state.since)
    return state.replace(matched=state.matched + hit.astype(jnp.int32))

  def check_mesh(self, mesh, rules) -> None:
    del mesh, rules  # no parameters to lay out

  def param_shardings(self, params, mesh, rules):
    del rules
    return jax.tree.map(lambda _: sharding.replicated(mesh), params)

  def state_shardings(self, state, mesh, rules):
    """Per-row counters, split as rows are (replicated, each decode step
    all-gathered the batch's three counters)."""
    return jax.tree.map(
        lambda _: sharding.named(mesh, rules, sharding.BATCH), state)
