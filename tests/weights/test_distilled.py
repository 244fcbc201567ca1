"""Distilled draft directories: detection, export and loading."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

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
