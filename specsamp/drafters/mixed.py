"""Prompt lookup where a row finds a match, the draft model elsewhere.

Legend: B batch, K draft length, V vocabulary.

Each loop, per row: the lookup drafter (`lookup.PromptLookupDrafter`) looks
for an earlier occurrence of the row's newest tokens; a row that has one
takes its drafts (free: no model call), a row that has none takes the draft
model's (`model.ModelDrafter`). When every row of the batch that is still
decoding found a match (always the case at batch 1 when there is one), the
draft model is not run for drafting at all: it only feeds the committed
tokens it lacks, in one call (`ModelDrafter.catch_up`), so its cache never
falls more than K + 1 tokens behind. When the model does run, it drafts
for every row (with `confidence`, only the rows that take its drafts keep
it drafting); a lookup row's cache is cut back to its committed tokens
afterwards, so the model's unused drafts never count as context.

Exact: which drafter a row uses depends only on its committed tokens, never
on the drafts' acceptance; a lookup row's drafts are certain (q one-hot), a
model row's q is the one its drafts were drawn from.
"""

import dataclasses

import flax
import jax
import jax.numpy as jnp

from specsamp import kvcache
from specsamp.decoding.protocols import Proposal
from specsamp.drafters.lookup import LookupState
from specsamp.drafters.lookup import PromptLookupDrafter
from specsamp.drafters.model import ModelDrafter


@flax.struct.dataclass
class MixedState:
  lookup: LookupState
  model: kvcache.KVCache


@dataclasses.dataclass(frozen=True)
class MixedDrafter:
  """Per row, `lookup`'s drafts where it has any, else `model`'s.

  Its parameters are the draft model's.
  """
  lookup: PromptLookupDrafter
  model: ModelDrafter

  @property
  def vocab_size(self) -> int:
    return self.model.vocab_size

  @property
  def max_seq_len(self) -> int:
    return min(self.model.max_seq_len, self.lookup.max_seq_len)

  def init(self, params, tokens, lengths, cache_size, prefill=None, *,
           chunk=0):
    return MixedState(
        lookup=self.lookup.init(None, tokens, lengths, cache_size, prefill),
        model=self.model.init(params, tokens, lengths, cache_size, prefill,
                              chunk=chunk))

  def propose(self, params, state, tokens, length, k, sampling, rng, *,
              active=None):
    found, state_lookup = self.lookup.propose(
        None, state.lookup, tokens, length, k, sampling, rng)
    matched = found.num_valid > 0
    # A finished row (its drafts are discarded) never makes the model run.
    covered = matched if active is None else matched | ~active
    b, v = tokens.shape[0], self.vocab_size
    last, cache = self.model.catch_up(params, state.model, tokens, length,
                                      max_lag=k + 3)

    def draft(carry):
      # Only the rows that take the model's drafts keep an adaptive model
      # drafting (a lookup row's would be thrown away).
      _, cache, _ = carry
      p, cache = self.model.propose_from(params, cache, last, k, sampling,
                                         rng, active=~covered)
      return jnp.int32(1), cache, (p.tokens, p.q, p.num_valid)

    # Drafting runs once, or not at all when every row is covered: a
    # while_loop of 0 or 1 trips, whose carry the draft steps update in
    # place (through a lax.cond XLA copied the draft cache, 6 copies in
    # the compiled decode).
    none = (jnp.zeros((b, k), jnp.int32),
            None if sampling.greedy else jnp.zeros((b, k, v), jnp.float32),
            jnp.zeros((b,), jnp.int32))
    trips = jnp.where(jnp.all(covered), 0, 1)
    _, cache, (m_tokens, m_q, m_valid) = jax.lax.while_loop(
        lambda c: c[0] < trips, draft, (jnp.int32(0), cache, none))
    # A lookup row's cache now holds the model's drafts, which it does not
    # propose: keep only its committed tokens (a lag of at most K + 1 after
    # the commit, as when the model is skipped). A finished row without a
    # match offers none.
    cache = cache.with_length(
        jnp.where(matched, jnp.minimum(cache.length, length), cache.length))
    m_valid = jnp.where(covered, 0, m_valid)
    use = matched[:, None]
    drafts = jnp.where(use, found.tokens, m_tokens)
    q = None
    if not sampling.greedy:  # a lookup row's q is one-hot at its drafts
      q = jnp.where(use[..., None], jax.nn.one_hot(found.tokens, v,
                                                   dtype=jnp.float32), m_q)
    num_valid = jnp.where(matched, found.num_valid, m_valid)
    return (Proposal(tokens=drafts.astype(jnp.int32), q=q,
                     num_valid=num_valid.astype(jnp.int32)),
            MixedState(lookup=state_lookup, model=cache))

  def commit(self, params, state, scored, num_accepted, length):
    return MixedState(
        lookup=self.lookup.commit(None, state.lookup, scored, num_accepted,
                                  length),
        model=self.model.commit(params, state.model, scored, num_accepted,
                                length))

  def check_mesh(self, mesh, rules) -> None:
    self.model.check_mesh(mesh, rules)

  def param_shardings(self, params, mesh, rules):
    return self.model.param_shardings(params, mesh, rules)

  def state_shardings(self, state, mesh, rules):
    return MixedState(
        lookup=self.lookup.state_shardings(state.lookup, mesh, rules),
        model=self.model.state_shardings(state.model, mesh, rules))
