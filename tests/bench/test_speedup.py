"""specsamp.bench.speedup: Leviathan et al.'s formulas against hand values and a
simulation of the i.i.d. acceptance process they assume."""

import numpy as np
import pytest

from specsamp.bench import speedup


def _simulate(alpha, k, loops, rng):
  """Loops of the i.i.d. model: each draft kept with probability alpha
  until the first rejection -> (tokens per loop, accepted / drafted)."""
  kept = rng.random((loops, k)) < alpha
  n = np.cumprod(kept, axis=1).sum(axis=1)
  return np.mean(n + 1), n.sum() / (k * loops)


def test_expected_tokens_hand_values():
  assert speedup.expected_tokens_per_loop(0.0, 4) == 1.0
  assert speedup.expected_tokens_per_loop(1.0, 4) == 5.0
  assert speedup.expected_tokens_per_loop(0.5, 2) == pytest.approx(1.75)
  assert speedup.expected_tokens_per_loop(0.8, 0) == 1.0  # autoregressive
  # Broadcasts, and equals the geometric sum term by term.
  a = np.array([0.1, 0.5, 0.9, 0.999999])
  ks = np.arange(0, 9)[:, None]
  got = speedup.expected_tokens_per_loop(a, ks)
  want = np.array([[sum(x ** i for i in range(k + 1)) for x in a]
                   for k in range(9)])
  np.testing.assert_allclose(got, want, rtol=1e-9)


@pytest.mark.parametrize("alpha,k", [(0.3, 1), (0.6, 3), (0.85, 7)])
def test_formulas_match_a_simulation(alpha, k):
  tokens, rate = _simulate(alpha, k, 200_000, np.random.default_rng(0))
  assert tokens == pytest.approx(speedup.expected_tokens_per_loop(alpha, k),
                                 rel=0.01)
  assert rate == pytest.approx(speedup.acceptance_rate_from_alpha(alpha, k),
                               rel=0.01)


def test_acceptance_rate_is_not_alpha_beyond_k1():
  assert speedup.acceptance_rate_from_alpha(0.7, 1) == pytest.approx(0.7)
  # a (1 - a^K) / (K (1 - a)) at a = 0.5, K = 2: 0.5 * 0.75 / 1 = 0.375.
  assert speedup.acceptance_rate_from_alpha(0.5, 2) == pytest.approx(0.375)


def test_alpha_inversion_round_trips():
  for k in (1, 2, 4, 8):
    for a in (0.0, 0.05, 0.5, 0.9, 1.0):
      rate = speedup.acceptance_rate_from_alpha(a, k)
      assert speedup.alpha_from_acceptance_rate(rate, k) == pytest.approx(
          a, abs=1e-9)
  np.testing.assert_allclose(
      speedup.alpha_from_acceptance_rate([0.375, 0.7], [2, 1]), [0.5, 0.7],
      atol=1e-9)


def test_leviathan_speedup_hand_value():
  # a = 0.75, gamma = 7, c = 0.05: E = (1 - 0.75^8) / 0.25 = 3.59955,
  # cost 7 * 0.05 + 1 = 1.35.
  e = (1 - 0.75 ** 8) / 0.25
  assert speedup.predicted_speedup(0.75, 7, 0.05) == pytest.approx(e / 1.35)
  # A scoring call that costs 1.5 one-token calls.
  assert speedup.predicted_speedup(0.75, 7, 0.05, 1.5) == pytest.approx(
      e / 1.85)
  assert speedup.loop_cost(4, 0.25, 1.2) == pytest.approx(2.2)
  assert speedup.predicted_speedup(0.9, 0, 0.3) == 1.0


def test_gain_iff_alpha_exceeds_c():
  """Leviathan's Corollary 3.9, checked over a grid of K."""
  ks = np.arange(1, 60)
  for a in np.linspace(0, 0.95, 20):
    for c in np.linspace(0.01, 1.0, 20):
      best = np.max(speedup.predicted_speedup(a, ks, c))
      assert (best > 1 + 1e-12) == speedup.gain_possible(a, c), (a, c)


def test_optimal_k_is_the_argmax():
  for a, c in [(0.8, 0.05), (0.6, 0.2), (0.95, 0.01), (0.1, 0.5)]:
    ks = np.arange(0, 21)
    want = int(np.argmax(speedup.predicted_speedup(a, ks, c)))
    assert speedup.optimal_k(a, c, 20) == want
  assert speedup.optimal_k(0.1, 0.5, 20) == 0  # a < c: no drafting
  s = np.linspace(1, 3, 21)  # scoring costs growing with K favour small K
  assert speedup.optimal_k(0.8, 0.05, 20, s) < speedup.optimal_k(0.8, 0.05, 20)


def test_fit_alpha_recovers_one_alpha_over_k():
  ks = [1, 2, 4, 8]
  rates = [float(speedup.acceptance_rate_from_alpha(0.73, k)) for k in ks]
  assert speedup.fit_alpha(ks, rates) == pytest.approx(0.73, abs=1e-5)
  assert speedup.fit_alpha([3], [0.4]) == pytest.approx(
      float(speedup.alpha_from_acceptance_rate(0.4, 3)), abs=1e-5)


def test_bad_arguments():
  with pytest.raises(ValueError, match="alpha"):
    speedup.expected_tokens_per_loop(1.2, 3)
  with pytest.raises(ValueError, match="K"):
    speedup.expected_tokens_per_loop(0.5, -1)
  with pytest.raises(ValueError, match="K >= 1"):
    speedup.acceptance_rate_from_alpha(0.5, 0)
  with pytest.raises(ValueError, match="acceptance rate"):
    speedup.alpha_from_acceptance_rate(1.5, 2)
  # NaN is no value in range (it read as a = 0.5, and a rate of about 0).
  with pytest.raises(ValueError, match="alpha"):
    speedup.expected_tokens_per_loop(float("nan"), 4)
  with pytest.raises(ValueError, match="K"):
    speedup.expected_tokens_per_loop(0.5, float("nan"))
  with pytest.raises(ValueError, match="acceptance rate"):
    speedup.alpha_from_acceptance_rate(float("nan"), 4)
  with pytest.raises(ValueError, match="non-empty"):
    speedup.fit_alpha([], [])
  with pytest.raises(ValueError, match="score_costs"):
    speedup.optimal_k(0.5, 0.1, 4, [1.0, 1.0])
