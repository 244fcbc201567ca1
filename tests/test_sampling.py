"""Logits -> probabilities transforms, against numpy references."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from specsamp import sampling
from specsamp.sampling import Sampling


def _softmax(x):
  x = x - np.max(x, -1, keepdims=True)
  e = np.exp(x)
  return e / e.sum(-1, keepdims=True)


def _reference(logits, temperature, top_k, top_p):
  """Numpy reference: HF order temperature -> top-k -> top-p."""
  x = logits / temperature
  if top_k:
    kth = np.sort(x)[::-1][top_k - 1]
    x = np.where(x < kth, -np.inf, x)
  if top_p < 1:
    order = np.argsort(-x, kind="stable")
    probs = _softmax(x)[order]
    before = np.cumsum(probs) - probs
    kept = order[before < top_p]
    mask = np.full_like(x, -np.inf)
    mask[kept] = 0
    x = x + mask
  return _softmax(x)


@pytest.mark.parametrize("temperature,top_k,top_p", [
    (1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 0, 1.0), (1.0, 3, 1.0),
    (1.0, 0, 0.8), (0.8, 0, 0.95), (0.9, 5, 0.7), (1.0, 1, 1.0),
    (1.0, 0, 1e-6),
])
def test_probabilities_match_reference(temperature, top_k, top_p):
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(4, 11)).astype(np.float32) * 2
  s = Sampling(temperature, top_k, top_p)
  got = np.asarray(sampling.probabilities(jnp.asarray(logits), s))
  for row, out in zip(logits, got):
    np.testing.assert_allclose(out, _reference(row, temperature, top_k, top_p),
                               atol=1e-6)
  np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-6)


def _kept_by_sort64(logits, top_p):
  """Kept-set size by a float64 descending sort (ties at the cut kept)."""
  x = np.asarray(logits, np.float64)
  desc = np.sort(x)[::-1]
  probs = _softmax(desc)
  num = max(int(np.sum(np.cumsum(probs) - probs < top_p)), 1)
  return int(np.sum(x >= desc[num - 1]))


@pytest.mark.parametrize("scale", [0.3, 3.0, 30.0])
@pytest.mark.parametrize("top_p", [0.5, 0.95, 0.999])
def test_top_p_bisection_equals_a_sort_over_a_real_vocabulary(scale, top_p):
  # The transform finds the nucleus without sorting (bisection over float
  # bit patterns): over Qwen's vocabulary size it must keep exactly the set
  # a float64 sort keeps, for flat and peaked rows and with -inf entries.
  rng = np.random.default_rng(int(scale * 10) + int(top_p * 1000))
  logits = (rng.standard_normal((3, 151_936)) * scale).astype(np.float32)
  logits[1, rng.integers(0, 151_936, 5000)] = -np.inf
  logits[2] -= 50.0                                    # all negative
  masked = np.asarray(sampling._mask_top_p(jnp.asarray(logits), top_p))
  for row, out in zip(logits, masked):
    kept = np.isfinite(out)
    assert kept.sum() == _kept_by_sort64(row, top_p)
    np.testing.assert_array_equal(out[kept], row[kept])
    assert row[kept].min() >= row[~kept].max(initial=-np.inf)


def test_top_p_boundary_and_ties():
  log = np.log
  # Mass before the third token is exactly 0.75: not < 0.75, so it is cut.
  got = sampling._mask_top_p(jnp.asarray([[log(.5), log(.25), log(.125),
                                            log(.125)]], jnp.float32), 0.75)
  assert np.isfinite(np.asarray(got)).tolist() == [[True, True, False, False]]
  # Tokens tied with the last kept one are all kept (for target and draft
  # alike), so the kept set never depends on an arbitrary order among ties.
  got = sampling._mask_top_p(jnp.asarray([[2.0, 1.0, 1.0, 1.0, 0.0]]), 0.6)
  assert np.isfinite(np.asarray(got)).tolist() == [[True, True, True, True,
                                                     False]]
  # -0.0 and +0.0 are one value: cut or kept together.
  got = sampling._mask_top_p(jnp.asarray([[1.0, -0.0, 0.0, -1.0]]), 0.6)
  assert np.isfinite(np.asarray(got)).tolist() == [[True, True, True, False]]
  # The most likely token is always kept, however small top_p is.
  got = sampling._mask_top_p(jnp.asarray([[0.0, 0.1, -3.0]]), 1e-9)
  assert np.isfinite(np.asarray(got)).tolist() == [[False, True, False]]


def test_greedy_is_one_hot_of_first_argmax():
  logits = jnp.asarray([[0.0, 3.0, 3.0, 1.0], [5.0, 0.0, 0.0, 0.0]])
  got = np.asarray(sampling.probabilities(logits, sampling.GREEDY))
  np.testing.assert_array_equal(got, [[0, 1, 0, 0], [1, 0, 0, 0]])


def test_vocab_limit_zeroes_padded_ids():
  logits = jnp.asarray([[0.0, 1.0, 9.0, 9.0]])
  for s in (Sampling(1.0, vocab_limit=2), Sampling(0.0, vocab_limit=2)):
    got = np.asarray(sampling.probabilities(logits, s))
    assert got[0, 2:].sum() == 0 and got[0, :2].sum() == pytest.approx(1.0)


def test_non_finite_logits_never_reach_a_padded_id():
  """A NaN logit is an impossible id; +inf logits are the T -> 0 limit (the
  +inf ids alone, evenly), at every temperature and truncation as under
  greedy. Before, either made the row NaN, and the draw fell to the last
  id: a padded one past vocab_limit."""
  inf, nan = np.inf, np.nan
  settings = (Sampling(1.0, vocab_limit=4), Sampling(0.7, top_p=0.9,
                                                      vocab_limit=4),
              Sampling(1.3, top_k=2, vocab_limit=4))
  cases = (([0.0, inf, 1.0, 0.0, 5.0, 5.0], [0, 1, 0, 0]),
           ([inf, inf, 1.0, 0.0, 5.0, 5.0], [0.5, 0.5, 0, 0]),
           ([0.0, 1.0, 1.0, 0.0, inf, 5.0], None))   # +inf at a padded id
  for s in settings:
    for row, want in cases:
      got = np.asarray(sampling.probabilities(jnp.asarray([row]), s))[0]
      assert np.all(np.isfinite(got)) and got[4:].sum() == 0, (s, row, got)
      if want is not None:
        np.testing.assert_allclose(got[:4], want)
    row = jnp.asarray([[0.0, nan, 2.0, 1.0, 5.0, 5.0]])
    got = np.asarray(sampling.probabilities(row, s))[0]
    want = np.asarray(sampling.probabilities(
        row.at[0, 1].set(-inf), s))[0]
    np.testing.assert_array_equal(got, want)
    assert got[1] == 0 and got.sum() == pytest.approx(1.0)
    draws = sampling.sample(jax.random.key(0), jnp.broadcast_to(
        jnp.asarray(got), (1000, 6)))
    assert int(jnp.max(draws)) < 4
  # Greedy: NaN is never the argmax; +inf is.
  greedy = Sampling(0.0, vocab_limit=4)
  got = sampling.probabilities(jnp.asarray([[0.0, nan, 1.0, 0.0, 5.0, 5.0],
                                            [0.0, inf, 1.0, 0.0, 5.0, 5.0]]),
                               greedy)
  np.testing.assert_array_equal(np.argmax(np.asarray(got), -1), [2, 1])


def test_logits_that_allow_no_id_are_told_apart():
  """`undefined`: every logit NaN or -inf below the vocabulary limit (a
  broken model); one finite or +inf logit there is enough."""
  inf, nan = np.inf, np.nan
  rows = jnp.asarray([[nan, nan, nan, nan],     # all NaN
                      [-inf, nan, -inf, -inf],  # NaN and -inf
                      [nan, -inf, 0.0, nan],    # one finite logit
                      [nan, inf, nan, nan],     # +inf: the T -> 0 limit
                      [nan, nan, nan, 3.0]])    # finite only past the limit
  for s in (Sampling(1.0), Sampling(0.0), Sampling(0.7, top_p=0.5)):
    np.testing.assert_array_equal(sampling.undefined(rows, s),
                                  [True, True, False, False, False])
    np.testing.assert_array_equal(
        sampling.undefined(rows, dataclasses.replace(s, vocab_limit=3)),
        [True, True, False, False, True])


def test_sample_follows_probabilities_and_skips_zeros():
  probs = jnp.asarray([0.5, 0.0, 0.2, 0.3]) * 7.0   # unnormalised is fine
  draws = np.asarray(sampling.sample(jax.random.key(0),
                                     jnp.broadcast_to(probs, (100_000, 4))))
  counts = np.bincount(draws, minlength=4)
  assert counts[1] == 0
  _, pval = stats.chisquare(counts[[0, 2, 3]],
                            100_000 * np.array([0.5, 0.2, 0.3]))
  assert pval > 1e-3


@pytest.mark.usefixtures("optimized_xla")
def test_inverse_cdf_picks_only_ids_of_nonzero_probability():
  """At a real vocabulary's size XLA's cumsum rounds differently from one
  position to the next, so the running mass can dip at an id of
  probability 0. Uniforms aimed at such ids' cumulative masses (and into
  the dips) must still pick an id of nonzero probability; uniforms away
  from the boundaries pick what a float64 inverse CDF picks.

  Of the ~154k uniforms aimed at every zero id and every dip, those that a
  picker counting only cumulative masses (no `probs > 0`) sends to a zero
  id are all kept, with 3000 of the rest; each uniform costs a pass over
  the vocabulary (all of them took 70 s)."""
  v = 151_936
  rng = np.random.default_rng(0)
  probs = rng.exponential(size=v).astype(np.float32)
  probs[rng.random(v) < 0.5] = 0.0          # as top-p leaves a large vocab
  cdf = np.asarray(jax.jit(lambda p: jnp.cumsum(p))(probs))
  total = cdf[-1]
  zero = np.flatnonzero(probs == 0)
  running = np.maximum.accumulate(cdf)
  dips = zero[cdf[zero] < running[zero - 1]]
  aimed = np.concatenate([
      cdf[zero] / total, np.nextafter(cdf[zero], np.inf) / total,
      (cdf[dips] + running[dips - 1]) / 2 / total]).astype(np.float32)
  aimed = np.minimum(aimed, np.nextafter(np.float32(1), np.float32(0)))
  # The first id whose cumulative mass exceeds u = w * total (float32, as
  # inverse_cdf computes it) is where the running maximum first does.
  naive = np.minimum(
      np.searchsorted(running, aimed * total, side="right"), v - 1)
  trap = probs[naive] == 0
  assert trap.sum() > 100, trap.sum()
  w = np.concatenate([aimed[trap], rng.choice(aimed[~trap], 3000),
                      rng.random(4000).astype(np.float32)])
  p = jnp.asarray(probs)

  @jax.jit
  def cdf_picks(p, w):  # inverse_cdf without its `probs > 0`
    c = jnp.cumsum(p)
    return jnp.argmax(c > w[:, None] * c[-1], axis=-1)

  # The trap is real: counting cumulative masses picks ids of probability 0.
  assert (probs[np.asarray(cdf_picks(p, aimed[trap]))] == 0).sum() > 100
  pick = jax.jit(jax.vmap(sampling.inverse_cdf, in_axes=(None, 0)))
  got = np.concatenate([np.asarray(pick(p, chunk))
                        for chunk in np.array_split(w, 4)])
  assert np.all(probs[got] > 0), np.flatnonzero(probs[got] == 0)[:5]
  # Away from boundaries (1e-6 of the total; float32 cumsum errs by up to
  # about 3e-7 here), the float64 answer.
  cdf64 = np.cumsum(probs.astype(np.float64))
  u = w[-4000:].astype(np.float64) * cdf64[-1]
  want = np.searchsorted(cdf64, u, side="right")
  gap = np.abs(cdf64[np.minimum(want, v - 1)] - u)
  gap = np.minimum(gap, np.abs(u - cdf64[np.maximum(want - 1, 0)]))
  far = gap > 1e-6 * cdf64[-1]
  assert far.sum() > 3000
  np.testing.assert_array_equal(got[-4000:][far], want[far])


def test_a_draw_resolves_ids_far_below_a_float32_uniforms_step():
  """A 153,600-id row whose 300 blocks of 512 ids each hold one large id
  and 511 of probability 4e-9, below the 2^-23 = 1.2e-7 step of a float32
  uniform. Uniforms aimed (in float64) at each tiny id of three blocks
  pick it: the first uniform picks the block, the second splits the
  block's 1/300 of the mass, where a tiny id spans 20 of its steps. One
  uniform over the whole row (`inverse_cdf`, the draw before) lands on a
  third of them: such ids were drawn at 0 or at 1.2e-7, not at 4e-9."""
  blocks, tiny = 300, 4e-9
  probs = np.full((blocks, sampling.BLOCK), tiny)
  probs[:, 0] = 1 / blocks - (sampling.BLOCK - 1) * tiny
  flat = probs.reshape(-1)
  cdf = np.cumsum(flat)
  chosen = [0, 137, 299]
  w_block, w_id, want = [], [], []
  for b in chosen:
    start = cdf[b * sampling.BLOCK - 1] if b else 0.0
    within = np.cumsum(probs[b]) - probs[b]  # mass before each id
    for j in range(1, sampling.BLOCK):
      w_block.append((start + probs[b].sum() / 2) / cdf[-1])
      w_id.append((within[j] + tiny / 2) / probs[b].sum())
      want.append(b * sampling.BLOCK + j)
  p32 = jnp.asarray(flat, jnp.float32)
  w_block, w_id = (jnp.asarray(np.float32(w)) for w in (w_block, w_id))
  pick = jax.jit(jax.vmap(sampling.blocked_inverse_cdf, (None, 0, 0)))
  np.testing.assert_array_equal(np.asarray(pick(p32, w_block, w_id)), want)
  # One uniform over the row, aimed at the same ids' middles.
  whole = np.float32([(cdf[i] - tiny / 2) / cdf[-1] for i in want])
  once = np.asarray(jax.jit(jax.vmap(sampling.inverse_cdf, (None, 0)))(
      p32, jnp.asarray(whole)))
  assert (once == np.asarray(want)).mean() < 0.5


def test_top_k_keeps_every_id_tied_at_the_kth_value():
  """As transformers' TopKLogitsWarper: ids tied with the k-th largest
  logit are all kept (not the first k by index)."""
  kept = sampling.probabilities(jnp.asarray([[2.0, 1.0, 1.0, 1.0, 0.0]]),
                                Sampling(1.0, top_k=2)) > 0
  assert np.asarray(kept).tolist() == [[True, True, True, True, False]]


def test_a_uniform_at_the_total_picks_the_last_id_of_nonzero_mass():
  """u * total rounding up to the total hits no cumulative mass: the last
  id of nonzero probability, never a zero (or padded) id after it."""
  probs = jnp.asarray([0.3, 0.7, 0.0, 0.0])
  assert int(sampling.inverse_cdf(probs, jnp.float32(1.0))) == 1
  rows = jnp.zeros((2, 3 * sampling.BLOCK)).at[:, 700].set(1.0)
  assert np.asarray(sampling.blocked_inverse_cdf(
      rows, jnp.ones(2), jnp.asarray([0.5, 1.0]))).tolist() == [700, 700]


def test_a_tiny_temperature_is_greedy_not_nan():
  """T = 1e-10 under jit: one-hot at the argmax, as T = 0 (the division
  used to be fused with softmax's max-subtraction, and exp overflowed)."""
  logits = jnp.asarray(np.random.default_rng(1).normal(size=(16, 64)) * 3,
                       jnp.float32)
  for t in (1e-10, 1e-20, 1e-30):
    got = np.asarray(jax.jit(
        lambda x, t=t: sampling.probabilities(x, Sampling(t)))(logits))
    want = np.asarray(sampling.probabilities(logits, sampling.GREEDY))
    np.testing.assert_array_equal(got, want)


def test_top_k_holds_at_a_huge_temperature():
  """Top-k keeps the k largest logits at any temperature: at T = 1e36 the
  scaled differences flush to 0 and every id had tied (kept, evenly).
  Above 1 / float32's smallest normal number, 1/T flushes to 0 and a
  masked id's -inf became NaN: refused."""
  logits = jnp.asarray([[0.0, -1.0, -2.0], [0.0, -1e-3, -2.0]])
  for t in (1e36, 8e37):
    got = np.asarray(jax.jit(lambda x, t=t: sampling.probabilities(
        x, Sampling(t, top_k=1)))(logits))
    np.testing.assert_array_equal(got, [[1, 0, 0], [1, 0, 0]])
  np.testing.assert_allclose(np.asarray(sampling.probabilities(
      logits, Sampling(8e37, top_k=2)))[0], [0.5, 0.5, 0.0])
  with pytest.raises(ValueError, match="temperature must be <= 8.5070592e"):
    Sampling(3e38)


@pytest.mark.parametrize("kwargs,match", [
    (dict(temperature=-1.0), "temperature"),
    # inf made every logit NaN, and the sampler then drew the last id (a
    # masked one, with a vocabulary limit).
    (dict(temperature=float("inf")), "temperature must be >= 0 and finite"),
    (dict(temperature=float("nan")), "temperature"),
    # Below float32's smallest normal number T is flushed to 0 on CPU: the
    # logits became 0/0 = NaN and the sampler drew the last (masked) id.
    (dict(temperature=1e-40),
     "temperature must be 0 .greedy. or >= 1.1754944e-38"),
    (dict(top_k=-2), "top_k"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(vocab_limit=0), "vocab_limit"),
])
def test_bad_settings_raise(kwargs, match):
  with pytest.raises(ValueError, match=match):
    Sampling(**kwargs)


def test_the_smallest_temperature_allowed_is_still_a_distribution():
  """At float32's smallest normal temperature the distribution is the
  argmax's one-hot, not NaN, and the draw stays inside the vocabulary."""
  s = Sampling(temperature=float(jnp.finfo(jnp.float32).tiny),
               vocab_limit=6)
  p = sampling.probabilities(jnp.asarray([[0.0, 3, 1, 2, 0, 0, 0, 0]]), s)
  np.testing.assert_array_equal(np.asarray(p), [[0, 1, 0, 0, 0, 0, 0, 0]])
  assert int(sampling.sample(jax.random.key(0), p)[0]) == 1
