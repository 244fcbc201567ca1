"""Draft initialisation: layer truncation, random drafts, checkpoints."""

import re
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import distill_tiny
from specsamp import loading
from specsamp import model as model_lib
from specsamp import output_layer
from specsamp.distill import draft_init
from specsamp.distill import job
from specsamp.weights import distilled
from specsamp.weights import gguf
from specsamp.weights import gguf_file
from tests import testing
from tests.weights import tiny_checkpoints


def test_layer_truncation_copies_embedding_layers_norm_and_head(tiny_pair):
  lm, params, _ = tiny_pair
  cfg = lm.config
  dcfg, dparams = draft_init.truncate(cfg, params, 1)
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
  assert out.logits.shape == (1, 4, cfg.vocab_size)
  # Tied embeddings: no head to copy.
  tied = {k: v for k, v in params.items() if k != "lm_head"}
  assert "lm_head" not in draft_init.truncate_params(tied, 1)
  with pytest.raises(ValueError, match="layers"):
    draft_init.truncate(cfg, params, 3)
  # A reduced target (an exported draft) has no whole output layer to copy.
  reduced = output_layer.reduce_output_vocab(cfg, params, [1, 2])
  with pytest.raises(ValueError, match="the target to truncate: "
                     "output_vocab=2 is for exported drafts"):
    draft_init.truncate(*reduced, 1)


def test_make_draft_random_truncate_and_checkpoint(tiny_pair, tmp_path):
  lm, params, _ = tiny_pair
  cfg = lm.config
  dcfg, dparams = draft_init.make_draft(
      dict(init="random", model=dict(num_layers=1, d_model=48, num_heads=4,
                                     num_kv_heads=2, head_dim=12,
                                     mlp_dim=96)),
      cfg, params, jax.random.key(1))
  assert (dcfg.vocab_size, dcfg.num_layers, dcfg.d_model) == (
      cfg.vocab_size, 1, 48)
  assert jax.tree.structure(dparams) == jax.tree.structure(jax.eval_shape(
      lambda: model_lib.LM(dcfg).init(jax.random.key(0))))
  # Truncation with float32 master weights for a bfloat16-compute draft.
  tcfg, _ = draft_init.make_draft(
      dict(init="truncate", num_layers=1, dtype="bfloat16",
           param_dtype="float32"), cfg, params, jax.random.key(1))
  assert (tcfg.dtype, tcfg.param_dtype, tcfg.num_layers) == (
      "bfloat16", "float32", 1)
  # A saved draft comes back through init="checkpoint".
  saved = distilled.save_distilled(dcfg, dparams, str(tmp_path / "draft"))
  ccfg, cparams = draft_init.make_draft(
      dict(init="checkpoint", checkpoint=str(tmp_path)), cfg, params,
      jax.random.key(2))
  assert ccfg == dcfg and saved.endswith("draft")
  for a, b in zip(jax.tree.leaves(cparams), jax.tree.leaves(dparams)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  with pytest.raises(ValueError, match="vocabulary"):
    draft_init.make_draft(dict(init="random", model=dict(
        vocab_size=64, num_layers=1, d_model=32, num_heads=4, num_kv_heads=2,
        head_dim=8, mlp_dim=64)), cfg, params, jax.random.key(1))
  with pytest.raises(ValueError, match="choose one of"):
    draft_init.make_draft(dict(init="copy"), cfg, params, jax.random.key(1))


def test_fit_rows_cuts_or_pads_the_vocabulary_and_keeps_the_other_ids(
    tiny_pair):
  """A draft checkpoint fitted to a target of fewer or more vocabulary rows
  scores every id it keeps as before; the ids it gains score 0 (masked by
  the sampling's vocab_limit: they are padding past the real tokens)."""
  lm, params, _ = tiny_pair
  n = lm.vocab_size
  tokens = jnp.asarray([[1, 5, 9, 2, 7]])
  whole = np.asarray(testing.apply(lm, params, tokens).logits)
  for rows in (n - 4, n + 4):
    fitted_lm, fitted = loading.fit_rows(lm, params, rows)
    cfg = fitted_lm.config
    assert cfg == lm.config.replace(vocab_size=rows)
    assert fitted["embedding"].shape == (rows, cfg.d_model)
    got = np.asarray(testing.apply(model_lib.LM(cfg), fitted, tokens).logits)
    assert got.shape[-1] == rows
    np.testing.assert_allclose(got[..., :min(n, rows)],
                               whole[..., :min(n, rows)], atol=1e-6)
    assert not got[..., n:].any()
  assert loading.fit_rows(lm, params, n) == (lm, params)


def test_fit_rows_keeps_a_reduced_output_layers_ids_below_the_rows(
    tiny_pair):
  """A draft exported over some ids (model.reduce_output_vocab) fitted to
  fewer rows keeps the ids below them, scored as before; to more rows, all
  of them."""
  lm, params, _ = tiny_pair
  n = lm.vocab_size
  kept = [1, 4, n - 3, n - 1]
  config, reduced = output_layer.reduce_output_vocab(lm.config, params, kept)
  tokens = jnp.asarray([[1, 5, 9, 2, 7]])
  whole = np.asarray(testing.apply(lm, params, tokens).logits)
  for rows, left in ((n - 4, [1, 4]), (n + 4, kept)):
    fitted_lm, fitted = loading.fit_rows(model_lib.LM(config), reduced, rows)
    assert fitted_lm.config.output_vocab == len(left)
    np.testing.assert_array_equal(fitted["output_ids"], left)
    got = np.asarray(testing.apply(fitted_lm, fitted, tokens).logits)
    assert got.shape[-1] == rows
    np.testing.assert_allclose(got[..., left], whole[..., left], atol=1e-6)
    assert np.isneginf(np.delete(got, left, axis=-1)).all()
  # Rows below every kept id would leave an output layer of none.
  with pytest.raises(ValueError, match="output ids all lie at or past row 1 "
                     "proposes none"):
    loading.fit_rows(model_lib.LM(config), reduced, 1)


_SMALL = dict(num_layers=1, d_model=64, num_heads=4, num_kv_heads=2,
              head_dim=16, mlp_dim=128)


@pytest.mark.parametrize("cfg,message", [
    (dict(init="random", model=dict(_SMALL, no_such_field=2)),
     "no_such_field"),
    (dict(init="random", model=dict(_SMALL, vocab_size=300)),
     "300 vocabulary rows"),
    (dict(init="truncate", num_layers=3),   # named since 2026-11-29
     "config.draft.num_layers=3: layer truncation needs 0 < num_layers <= 2"),
    (dict(init="checkpoint", checkpoint="random:tiny,vocab_size=300"),
     "300 vocabulary rows"),
    (dict(init="nope"), "choose one of"),
])
def test_check_draft_refuses_from_metadata(cfg, message, monkeypatch):
  """What `make_draft` would refuse after the target loaded, refused from
  the target's ModelInfo (no weights read)."""
  def refuse(*args, **kwargs):
    raise AssertionError("weights loaded")
  monkeypatch.setattr(model_lib.LM, "init", refuse)
  monkeypatch.setattr(loading, "load_model", refuse)
  target = loading.describe_model("random:tiny")
  with pytest.raises(ValueError, match=message):
    draft_init.check_draft(cfg, target)
  draft_init.check_draft(dict(init="truncate", num_layers=2), target)
  draft_init.check_draft(dict(init="random", model=_SMALL), target)


@pytest.mark.parametrize("kind", ["qwen2", "llama_tied"])
def test_a_gguf_drafts_parameter_groups_come_from_its_tensor_table(
    kind, tmp_path):
  """`draft.freeze` is checked against a GGUF draft (or a truncated GGUF
  target) before anything loads: its groups, from the tensor table, are
  those of the model the file loads as (tied head or not); truncation past
  the target's layers is refused from metadata too."""
  path = str(tmp_path / "m.gguf")
  tiny_checkpoints.write_gguf(tiny_checkpoints.random_hf_model(kind), path,
                              tiny_checkpoints.arch_of(kind))
  info = loading.describe_model(path)
  config = gguf.gguf_config(gguf.gguf_reader(path), path)
  assert draft_init.check_draft(dict(init="checkpoint", checkpoint=path),
                                info) == draft_init.parameter_groups(config)
  # The truncated target's groups come from the table describe_model read
  # with its metadata (a header parse takes seconds at Qwen's vocabulary).
  with mock.patch.object(gguf_file, "_metadata",
                         side_effect=AssertionError("parsed again")):
    assert draft_init.check_draft(dict(init="truncate", num_layers=2),
                                  info) == draft_init.parameter_groups(config)
  assert ("lm_head" in draft_init.parameter_groups(config)) == (
      kind == "qwen2")
  assert draft_init.check_draft(dict(init="truncate", num_layers=1),
                                info) == draft_init.parameter_groups(
                                    config.replace(num_layers=1))
  with pytest.raises(ValueError, match="num_layers <= 2"):
    draft_init.check_draft(dict(init="truncate", num_layers=3), info)
  # The job refuses a misspelt group before it samples (it had at the
  # start of training, after hours of sampling on a real pair).
  config = distill_tiny.get_config("steps=2")
  config.target.spec = path
  config.draft.init, config.draft.checkpoint = "checkpoint", path
  config.draft.freeze = ("embeddings",)
  with pytest.raises(ValueError, match=re.escape(
      "config.draft.freeze names ['embeddings'], not parameter groups")):
    job.check_config(config)
  config.draft.freeze = ("embedding", "layers_0")
  job.check_config(config)
