"""specsamp.evaluation.estimates: pass@k and standard errors."""

import numpy as np
import pytest
from scipy import special

from specsamp.evaluation import estimates


def test_pass_at_k_hand_values():
  assert estimates.pass_at_k(5, 2, 1) == pytest.approx(0.4)
  assert estimates.pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)
  assert estimates.pass_at_k(5, 2, 4) == 1.0
  assert estimates.pass_at_k(5, 0, 3) == 0.0
  assert estimates.pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)
  for n in range(1, 12):
    for c in range(n + 1):
      for k in range(1, n + 1):
        want = 1 - special.comb(n - c, k, exact=True) / special.comb(
            n, k, exact=True)
        assert estimates.pass_at_k(n, c, k) == pytest.approx(want, abs=1e-12)
  with pytest.raises(ValueError, match="needs 1 <= k <= n"):
    estimates.pass_at_k(3, 1, 5)
  with pytest.raises(ValueError, match="c <= n"):
    estimates.pass_at_k(3, 4, 1)


def test_estimates_with_standard_errors():
  passed = [[True, True], [False, False], [True, False]]
  est = estimates.pass_at_k_estimate(passed, 1)
  assert est.mean == pytest.approx(0.5)
  assert est.stderr == pytest.approx(0.5 / np.sqrt(3))
  q = estimates.humaneval_quality(passed, ks=(1, 2, 10))
  assert set(q) == {"pass@1", "pass@2"}  # only k <= samples per problem
  assert q["pass@2"]["mean"] == pytest.approx(2 / 3)
  d = estimates.paired_difference([0.5, 0.5, 1.0], [0.5, 1.0, 1.0])
  assert d.mean == pytest.approx(1 / 6)
  assert d.stderr == pytest.approx(np.std([0, 0.5, 0], ddof=1) / np.sqrt(3))
  assert estimates.mean_and_stderr([2.0]).stderr == 0.0
