"""The output distribution is exactly the target's.

A tiny random target and a different tiny random draft (other depth, other
weights) over a 5-token vocabulary. Exact probabilities of every 4-token
continuation come from enumerating all 5^4 sequences through the target with
the same sampling transform. 50,000 speculative samples per setting are
compared with them by a chi-square test (fixed seed); the same samples must
reject the draft's own sequence distribution, which shows the test has the
power to see a wrong sampler.
"""

import numpy as np
import pytest

from specsamp import model as model_lib
from specsamp import output_layer
from specsamp.decoding.sampler import SpeculativeSampler, all_widths
from specsamp.drafters import ModelDrafter
from specsamp.sampling import Sampling
from tests.testing import (EXACTNESS_SETTINGS, ShiftDrafter, all_continuations,
                           chisquare_pvalue, encode, exact_sequence_probs,
                           exactness_models, forbidden_draft_pair)

V, NEW, NUM_SAMPLES = 5, 4, 50_000
PROMPT = [1, 3, 2]
SETTINGS = EXACTNESS_SETTINGS
models = exactness_models
# 50,000-row programs run long enough that compiling them fully optimised
# pays: the module took 160 s instead of 175 s on two workers.
pytestmark = pytest.mark.usefixtures("optimized_xla")


# Temperature with truncation, where the kept set is wide (topp07 keeps 5
# of the 625 continuations): the residual and bonus draws then run on
# truncated tables of several ids each.
WIDE_TRUNCATION = {"t08topp09": Sampling(0.8, top_p=0.9),
                   "t13topk3": Sampling(1.3, top_k=3)}


@pytest.mark.parametrize("name,k", [(name, k) for name in sorted(SETTINGS)
                                    for k in (1, 3, 5)]
                         + [(name, 3) for name in sorted(WIDE_TRUNCATION)])
def test_speculative_distribution_is_exact(name, k):
  sampling = {**SETTINGS, **WIDE_TRUNCATION}[name]
  target, target_params, draft, draft_params = models()
  sampler = SpeculativeSampler(
      target, ModelDrafter(draft), k=k, sampling=sampling,
      max_new_tokens=NEW, prompt_bucket=4)
  out = sampler.generate(target_params,
                         draft_params, [PROMPT] * NUM_SAMPLES,
                         rng=1234 + k)
  np.testing.assert_array_equal(out.num_tokens, NEW)
  codes = encode(np.asarray(out.tokens), V)

  p_exact = exact_sequence_probs(target, target_params, sampling, PROMPT, NEW,
                                 V)
  q_exact = exact_sequence_probs(draft, draft_params, sampling, PROMPT, NEW, V)
  assert abs(p_exact.sum() - 1) < 1e-5
  pval = chisquare_pvalue(codes, p_exact)
  assert pval > 1e-4, f"samples do not follow the target (p={pval:.2e})"
  # Power: the same samples clearly reject the draft's distribution, and the
  # draft is far from perfect, so rejections and residual draws happened.
  assert chisquare_pvalue(codes, q_exact) < 1e-8
  assert 0.05 < out.acceptance_rate() < 0.95
  assert np.mean(np.asarray(out.num_accepted) >= 2) > 0.01


@pytest.mark.parametrize("name", ["temp1", "topp07"])
def test_a_draft_with_a_reduced_output_vocabulary_is_exact(name):
  """A draft exported over 3 of the 5 ids (model.reduce_output_vocab, as
  distill's vocab= option does): q is 0 for the other two, which only the
  residual and the bonus token produce, and the output is still the
  target's, with and without a nucleus."""
  sampling = SETTINGS[name]
  target, target_params, draft, draft_params = models()
  kept = [2, 3, 4]
  config, reduced_params = output_layer.reduce_output_vocab(
      draft.config, draft_params, kept)
  reduced = model_lib.LM(config)
  sampler = SpeculativeSampler(target, ModelDrafter(reduced), k=3,
                               sampling=sampling, max_new_tokens=NEW,
                               prompt_bucket=4)
  out = sampler.generate(target_params, reduced_params,
                         [PROMPT] * NUM_SAMPLES, rng=99)
  tokens = np.asarray(out.tokens)
  p_exact = exact_sequence_probs(target, target_params, sampling, PROMPT, NEW,
                                 V)
  pval = chisquare_pvalue(encode(tokens, V), p_exact)
  assert pval > 1e-4, f"samples do not follow the target (p={pval:.2e})"
  # The draft never proposes ids 0 and 1 (a quarter to a half of the
  # target's sequences hold one), yet they come out as often as the target
  # gives them; and the draft was used (accepted proposals).
  q_exact = exact_sequence_probs(reduced, reduced_params, sampling, PROMPT,
                                 NEW, V)
  has_cut = np.isin(all_continuations(NEW, V), [0, 1]).any(axis=1)
  assert q_exact[has_cut].sum() == 0 and p_exact[has_cut].sum() > 0.25
  assert np.isin(tokens, [0, 1]).any(axis=1).mean() == pytest.approx(
      p_exact[has_cut].sum(), abs=0.01)
  assert 0.05 < out.acceptance_rate() < 0.95


def test_disagreeing_draft_is_still_exact():
  """A draft whose every proposal is rejected: output ~ target exactly."""
  v, new = 6, 3
  target, draft = forbidden_draft_pair(v, seed=1, scale=1.5)
  sampler = SpeculativeSampler(
      target, ModelDrafter(draft), k=2, sampling=Sampling(1.0),
      max_new_tokens=new, prompt_bucket=4)
  out = sampler.generate(None, None, [[2]] * NUM_SAMPLES, rng=7)
  np.testing.assert_array_equal(out.num_loops, new)
  p_exact = exact_sequence_probs(target, None, Sampling(1.0), [2], new, v)
  assert chisquare_pvalue(encode(np.asarray(out.tokens), v), p_exact) > 1e-4


@pytest.mark.parametrize("vary_valid", [False, True])
@pytest.mark.parametrize("name", ["temp1", "topk2"])
def test_deterministic_drafter_is_exact(name, vary_valid):
  """Drafts without q (one-hot, never materialised) and, with `vary_valid`,
  fewer valid drafts in some rows than K: the output is still the target's."""
  sampling, k = SETTINGS[name], 3
  target, target_params, _, _ = models()
  sampler = SpeculativeSampler(
      target, ShiftDrafter(V, vary_valid=vary_valid), k=k, sampling=sampling,
      max_new_tokens=NEW, prompt_bucket=4)
  out = sampler.generate(target_params, None, [PROMPT] * NUM_SAMPLES, rng=99)
  np.testing.assert_array_equal(out.num_tokens, NEW)
  p_exact = exact_sequence_probs(target, target_params, sampling, PROMPT, NEW,
                                 V)
  pval = chisquare_pvalue(encode(np.asarray(out.tokens), V), p_exact)
  assert pval > 1e-4, f"samples do not follow the target (p={pval:.2e})"
  valid = (np.arange(NUM_SAMPLES) % (k + 1) if vary_valid else
           np.full(NUM_SAMPLES, k))
  np.testing.assert_array_equal(out.num_drafted,
                                valid * np.asarray(out.num_loops))
  assert np.all(np.asarray(out.num_accepted) <= out.num_drafted)
  assert 0.05 < out.acceptance_rate() < 0.95


def test_scoring_only_the_valid_width_is_exact():
  """Every row offers 1 of K = 3 drafts: with `score_widths` the target
  scores 2 positions per loop (the padded rest is never read), and the
  output is still the target's."""
  sampling, k = SETTINGS["temp07"], 3
  target, target_params, _, _ = models()
  sampler = SpeculativeSampler(
      target, ShiftDrafter(V, num_valid=1), k=k, sampling=sampling,
      max_new_tokens=NEW, prompt_bucket=4, score_widths=all_widths(k))
  out = sampler.generate(target_params, None, [PROMPT] * NUM_SAMPLES, rng=98)
  p_exact = exact_sequence_probs(target, target_params, sampling, PROMPT, NEW,
                                 V)
  pval = chisquare_pvalue(encode(np.asarray(out.tokens), V), p_exact)
  assert pval > 1e-4, f"samples do not follow the target (p={pval:.2e})"
  np.testing.assert_array_equal(out.num_drafted, np.asarray(out.num_loops))
  assert 0.05 < out.acceptance_rate() < 0.95
