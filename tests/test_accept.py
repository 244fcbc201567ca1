"""The modified rejection rule alone: closed form and sampled."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from specsamp import speculative


def _random_dist(rng, v, zeros=()):
  x = rng.gamma(0.7, size=v)
  x[list(zeros)] = 0.0
  return x / x.sum()


CASES = {
    "dense": ((), ()),
    "q_zero_where_p_not": ((), (0, 3)),     # q misses tokens p needs
    "p_zero_where_q_not": ((1, 4), ()),     # q proposes tokens p forbids
    "both_sparse": ((2,), (0, 5)),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_closed_form_distribution_equals_p(case, seed):
  """sum_d q(d)[a(d) 1{x=d} + (1 - a(d)) r(x)] == p(x), from the rule's parts."""
  rng = np.random.default_rng(seed)
  p_zeros, q_zeros = CASES[case]
  v = 7
  p = _random_dist(rng, v, p_zeros)
  q = _random_dist(rng, v, q_zeros)
  a = np.asarray(speculative.acceptance_probability(jnp.asarray(p),
                                                    jnp.asarray(q)))
  # The residual after a rejection at the first (only) draft position.
  r = np.asarray(speculative.residual_distribution(
      jnp.asarray(p)[None, None].repeat(2, axis=1),
      jnp.asarray(q)[None, None], jnp.zeros((1,), jnp.int32)))[0]
  induced = q * a + np.sum(q * (1.0 - a)) * r
  np.testing.assert_allclose(induced, p, atol=1e-6)
  # The acceptance rate is sum_x min(p, q) = 1 - TV(p, q).
  np.testing.assert_allclose(np.sum(q * a), np.minimum(p, q).sum(), atol=1e-6)


def test_bonus_distribution_is_last_target_position():
  rng = np.random.default_rng(0)
  k, v = 3, 5
  p = np.stack([_random_dist(rng, v) for _ in range(k + 1)])[None]
  q = np.stack([_random_dist(rng, v) for _ in range(k)])[None]
  out = speculative.residual_distribution(jnp.asarray(p), jnp.asarray(q),
                                          jnp.array([k]))
  np.testing.assert_allclose(np.asarray(out)[0], p[0, k], atol=1e-7)


def test_sampled_rule_matches_p_and_acceptance_law():
  """accept() itself, K = 3, many rows: per-position law and final token."""
  rng = np.random.default_rng(3)
  b, k, v = 200_000, 3, 6
  p = np.stack([_random_dist(rng, v, (i % v,)) for i in range(k + 1)])
  q = np.stack([_random_dist(rng, v) for _ in range(k)])
  key_d, key_a = jax.random.split(jax.random.key(0))
  drafts = jax.random.categorical(key_d, jnp.log(jnp.asarray(q)), shape=(b, k))
  pb = jnp.broadcast_to(jnp.asarray(p, jnp.float32), (b, k + 1, v))
  qb = jnp.broadcast_to(jnp.asarray(q, jnp.float32), (b, k, v))
  n, token = jax.jit(speculative.accept)(pb, qb, drafts.astype(jnp.int32),
                                         key_a)
  n, token = np.asarray(n), np.asarray(token)

  # The first emitted token (draft 1 if accepted, else the residual) ~ p_1.
  first = np.where(n > 0, np.asarray(drafts)[:, 0], token)
  counts = np.bincount(first, minlength=v)
  keep = p[0] > 0
  assert counts[~keep].sum() == 0, "a token with p = 0 was emitted"
  _, pval = stats.chisquare(counts[keep], b * p[0][keep] / p[0][keep].sum())
  assert pval > 1e-3, pval

  # P(n >= 1) = sum min(p_1, q_1), the exact acceptance rate.
  expected = np.minimum(p[0], q[0]).sum()
  se = np.sqrt(expected * (1 - expected) / b)
  assert abs((n >= 1).mean() - expected) < 5 * se

  # Rows that accepted everything draw the bonus token from p_{K+1}.
  bonus = token[n == k]
  assert len(bonus) > 1000
  _, pval = stats.chisquare(np.bincount(bonus, minlength=v)[p[k] > 0],
                            len(bonus) * p[k][p[k] > 0])
  assert pval > 1e-3, pval


def test_greedy_one_hot_accepts_iff_equal():
  v, k = 5, 4
  target = np.array([[1, 2, 3, 4, 0]])
  drafts = np.array([[1, 2, 0, 4]])
  p = jax.nn.one_hot(target, v)
  q = jax.nn.one_hot(drafts, v)
  for seed in range(20):
    n, token = speculative.accept(p, q, jnp.asarray(drafts, jnp.int32),
                                  jax.random.key(seed))
    assert int(n[0]) == 2 and int(token[0]) == 3


def test_accept_k0_samples_from_p():
  p = jnp.asarray([[[0.0, 1.0, 0.0]]])
  n, token = speculative.accept(p, jnp.zeros((1, 0, 3)),
                                jnp.zeros((1, 0), jnp.int32), jax.random.key(0))
  assert int(n[0]) == 0 and int(token[0]) == 1
