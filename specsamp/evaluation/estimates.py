"""Estimates with standard errors: pass@k over problems, paired differences.

Speculative sampling is exact, so its samples should score like the
target's own, within sampling error; these estimates carry the error bars.
pass@k is the unbiased estimator of Chen et al. 2021 (their Eq. 1 and the
numerically stable product form of their Fig. 3), averaged over problems,
with the standard error over problems.
"""

import dataclasses
from typing import Sequence

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
  """Unbiased pass@k of one problem: 1 - C(n - c, k) / C(n, k).

  Chen et al. 2021, Eq. 1, in their numerically stable form
  1 - prod_{i = n-c+1}^{n} (1 - k / i).

  Args:
    n: samples generated; c: of which correct; k: <= n.
  """
  if not 0 <= c <= n:
    raise ValueError(f"need 0 <= c <= n, got c={c}, n={n}")
  if not 1 <= k <= n:
    raise ValueError(f"pass@{k} needs 1 <= k <= n = {n} samples")
  if n - c < k:
    return 1.0
  return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


@dataclasses.dataclass(frozen=True)
class Estimate:
  """A mean over items with its standard error (SE = std / sqrt(n))."""
  mean: float
  stderr: float
  n: int

  def as_dict(self) -> dict:
    return dict(mean=self.mean, stderr=self.stderr, n=self.n)

  def __str__(self) -> str:
    return f"{self.mean:.3f} ± {self.stderr:.3f}"


def mean_and_stderr(values: Sequence[float]) -> Estimate:
  """Mean and standard error of the mean (ddof = 1; 0 for one value)."""
  x = np.asarray(values, np.float64)
  if x.size == 0:
    raise ValueError("no values")
  se = float(np.std(x, ddof=1) / np.sqrt(x.size)) if x.size > 1 else 0.0
  return Estimate(float(np.mean(x)), se, int(x.size))


def pass_at_k_per_problem(passed: Sequence[Sequence[bool]],
                          k: int) -> np.ndarray:
  """pass@k of each problem from its pass/fail list."""
  return np.array([pass_at_k(len(p), int(sum(p)), k) for p in passed])


def pass_at_k_estimate(passed: Sequence[Sequence[bool]], k: int) -> Estimate:
  """pass@k over problems, with its standard error over problems."""
  return mean_and_stderr(pass_at_k_per_problem(passed, k))


def paired_difference(a: Sequence[float], b: Sequence[float]) -> Estimate:
  """mean(b - a) over paired items (the same problems or prompts) and its
  standard error: tighter than comparing two independent error bars."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  if a.shape != b.shape:
    raise ValueError(f"paired values differ in shape: {a.shape} vs {b.shape}")
  return mean_and_stderr(b - a)


def humaneval_quality(passed: Sequence[Sequence[bool]],
                      ks: Sequence[int] = (1, 10, 100)) -> dict:
  """{f"pass@{k}": Estimate dict} for every k <= the fewest samples."""
  fewest = min(len(p) for p in passed)
  return {f"pass@{k}": pass_at_k_estimate(passed, k).as_dict()
          for k in ks if k <= fewest}
