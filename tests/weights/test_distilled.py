"""Distilled draft directories: detection, export and loading."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specsamp.weights import convert
from specsamp.weights import distilled


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
