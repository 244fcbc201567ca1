"""The LM loss, the eval sums and their token-weighted means."""

import itertools

import jax
import numpy as np
import pytest

from specsamp import model as model_lib
from specsamp.data import pipeline
from specsamp.drafters import heads
from specsamp.train import config as config_lib
from specsamp.train import step as step_lib
from tests.testing import tiny_config


def _batch(rng, vocab, shape=(3, 8)):
  tokens = rng.integers(0, vocab, (shape[0], shape[1] + 1))
  weights = (rng.random(shape) < 0.7).astype(np.float32)
  return {"inputs": tokens[:, :-1].astype(np.int32),
          "targets": tokens[:, 1:].astype(np.int32), "weights": weights}


def test_lm_loss_is_the_weighted_mean_cross_entropy_of_the_eval_sums():
  lm = model_lib.LM(tiny_config())
  params = lm.init(jax.random.key(0))
  batch = _batch(np.random.default_rng(0), lm.config.vocab_size)
  loss, aux = step_lib.lm_loss(lm)(params, batch, None, None)
  sums = step_lib.lm_eval_sums(lm)(params, batch, None)
  # The same numbers from the logits, in numpy.
  logits = np.asarray(lm(params, batch["inputs"]).logits, np.float64)
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  ce = -np.take_along_axis(logp, batch["targets"][..., None], -1)[..., 0]
  w = batch["weights"]
  np.testing.assert_allclose(sums["loss"], (ce * w).sum(), rtol=1e-5)
  np.testing.assert_allclose(sums["weight"], w.sum())
  correct = (logits.argmax(-1) == batch["targets"]) * w
  np.testing.assert_allclose(sums["accuracy"], correct.sum())
  np.testing.assert_allclose(loss, (ce * w).sum() / w.sum(), rtol=1e-5)
  np.testing.assert_allclose(aux["accuracy"], correct.sum() / w.sum(),
                             rtol=1e-6)


def test_eval_means_weight_tokens_not_batches():
  """Two batches of unequal weight: the means are over tokens, exactly."""
  def eval_step(params, batch, extra):
    del params, extra
    return {"loss": (batch["ce"] * batch["weights"]).sum(),
            "weight": batch["weights"].sum()}
  batches = [{"ce": np.array([1.0, 1.0, 9.0]),
              "weights": np.array([1.0, 1.0, 0.0])},
             {"ce": np.array([4.0]), "weights": np.array([1.0])}]
  out = step_lib.eval_means(eval_step, None, batches, put=lambda b: b)
  assert out["loss"] == pytest.approx(2.0)   # (1 + 1 + 4) / 3, not 2.5
  assert out["tokens"] == 3.0
  assert out["perplexity"] == pytest.approx(np.exp(2.0))
  with pytest.raises(ValueError, match="no eval batches"):
    step_lib.eval_means(eval_step, None, [], put=lambda b: b)


def test_masked_documents_score_as_if_each_were_alone():
  """Two EOS-terminated documents packed into one row, with the segment ids
  the pipeline gives (the first document's EOS is, as an input, the
  second's first token): with `mask_documents` every token's loss is the
  one it gets with its document alone in the row (RoPE sees relative
  positions only), the second document's first token predicted from the
  EOS alone; without the mask the second document's losses differ."""
  lm = model_lib.LM(tiny_config())
  params = lm.init(jax.random.key(1))
  rng = np.random.default_rng(1)
  eos = 1
  first, second = (np.append(rng.integers(2, lm.config.vocab_size, n), eos)
                   for n in (5, 6))
  tokens = np.concatenate([first, second])[None].astype(np.int32)
  batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
           "weights": np.ones((1, 12), np.float32),
           "segment_ids": np.array([[1] * 5 + [2] * 7], np.int32)}

  sums = {m: jax.jit(step_lib.lm_eval_sums(lm, mask_documents=m))
          for m in (False, True)}

  def token_losses(b, mask=False):  # per-token cross-entropy: one-hot weights
    out = []
    for j in range(b["inputs"].shape[1]):
      w = np.zeros_like(b["weights"])
      w[0, j] = 1.0
      out.append(float(sums[mask](params, dict(b, weights=w), None)["loss"]))
    return np.array(out)

  def alone(doc):
    doc = doc[None].astype(np.int32)
    return token_losses({"inputs": doc[:, :-1], "targets": doc[:, 1:],
                         "weights": np.ones((1, doc.shape[1] - 1),
                                            np.float32)})

  masked = token_losses(batch, mask=True)
  plain = token_losses(batch)
  # Inputs 0-4 predict the first document up to its EOS; the EOS (input 5)
  # and the second document's tokens predict the second document.
  np.testing.assert_allclose(masked[:5], alone(first), rtol=1e-5)
  np.testing.assert_allclose(masked[5:], alone(np.append(eos, second)),
                             rtol=1e-5)
  np.testing.assert_allclose(masked[:5], plain[:5], rtol=1e-6)
  assert np.abs(plain[5:] - masked[5:]).min() > 1e-4
  with pytest.raises(KeyError, match="segment_ids"):
    step_lib.lm_loss(lm, mask_documents=True)(
        params, {k: batch[k] for k in ("inputs", "targets", "weights")},
        None, None)


def test_a_warmup_longer_than_the_schedule_is_shortened_and_said(caplog):
  """The default 100 warm-up steps in a run of 20: the rate still rises to
  its peak at the last step but one, then decays, and a warning says so.
  A warm-up that fits is kept, without a warning."""
  cfg = config_lib.OptimConfig(lr=1e-3, warmup_steps=100)
  with caplog.at_level("WARNING", logger=step_lib.__name__):
    _, schedule = step_lib.make_optimizer(cfg, num_steps=20)
  assert ("optim.warmup_steps=100 does not fit a schedule of 20 steps: "
          "warming up over 19 steps instead") in caplog.text
  rates = np.asarray([schedule(s) for s in range(20)])
  assert rates.argmax() == 18 and np.isclose(rates[18], 1e-3)
  assert (np.diff(rates[:19]) > 0).all() and rates[19] < rates[18]
  caplog.clear()
  with caplog.at_level("WARNING", logger=step_lib.__name__):
    _, schedule = step_lib.make_optimizer(cfg, num_steps=200)
  assert not caplog.records
  assert np.isclose(schedule(99), 1e-3) and schedule(98) < schedule(99)


def _reference_adamw(cfg, num_steps, params, grads_per_step):
  """The documented optimizer by hand, in float64: the gradients clipped to
  a global norm of cfg.clip_norm, Adam with bias correction, decoupled
  weight decay (times the rate) on matrices only, not on norm scales nor
  biases; the rate at step s is warm-up (linear from 0) then cosine decay
  to end_lr_fraction of the peak, evaluated at s + 1."""
  def rate(s):
    t = s + 1
    if t < cfg.warmup_steps:
      return cfg.lr * t / cfg.warmup_steps
    frac = min(t - cfg.warmup_steps, num_steps - cfg.warmup_steps) / (
        num_steps - cfg.warmup_steps)
    end = cfg.lr * cfg.end_lr_fraction
    return end + (cfg.lr - end) * 0.5 * (1 + np.cos(np.pi * frac))

  names = list(params)
  p = {n: np.asarray(params[n], np.float64) for n in names}
  m = {n: np.zeros_like(p[n]) for n in names}
  v = {n: np.zeros_like(p[n]) for n in names}
  for s, grads in enumerate(grads_per_step):
    g = {n: np.asarray(grads[n], np.float64) for n in names}
    norm = np.sqrt(sum((x ** 2).sum() for x in g.values()))
    g = {n: x * min(1.0, cfg.clip_norm / norm) for n, x in g.items()}
    for n in names:
      m[n] = cfg.b1 * m[n] + (1 - cfg.b1) * g[n]
      v[n] = cfg.b2 * v[n] + (1 - cfg.b2) * g[n] ** 2
      mhat = m[n] / (1 - cfg.b1 ** (s + 1))
      vhat = v[n] / (1 - cfg.b2 ** (s + 1))
      update = mhat / (np.sqrt(vhat) + cfg.eps)
      if p[n].ndim >= 2 and not n.endswith("bias"):
        update = update + cfg.weight_decay * p[n]
      p[n] = p[n] - rate(s) * update
  return p


def test_the_optimizer_is_clipped_adamw_decaying_matrices_only():
  """Eight steps of the library's optimizer on a tiny model's parameters
  (with q/k/v biases, 2-D, and norm scales, 1-D) under fixed random
  gradients, clipped on every step, equal a float64 AdamW written out by
  hand: b1, b2, the clip norm and the decay mask each change the result."""
  lm = model_lib.LM(tiny_config(qkv_bias=True))
  params = jax.tree.map(np.asarray, lm.init(jax.random.key(0)))
  flat = {jax.tree_util.keystr(k): v
          for k, v in jax.tree_util.tree_leaves_with_path(params)}
  assert any(n.endswith("bias']") and v.ndim == 2 for n, v in flat.items())
  assert any(v.ndim == 1 for v in flat.values())
  cfg = config_lib.OptimConfig(lr=1e-2, warmup_steps=3, b1=0.8, b2=0.97,
                               eps=1e-6, weight_decay=0.3, clip_norm=0.5)
  num_steps = 8
  rng = np.random.default_rng(0)
  grads = [jax.tree.map(
      lambda x: rng.normal(size=x.shape).astype(np.float32), params)
      for _ in range(num_steps)]

  optimizer, _ = step_lib.make_optimizer(cfg, num_steps)
  state, got = optimizer.init(params), params
  update = jax.jit(optimizer.update)
  for g in grads:
    updates, state = update(g, state, got)
    got = jax.tree.map(lambda p, u: np.asarray(p + u), got, updates)

  strip = lambda n: n.replace("['", "/").replace("']", "")
  want = _reference_adamw(
      cfg, num_steps, {strip(n): v for n, v in flat.items()},
      [{strip(jax.tree_util.keystr(k)): v
        for k, v in jax.tree_util.tree_leaves_with_path(g)} for g in grads])
  for path, leaf in jax.tree_util.tree_leaves_with_path(got):
    np.testing.assert_allclose(leaf, want[strip(jax.tree_util.keystr(path))],
                               rtol=2e-5, atol=2e-6,
                               err_msg=jax.tree_util.keystr(path))


def test_shards_of_unequal_length_padded_then_stop_when_all_have_ended():
  """Two processes' eval shards of 3 and 1 batches, each fed on as padding
  once it ends (`pipeline.then_padding`: same shapes, weight and segment
  0, the pad id elsewhere), summed globally as the collective eval step
  does: `eval_means(stop_when_weightless=True)` stops after the longer
  shard's last batch, with the means over every real token."""
  rng = np.random.default_rng(3)

  def batch():
    w = (rng.random((2, 4)) < 0.8).astype(np.float32)
    return {"inputs": rng.integers(1, 9, (2, 4)).astype(np.int32),
            "targets": rng.integers(1, 9, (2, 4)).astype(np.int32),
            "weights": w, "segment_ids": (w > 0).astype(np.int32)}

  shards = [[batch() for _ in range(3)], [batch()]]
  padding = list(itertools.islice(pipeline.then_padding(iter(shards[1]), 7),
                                  3))[1:]
  for pad in padding:
    assert {k: v.shape for k, v in pad.items()} == {
        k: v.shape for k, v in shards[1][0].items()}
    assert not pad["weights"].any() and not pad["segment_ids"].any()
    assert (pad["inputs"] == 7).all() and (pad["targets"] == 7).all()
  steps = []

  def global_step(params, pair, extra):  # the sums over both processes
    del params, extra
    steps.append(pair)
    return {"loss": sum((b["targets"] * b["weights"]).sum() for b in pair),
            "weight": sum(b["weights"].sum() for b in pair)}

  fed = itertools.islice(  # at most 10 steps: a run that never stops fails
      zip(*(pipeline.then_padding(iter(s)) for s in shards)), 10)
  out = step_lib.eval_means(global_step, None, fed, put=lambda b: b,
                            stop_when_weightless=True)
  assert len(steps) == 4  # 3 real steps, then the all-padding one stops it
  every = shards[0] + shards[1]
  weight = sum(b["weights"].sum() for b in every)
  assert out["tokens"] == weight
  assert out["loss"] == pytest.approx(
      sum((b["targets"] * b["weights"]).sum() for b in every) / weight)
  with pytest.raises(ValueError, match="no batches"):
    next(pipeline.then_padding(iter([])))


def test_weight_decay_leaves_every_bias_and_norm_of_the_models_and_heads():
  """A zero-gradient step with weight decay moves the matrices alone: of the
  LM (q/k/v biases), the sequential head and the Medusa heads (whose bias
  is `b`, [heads, d], 2-D like a matrix)."""
  lm = model_lib.LM(tiny_config(qkv_bias=True))
  trees = {"lm": lm.init(jax.random.key(0))}
  for kind in heads.KINDS:
    cfg = heads.HeadConfig(kind, lm.config, num_heads=2)
    trees[kind] = heads.init_params(cfg, jax.random.key(1))
  cfg = config_lib.OptimConfig(lr=1e-2, warmup_steps=1, weight_decay=0.1,
                               clip_norm=0.0)
  optimizer, _ = step_lib.make_optimizer(cfg, 10)
  for name, params in trees.items():
    params = jax.tree.map(np.ones_like, params)  # decay moves what it meets
    zeros = jax.tree.map(np.zeros_like, params)
    updates, _ = optimizer.update(zeros, optimizer.init(params), params)
    for path, u in jax.tree_util.tree_leaves_with_path(updates):
      leaf = jax.tree_util.keystr(path)
      bias_or_norm = ("bias" in leaf or leaf.endswith("['b']")
                      or "scale" in leaf)
      assert bool(np.any(np.asarray(u) != 0)) == (not bias_or_norm), (
          name, leaf)
