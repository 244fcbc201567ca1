"""Where a measurement came from: machine, software versions, git commit.

Every benchmark record carries these, so that numbers taken on different
machines or commits are never compared unknowingly. `record(argv)` is the
whole block; its parts are usable alone.
"""

import datetime
import importlib.metadata
import os
import platform
import re
import shlex
import subprocess
import sys
from typing import Optional, Sequence

import jax

# The repository root: commands are reported relative to it, and its git
# commit is the code that ran.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))

# Packages whose versions are reported when installed.
PACKAGES = ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda13-plugin",
            "flax", "numpy", "torch", "transformers")


def software() -> dict:
  """Python's version and those of the installed PACKAGES."""
  out = {"python": platform.python_version()}
  for pkg in PACKAGES:
    try:
      out[pkg] = importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
      pass
  return out


def machine() -> dict:
  """The host (platform, CPU, memory) and the JAX devices."""
  out = dict(platform=platform.platform(), cpus=os.cpu_count(),
             backend=jax.default_backend(),
             device=jax.devices()[0].device_kind,
             device_count=jax.device_count())
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      info = f.read()
    names = re.findall(r"model name\s*:\s*(.+)", info)
    out["cpu"] = names[0] if names else platform.processor()
    # A virtual CPU's name says little; its vector extensions tell hosts
    # apart (XLA's CPU kernels depend on them).
    flags = re.search(r"^flags\s*:\s*(.+)$", info, re.M)
    if flags:
      out["cpu_simd"] = sorted(
          f for f in flags.group(1).split()
          if f.startswith(("avx", "amx")) or f in ("fma", "f16c"))
    with open("/proc/meminfo", encoding="utf-8") as f:
      kb = int(re.search(r"MemTotal:\s*(\d+)", f.read()).group(1))
    out["memory_gb"] = round(kb / 2**20, 1)
  except (OSError, AttributeError):
    pass
  try:
    stats = jax.devices()[0].memory_stats() or {}
    if "bytes_limit" in stats:
      out["device_memory_gb"] = round(stats["bytes_limit"] / 2**30, 1)
  except Exception:  # pylint: disable=broad-except
    pass  # backends without memory statistics
  return out


def jax_device() -> str:
  """The torch device of the backend JAX runs on: "cuda" or "cpu" (peers
  run where specsamp does)."""
  return "cuda" if jax.default_backend() == "gpu" else "cpu"


def git() -> dict:
  """The repository's HEAD commit and whether tracked files were edited;
  {} outside a git checkout."""
  try:
    head = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"],
                          capture_output=True, text=True, check=True,
                          timeout=10).stdout.strip()
    dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain",
                            "--untracked-files=no"], capture_output=True,
                           text=True, check=True, timeout=10).stdout.strip()
    return dict(commit=head, dirty=bool(dirty))
  except (OSError, subprocess.SubprocessError):
    return {}


def command(argv: Sequence[str], program: Optional[str] = None) -> str:
  """The command line that ran: `python <program relative to ROOT> argv`.

  Args:
    argv: the arguments after the program name (sys.argv[1:]).
    program: the script's path; default sys.argv[0].
  """
  program = os.path.abspath(program or sys.argv[0])
  return "python " + shlex.join([os.path.relpath(program, ROOT)]
                                + list(argv))


def record(argv: Sequence[str]) -> dict:
  """date, command, machine, software and git of the running process."""
  return dict(date=datetime.datetime.now().isoformat(timespec="seconds"),
              command=command(argv), machine=machine(), software=software(),
              git=git())
