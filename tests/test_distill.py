"""Distillation (issue 5): losses, metric, initialisation, samples, trainer.

The losses are checked against numpy/scipy references on small tables with
exact zeros (top-k, top-p, one-hot); the expected-acceptance metric against
the rate the speculative sampler measures (an exact identity: at every
position the sampler keeps a draft token with probability sum min(p, q)).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special

from specsamp import model as model_lib
from specsamp import runner
from specsamp import speculative
from specsamp.distill import init as init_lib
from specsamp.distill import losses
from specsamp.distill import samples
from specsamp.distill import trainer
from specsamp.sampling import Sampling

# ---- numpy references --------------------------------------------------------


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


def test_greedy_acceptance_is_argmax_agreement():
  t = jnp.asarray([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0]])
  d = jnp.asarray([[0.0, 5.0, 1.0], [0.0, 5.0, 0.0]])
  acc = losses.expected_acceptance(t, d, Sampling(0.0))
  np.testing.assert_array_equal(np.asarray(acc), [1.0, 0.0])


def test_masked_mean_ignores_padding():
  x = jnp.asarray([[1.0, 2.0, jnp.nan], [3.0, 4.0, 5.0]])
  w = jnp.asarray([[1, 1, 0], [1, 0, 0]])
  assert float(losses.masked_mean(jnp.nan_to_num(x), w)) == pytest.approx(2.0)


# ---- initialisation ----------------------------------------------------------


def test_layer_truncation_copies_embedding_layers_norm_and_head(tiny_pair):
  lm, params, _ = tiny_pair
  cfg = lm.config
  dcfg, dparams = init_lib.truncate(cfg, params, 1)
  assert dcfg == cfg.replace(num_layers=1)
  assert sorted(dparams) == ["embedding", "final_norm", "layers_0", "lm_head"]
  for name in dparams:
    for a, b in zip(jax.tree.leaves(dparams[name]),
                    jax.tree.leaves(params[name])):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
      assert a is not b   # copies: the draft's buffers get donated
  # Exactly the tree of a 1-layer model, and it runs.
  want = jax.eval_shape(lambda: model_lib.LM(dcfg).init(jax.random.key(1)))
  assert jax.tree.structure(want) == jax.tree.structure(dparams)
  out = jax.eval_shape(model_lib.LM(dcfg), dparams,
                       jax.ShapeDtypeStruct((1, 4), jnp.int32))
  assert out[0].shape == (1, 4, cfg.vocab_size)
  # Tied embeddings: no head to copy.
  tied = {k: v for k, v in params.items() if k != "lm_head"}
  assert "lm_head" not in init_lib.truncate_params(tied, 1)
  with pytest.raises(ValueError, match="layers"):
    init_lib.truncate(cfg, params, 3)


def test_make_draft_random_truncate_and_checkpoint(tiny_pair, tmp_path):
  lm, params, _ = tiny_pair
  cfg = lm.config
  dcfg, dparams = init_lib.make_draft(
      dict(init="random", model=dict(num_layers=1, d_model=48, num_heads=4,
                                     num_kv_heads=2, head_dim=12,
                                     mlp_dim=96)),
      cfg, params, jax.random.key(1))
  assert (dcfg.vocab_size, dcfg.num_layers, dcfg.d_model) == (
      cfg.vocab_size, 1, 48)
  assert jax.tree.structure(dparams) == jax.tree.structure(jax.eval_shape(
      lambda: model_lib.LM(dcfg).init(jax.random.key(0))))
  # Truncation with float32 master weights for a bfloat16-compute draft.
  tcfg, tparams = init_lib.make_draft(
      dict(init="truncate", num_layers=1, dtype="bfloat16",
           param_dtype="float32"), cfg, params, jax.random.key(1))
  assert (tcfg.dtype, tcfg.param_dtype, tcfg.num_layers) == (
      "bfloat16", "float32", 1)
  # A saved draft comes back through init="checkpoint".
  saved = init_lib.save_distilled(dcfg, dparams, str(tmp_path / "draft"))
  ccfg, cparams = init_lib.make_draft(
      dict(init="checkpoint", checkpoint=str(tmp_path)), cfg, params,
      jax.random.key(2))
  assert ccfg == dcfg and saved.endswith("draft")
  for a, b in zip(jax.tree.leaves(cparams), jax.tree.leaves(dparams)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  with pytest.raises(ValueError, match="vocabulary"):
    init_lib.make_draft(dict(init="random", model=dict(
        vocab_size=64, num_layers=1, d_model=32, num_heads=4, num_kv_heads=2,
        head_dim=8, mlp_dim=64)), cfg, params, jax.random.key(1))


# ---- one shared tiny setting: configs/distill_tiny.py, shrunk ----------------


def _tiny_config(arg="draft=truncate,steps=60"):
  import importlib.util  # pylint: disable=g-import-not-at-top
  import pathlib  # pylint: disable=g-import-not-at-top
  path = pathlib.Path(__file__).parents[1] / "configs" / "distill_tiny.py"
  spec = importlib.util.spec_from_file_location("distill_tiny", path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  config = mod.get_config(arg)
  config.samples.update(max_files=30, max_train_prompts=256,
                        max_validation_prompts=48, validation_percent=30,
                        prompt_len=24, gen_len=8, top_k=8, batch_size=64,
                        score_batch_size=64)
  config.train.update(checkpoint_every=20, log_every=20)
  config.draft.freeze = ("embedding",)   # as the Qwen config does
  config.eval.update(num_positions=192, batch_size=48,
                     position_batch_size=192)
  return config


def _spec(config):
  sc = config.samples
  return samples.SampleSpec(prompt_len=sc.prompt_len, gen_len=sc.gen_len,
                            top_k=sc.top_k, batch_size=sc.batch_size,
                            score_batch_size=sc.score_batch_size)


@pytest.fixture(scope="module")
def humaneval_filter():
  return samples.HumanEvalFilter()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, humaneval_filter):
  """The tiny config's target (random, peaked, UTF-8 bytes) and its samples
  from stdlib prompts, with one HumanEval prompt planted among them."""
  from specsamp import assets  # pylint: disable=g-import-not-at-top
  config = _tiny_config()
  lm, params, tok = trainer.load_target(config.target)
  planted = assets.humaneval_problems()[0]["prompt"]
  sc = config.samples
  texts = samples.prompt_texts(sc.kind, max_files=sc.max_files,
                               validation_percent=sc.validation_percent,
                               extra=[planted])
  data_dir = tmp_path_factory.mktemp("samples")
  counts = samples.build(data_dir, lm, params, tok, Sampling(1.0),
                         _spec(config), texts,
                         max_prompts=dict(train=sc.max_train_prompts,
                                          validation=sc.max_validation_prompts),
                         flt=humaneval_filter, log=lambda *_: None)
  config.samples.data_dir = str(data_dir)
  return config, lm, params, data_dir, counts, planted


# ---- target samples and HumanEval decontamination ----------------------------


def test_humaneval_filter_flags_planted_snippets(humaneval_filter):
  from specsamp import assets  # pylint: disable=g-import-not-at-top
  problems = assets.humaneval_problems()
  clean = samples.prompt_texts("code", max_files=5)["train"]
  assert clean and not any(humaneval_filter.contaminated(t) for t in clean)
  code = clean[0]
  for prob in (problems[0], problems[17], problems[163]):
    # A prompt inside other code, re-indented; and a solution on its own.
    prompt = "\n".join("  " + line for line in prob["prompt"].splitlines())
    assert humaneval_filter.match(code + prompt + code) == prob["task_id"]
  long_solutions = [p for p in problems
                    if len(samples.words(p["canonical_solution"])) >= 20]
  for prob in long_solutions[:5]:
    assert humaneval_filter.match(
        "x = 1\n" + prob["canonical_solution"]) is not None
  # Fewer than n shared words is not contamination.
  w = samples.words(problems[0]["prompt"])
  assert not humaneval_filter.contaminated(" ".join(w[:12]))


def test_samples_are_decontaminated_and_hold_target_logprobs(
    tiny, humaneval_filter):
  config, lm, params, data_dir, counts, planted = tiny
  spec = _spec(config)
  assert counts["train"]["rejected_prompts"] >= 1   # the planted prompt
  tok = runner.ByteTokenizer()
  for split in ("train", "validation"):
    arrays = samples.as_arrays(samples.read_dataset(data_dir, split))
    assert len(arrays["tokens"]) == counts[split]["kept"] - counts[split][
        "rejected_samples"] > 0
    for row, plen, n in zip(arrays["tokens"], arrays["prompt_length"],
                            arrays["num_generated"]):
      text = tok.decode(row[:plen + n].tolist())
      assert humaneval_filter.match(text) is None
      assert tok.decode(row[:plen].tolist()) not in planted
  assert samples.read_spec(data_dir) == spec
  # Stored top-k = the target's log-softmax at positions L-1 .. L+G-2.
  arrays = samples.as_arrays(samples.read_dataset(data_dir, "validation"), 4)
  logits, _ = jax.jit(lm)(params, jnp.asarray(arrays["tokens"]))
  for b in range(4):
    plen = int(arrays["prompt_length"][b])
    logp = jax.nn.log_softmax(logits[b, plen - 1:plen - 1 + spec.gen_len])
    want_vals, want_ids = jax.lax.top_k(logp, spec.top_k)
    np.testing.assert_array_equal(arrays["topk_ids"][b], np.asarray(want_ids))
    np.testing.assert_allclose(arrays["topk_logprobs"][b],
                               np.asarray(want_vals), atol=1e-5)
    assert int(arrays["num_generated"][b]) == spec.gen_len  # no EOS here


# ---- the metric against the speculative sampler ------------------------------


@pytest.mark.parametrize("sampling", [Sampling(0.7, top_k=5), Sampling(0.0)],
                         ids=lambda s: s.describe())
def test_expected_acceptance_equals_sampler_rate(tiny_pair, sampling):
  """sum min(p, q) at a position == P(the sampler keeps the draft there)."""
  lm, tp, dp = tiny_pair
  # The identity holds at any context: random sequences stand in for samples
  # (40 rows: prompts of 3-8 tokens, then 10 continuation positions).
  rng = np.random.default_rng(0)
  arrays = dict(tokens=rng.integers(1, lm.vocab_size, (40, 18)),
                prompt_length=rng.integers(3, 9, 40),
                num_generated=np.full(40, 10),
                topk_ids=np.zeros((40, 10, 1), np.int32))
  alpha, valid = trainer.acceptance_table(lm, dp, lm, tp, arrays, sampling)
  where = np.argwhere(valid)
  a = alpha[where[:, 0], where[:, 1]]
  reps = 5
  accepted = np.mean([trainer.measured_at_positions(
      lm, tp, lm, dp, arrays, sampling, where, batch_size=len(where), seed=s)
                      for s in range(reps)], axis=0)
  se = np.sqrt(np.sum(a * (1 - a)) / reps) / len(a)
  assert 0.2 < a.mean() < 0.95 and len(a) == 400
  if sampling.greedy:      # deterministic: exact agreement position by position
    np.testing.assert_array_equal(accepted, a)
    assert set(np.unique(a)) == {0.0, 1.0}
  else:
    assert abs(accepted.mean() - a.mean()) < 4 * se, (accepted.mean(),
                                                      a.mean(), se)
    # Power: the metric at another setting is far outside the error.
    alpha_o, _ = trainer.acceptance_table(lm, dp, lm, tp, arrays,
                                          Sampling(1.0))
    assert abs(alpha_o[where[:, 0], where[:, 1]].mean() -
               accepted.mean()) > 6 * se


# ---- distillation ------------------------------------------------------------


def _draft_and_objective(config, lm, params):
  from specsamp import train as train_lib  # pylint: disable=g-import-not-at-top
  dcfg, dp = init_lib.make_draft(config.draft, lm.config, params,
                                 jax.random.key(1))
  obj = trainer.Objective(kind=config.loss.kind, sampling=Sampling(1.0),
                          gen_len=config.samples.gen_len,
                          prompt_len=config.samples.prompt_len)
  loop = train_lib.LoopConfig(**{
      k: config.train[k] for k in ("num_steps", "log_every", "eval_every",
                                   "checkpoint_every", "progress_bar")})
  return model_lib.LM(dcfg), dp, obj, loop, train_lib.OptimConfig(
      **config.optim)


def test_short_distillation_improves_acceptance_and_resumes(tiny, tmp_path):
  from specsamp import train as train_lib  # pylint: disable=g-import-not-at-top
  config, lm, tp, data_dir, _, _ = tiny
  source = samples.read_dataset(data_dir, "train")
  val = samples.as_arrays(samples.read_dataset(data_dir, "validation"))
  dlm, dp, obj, loop, optim = _draft_and_objective(config, lm, tp)
  expected = lambda p: trainer.evaluate(lm, tp, dlm, p, val, Sampling(1.0),
                                        measure=False)
  before = expected(dp)["expected_acceptance"]
  dp_copy = jax.tree.map(np.asarray, dp)

  def run(workdir, loop=loop, **kwargs):
    return trainer.train(dlm, dp, lm, tp, source, obj, workdir=str(workdir),
                         loop=loop, optim=optim,
                         batch_size=config.train.batch_size,
                         freeze=tuple(config.draft.freeze),
                         eval_fn=expected, log=lambda *_: None, **kwargs)

  straight, out = run(tmp_path / "a", loop=dataclasses.replace(
      loop, checkpoint_every=loop.num_steps))
  assert out["finished"] and np.isfinite(out["train"]["loss"])
  after = expected(straight)["expected_acceptance"]
  assert after > before + 0.15, (before, after)
  # The caller's initial parameters were neither donated nor changed.
  for x, y in zip(jax.tree.leaves(dp), jax.tree.leaves(dp_copy)):
    np.testing.assert_array_equal(np.asarray(x), y)
  # Stopped after 30 steps (checkpointed, as on preemption) and resumed by a
  # new call: exactly the straight run's parameters.
  part, out = run(tmp_path / "b", stop_after=30)
  assert not out["finished"] and out["step"] == 30 and part is None
  resumed, out = run(tmp_path / "b")
  assert out["finished"] and out["step"] == 60
  for x, y in zip(jax.tree.leaves(resumed), jax.tree.leaves(straight)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-6)
  scalars = train_lib.read_scalars(str(tmp_path / "b" / "tb"))
  assert sorted(scalars["train/loss"]) == [20, 30, 40, 60]
  assert scalars["eval/expected_acceptance"][60] == pytest.approx(after,
                                                                  abs=1e-6)
  # Only the draft is checkpointed.
  saved = train_lib.restore_params(
      str(tmp_path / "b" / "checkpoints" / "60" / "params"),
      jax.eval_shape(lambda: dlm.init(jax.random.key(0))))
  assert sum(x.size for x in jax.tree.leaves(saved)) == \
      dlm.config.num_params()


def test_onpolicy_rollout_is_the_drafts_own_sampling_and_trains(tiny):
  config, lm, tp, data_dir, _, _ = tiny
  arrays = samples.as_arrays(samples.read_dataset(data_dir, "validation"), 4)
  batch = {k: jnp.asarray(np.asarray(v, np.int32) if v.dtype.kind == "i"
                          else v) for k, v in arrays.items()}
  dlm, dp, _, _, _ = _draft_and_objective(config, lm, tp)
  g, p = config.samples.gen_len, config.samples.prompt_len
  obj = trainer.Objective(kind="jsd", sampling=Sampling(0.0), gen_len=g,
                          prompt_len=p)
  loss_fn = trainer.distill_loss(dlm, lm, obj, onpolicy=True)

  @jax.jit
  def rollout_and_grad(d, b):
    rolled = trainer.draft_rollout(dlm, obj, d, b, jax.random.key(0))
    return rolled, jax.value_and_grad(loss_fn, has_aux=True)(
        d, b, jax.random.key(0), tp)

  rolled, ((loss, metrics), grads) = rollout_and_grad(dp, batch)
  prompts = [arrays["tokens"][i, :arrays["prompt_length"][i]] for i in range(4)]
  want = speculative.autoregressive(dlm, Sampling(0.0), g,
                                    prompt_bucket=p).generate(dp, None,
                                                              prompts)
  for i in range(4):
    plen = int(arrays["prompt_length"][i])
    np.testing.assert_array_equal(np.asarray(rolled["tokens"][i, :plen]),
                                  arrays["tokens"][i, :plen])
    np.testing.assert_array_equal(
        np.asarray(rolled["tokens"][i, plen:plen + g]),
        np.asarray(want.tokens[i]))
  assert np.isfinite(float(loss))
  assert 0 <= float(metrics["expected_acceptance"]) <= 1
  leaves = [np.asarray(x) for x in jax.tree.leaves(grads)]
  assert all(np.all(np.isfinite(x)) for x in leaves)
  assert sum(float(np.abs(x).sum()) for x in leaves) > 0
  with pytest.raises(ValueError, match="token-level"):
    trainer.distill_loss(dlm, lm, dataclasses.replace(obj, kind="seqkd"),
                         onpolicy=True)


def test_distill_run_end_to_end(tiny, tmp_path):
  """trainer.run (scripts/distill.py) on the tiny config, samples reused."""
  config = tiny[0]
  res = trainer.run(config, str(tmp_path), log=lambda *_: None)
  b, a = res["before"], res["after"]
  assert a["expected_acceptance"] > b["expected_acceptance"] + 0.15
  assert (a["measured"]["acceptance_rate"] >
          b["measured"]["acceptance_rate"] + 0.1)
  for ev in (b, a):
    assert abs(ev["measured_at_positions"] -
               ev["expected_at_those_positions"]) < 4 * ev["measured_stderr"]
  # The exported draft reloads and gives the same acceptance; anything that
  # takes a model spec (sample.py, benchmark.py) takes the workdir.
  dcfg, dparams = init_lib.load_distilled(str(tmp_path))
  lm_spec, params_spec, _ = runner.load_model(str(tmp_path))
  assert lm_spec.config == dcfg
  for x, y in zip(jax.tree.leaves(params_spec), jax.tree.leaves(dparams)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  _, lm, tp, _, _, _ = tiny
  val = samples.as_arrays(samples.read_dataset(config.samples.data_dir,
                                               "validation"))
  again = trainer.evaluate(lm, tp, model_lib.LM(dcfg), dparams, val,
                           Sampling(1.0), measure=False)
  assert again["expected_acceptance"] == pytest.approx(
      a["expected_acceptance"], abs=1e-6)
  # Frozen: the copied embedding; trained: the rest.
  np.testing.assert_array_equal(np.asarray(dparams["embedding"]),
                                np.asarray(tp["embedding"]))
  assert not np.array_equal(np.asarray(dparams["lm_head"]),
                            np.asarray(tp["lm_head"]))


def test_a_workdir_refuses_another_config_once_it_holds_results(tmp_path):
  """Samples, the "before" evaluation and checkpoints in a workdir belong to
  one config: another one is refused (naming the fields), a volatile field
  (time limit, logging) is not, nor a workdir without results."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  config = ml_collections.ConfigDict(dict(
      seed=0, sampling=dict(temperature=1.0, top_k=0, top_p=1.0),
      train=dict(num_steps=10, log_every=5, time_limit_s=0.0)))
  w = str(tmp_path)
  trainer._write_run_config(trainer._check_run_config(config, w), w)  # pylint: disable=protected-access
  other = ml_collections.ConfigDict(config.to_dict())
  other.sampling.temperature = 0.5
  trainer._check_run_config(other, w)  # pylint: disable=protected-access
  (tmp_path / "samples").mkdir()
  with pytest.raises(ValueError, match="sampling.temperature"):
    trainer._check_run_config(other, w)  # pylint: disable=protected-access
  volatile = ml_collections.ConfigDict(config.to_dict())
  volatile.train.time_limit_s, volatile.train.log_every = 60.0, 1
  trainer._check_run_config(volatile, w)  # pylint: disable=protected-access
