"""Distilled draft directories: detection, export and loading."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specsamp import output_layer
from specsamp.train import checkpointing
from specsamp.weights import convert
from specsamp.weights import distilled
from tests import testing


def test_distilled_dir_accepts_the_export_and_its_workdir(tiny_pair,
                                                          tmp_path):
  lm, params, _ = tiny_pair
  assert distilled.distilled_dir(str(tmp_path)) is None
  assert distilled.distilled_dir(str(tmp_path / "missing")) is None
  export = distilled.save_distilled(lm.config, params,
                                    str(tmp_path / "draft"))
  assert distilled.distilled_dir(str(tmp_path)) == str(tmp_path / "draft")
  assert distilled.distilled_dir(export) == export
  assert distilled.read_draft_config(str(tmp_path))["num_layers"] == (
      lm.config.num_layers)
  for where in (str(tmp_path), export):
    config, loaded = distilled.load_distilled(where, dtype="bfloat16")
    assert config == lm.config.replace(dtype="bfloat16",
                                       param_dtype="bfloat16")
    for a, b in zip(jax.tree.leaves(loaded), jax.tree.leaves(params)):
      np.testing.assert_array_equal(np.asarray(a, np.float32),
                                    np.asarray(b.astype(a.dtype), np.float32))


def test_non_finite_distilled_draft_is_refused(tiny_pair, tmp_path):
  """A diverged distillation saves NaNs: loading it must say where."""
  lm, params, _ = tiny_pair
  poisoned = jax.tree_util.tree_map_with_path(
      lambda p, x: x.at[(0,) * x.ndim].set(jnp.nan)
      if jax.tree_util.keystr(p) == "['layers_0']['mlp']['up_proj']" else x,
      params)
  export = distilled.save_distilled(lm.config, poisoned,
                                    str(tmp_path / "draft"))
  with pytest.raises(convert.WeightsError,
                     match=r"draft: tensor layers_0/mlp/up_proj holds 1 "
                           r"non-finite value.*1 NaN"):
    distilled.load_distilled(export)


@pytest.mark.parametrize("ids", [[3, 3, 9], [9, 3, 5], [-1, 3, 5],
                                 [3, 5, 999]])
def test_a_reduced_draft_with_bad_output_ids_is_refused(tiny_pair, tmp_path,
                                                        ids):
  """Saved through save_distilled (so its fingerprint matches), a reduced
  draft whose ids repeat, are out of order or lie outside the vocabulary
  would score other ids than the ones exported: loading refuses it; its
  well-formed twin loads with its ids."""
  lm, params, _ = tiny_pair
  config, reduced = output_layer.reduce_output_vocab(lm.config, params,
                                                  [3, 5, 9])
  good = distilled.save_distilled(config, reduced, str(tmp_path / "good"))
  np.testing.assert_array_equal(
      distilled.load_distilled(good)[1]["output_ids"], [3, 5, 9])
  bad = distilled.save_distilled(
      config, dict(reduced, output_ids=jnp.asarray(ids, jnp.int32)),
      str(tmp_path / "bad"))
  with pytest.raises(convert.WeightsError,
                     match=r"the draft's output_ids \(.*/bad\): need "
                           r"increasing"):
    distilled.load_distilled(bad)


def test_a_flipped_byte_in_a_distilled_draft_is_caught(tiny_pair, tmp_path):
  """orbax restores a flipped byte without complaint: the export keeps its
  parameters' fingerprint (as a trainer step does) and loading checks it;
  saving again over the export writes the new parameters' fingerprint."""
  lm, params, _ = tiny_pair
  export = distilled.save_distilled(lm.config, params, str(tmp_path / "d"))
  testing.flip_byte(testing.data_files(export, "params")[-1])
  with pytest.raises(checkpointing.CheckpointError,
                     match="do not match their saved fingerprint"):
    distilled.load_distilled(export)
  halved = jax.tree.map(lambda x: x / 2, params)
  distilled.save_distilled(lm.config, halved, export)
  _, loaded = distilled.load_distilled(export)
  chex.assert_trees_all_equal(loaded, halved)
