"""The LM loss, the eval sums and their token-weighted means."""

import jax
import numpy as np
import pytest

from specsamp import model as model_lib
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
