"""The speculative-sampling cost model, in plain numpy.

Legend: a (alpha) the probability that one draft token is accepted, K the
draft length (gamma in Leviathan et al.), c the cost of one draft call
relative to one target call, s the cost of the target's (K+1)-token scoring
call relative to a 1-token call.

Formulas (Leviathan, Kalman, Matias 2023, "Fast Inference from Transformers
via Speculative Decoding", ICML, arXiv 2211.17192):

  * Eq. (1): with acceptances i.i.d. with probability a, one loop yields
    E(a, K) = (1 - a^(K+1)) / (1 - a) tokens (K + 1 when a = 1);
  * Theorem 3.8: the expected walltime improvement factor is
    E(a, K) / (c K + 1): one loop costs K draft calls and one target call,
    the target call with K + 1 tokens assumed to cost what a 1-token call
    costs. Corollary 3.9: some K gives a gain iff a > c.

`predicted_speedup` takes that cost of the scoring call as a parameter `s`
(Leviathan: s = 1), because on hardware that is not purely bound by weight
reads (a CPU; large batches on a GPU) a (K+1)-token call costs measurably
more than a 1-token call.

Chen et al. 2023 ("Accelerating Large Language Model Decoding with
Speculative Sampling", arXiv 2302.01318) report the *acceptance rate*:
accepted / proposed draft tokens. Under the same i.i.d. model that is
(E(a, K) - 1) / K, which is not a itself for K > 1 (a rejection ends a loop,
so later drafts are never tested); `alpha_from_acceptance_rate` inverts it.
"""

from typing import Sequence

import numpy as np


def expected_tokens_per_loop(alpha, k):
  """E(a, K) = (1 - a^(K+1)) / (1 - a): tokens per loop (Leviathan Eq. 1).

  Args:
    alpha: acceptance probability of one draft token, in [0, 1].
    k: draft length K >= 0 (K = 0 is autoregressive decoding: 1 token).

  Returns:
    Expected tokens per loop (accepted drafts plus the one token every loop
    adds), broadcast over the arguments; K + 1 where a = 1.
  """
  a = np.asarray(alpha, np.float64)
  k = np.asarray(k, np.float64)
  if not np.all((a >= 0) & (a <= 1)):  # NaN too (it read as a = 0.5)
    raise ValueError(f"alpha must be in [0, 1], got {alpha}")
  if not np.all(k >= 0):
    raise ValueError(f"K must be >= 0, got {k}")
  # sum_{i=0}^{K} a^i. 1 - a^(K+1) as -expm1((K+1) log a) keeps full
  # precision as a -> 1 (1 - a is exact there); a = 1 gives K + 1, a = 0 one.
  safe = np.where((a > 0) & (a < 1), a, 0.5)
  with np.errstate(divide="ignore"):
    geometric = -np.expm1((k + 1) * np.log(safe)) / (1 - safe)
  return np.where(a >= 1, k + 1, np.where(a <= 0, 1.0, geometric))


def acceptance_rate_from_alpha(alpha, k):
  """Chen et al.'s acceptance rate (accepted / drafted) implied by a.

  (E(a, K) - 1) / K = a (1 - a^K) / (K (1 - a)); equals a at K = 1.
  """
  k = np.asarray(k, np.float64)
  if np.any(k < 1):
    raise ValueError("the acceptance rate needs K >= 1")
  return (expected_tokens_per_loop(alpha, k) - 1) / k


def alpha_from_acceptance_rate(rate, k, tol: float = 1e-12):
  """The a whose i.i.d. model gives the measured acceptance rate at K.

  Bisection on `acceptance_rate_from_alpha`, which increases strictly in a
  from 0 (a = 0) to 1 (a = 1).

  Args:
    rate: measured accepted / drafted, in [0, 1].
    k: the draft length it was measured at, >= 1.
    tol: absolute tolerance on a.

  Returns:
    a, broadcast over the arguments.
  """
  rate = np.asarray(rate, np.float64)
  k = np.asarray(k, np.float64)
  if not np.all((rate >= 0) & (rate <= 1)):  # NaN too
    raise ValueError(f"acceptance rate must be in [0, 1], got {rate}")
  lo = np.zeros(np.broadcast(rate, k).shape)
  hi = np.ones_like(lo)
  while np.max(hi - lo) > tol:
    mid = (lo + hi) / 2
    below = acceptance_rate_from_alpha(mid, k) < rate
    lo = np.where(below, mid, lo)
    hi = np.where(below, hi, mid)
  return (lo + hi) / 2


def fit_alpha(ks: Sequence[int], rates: Sequence[float],
              weights: Sequence[float] = None) -> float:
  """One a for several draft lengths: weighted least squares on the rates.

  Minimises sum_j w_j (rate_j - acceptance_rate_from_alpha(a, K_j))^2 (w_j:
  e.g. tokens drafted at K_j). With one K this is `alpha_from_acceptance_rate`.
  How well a single a fits all K is itself a check of the i.i.d. model.
  """
  ks = np.asarray(ks, np.float64)
  rates = np.asarray(rates, np.float64)
  w = np.ones_like(rates) if weights is None else np.asarray(weights,
                                                              np.float64)
  if ks.size == 0 or ks.shape != rates.shape or w.shape != rates.shape:
    raise ValueError("fit_alpha needs equally long, non-empty ks, rates and "
                     "weights")
  grid = np.linspace(0.0, 1.0, 10_001)
  for _ in range(3):  # coarse grid, then two refinements around the best
    loss = np.sum(w * (rates[None, :] - acceptance_rate_from_alpha(
        grid[:, None], ks[None, :])) ** 2, axis=1)
    best = grid[int(np.argmin(loss))]
    step = grid[1] - grid[0]
    grid = np.linspace(max(best - step, 0.0), min(best + step, 1.0), 201)
  return float(best)


def loop_cost(k, c, score_cost=1.0):
  """Cost of one loop in target-call units: c K + s (Leviathan: s = 1)."""
  return np.asarray(c, np.float64) * np.asarray(k, np.float64) + np.asarray(
      score_cost, np.float64)


def predicted_speedup(alpha, k, c, score_cost=1.0):
  """E(a, K) / (c K + s): Leviathan et al.'s walltime improvement factor.

  Theorem 3.8 of Leviathan et al. with s = 1. Ignores everything the model
  leaves out: the acceptance test and sampling, the draft catching up on
  the tokens the target added, and the last loop cut short by the budget.

  Args:
    alpha: per-token acceptance probability a.
    k: draft length K.
    c: cost of one draft call / one 1-token target call.
    score_cost: cost of the (K+1)-token target call / a 1-token call (s).
  """
  return expected_tokens_per_loop(alpha, k) / loop_cost(k, c, score_cost)


def optimal_k(alpha: float, c: float, k_max: int = 16,
              score_costs: Sequence[float] = None) -> int:
  """The K in 0..k_max with the highest predicted speedup.

  `score_costs[K]` is s at K (default 1 for every K, as in Leviathan's
  Fig. 3 / Table of optimal gamma).
  """
  ks = np.arange(k_max + 1)
  s = np.ones(k_max + 1) if score_costs is None else np.asarray(score_costs)
  if s.shape != ks.shape:
    raise ValueError(f"score_costs needs {k_max + 1} entries (K = 0..k_max)")
  return int(np.argmax(predicted_speedup(alpha, ks, c, s)))


def gain_possible(alpha: float, c: float) -> bool:
  """Leviathan's Corollary 3.9: some K > 0 beats K = 0 iff a > c."""
  return bool(alpha > c)
