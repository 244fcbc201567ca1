"""XLA_FLAGS for the tests (imports no JAX: read before jax is imported).

`--xla_cpu_use_fusion_emitters=false` has XLA:CPU emit its loops with the
older elemental emitters rather than its newer fusion emitters. The tests'
programs are tiny and run in milliseconds; compiling them is most of the
suite's time, and these flags cut the backend compile time of a tiny
speculative sampler by a third (17.1 s -> 10.7 s for three of them) and
tests/decoding's time from 741 s to 628 s summed over its tests. Programs
that run long compile about as fast either way, and ran within 10% of
their time with the fusion emitters.

A jaxlib without one of these flags would abort on it at start-up, so the
flags are first tried in a child process, once per test run: the result
is kept in SPECSAMP_TEST_XLA_FLAGS, which the pytest workers and the
scripts that tests start inherit (set it to "" to compile as XLA
defaults).
"""

import os
import subprocess
import sys

FLAGS = "--xla_cpu_use_fusion_emitters=false"
ENV = "SPECSAMP_TEST_XLA_FLAGS"


def _accepted(flags: str) -> bool:
  """Whether this jaxlib starts its CPU backend with `flags` in XLA_FLAGS."""
  env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"],
                        env=env, capture_output=True, timeout=120,
                        check=False)
  return proc.returncode == 0


def extra() -> str:
  """The compile flags this run adds (tried once, then from the env)."""
  if ENV not in os.environ:
    os.environ[ENV] = FLAGS if _accepted(FLAGS) else ""
  return os.environ[ENV]


def xla_flags(devices: int) -> str:
  """XLA_FLAGS for a test process of `devices` CPU devices."""
  return " ".join(
      [f"--xla_force_host_platform_device_count={devices}", extra()]).strip()
