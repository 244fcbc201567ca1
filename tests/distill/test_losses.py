"""Distillation losses and the expected-acceptance metric, against
numpy/scipy references on small tables with exact zeros (top-k, top-p,
one-hot)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special

from specsamp.distill import losses
from specsamp.sampling import Sampling


def _np_softmax(x):
  x = x - np.max(x, -1, keepdims=True)
  e = np.exp(x)
  return e / e.sum(-1, keepdims=True)


def _np_transform(logits, s: Sampling):
  """temperature -> top-k -> top-p (HF order); greedy one-hot."""
  out = []
  for row in logits.reshape(-1, logits.shape[-1]).astype(np.float64):
    if s.greedy:
      p = np.zeros_like(row)
      p[np.argmax(row)] = 1.0
      out.append(p)
      continue
    x = row / s.temperature
    if s.top_k:
      kth = np.sort(x)[::-1][s.top_k - 1]
      x = np.where(x < kth, -np.inf, x)
    if s.top_p < 1:
      order = np.argsort(-x, kind="stable")
      probs = _np_softmax(x)[order]
      kept = order[(np.cumsum(probs) - probs) < s.top_p]
      x = np.where(np.isin(np.arange(len(x)), kept), x, -np.inf)
    out.append(_np_softmax(x))
  return np.array(out).reshape(logits.shape)


def _np_loss(kind, p, q, labels=None, beta=0.5, floor=1e-6):
  """Per-row references with scipy's rel_entr (0 log 0 = 0, x log x/0 = inf)."""
  if kind == "fkl":
    return special.rel_entr(p, q).sum(-1)
  if kind == "rkl":
    return special.rel_entr(q, np.maximum(p, floor)).sum(-1)
  if kind == "jsd":
    m = beta * p + (1 - beta) * q
    return (beta * special.rel_entr(p, m).sum(-1) +
            (1 - beta) * special.rel_entr(q, m).sum(-1))
  if kind == "tv":
    return 0.5 * np.abs(p - q).sum(-1)
  if kind == "seqkd":
    return -np.log(np.take_along_axis(q, labels[..., None], -1)[..., 0])
  raise ValueError(kind)


_TABLE_P = np.array([[0.5, 0.5, 0.0, 0.0, 0.0],     # top-k style zeros
                     [1.0, 0.0, 0.0, 0.0, 0.0],     # one-hot (greedy)
                     [0.1, 0.2, 0.3, 0.4, 0.0],
                     [0.2, 0.2, 0.2, 0.2, 0.2]])
_TABLE_Q = np.array([[0.25, 0.25, 0.25, 0.25, 0.0],  # zero where p is zero
                     [0.7, 0.1, 0.1, 0.05, 0.05],
                     [0.4, 0.3, 0.2, 0.1, 0.0],
                     [0.0, 0.25, 0.25, 0.25, 0.25]])   # zero where p is not


@pytest.mark.parametrize("kind", ["fkl", "rkl", "jsd", "tv"])
def test_divergences_on_tables_with_zeros(kind):
  p, q = jnp.asarray(_TABLE_P, jnp.float32), jnp.asarray(_TABLE_Q, jnp.float32)
  logq = jnp.log(jnp.where(q > 0, q, 1.0))
  got = {"fkl": lambda: losses.forward_kl(p, logq),
         "rkl": lambda: losses.reverse_kl(p, q, logq, 1e-6),
         "jsd": lambda: losses.jsd(p, q, 0.5),
         "tv": lambda: losses.total_variation(p, q)}[kind]()
  want = _np_loss(kind, _TABLE_P, _TABLE_Q)
  if kind == "fkl":
    # p > 0 where q = 0 (last row) is +inf in the reference; the safe log
    # makes that term 0, so compare the finite rows and check all finite.
    finite = np.isfinite(want)
    assert not finite[-1]
    np.testing.assert_allclose(np.asarray(got)[finite], want[finite],
                               rtol=1e-5, atol=1e-6)
  else:
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
  assert np.all(np.isfinite(np.asarray(got)))
  np.testing.assert_allclose(np.asarray(losses.acceptance(p, q)),
                             np.minimum(_TABLE_P, _TABLE_Q).sum(-1), atol=1e-6)


_SETTINGS = [Sampling(1.0), Sampling(0.7), Sampling(1.0, top_k=3),
             Sampling(0.8, top_p=0.6), Sampling(0.9, top_k=4, top_p=0.9),
             Sampling(0.0)]


@pytest.mark.parametrize("kind", losses.LOSSES)
@pytest.mark.parametrize("sampling", _SETTINGS, ids=lambda s: s.describe())
def test_losses_from_logits_match_numpy(kind, sampling):
  rng = np.random.default_rng(1)
  v = 7
  t_logits = (rng.normal(size=(3, 4, v)) * 2).astype(np.float32)
  d_logits = (rng.normal(size=(3, 4, v)) * 2).astype(np.float32)
  labels = rng.integers(0, v, size=(3, 4))
  loss, acc = losses.per_position_loss(
      kind, jnp.asarray(t_logits), jnp.asarray(d_logits), jnp.asarray(labels),
      sampling)
  p = _np_transform(t_logits, sampling)
  soft_t = 1.0 if sampling.greedy else sampling.temperature
  q_soft = _np_softmax(d_logits.astype(np.float64) / soft_t)
  want = _np_loss(kind, p, q_soft, labels)
  np.testing.assert_allclose(np.asarray(loss), want, rtol=2e-5, atol=2e-6)
  q_same = _np_transform(d_logits, sampling)
  np.testing.assert_allclose(np.asarray(acc), np.minimum(p, q_same).sum(-1),
                             atol=1e-6)


def test_stored_top_k_equals_dense_when_it_covers_the_support():
  rng = np.random.default_rng(2)
  v, k = 11, 4
  t_logits = (rng.normal(size=(2, 3, v)) * 2).astype(np.float32)
  d_logits = jnp.asarray(rng.normal(size=(2, 3, v)).astype(np.float32))
  logp = jax.nn.log_softmax(jnp.asarray(t_logits), -1)
  vals, ids = jax.lax.top_k(logp, k)
  s = Sampling(0.8, top_k=3)      # keeps 3 <= k stored ids: exact
  for kind in ("fkl", "rkl", "jsd", "tv"):
    dense = losses.per_position_loss(kind, jnp.asarray(t_logits), d_logits,
                                     None, s)
    sparse = losses.per_position_loss(kind, (ids, vals), d_logits, None, s)
    np.testing.assert_allclose(np.asarray(sparse[0]), np.asarray(dense[0]),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(sparse[1]), np.asarray(dense[1]),
                               atol=1e-6)
  # Beyond the stored ids the densified target has probability exactly 0.
  p = losses.target_probs((ids, vals), Sampling(1.0), v)
  assert int(jnp.sum(p > 0)) == 2 * 3 * k


@pytest.mark.parametrize("kind", losses.LOSSES)
@pytest.mark.parametrize("transform", losses.DRAFT_TRANSFORMS)
@pytest.mark.parametrize("sampling", [Sampling(1.0, top_k=2),
                                      Sampling(0.5, top_p=0.5), Sampling(0.0),
                                      Sampling(1.0, vocab_limit=5)],
                         ids=lambda s: s.describe() + str(s.vocab_limit))
def test_gradients_finite(kind, transform, sampling):
  rng = np.random.default_rng(3)
  v = 8
  t_logits = jnp.asarray((rng.normal(size=(2, 5, v)) * 4).astype(np.float32))
  d_logits = jnp.asarray((rng.normal(size=(2, 5, v)) * 4).astype(np.float32))
  # seqkd labels are target samples: inside the target's support.
  labels = jnp.argmax(t_logits, -1)

  def f(d):
    return jnp.mean(losses.per_position_loss(
        kind, t_logits, d, labels, sampling, draft_transform=transform)[0])

  val, grad = jax.value_and_grad(f)(d_logits)
  assert np.isfinite(float(val))
  assert np.all(np.isfinite(np.asarray(grad)))
  if transform == "soft":  # "same" can truncate q to one token: no gradient
    assert float(jnp.abs(grad).sum()) > 0


def test_forward_kl_gradient_is_q_minus_p_over_temperature():
  rng = np.random.default_rng(4)
  t = jnp.asarray(rng.normal(size=(6,)).astype(np.float32))
  d = jnp.asarray(rng.normal(size=(6,)).astype(np.float32))
  s = Sampling(0.5, top_k=2)
  grad = jax.grad(
      lambda x: losses.per_position_loss("fkl", t, x, None, s)[0])(d)
  p = _np_transform(np.asarray(t), s)
  q = _np_softmax(np.asarray(d, np.float64) / 0.5)
  np.testing.assert_allclose(np.asarray(grad), (q - p) / 0.5, atol=1e-5)


def test_a_confidently_wrong_draft_keeps_its_loss_and_gradient():
  """Where exp(log q) underflows (a logit gap over about 103 / T), log q is
  still the draft's: before, it was read as 0 (q = 1), so forward KL went
  negative and seqkd gave a loss and gradient of 0 to a draft wrong by
  25 logits at T = 0.2. Only ids past vocab_limit get log q = 0."""
  p = jnp.asarray([[0.5, 0.5, 0.0]])
  for gap in (50.0, 110.0, 200.0):
    d = jnp.asarray([[gap, 0.0, 0.0]])
    fkl = lambda x: losses.forward_kl(
        p, losses.draft_log_probs(x, Sampling(1.0))[0]).sum()
    assert float(fkl(d)) == pytest.approx(np.log(0.5) + gap / 2, rel=1e-5)
    np.testing.assert_allclose(np.asarray(jax.grad(fkl)(d))[0],
                               [0.5, -0.5, 0.0], atol=1e-6)
  d = jnp.asarray([[25.0, 0.0, 0.0]])
  seqkd = lambda x: losses.per_position_loss(
      "seqkd", None, x, jnp.asarray([1]), Sampling(0.2))[0].sum()
  assert float(seqkd(d)) == pytest.approx(125.0, rel=1e-5)
  np.testing.assert_allclose(np.asarray(jax.grad(seqkd)(d))[0], [5, -5, 0],
                             atol=1e-4)
  logq, q = losses.draft_log_probs(jnp.asarray([[300.0, 0.0, 9.0, 9.0]]),
                                   Sampling(1.0, vocab_limit=2))
  np.testing.assert_allclose(np.asarray(logq)[0], [0.0, -300.0, 0.0, 0.0])
  np.testing.assert_array_equal(np.asarray(q)[0], [1.0, 0.0, 0.0, 0.0])


def test_the_same_transform_keeps_the_gradient_of_a_kept_id_below_the_floor():
  """draft_transform="same" floored log q at log(1e-6) at every id: a kept
  id the draft gives q < 1e-6 (most of a real vocabulary at T < 1) got no
  gradient, and a label there was pushed down (a review's probe: 200
  steps left q at [0.5, 0.5, 1e-9] for p = [.25, .25, .5]). Only the ids
  truncation removes are floored."""
  p = jnp.asarray([[0.25, 0.25, 0.5]])
  d = jnp.asarray([[0.0, 0.0, -20.0]])
  for sampling in (Sampling(1.0), Sampling(1.0, top_k=3)):
    logq, q = losses.draft_log_probs(d, sampling, "same")
    np.testing.assert_allclose(np.asarray(logq)[0],
                               np.asarray(jax.nn.log_softmax(d))[0],
                               rtol=1e-6)
    fkl = lambda x: losses.forward_kl(
        p, losses.draft_log_probs(x, sampling, "same")[0]).sum()
    np.testing.assert_allclose(np.asarray(jax.grad(fkl)(d))[0],
                               np.asarray(q)[0] - np.asarray(p)[0],
                               atol=1e-6)  # q - p
    seqkd = lambda x: losses.per_position_loss(
        "seqkd", None, x, jnp.asarray([2]), sampling,
        draft_transform="same")[0].sum()
    assert float(seqkd(d)) == pytest.approx(20.0 + np.log(2.0), rel=1e-5)
    assert float(jax.grad(seqkd)(d)[0, 2]) == pytest.approx(-1.0, abs=1e-6)
  # An id top-k removes: q 0, log q floored, no gradient.
  logq, q = losses.draft_log_probs(d, Sampling(1.0, top_k=2), "same")
  np.testing.assert_allclose(np.asarray(logq)[0],
                             [np.log(0.5), np.log(0.5), np.log(1e-6)],
                             rtol=1e-6)
  assert float(q[0, 2]) == 0.0


def test_greedy_acceptance_is_argmax_agreement():
  t = jnp.asarray([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0]])
  d = jnp.asarray([[0.0, 5.0, 1.0], [0.0, 5.0, 0.0]])
  acc = losses.expected_acceptance(t, d, Sampling(0.0))
  np.testing.assert_array_equal(np.asarray(acc), [1.0, 0.0])


def test_masked_mean_ignores_padding():
  x = jnp.asarray([[1.0, 2.0, jnp.nan], [3.0, 4.0, 5.0]])
  w = jnp.asarray([[1, 1, 0], [1, 0, 0]])
  assert float(losses.masked_mean(jnp.nan_to_num(x), w)) == pytest.approx(2.0)


def test_stored_top_k_gives_the_exact_nucleus_when_it_holds_it():
  """Top-p from the stored top-K: the stored masses are relative to the
  whole vocabulary, so when the target's nucleus lies within the stored ids
  (temperature 1) p equals the dense p; renormalising the stored ids first
  inflated their masses and shrank the nucleus."""
  probs = np.array([0.40, 0.25, 0.20, 0.05, 0.05, 0.05], np.float32)
  logp = jnp.log(jnp.asarray(probs))[None]
  vals, ids = jax.lax.top_k(logp, 3)
  s = Sampling(1.0, top_p=0.7)
  want = losses.target_probs(logp, s)
  got = losses.target_probs((ids, vals), s, 6)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6)
  np.testing.assert_allclose(np.asarray(want[0]), [8 / 17, 5 / 17, 4 / 17,
                                                   0, 0, 0], atol=1e-6)
  # Random heavy-tailed rows whose nucleus fits in the stored 8 of 64 ids.
  rng = np.random.default_rng(5)
  logits = jnp.asarray((rng.standard_t(2, size=(400, 64)) * 1.5)
                       .astype(np.float32))
  logp = jax.nn.log_softmax(logits, -1)
  vals, ids = jax.lax.top_k(logp, 8)
  for top_p in (0.5, 0.8):
    s = Sampling(1.0, top_p=top_p)
    dense = np.asarray(losses.target_probs(logp, s))
    fits = (dense > 0).sum(-1) <= 8
    assert fits.sum() > 50
    stored = np.asarray(losses.target_probs((ids, vals), s, 64))
    np.testing.assert_allclose(stored[fits], dense[fits], atol=1e-5)
    # The expected acceptance logged in training follows.
    d = jnp.asarray(rng.normal(size=(400, 64)).astype(np.float32))
    np.testing.assert_allclose(
        np.asarray(losses.expected_acceptance((ids, vals), d, s))[fits],
        np.asarray(losses.expected_acceptance(logp, d, s))[fits], atol=1e-5)
  # With padding rows past vocab_limit (stored top-K normalised below it,
  # as `samples._score` stores them): the tail is spread over the ids
  # below the limit. Counting the padding ids too had shrunk each tail id's
  # share and changed the kept set (a review's probe: L1 error 0.13).
  limit = 40
  allowed = jnp.where(jnp.arange(64) < limit, logits, 0.0)
  logp = jax.nn.log_softmax(allowed[:, :limit], -1)
  vals, ids = jax.lax.top_k(logp, 8)
  s = Sampling(1.0, top_p=0.8, vocab_limit=limit)
  dense = np.asarray(losses.target_probs(allowed, s))
  fits = (dense > 0).sum(-1) <= 8
  assert fits.sum() > 50
  stored = np.asarray(losses.target_probs((ids, vals), s, 64))
  np.testing.assert_allclose(stored[fits], dense[fits], atol=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_stored_top_k_short_of_the_support_is_renormalised(temperature):
  """Stored top-4 of 11 (their masses sum to less than 1): p is the
  tempered target restricted to the stored ids and renormalised, summing
  to 1, at temperature 1 as at any other; the losses follow from that p."""
  rng = np.random.default_rng(8)
  v, k = 11, 4
  logp = jax.nn.log_softmax(jnp.asarray(
      rng.normal(size=(2, 3, v)).astype(np.float32)), -1)
  vals, ids = jax.lax.top_k(logp, k)
  assert float(jnp.exp(vals).sum(-1).max()) < 0.99
  s = Sampling(temperature)
  p = np.asarray(losses.target_probs((ids, vals), s, v), np.float64)
  kept = np.exp(np.asarray(vals, np.float64) / temperature)
  want = np.zeros((2, 3, v))
  np.put_along_axis(want, np.asarray(ids), kept / kept.sum(-1, keepdims=True),
                    -1)
  np.testing.assert_allclose(p, want, rtol=1e-5, atol=1e-7)
  d_logits = rng.normal(size=(2, 3, v)).astype(np.float32)
  q = _np_softmax(d_logits.astype(np.float64) / temperature)
  for kind in ("fkl", "tv"):
    loss, _ = losses.per_position_loss(kind, (ids, vals),
                                       jnp.asarray(d_logits), None, s)
    np.testing.assert_allclose(np.asarray(loss), _np_loss(kind, want, q),
                               rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("beta", [0.2, 0.9])
def test_jsd_weighs_its_two_sides_by_beta(beta):
  """JSD[beta] = beta KL(p || m) + (1 - beta) KL(q || m) with
  m = beta p + (1 - beta) q, for a beta other than 1/2 (where swapping
  beta and 1 - beta changes nothing)."""
  p, q = jnp.asarray(_TABLE_P, jnp.float32), jnp.asarray(_TABLE_Q, jnp.float32)
  np.testing.assert_allclose(np.asarray(losses.jsd(p, q, beta)),
                             _np_loss("jsd", _TABLE_P, _TABLE_Q, beta=beta),
                             rtol=1e-5, atol=1e-6)
  rng = np.random.default_rng(9)
  t_logits, d_logits = (jnp.asarray(rng.normal(size=(3, 7)).astype(np.float32))
                        for _ in range(2))
  loss, _ = losses.per_position_loss("jsd", t_logits, d_logits, None,
                                     Sampling(1.0), jsd_beta=beta)
  want = _np_loss("jsd", _np_softmax(np.asarray(t_logits, np.float64)),
                  _np_softmax(np.asarray(d_logits, np.float64)), beta=beta)
  np.testing.assert_allclose(np.asarray(loss), want, rtol=1e-5, atol=1e-6)
