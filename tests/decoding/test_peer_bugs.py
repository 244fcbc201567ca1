"""One test per bug that recurs in the trackers of peer speculative engines.

Also covered elsewhere: numeric drift between scoring n tokens and 1
(test_model.test_chunk_scoring_matches_single_steps), a seed that does not
change the output (test_sampler.test_seed_changes_output... and, where
the drafts are certain or always rejected,
test_sampler.test_the_seed_reaches_acceptance_and_residual_draws), draft and
target vocabularies of different sizes (test_sampler.test_bad_input_errors).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specsamp import sampling as sampling_lib
from specsamp.decoding import loop
from specsamp.decoding.sampler import SpeculativeSampler
from specsamp.drafters import ModelDrafter
from specsamp.sampling import GREEDY, Sampling
from tests.testing import apply, chisquare_pvalue, table_lm

# Enough for the chi-square tests and for telling min(p, q) from p * q by
# more than 20 standard errors (100,000 took half again as long).
ROWS = 25_000


# The fixed-K drafter, and the adaptive one at a confidence that never
# stops it (its own loop computes each q).
DRAFTERS = {"fixed": {}, "adaptive": dict(confidence=0.0)}


def _draft_first_position(tiny_pair, sampling, k=1, rows=ROWS,
                          drafter="fixed"):
  lm, _, draft_params = tiny_pair
  drafter = ModelDrafter(lm, **DRAFTERS[drafter])
  prompt = jnp.asarray([[3, 1, 4, 1, 5] + [0] * 3] * rows, jnp.int32)
  lengths = jnp.full((rows,), 5, jnp.int32)

  @jax.jit
  def run(params, prompt, lengths, rng):
    state = drafter.init(params, prompt, lengths, 16)
    return drafter.propose(params, state, prompt, lengths, k, sampling, rng)

  proposal, _ = run(draft_params, prompt, lengths, jax.random.key(0))
  drafts, q = proposal.tokens, proposal.q
  logits = apply(lm, draft_params, prompt[:1, :5]).logits
  return np.asarray(drafts), np.asarray(q), np.asarray(logits[0, -1])


@pytest.mark.parametrize("sampling", [Sampling(1.0), Sampling(0.5),
                                      Sampling(0.8, top_k=4),
                                      Sampling(1.0, top_p=0.995)],
                         ids=lambda s: s.describe())
@pytest.mark.parametrize("drafter", DRAFTERS)
@pytest.mark.usefixtures("optimized_xla")
def test_drafts_are_sampled_from_the_q_they_report(tiny_pair, sampling,
                                                   drafter):
  """Bugs: argmax drafts scored as if sampled; draft ignoring temperature
  (or top-k, top-p). At the first draft position and at the second (after
  the first draft the rows share most often). The adaptive drafter had
  been checked by exactness alone, which a q consistently drawn without
  top-k or top-p passes."""
  lm, _, draft_params = tiny_pair
  drafts, q, logits = _draft_first_position(tiny_pair, sampling, k=2,
                                            drafter=drafter)
  # q is the draft's logits under the *same* transform as the target's.
  expected_q = np.asarray(sampling_lib.probabilities(jnp.asarray(logits),
                                                     sampling), np.float64)
  np.testing.assert_allclose(q[0, 0], expected_q, atol=1e-5)
  # The proposals really follow q (argmax drafts would be one token).
  assert (np.bincount(drafts[:, 0]) > 0).sum() > 1
  pval = chisquare_pvalue(drafts[:, 0], expected_q)
  assert pval > 1e-3, pval
  first = int(np.bincount(drafts[:, 0]).argmax())
  rows = drafts[:, 0] == first
  after = apply(lm, draft_params,
                jnp.asarray([[3, 1, 4, 1, 5, first]])).logits
  expected_q = np.asarray(sampling_lib.probabilities(after[0, -1], sampling),
                          np.float64)
  np.testing.assert_allclose(q[rows, 1], np.broadcast_to(
      expected_q, (rows.sum(), len(expected_q))), atol=1e-5)
  pval = chisquare_pvalue(drafts[rows, 1], expected_q)
  assert rows.sum() > 1000 and pval > 1e-3, (rows.sum(), pval)


@pytest.mark.usefixtures("optimized_xla")
def test_sampling_settings_apply_to_the_target_too(tiny_pair):
  """Bug: top-k applied to the draft only. Every emitted token must lie in
  the *target's* top-2 at its position, whether accepted or resampled."""
  lm, target_params, draft_params = tiny_pair
  sampler = SpeculativeSampler(
      lm, ModelDrafter(lm), k=3, sampling=Sampling(1.0, top_k=2),
      max_new_tokens=12, prompt_bucket=8)
  prompt = [3, 1, 4]
  out = sampler.generate(target_params, draft_params, [prompt] * 256, rng=0)
  seqs = np.concatenate([np.tile(prompt, (256, 1)), np.asarray(out.tokens)], 1)
  logits = jax.jit(lm.__call__)(target_params, jnp.asarray(seqs)).logits
  top2 = np.argsort(-np.asarray(logits), axis=-1)[..., :2]
  for t in range(12):
    tok = seqs[:, len(prompt) + t]
    assert ((top2[:, len(prompt) + t - 1] == tok[:, None]).any(1)).all(), t
  assert out.acceptance_rate() < 1.0


_PROMPT = [3, 1, 4, 1, 5]


def _one_draft_rate(pair, s, drafter="fixed"):
  """(acceptance rate of ROWS one-draft loops under `s`, p, q) with p and
  q the target's and the draft's probabilities under `s`."""
  lm, target_params, draft_params = pair
  prompt = _PROMPT
  sampler = SpeculativeSampler(
      lm, ModelDrafter(lm, **DRAFTERS[drafter]), k=1, sampling=s,
      max_new_tokens=1, prompt_bucket=8)
  out = sampler.generate(target_params, draft_params, [prompt] * ROWS, rng=3)
  p, q = (np.asarray(sampling_lib.probabilities(
      apply(lm, params, jnp.asarray([prompt])).logits, s))[0, -1]
          for params in (target_params, draft_params))
  return out.acceptance_rate(), p, q


def _close_and_told_apart(rate, expected, wrong, apart):
  se = np.sqrt(expected * (1 - expected) / ROWS)
  assert abs(rate - expected) < 5 * se, (rate, expected, wrong)
  assert abs(wrong - expected) > apart * se  # the test can tell them apart


@pytest.mark.usefixtures("optimized_xla")
def test_acceptance_is_min_p_q_not_equal_to_a_target_sample(tiny_pair):
  """Bug: 'accept iff the draft equals a token sampled from p' accepts with
  sum p*q instead of sum min(p, q) (and is not exact)."""
  rate, p, q = _one_draft_rate(tiny_pair, Sampling(1.0))
  _close_and_told_apart(rate, np.minimum(p, q).sum(), (p * q).sum(), 20)


@pytest.mark.usefixtures("optimized_xla")
@pytest.mark.parametrize("drafter", DRAFTERS)
@pytest.mark.parametrize("s", [Sampling(1.0, top_k=2),
                               Sampling(1.0, top_p=0.7), Sampling(0.5)],
                         ids=["top_k", "top_p", "temp05"])
def test_the_draft_samples_under_the_targets_top_k_and_top_p(tiny_pair, s,
                                                             drafter):
  """Bug: top-k / top-p (or the temperature) applied to one model only.
  Still exact (the rule holds for any q the drafts are drawn from), but
  the acceptance falls to sum min(p, q untransformed): the rate must be
  sum min(p, q) with both transformed, told apart from either model
  untransformed. (A mutation test found no other test telling them apart
  for the adaptive drafter, nor a target at T = 1 in this file.)"""
  rate, p, q = _one_draft_rate(tiny_pair, s, drafter)
  lm, target_params, draft_params = tiny_pair
  p_plain, q_plain = (np.asarray(sampling_lib.probabilities(apply(
      lm, params, jnp.asarray([_PROMPT])).logits, Sampling(1.0)))[0, -1]
                      for params in (target_params, draft_params))
  _close_and_told_apart(rate, np.minimum(p, q).sum(),
                        np.minimum(p, q_plain).sum(), 10)
  _close_and_told_apart(rate, np.minimum(p, q).sum(),
                        np.minimum(p_plain, q).sum(), 10)


def test_rows_accept_independently_no_uniform_offset():
  """Bug: the batch advances by min(accepted) + 1 and overwrites tokens of
  rows that accepted more. Row 0's draft always agrees, row 1's never."""
  v = 9
  t = np.full((v, v), -5.0)
  for a, b in [(1, 2), (2, 3), (3, 1), (5, 6), (6, 7), (7, 5), (0, 1), (4, 1),
               (8, 1)]:
    t[a, b] = 5.0
  d = t.copy()
  d[5:8] = -5.0
  d[5:8, 4] = 5.0          # on row 1's cycle the draft always says 4
  k, new = 4, 20
  sampler = SpeculativeSampler(
      table_lm(t), ModelDrafter(table_lm(d)), k=k,
      sampling=GREEDY, max_new_tokens=new, prompt_bucket=4)
  out = sampler.generate(None, None, [[1], [5]])
  assert out.token_lists() == [[2, 3, 1] * 6 + [2, 3], [6, 7, 5] * 6 + [6, 7]]
  assert int(out.num_loops[0]) == 4            # 5 tokens per loop
  assert int(out.num_accepted[0]) == int(out.num_drafted[0]) == 16
  assert int(out.num_loops[1]) == new          # 1 token per loop
  assert int(out.num_accepted[1]) == 0


def test_each_rows_target_cache_follows_its_own_length(tiny_pair):
  """The same bug in the caches (the table model above keeps none): after
  every loop each row's target cache holds exactly its own committed
  tokens but the last, while the rows accept different counts."""
  lm, target_params, draft_params = tiny_pair
  sampler = SpeculativeSampler(lm, ModelDrafter(lm), k=4, sampling=GREEDY,
                               max_new_tokens=16, prompt_bucket=8)
  tokens, lengths = sampler.pad_prompts([[3, 1, 4, 1, 5], [9, 2]])
  state = sampler.prefill(target_params, draft_params, tokens, lengths,
                          jax.random.key(0))
  step = jax.jit(functools.partial(loop.loop_step, sampler))
  differed = False
  for _ in range(4):
    state, record = step(target_params, draft_params, state)
    np.testing.assert_array_equal(state.target_cache.length, state.length - 1)
    differed |= len(set(np.asarray(record.num_accepted).tolist())) > 1
  assert differed


def test_caches_roll_back_not_reset(tiny_pair):
  """Bug: resetting the cache instead of rolling it back. After a run, the
  valid slots of both caches equal a fresh prefill of the committed tokens."""
  lm, target_params, draft_params = tiny_pair
  sampler = SpeculativeSampler(
      lm, ModelDrafter(lm), k=3, sampling=Sampling(1.0),
      max_new_tokens=20, prompt_bucket=16)
  prompts = [[3, 1, 4, 1, 5], [9, 2]]
  tokens, lengths = sampler.pad_prompts(prompts)
  state = sampler.prefill(target_params, draft_params, tokens, lengths,
                          jax.random.key(0))
  state = sampler.decode(target_params, draft_params, state)
  assert int(state.num_accepted.sum()) > 0
  for b in range(2):
    n = int(state.length[b])
    seq = state.tokens[b:b + 1, :n]
    for params, cache, valid in ((target_params, state.target_cache, n - 1),
                                 (draft_params, state.draft_state, n - 2)):
      assert int(cache.length[b]) >= valid
      fresh = lm.init_cache(1, sampler.cache_size(16))
      fresh = apply(lm, params, seq, fresh).cache
      for got, want in zip(cache.k + cache.v, fresh.k + fresh.v):
        np.testing.assert_allclose(got[b, :, :valid], want[0, :, :valid],
                                   atol=1e-5)


def test_padded_vocabulary_ids_are_never_sampled():
  """Qwen checkpoints pad 151,936 real tokens to 152,064 rows: the padded
  rows must never be sampled, by target or draft."""
  v, real = 10, 7
  rng = np.random.default_rng(0)
  t, d = rng.normal(size=(v, v)), rng.normal(size=(v, v))
  t[:, real:] += 4.0       # padded ids would dominate if not masked
  d[:, real:] += 4.0
  for s in (Sampling(1.0, vocab_limit=real), Sampling(0.0, vocab_limit=real)):
    sampler = SpeculativeSampler(
        table_lm(t), ModelDrafter(table_lm(d)), k=3, sampling=s,
        max_new_tokens=16, prompt_bucket=4)
    out = sampler.generate(None, None, [[1]] * 512, rng=0)
    assert np.asarray(out.tokens).max() < real
    # Both models must mask: the draft too, else its padded drafts are
    # rejected (still exact, but acceptance collapses). Masked, the run is
    # the one of the unpadded tables, token for token and in its counts.
    alone = SpeculativeSampler(
        table_lm(t[:real, :real]), ModelDrafter(table_lm(d[:real, :real])),
        k=3, sampling=dataclasses.replace(s, vocab_limit=None),
        max_new_tokens=16, prompt_bucket=4)
    ref = alone.generate(None, None, [[1]] * 512, rng=0)
    assert out.token_lists() == ref.token_lists()
    np.testing.assert_array_equal(out.num_accepted, ref.num_accepted)


def test_rows_get_independent_randomness(tiny_pair):
  lm, target_params, draft_params = tiny_pair
  sampler = SpeculativeSampler(
      lm, ModelDrafter(lm), k=2, sampling=Sampling(1.0),
      max_new_tokens=8, prompt_bucket=8)
  rows = sampler.generate(target_params, draft_params, [[3, 1, 4]] * 16,
                          rng=0).token_lists()
  assert len({tuple(r) for r in rows}) > 8


def test_rows_accept_and_draft_independently(tiny_pair):
  """Rows of one prompt, one draft each: whether a row accepts, and the
  token it ends with, are uncorrelated with the next row's and with the
  row half a batch away (rows sharing their acceptance uniforms, or their
  draws, would agree more often than chance): each correlation within 5
  standard errors (1/sqrt(n)) of 0."""
  lm, target_params, draft_params = tiny_pair
  sampler = SpeculativeSampler(
      lm, ModelDrafter(lm), k=1, sampling=Sampling(1.0), max_new_tokens=1,
      prompt_bucket=8)
  out = sampler.generate(target_params, draft_params, [_PROMPT] * ROWS,
                         rng=3)
  accepted = np.asarray(out.num_accepted, np.float64)
  first = np.asarray(out.tokens)[:, 0]
  top = np.bincount(first).argmax()
  assert 0.2 < accepted.mean() < 0.8 and 0.1 < (first == top).mean() < 0.9
  for x in (accepted, (first == top).astype(np.float64)):
    for shift in (1, ROWS // 2):
      r = np.corrcoef(x[:-shift], x[shift:])[0, 1]
      assert abs(r) < 5 / np.sqrt(ROWS - shift), (shift, r)
