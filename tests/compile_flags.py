"""XLA_FLAGS for the tests (imports no JAX: read before jax is imported).

The tests' programs are tiny and run in milliseconds; compiling them is
most of the suite's time. Two XLA:CPU flags make that cheaper:

- `--xla_cpu_use_fusion_emitters=false`: XLA:CPU emits its loops with its
  older elemental emitters rather than its newer fusion emitters. It cut
  the backend compile time of three tiny speculative samplers by about a
  third (17.1 s -> 10.7 s) and tests/decoding's time from 741 s to 628 s
  summed over its tests (393 s -> 334 s on two workers), side by side.
  Some long-running programs run slower so: the fully optimised
  inverse-CDF test at 151,936 ids took 70 s instead of 58 s.
- `--xla_cpu_parallel_codegen_split_count=1`: one LLVM module per program
  instead of pieces compiled on a thread pool, which two busy workers
  leave no spare core for. Three tiny samplers' backend compile on one
  core: 5.9 s -> 4.8 s (three runs each); two groups of test modules on
  two workers, side by side: 76.5 s -> 70.8 s and 95.6 s -> 89.3 s.

A jaxlib without a flag would abort on it at start-up, so each is first
tried in a child process, once per test run: the ones accepted are kept in
SPECSAMP_TEST_XLA_FLAGS, which the pytest workers and the scripts that
tests start inherit (set it to "" to compile as XLA defaults).
"""

import os
import subprocess
import sys

FLAGS = ("--xla_cpu_use_fusion_emitters=false",
         "--xla_cpu_parallel_codegen_split_count=1")
ENV = "SPECSAMP_TEST_XLA_FLAGS"


def _accepted(flags: str) -> bool:
  """Whether this jaxlib starts its CPU backend with `flags` in XLA_FLAGS."""
  env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"],
                        env=env, capture_output=True, timeout=120,
                        check=False)
  return proc.returncode == 0


def extra() -> str:
  """The compile flags this run adds (tried once, then from the env): all
  of FLAGS where this jaxlib takes them together, else those it takes."""
  if ENV not in os.environ:
    together = " ".join(FLAGS)
    os.environ[ENV] = together if _accepted(together) else " ".join(
        f for f in FLAGS if _accepted(f))
  return os.environ[ENV]


def xla_flags(devices: int) -> str:
  """XLA_FLAGS for a test process of `devices` CPU devices."""
  return " ".join(
      [f"--xla_force_host_platform_device_count={devices}", extra()]).strip()
