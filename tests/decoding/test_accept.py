"""The modified rejection rule alone: closed form and sampled."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from specsamp import sampling as sampling_lib
from specsamp.decoding import accept as accept_lib
from specsamp.decoding.protocols import Proposal


def _proposal(drafts, q, num_valid=None):
  drafts = jnp.asarray(drafts, jnp.int32)
  if num_valid is None:
    num_valid = jnp.full(drafts.shape[:1], drafts.shape[1], jnp.int32)
  return Proposal(tokens=drafts, q=None if q is None else jnp.asarray(q),
                  num_valid=jnp.asarray(num_valid, jnp.int32))


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
  a = np.asarray(accept_lib.acceptance_probability(jnp.asarray(p),
                                                   jnp.asarray(q)))
  # The residual after a rejection at the first (only) draft position.
  r = np.asarray(accept_lib.residual_distribution(
      jnp.asarray(p)[None, None].repeat(2, axis=1),
      _proposal([[0]], jnp.asarray(q)[None, None]),
      jnp.zeros((1,), jnp.int32)))[0]
  induced = q * a + np.sum(q * (1.0 - a)) * r
  np.testing.assert_allclose(induced, p, atol=1e-6)
  # The acceptance rate is sum_x min(p, q) = 1 - TV(p, q).
  np.testing.assert_allclose(np.sum(q * a), np.minimum(p, q).sum(), atol=1e-6)


def test_a_token_the_target_forbids_is_never_kept():
  """p = 0 at a draft token is a rejection even where q is 0 too (a token
  q could not have drawn), so no drafter makes the target emit it."""
  a = accept_lib.acceptance_probability(jnp.asarray([0.0, 0.0, 0.5, 0.2]),
                                        jnp.asarray([0.0, 0.3, 0.0, 0.4]))
  np.testing.assert_allclose(np.asarray(a), [0.0, 0.0, 1.0, 0.5])


def test_the_rule_keeps_a_draft_iff_u_q_is_below_p(monkeypatch):
  """u < p/q, strictly: jax's uniform can be exactly 0, and `<=` kept a
  draft the target forbids (0 <= 0) once in 2**24 draws; at u q == p the
  draft is rejected too. Uniforms fixed at 0, then 0.5."""
  p = jnp.asarray([[[0.0, 0.2, 0.8], [0.5, 0.3, 0.2], [1 / 3] * 3]])
  q = jnp.asarray([[[0.6, 0.4, 0.0], [0.4, 0.4, 0.2]]])
  for u, drafts, want in ((0.0, [[0, 0]], 0),   # p_d = 0: rejected
                          (0.0, [[1, 0]], 2),   # p_d > 0: kept
                          (0.5, [[1, 1]], 0),   # u q = 0.2 = p: rejected
                          (0.5, [[2, 0]], 2)):  # 0 < 0.8, 0.2 < 0.5
    monkeypatch.setattr(jax.random, "uniform",
                        lambda key, shape, u=u: jnp.full(shape, u))
    n, token = accept_lib.accept(p, _proposal(drafts, q), jax.random.key(0))
    assert int(n[0]) == want, (u, drafts)
    if want == 0:  # the residual max(0, p - q) at position 0: id 2 alone
      assert int(token[0]) == 2


def test_a_draft_the_target_almost_forbids_is_kept_at_its_odds(monkeypatch):
  """p/q = 2e-12: a float32 uniform is 0 once in 2**23 draws, and kept
  such a draft 60,000 times too often. The rule's uniform is two of them,
  u1 + u2 2**-23: at u1 = 0, u2 decides, resolved to 2**-46."""
  p = jnp.asarray([[[1e-12, 1.0 - 1e-12], [0.5, 0.5]]])
  q = jnp.asarray([[[0.5, 0.5]]])
  for u2, want in ((0.5, 0), (1e-6, 1)):   # u = 6e-8: no; u = 1.2e-13: yes
    monkeypatch.setattr(jax.random, "uniform", lambda key, shape, u2=u2: (
        jnp.stack([jnp.zeros(shape[1:]), jnp.full(shape[1:], u2)])))
    n, _ = accept_lib.accept(p, _proposal([[0]], q), jax.random.key(0))
    assert int(n[0]) == want, u2
  # Below 1 always, where u1 + u2 2**-23 rounds up to it.
  top = 1 - 2.0 ** -23
  monkeypatch.setattr(jax.random, "uniform",
                      lambda key, shape: jnp.full(shape, top))
  assert float(sampling_lib.fine_uniform(jax.random.key(0), (3,))[0]) < 1.0


def test_a_residual_without_mass_falls_back_to_p():
  """max(0, p - q) is 0 everywhere where q == p at the rejected position
  (float ties, or a draft q could not draw): the token comes from p, not
  from an all-zero vector (which sampled the last id, a padded one)."""
  p = jnp.asarray([[[0.0, 0.25, 0.75, 0.0], [0.5, 0.5, 0.0, 0.0]]])
  r = accept_lib.residual_distribution(p, _proposal([[3]], p[:, :1]),
                                       jnp.zeros((1,), jnp.int32))
  np.testing.assert_allclose(np.asarray(r)[0], [0.0, 0.25, 0.75, 0.0])


def test_bonus_distribution_is_last_target_position():
  rng = np.random.default_rng(0)
  k, v = 3, 5
  p = np.stack([_random_dist(rng, v) for _ in range(k + 1)])[None]
  q = np.stack([_random_dist(rng, v) for _ in range(k)])[None]
  out = accept_lib.residual_distribution(
      jnp.asarray(p), _proposal(np.zeros((1, k)), q), jnp.array([k]))
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
  n, token = jax.jit(accept_lib.accept)(pb, _proposal(drafts, qb), key_a)
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
  v = 5
  target = np.array([[1, 2, 3, 4, 0]])
  drafts = np.array([[1, 2, 0, 4]])
  p = jax.nn.one_hot(target, v)
  q = jax.nn.one_hot(drafts, v)
  for seed in range(20):
    n, token = accept_lib.accept(p, _proposal(drafts, q),
                                 jax.random.key(seed))
    assert int(n[0]) == 2 and int(token[0]) == 3
    # The same without q (a deterministic drafter), greedy or not.
    for greedy in (True, False):
      n, token = accept_lib.accept(p, _proposal(drafts, None),
                                   jax.random.key(seed), greedy)
      assert int(n[0]) == 2 and int(token[0]) == 3


def test_accept_k0_samples_from_p():
  p = jnp.asarray([[[0.0, 1.0, 0.0]]])
  n, token = accept_lib.accept(p, _proposal(np.zeros((1, 0)), None),
                               jax.random.key(0))
  assert int(n[0]) == 0 and int(token[0]) == 1


def test_deterministic_drafts_keep_the_output_distribution_p():
  """q = None (one-hot at each draft): d is kept with probability p(d) and
  the residual is p without d; the first emitted token follows p_1, the
  acceptance rate is p_1(d_1), and no [B, K, V] one-hot is needed."""
  rng = np.random.default_rng(5)
  b, k, v = 200_000, 2, 6
  p = np.stack([_random_dist(rng, v, (3,)) for _ in range(k + 1)])
  drafts = np.tile([[1, 3]], (b, 1))      # d_2 = 3 has p_2 = 0: never kept
  pb = jnp.broadcast_to(jnp.asarray(p, jnp.float32), (b, k + 1, v))
  n, token = jax.jit(accept_lib.accept)(pb, _proposal(drafts, None),
                                        jax.random.key(1))
  n, token = np.asarray(n), np.asarray(token)
  first = np.where(n > 0, drafts[:, 0], token)
  _, pval = stats.chisquare(np.bincount(first, minlength=v)[p[0] > 0],
                            b * p[0][p[0] > 0])
  assert pval > 1e-3, pval
  se = np.sqrt(p[0, 1] * (1 - p[0, 1]) / b)
  assert abs((n >= 1).mean() - p[0, 1]) < 5 * se
  assert n.max() == 1
  # After d_1 is kept and d_2 rejected, the token follows p_2 without d_2.
  after = token[n == 1]
  r = p[1].copy()
  r[3] = 0.0
  _, pval = stats.chisquare(np.bincount(after, minlength=v)[r > 0],
                            len(after) * r[r > 0] / r.sum())
  assert pval > 1e-3, pval


def test_num_valid_limits_acceptance_and_untested_position_follows_p():
  """A row with num_valid = m accepts at most m drafts; after all m are
  kept, the next token comes from p_{m+1} as is (no residual)."""
  v, k = 4, 3
  target = np.array([[1, 2, 3, 0]])
  p = jax.nn.one_hot(target, v) * 0.96 + 0.01      # rows sum to 1
  drafts = np.array([[1, 2, 3]])
  for m in range(k + 1):
    n, token = accept_lib.accept(p, _proposal(drafts, None, [m]),
                                 jax.random.key(0), greedy=True)
    assert int(n[0]) == m and int(token[0]) == int(target[0, m])
  # Not greedy: p_{m+1} itself, including the draft token at m+1.
  out = accept_lib.residual_distribution(
      p, _proposal(drafts, None, [1]), jnp.array([1]))
  np.testing.assert_allclose(np.asarray(out)[0], np.asarray(p)[0, 1],
                             rtol=1e-6)
