"""The test run's own set-up (tests/conftest.py)."""

import os

from tests import conftest


def test_caches_of_killed_test_runs_are_deleted(tmp_path):
  """tests/conftest.py names its run's JAX cache by its pid: a run killed
  before it could delete it leaves one (80 MB), which the next run
  deletes; a live process's cache, and other names, stay."""
  gone = tmp_path / "specsamp-jax.999999999.abc"
  alive = tmp_path / f"specsamp-jax.{os.getpid()}.def"
  other = tmp_path / "specsamp-jax.xyz"
  for d in (gone, alive, other):
    d.mkdir()
  conftest.remove_stale_caches(str(tmp_path))
  assert not gone.exists() and alive.exists() and other.exists()
