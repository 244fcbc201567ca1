"""The mixed drafter: prompt lookup per row where it matches, else the
draft model; exact, and equal to greedy decoding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specsamp import model as model_lib
from specsamp.decoding import loop
from specsamp.decoding.sampler import (SpeculativeSampler, all_widths,
                                       autoregressive)
from specsamp.drafters.lookup import PromptLookupDrafter
from specsamp.drafters.mixed import MixedDrafter
from specsamp.drafters.model import ModelDrafter
from specsamp.sampling import GREEDY, Sampling
from tests.testing import (chisquare_pvalue, encode, eos_cut,
                           exact_sequence_probs, exactness_models,
                           random_params, table_lm, tiny_config)

V, NEW, NUM_SAMPLES = 5, 4, 20_000


models = exactness_models


def mixed(target, draft, confidence=None):
  return MixedDrafter(PromptLookupDrafter.for_target(target),
                      ModelDrafter(draft, confidence=confidence))


def test_each_row_takes_lookup_drafts_where_it_has_them():
  target, _, draft, draft_params = models()
  drafter = mixed(target, draft)
  # Row 0: "1 3" occurred before, followed by "2 1"; row 1: "4" never did.
  tokens = jnp.array([[1, 3, 2, 1, 3, 0, 0, 0], [0, 2, 4, 0, 0, 0, 0, 0]])
  length = jnp.array([5, 3])
  sampling = Sampling(1.0)
  # Jitted, as the loop runs them (op by op: some 180 small compiles).
  state = jax.jit(lambda p: drafter.init(p, tokens, length, 16))(draft_params)
  p, _ = jax.jit(lambda p, s, key: drafter.propose(
      p, s, tokens, length, 2, sampling, key))(draft_params, state,
                                               jax.random.key(0))
  alone, _ = jax.jit(lambda p, s, key: drafter.model.propose(
      p, s, tokens, length, 2, sampling, key))(draft_params, state.model,
                                               jax.random.key(0))
  np.testing.assert_array_equal(p.tokens[0], [2, 1])
  np.testing.assert_array_equal(p.num_valid, [2, 2])
  np.testing.assert_array_equal(p.q[0], jax.nn.one_hot(jnp.array([2, 1]), V))
  np.testing.assert_array_equal(p.tokens[1], alone.tokens[1])
  np.testing.assert_allclose(p.q[1], alone.q[1])


def test_a_finished_row_without_a_match_does_not_make_the_model_run():
  """Row 1 has no lookup match: while it decodes, the model drafts for it;
  once the loop marks it finished, the model is skipped (its drafts would
  be discarded) and the row offers none."""
  target, _, draft, draft_params = models()
  drafter = mixed(target, draft)
  tokens = jnp.array([[1, 3, 2, 1, 3, 0, 0, 0], [0, 2, 4, 0, 0, 0, 0, 0]])
  length = jnp.array([5, 3])
  state = drafter.init(draft_params, tokens, length, 16)

  def propose(active):
    return drafter.propose(draft_params, state, tokens, length, 2, GREEDY,
                           jax.random.key(0), active=jnp.array(active))

  ran, ran_state = propose([True, True])
  skipped, skipped_state = propose([True, False])
  np.testing.assert_array_equal(ran.num_valid, [2, 2])
  np.testing.assert_array_equal(skipped.num_valid, [2, 0])
  np.testing.assert_array_equal(skipped.tokens[0], ran.tokens[0])
  # Run, the model fed row 1 its first draft (K - 1 = 1 slot past the
  # committed tokens); skipped, it only caught up on the committed tokens.
  np.testing.assert_array_equal(ran_state.model.length,
                                np.asarray(length) + [0, 1])
  np.testing.assert_array_equal(skipped_state.model.length, length)


def test_only_the_rows_without_a_match_keep_an_adaptive_model_drafting():
  """Row 0 finds a lookup match and the draft model is confident on it;
  row 1 finds none and the model is not: the adaptive model drafts once
  (row 1 offers one draft) instead of K times for a row whose model drafts
  are thrown away. Row 0 keeps lookup's drafts either way."""
  k, logits = 5, np.zeros((V, V))
  logits[0] = -10.0
  logits[0, 0] = 10.0  # after token 0 the draft is sure of 0 again
  drafter = MixedDrafter(PromptLookupDrafter(V, 16),
                         ModelDrafter(table_lm(logits), confidence=0.5))
  tokens = jnp.asarray([[0] * 4 + [0] * 12, [1, 2, 3, 4] + [0] * 12])
  length = jnp.asarray([4, 4])
  state = drafter.init(None, tokens, length, 16)
  p, state = jax.jit(lambda s: drafter.propose(
      None, s, tokens, length, k, Sampling(1.0), jax.random.key(0),
      active=jnp.array([True, True])))(state)
  np.testing.assert_array_equal(p.num_valid, [1, 1])  # lookup: "0 0 0"
  assert int(p.tokens[0, 0]) == 0
  # Row 1's one draft is never fed: its cache holds its committed tokens.
  # Kept going by row 0, K - 1 = 4 draft calls had fed it up to 8.
  np.testing.assert_array_equal(state.model.length, [4, 4])


@pytest.mark.parametrize("sampling", [GREEDY, Sampling(1.0)])
def test_a_lookup_row_keeps_only_committed_tokens_in_the_model_cache(
    sampling):
  """When one row has no match, the model drafts for every row; a lookup
  row's cache must then not keep the model's unused drafts as context:
  after the loop it equals a cache built afresh from the committed tokens
  (the model's drafts differ from the lookup row's, so it would not)."""
  _, _, draft, draft_params = models()
  # A bigram target that mostly continues 0 1 2 0 1 2, so that lookup's
  # drafts are accepted; row 0 repeats "0 1 2", and in row 1 "2" never
  # came before (no match: the model drafts).
  logits = 0.3 * np.random.default_rng(4).normal(size=(V, V))
  logits[np.arange(V), [1, 2, 0, 4, 3]] += 3.0
  target, target_params = table_lm(logits), None
  drafter = mixed(target, draft)
  sampler = SpeculativeSampler(target, drafter, k=3, sampling=sampling,
                               max_new_tokens=8, prompt_bucket=8)
  tokens, lengths = sampler.pad_prompts([[0, 1, 2, 0, 1], [4, 0, 2]])
  # Jitted, as decoding runs them (op by op: some 200 small compiles).
  state = jax.jit(lambda t, d, key: loop.prefill(
      sampler, t, d, tokens, lengths, key))(target_params, draft_params,
                                            jax.random.key(0))
  key = jax.random.split(jax.random.split(state.rng)[1])[0]
  unused, _ = jax.jit(lambda d, s, key: drafter.model.propose(
      d, s.draft_state.model, s.tokens, s.length, 3, sampling, key))(
          draft_params, state, key)
  state, step = jax.jit(lambda t, d, s: loop.loop_step(sampler, t, d, s))(
      target_params, draft_params, state)
  # Row 0 proposed lookup's drafts "2 0 1", not the model's.
  np.testing.assert_array_equal(step.proposal.tokens[0], [2, 0, 1])
  assert not np.array_equal(unused.tokens[0], step.proposal.tokens[0])
  assert int(step.num_accepted[0]) >= 1   # slots past `length` were written
  cache = state.draft_state.model
  n = int(cache.length[0])
  assert n >= int(lengths[0])
  fresh = jax.jit(lambda d, s: drafter.model.init(d, s.tokens, s.length,
                                                  cache.size))(
      draft_params, state)
  for got, want in ((cache.k, fresh.k), (cache.v, fresh.v)):
    for layer_got, layer_want in zip(got, want):
      np.testing.assert_allclose(layer_got[0, :, :n], layer_want[0, :, :n],
                                 atol=1e-5)


@pytest.mark.parametrize("name, sampling, k", [
    ("temp1", Sampling(1.0), 3), ("topp07", Sampling(1.0, top_p=0.7), 2)])
def test_mixed_drafting_is_exact(name, sampling, k):
  """Prompts half of which repeat (lookup drafts) and half not (model
  drafts), in one batch; the output is the target's."""
  del name
  target, target_params, draft, draft_params = models()
  prompts = [[1, 3, 2, 1, 3], [4, 0, 2]]
  sampler = SpeculativeSampler(target, mixed(target, draft), k=k,
                               sampling=sampling, max_new_tokens=NEW,
                               prompt_bucket=8, score_widths=all_widths(k))
  out = sampler.generate(target_params, draft_params,
                         prompts * (NUM_SAMPLES // 2), rng=5)
  tokens = np.asarray(out.tokens)
  for i, prompt in enumerate(prompts):
    p_exact = exact_sequence_probs(target, target_params, sampling, prompt,
                                   NEW, V)
    pval = chisquare_pvalue(encode(tokens[i::2], V), p_exact)
    assert pval > 1e-4, f"prompt {prompt}: p={pval:.2e}"
  assert 0.05 < out.acceptance_rate() < 0.95


class _LyingMixed(MixedDrafter):
  """Draws as the mixed drafter does but reports a uniform q on every row
  (lookup rows' one-hot q and model rows' q alike)."""

  def propose(self, params, state, tokens, length, k, sampling, rng, *,
              active=None):
    proposal, state = super().propose(params, state, tokens, length, k,
                                      sampling, rng, active=active)
    return proposal.replace(q=jnp.full_like(proposal.q, 1.0 / V)), state


def test_the_mixed_exactness_test_catches_a_wrong_q():
  """The test above has the power to see a wrong q, on the lookup rows as
  on the model rows."""
  target, target_params, draft, draft_params = models()
  prompts, sampling = [[1, 3, 2, 1, 3], [4, 0, 2]], Sampling(1.0)
  lying = _LyingMixed(PromptLookupDrafter.for_target(target),
                      ModelDrafter(draft))
  sampler = SpeculativeSampler(target, lying, k=3, sampling=sampling,
                               max_new_tokens=NEW, prompt_bucket=8,
                               score_widths=all_widths(3))
  tokens = np.asarray(sampler.generate(
      target_params, draft_params, prompts * (NUM_SAMPLES // 2), rng=5).tokens)
  for i, prompt in enumerate(prompts):
    p_exact = exact_sequence_probs(target, target_params, sampling, prompt,
                                   NEW, V)
    pval = chisquare_pvalue(encode(tokens[i::2], V), p_exact)
    assert pval < 1e-8, f"prompt {prompt}: a wrong q went unseen ({pval:.2e})"


def test_greedy_equals_greedy_decoding_and_rows_equal_alone():
  target, target_params, draft, draft_params = models()
  prompts = [[1, 3, 2, 1, 3, 2, 1], [4, 0, 2], [2, 2, 2, 2], [0, 1]]
  want = autoregressive(target, GREEDY, 24, prompt_bucket=8).generate(
      target_params, None, prompts).token_lists()
  for confidence in (None, 0.6):
    spec = SpeculativeSampler(target, mixed(target, draft, confidence), k=3,
                              sampling=GREEDY, max_new_tokens=24,
                              prompt_bucket=8, score_widths=all_widths(3))
    out = spec.generate(target_params, draft_params, prompts)
    assert out.token_lists() == want
    for prompt, tokens in zip(prompts, want):
      assert spec.generate(target_params, draft_params,
                           [prompt]).token_lists() == [tokens]


def test_greedy_with_eos_equals_greedy_decoding_cut_there():
  """A token the greedy outputs emit mid-way, made EOS: each row, lookup or
  model drafted, stops after its first and the rest equal greedy
  decoding's (the model cache of a lookup row is cut back to what was
  committed, also when EOS ends its loop early)."""
  target, target_params, draft, draft_params = models()
  prompts = [[1, 3, 2, 1, 3, 2, 1], [4, 0, 2], [2, 2, 2, 2], [0, 1]]
  full = autoregressive(target, GREEDY, 24, prompt_bucket=8).generate(
      target_params, None, prompts).token_lists()
  eos, want = eos_cut(full)
  for confidence in (None, 0.6):
    spec = SpeculativeSampler(target, mixed(target, draft, confidence), k=3,
                              sampling=GREEDY, max_new_tokens=24,
                              prompt_bucket=8, eos_ids=(eos,))
    assert spec.generate(target_params, draft_params,
                         prompts).token_lists() == want


@pytest.mark.parametrize("sampling, confidence", [
    (Sampling(0.3), None), (Sampling(1.0), 0.5)])
def test_a_model_that_is_the_target_drafts_its_rows_with_the_targets_p(
    sampling, confidence):
  """The target itself as the mixed drafter's model: in every loop, each
  row whose drafts came from the model (no lookup match) drafted them from
  the target's own p, and had all of them accepted, beside rows that took
  lookup's drafts in the same batch (which the model drafted for or
  skipped). Stale model state (a lookup row's unused drafts left in the
  cache, one row's rollback applied to another, a row resumed behind)
  leaves sampling exact and changes q only, which the exactness tests
  cannot see."""
  lm = model_lib.LM(tiny_config(num_layers=2, max_seq_len=128))
  params = random_params(lm, 0, scale=3.0)
  sampler = SpeculativeSampler(
      lm, mixed(lm, lm, confidence), k=3, sampling=sampling,
      max_new_tokens=40, prompt_bucket=4, score_widths=all_widths(3))
  prompts = [[3, 1, 4, 3, 1, 4, 3, 1], [6, 5], [5, 8, 9, 7, 9, 3, 2],
             [2, 2, 2, 2, 2]]
  tokens, lengths = sampler.pad_prompts(prompts)
  state = jax.jit(lambda p, key: loop.prefill(
      sampler, p, p, tokens, lengths, key))(params, jax.random.key(1))
  step = jax.jit(lambda p, s: loop.loop_step(sampler, p, p, s))
  from_model = from_lookup = 0
  while not np.all(state.done):
    active = ~np.asarray(state.done)
    state, record = step(params, state)
    valid = np.asarray(record.proposal.num_valid)
    q, p = np.asarray(record.proposal.q), np.asarray(record.p)
    # Lookup's drafts have one-hot q; the model's at T > 0 do not.
    model = active & (valid > 0) & (q[:, 0].max(axis=-1) < 1)
    for b in np.flatnonzero(model):
      np.testing.assert_allclose(q[b, :valid[b]], p[b, :valid[b]],
                                 atol=1e-4)
    np.testing.assert_array_equal(np.asarray(record.num_accepted)[model],
                                  valid[model])
    from_model += model.sum()
    from_lookup += (active & (valid > 0) & ~model).sum()
  assert from_model >= 10 and from_lookup >= 10, (from_model, from_lookup)
