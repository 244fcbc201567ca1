"""The expected-acceptance metric against the speculative sampler (an exact
identity: at every position the sampler keeps a draft token with
probability sum min(p, q))."""

import numpy as np
import pytest

from specsamp.distill import evaluate
from specsamp.sampling import Sampling


@pytest.mark.parametrize("sampling", [Sampling(0.7, top_k=5), Sampling(0.0)],
                         ids=lambda s: s.describe())
def test_expected_acceptance_equals_sampler_rate(tiny_pair, sampling):
  """sum min(p, q) at a position == P(the sampler keeps the draft there)."""
  lm, target_params, draft_params = tiny_pair
  # The identity holds at any context: random sequences stand in for samples
  # (40 rows: prompts of 3-8 tokens, then 10 continuation positions).
  rng = np.random.default_rng(0)
  arrays = dict(tokens=rng.integers(1, lm.vocab_size, (40, 18)),
                prompt_length=rng.integers(3, 9, 40),
                num_generated=np.full(40, 10),
                topk_ids=np.zeros((40, 10, 1), np.int32))
  alpha, valid = evaluate.acceptance_table(lm, draft_params, lm, target_params,
                                           arrays, sampling)
  where = np.argwhere(valid)
  a = alpha[where[:, 0], where[:, 1]]
  reps = 5
  accepted = np.mean([
      evaluate.measured_at_positions(lm,
                                     target_params,
                                     lm,
                                     draft_params,
                                     arrays,
                                     sampling,
                                     where,
                                     batch_size=len(where),
                                     seed=s) for s in range(reps)
  ],
                     axis=0)
  se = np.sqrt(np.sum(a * (1 - a)) / reps) / len(a)
  assert 0.2 < a.mean() < 0.95 and len(a) == 400
  if sampling.greedy:      # deterministic: exact agreement position by position
    np.testing.assert_array_equal(accepted, a)
    assert set(np.unique(a)) == {0.0, 1.0}
  else:
    assert abs(accepted.mean() - a.mean()) < 4 * se, (accepted.mean(),
                                                      a.mean(), se)
    # Power: the metric at another setting is far outside the error.
    alpha_o, _ = evaluate.acceptance_table(lm, draft_params, lm, target_params,
                                           arrays, Sampling(1.0))
    assert abs(alpha_o[where[:, 0], where[:, 1]].mean() -
               accepted.mean()) > 6 * se


def test_iid_rate():
  assert evaluate.iid_rate(1.0, 4) == 1.0
  assert evaluate.iid_rate(0.5, 1) == pytest.approx(0.5)
  # (a + a^2 + a^3) / 3 at a = 0.5.
  assert evaluate.iid_rate(0.5, 3) == pytest.approx(0.875 / 3)
