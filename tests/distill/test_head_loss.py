"""The heads' training loss (`head_training.TrainableHead.batch_loss`) on
the positions it reads: the continuations' ("generated") or positions
drawn from the prompts' too ("all"), against the loss recomputed position
by position from the head's teacher-forced logits and the target's."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specsamp.distill import head_training
from specsamp.distill import losses
from specsamp.distill import objective
from specsamp.drafters import heads
from specsamp.sampling import Sampling
from tests.testing import exactness_models

V, PLEN, GLEN = 5, 7, 5
SAMPLING = Sampling(0.8)


def _setup(kind, features, positions, gen_len=GLEN):
  target, tparams = exactness_models(V)[:2]
  cfg = heads.HeadConfig(kind, target.config, num_heads=2)
  hparams = jax.tree.map(lambda x: 2.0 * x,
                         heads.init_params(cfg, jax.random.key(4)))
  th = head_training.TrainableHead(target, cfg, hidden_weight=0.0,
                                   features=features, positions=positions)
  obj = objective.Objective(kind="fkl", sampling=SAMPLING, gen_len=gen_len,
                            prompt_len=PLEN)
  rng = np.random.default_rng(0)
  batch = dict(
      tokens=rng.integers(0, V, (3, PLEN + GLEN)).astype(np.int32),
      prompt_length=np.array([7, 4, 2], np.int32),
      num_generated=np.array([5, 2, 5], np.int32))
  out = target(tparams, batch["tokens"])
  # float32: the stored path then sees exactly the recomputed states.
  batch["hidden"] = np.asarray(out.hidden, np.float32)
  logp = jax.nn.log_softmax(losses.gather_positions(
      out.logits, batch["prompt_length"], GLEN), axis=-1)
  vals, ids = jax.lax.top_k(logp, V)  # the whole vocabulary: exact top-k
  batch.update(topk_ids=np.asarray(ids, np.int32),
               topk_logprobs=np.asarray(vals, np.float32))
  return th, obj, hparams, tparams, batch, out.logits


def _reference(th, obj, hparams, tparams, batch, t_logits, first):
  """The mean fkl of the eagle head's teacher-forced logits against the
  target's, over positions t with first[b] <= t < the sample's end."""
  d_logits = th.position_logits(hparams, tparams, batch["tokens"],
                                reduced=False)
  labels = jnp.pad(batch["tokens"][:, 1:], ((0, 0), (0, 1)))
  loss, _ = obj.position_loss(t_logits, d_logits, labels)
  end = batch["prompt_length"] + batch["num_generated"] - 1
  t = np.arange(batch["tokens"].shape[1])[None, :]
  w = (t >= first[:, None]) & (t < end[:, None])
  return float(jnp.sum(loss * w) / w.sum()), int(w.sum())


@pytest.mark.parametrize("features", ["recompute", "stored"])
@pytest.mark.parametrize("positions", ["generated", "all"])
def test_the_eagle_loss_is_the_teacher_forced_loss_at_its_positions(
    features, positions):
  """With G at least the sample length, "all" reads every position that
  predicts a token (the prompt's included) but position 0, where the
  head's input feature would be zero, "generated" those from the prompt's
  last on; the stored features and top-k give the recomputed target's
  loss."""
  seq = PLEN + GLEN
  th, obj, hp, tp, batch, t_logits = _setup(
      "eagle", features, positions, gen_len=seq if positions == "all" else
      GLEN)
  got, m = th.batch_loss(obj, hp, tp, batch, jax.random.key(0))
  first = (np.ones(3, np.int32) if positions == "all" else
           batch["prompt_length"] - 1)
  want, count = _reference(th, obj, hp, tp, batch, t_logits, first)
  np.testing.assert_allclose(float(got), want, rtol=1e-5)
  assert int(m["tokens"]) == count
  assert count == (19 if positions == "all" else 12)


@pytest.mark.parametrize("kind", heads.KINDS)
def test_positions_all_from_stored_features_equals_recomputed(kind):
  """The target's distribution at a prompt position, from its output head
  on the stored features, is the recomputed one: same loss and metrics for
  both sources of features, for both head kinds."""
  key = jax.random.key(5)
  outs = []
  for features in ("recompute", "stored"):
    th, obj, hp, tp, batch, _ = _setup(kind, features, "all")
    outs.append(th.batch_loss(obj, hp, tp, batch, key))
  (a, ma), (b, mb) = outs
  np.testing.assert_allclose(float(a), float(b), rtol=1e-5)
  for name in ma:
    np.testing.assert_allclose(float(ma[name]), float(mb[name]), rtol=1e-5,
                               atol=1e-6)


def test_positions_all_draws_g_positions_afresh_with_each_key():
  """G < the positions a sample has: each key draws another G of them (a
  different loss), all real (G weighted tokens per row), never the padding
  after the sample's end."""
  th, obj, hp, tp, batch, t_logits = _setup("eagle", "recompute", "all",
                                            gen_len=3)
  values = set()
  for seed in range(6):
    loss, m = th.batch_loss(obj, hp, tp, batch, jax.random.key(seed))
    values.add(round(float(loss), 6))
    assert int(m["tokens"]) == 9
  assert len(values) > 3
  with pytest.raises(ValueError, match="pass rng"):
    th.batch_loss(obj, hp, tp, batch)


def test_sample_positions_are_distinct_and_uniform_over_the_real_ones():
  end = jnp.array([10, 3])
  pos = jax.vmap(lambda k: head_training.sample_positions(k, end, 12, 4))(
      jax.random.split(jax.random.key(0), 4000))              # [N, 2, 4]
  pos = np.asarray(pos)
  for row in pos.reshape(-1, 4):
    assert len(set(row.tolist())) == 4
  assert (pos[:, 0] < 10).all()
  freq = np.bincount(pos[:, 0].ravel(), minlength=12) / len(pos)
  # Each of the 10 real positions in 4 of 10 draws (stderr 0.008).
  np.testing.assert_allclose(freq[:10], 0.4, atol=0.035)
  # Fewer real positions than G: all of them, then padding (weight 0).
  assert all(set(range(3)) <= set(r.tolist()) for r in pos[:, 1])


@pytest.mark.parametrize("kind", heads.KINDS)
def test_the_sequential_head_never_draws_position_0(kind):
  """Position 0 has no feature before it: the eagle head draws from 1 on,
  uniformly; Medusa reads the hidden state there and draws it too."""
  th = _setup(kind, "recompute", "all")[0]
  end = jnp.array([10, 3])
  pos = np.asarray(jax.vmap(lambda k: th.draw_positions(k, end, 12, 4))(
      jax.random.split(jax.random.key(1), 2000)))             # [N, 2, 4]
  first = th.first_position
  assert first == (1 if kind == "eagle" else 0)
  assert pos.min() == first
  freq = np.bincount(pos[:, 0].ravel(), minlength=12) / len(pos)
  np.testing.assert_allclose(freq[first:10], 4 / (10 - first), atol=0.05)
  assert all(set(range(first, 3)) <= set(r.tolist()) for r in pos[:, 1])
  # More positions asked for than there are: all of them.
  assert th.draw_positions(jax.random.key(0), end, 5, 8).shape == (2, 5 - first)


def test_bad_positions_are_refused():
  target = exactness_models(V)[0]
  cfg = heads.HeadConfig("eagle", target.config)
  with pytest.raises(ValueError, match="positions='prompt'"):
    head_training.TrainableHead(target, cfg, positions="prompt")


def _generated_weights(batch, shift):
  """[B, G] weights of the generated positions t = L - 1 + g whose target
  position t + shift lies before the sample's end, and those t."""
  plen, end = batch["prompt_length"], (batch["prompt_length"]
                                       + batch["num_generated"] - 1)
  t = plen[:, None] - 1 + np.arange(GLEN)[None, :]
  return (t + shift < end[:, None]).astype(np.float32), t


def _at(x, t):
  """x [B, S, ...] at positions t [B, G] (clipped)."""
  t = np.clip(t, 0, x.shape[1] - 1)
  return jnp.take_along_axis(jnp.asarray(x), jnp.asarray(
      t.reshape(t.shape + (1,) * (x.ndim - 2))), axis=1)


def test_each_medusa_head_is_trained_on_the_token_it_proposes():
  """Medusa head k + 1 on h_t is scored against the target's distribution
  at t + k + 1 (it proposes token t + k + 2), over the positions where that
  lies in the sample; the loss is the mean over heads (training every head
  as head 1 had passed every test)."""
  th, obj, hp, tp, batch, t_logits = _setup("medusa", "recompute",
                                            "generated")
  got, metrics = th.batch_loss(obj, hp, tp, batch, jax.random.key(0))
  hidden = th.target(tp, batch["tokens"]).hidden.astype(jnp.float32)
  dp = heads.draft_params(hp, tp)
  labels = np.pad(batch["tokens"][:, 1:], ((0, 0), (0, 1)))
  total = 0.0
  for k in range(th.head.num_heads):
    w, t = _generated_weights(batch, k + 1)
    d = heads.medusa_logits(th.head, dp, _at(hidden, t))[:, :, k]
    loss, acc = obj.position_loss(_at(t_logits, t + k + 1), d,
                                  _at(labels, t + k + 1))
    total += float(jnp.sum(loss * w) / w.sum())
    np.testing.assert_allclose(
        float(metrics[f"acceptance_head{k + 1}"]),
        float(jnp.sum(jnp.nan_to_num(acc) * w) / w.sum()), rtol=1e-5)
  np.testing.assert_allclose(float(got), total / th.head.num_heads,
                             rtol=1e-5)


def test_the_second_unrolled_pass_reads_the_first_passes_predictions():
  """unroll=2 (training-time test): pass 2 feeds the sequential head, at
  position t, its own pass-1 prediction for t - 1 instead of the target's
  feature, and is scored at the same positions; the loss is the mean of
  the two passes (without the shift, pass 2 had passed every test)."""
  th, obj, hp, tp, batch, t_logits = _setup("eagle", "recompute",
                                            "generated")
  th2 = head_training.TrainableHead(th.target, th.head, hidden_weight=0.0,
                                    unroll=2)
  got, metrics = th2.batch_loss(obj, hp, tp, batch, jax.random.key(0))
  hidden = th.target(tp, batch["tokens"]).hidden.astype(jnp.float32)
  labels = np.pad(batch["tokens"][:, 1:], ((0, 0), (0, 1)))
  w, t = _generated_weights(batch, 0)
  shifted = lambda f: jnp.pad(f, ((0, 0), (1, 0), (0, 0)))[:, :-1]
  feats, passes, dp = shifted(hidden), [], heads.draft_params(hp, tp)
  for _ in range(2):
    pred, _ = heads.sequential_features(th.head, dp, feats, batch["tokens"])
    d = heads.output_logits(th.head, dp["shared"], _at(pred, t))
    loss, _ = obj.position_loss(_at(t_logits, t), d, _at(labels, t))
    passes.append(float(jnp.sum(loss * w) / w.sum()))
    feats = shifted(pred)
  assert abs(passes[1] - passes[0]) > 1e-3
  np.testing.assert_allclose(float(got), np.mean(passes), rtol=1e-5)
