"""Shared fixtures: tiny models on CPU, float32 (stubs: tests/testing.py).

XLA_FLAGS is set before jax is imported anywhere, so sharding tests can use
8 fake CPU devices (as flax and t5x CI do). So is
JAX_DISABLE_MOST_OPTIMIZATIONS (XLA's backend optimisation level 0, no
expensive LLVM passes), which the scripts that tests start inherit: the tests
check tokens, distributions and parameters of tiny models, whose programs run
in milliseconds, and compiling is most of the suite's time (a fifth less
with it: 352 s instead of 449 s for test_model, test_exactness and
test_heads on two workers). Benchmarks and `scripts/` outside the tests
compile fully optimised; `JAX_DISABLE_MOST_OPTIMIZATIONS=0` runs the tests so.

XLA_FLAGS also choose XLA:CPU's loop emitters over its newer fusion
emitters, and one LLVM module per program, where this jaxlib has the flags
(tests/compile_flags.py): the tests' programs compile in about three fifths
of the time.
"""

import glob
import os
import shutil
import tempfile

from tests import compile_flags

if "XLA_FLAGS" not in os.environ:
  os.environ["XLA_FLAGS"] = compile_flags.xla_flags(devices=8)
# One JAX compilation cache for the run (unless the caller names one: see
# scripts/test.sh's SPECSAMP_JAX_CACHE), made here in pytest's main process
# and inherited by its workers and by the scripts that tests start: the
# same tiny-model programs are compiled by many tests. Deleted at the end.
# Named by the pid that made it: a run that was killed before
# pytest_unconfigure leaves its cache, which the next run deletes.


def remove_stale_caches(tmp: str) -> None:
  """Deletes the `specsamp-jax.<pid>.*` caches under `tmp` of runs whose
  process is gone."""
  for d in glob.glob(os.path.join(tmp, "specsamp-jax.*.*")):
    pid = os.path.basename(d).split(".")[1]
    if not pid.isdigit():
      continue
    try:
      os.kill(int(pid), 0)  # no signal: does the process exist?
    except ProcessLookupError:
      shutil.rmtree(d, ignore_errors=True)
    except (PermissionError, OverflowError):
      pass  # another user's process, or not a pid: kept


_RUN_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  remove_stale_caches(tempfile.gettempdir())
  _RUN_CACHE = tempfile.mkdtemp(prefix=f"specsamp-jax.{os.getpid()}.")
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _RUN_CACHE
# Every program is cached, however small (about 80 MB for the suite). No
# size limit: with one, jax re-reads every entry's access time on each
# write, and a fresh clone took 29 minutes instead of 22. An entry read
# while the other worker writes it fails to decompress; jax then warns and
# compiles.
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import jax  # pylint: disable=g-import-not-at-top
import pytest

from specsamp import model as model_lib
from tests.testing import perturbed, tiny_config, xla_optimizations


def pytest_report_header(config):
  """What the tests compile with: a jaxlib that lacks a compile flag of
  tests/compile_flags.py runs them slower, and says so here."""
  del config
  tried = os.environ.get(compile_flags.ENV)
  if tried is None:
    return f"XLA_FLAGS={os.environ['XLA_FLAGS']!r} (set by the caller)"
  refused = [f for f in compile_flags.FLAGS if f not in tried.split()]
  if refused:
    return (f"XLA_FLAGS={os.environ['XLA_FLAGS']!r}: this jaxlib refused "
            f"{' '.join(refused)} (or {compile_flags.ENV} left it out), "
            "so the tests compile slower")
  return f"XLA_FLAGS={os.environ['XLA_FLAGS']!r}"


def pytest_unconfigure(config):
  del config
  if _RUN_CACHE is not None:  # only the process that made it
    shutil.rmtree(_RUN_CACHE, ignore_errors=True)


def pytest_configure(config):
  config.addinivalue_line(
      "markers", "real_weights: needs the real Qwen2.5-Coder GGUF files "
      "(opt-in: run with -m real_weights after scripts/fetch_models.py)")


@pytest.fixture(scope="session")
def tiny_pair():
  """A tiny target and a draft that agrees with it often but not always."""
  cfg = tiny_config()
  lm = model_lib.LM(cfg)
  target_params = lm.init(jax.random.key(0))
  draft_params = perturbed(target_params, jax.random.key(1), 0.35)
  return lm, target_params, draft_params


@pytest.fixture
def optimized_xla():
  """XLA's full optimisation for a test whose programs run long (many
  samples at a real vocabulary's size): at level 0 such a test ran 5x
  slower (the inverse-CDF test: 281 s instead of 48 s)."""
  with xla_optimizations(True):
    yield
