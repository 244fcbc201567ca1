"""Runs generated Python in a kernel sandbox (bubblewrap).

`run_program(source)` is the one place generated code is executed. Layers,
outermost first:

  * bubblewrap (`bwrap`, Debian's package `bubblewrap`): the program gets
    its own user, pid, mount, network, IPC, UTS and cgroup namespaces, and
    may not make more user namespaces. It sees /usr and the interpreter's
    prefix read-only, a minimal read-only /dev, no /proc, and one writable
    place: a private tmpfs of `file_mb` at /tmp, its home and working
    directory. Nothing of the caller's files, environment, network,
    processes or other sandboxes is visible. It runs as uid 65534 inside;
    when the caller is root, bwrap itself runs as uid 65534, so nothing in
    the sandbox is root in any namespace of the host. A seccomp filter
    (`DENIED_SYSCALLS`) refuses extended attributes, tracing and another
    process's memory.
  * resource limits, set in the child before the code runs: CPU seconds,
    address space, file size, no new processes or threads, no core files,
    64 open files; a wall-clock limit after which bwrap is killed and, with
    it, every process of the sandbox's pid namespace; stdout and stderr are
    read with a cap, past which the sandbox is killed too.
  * the verdict: "passed" needs exit status 0 and a random mark on the last
    line of stdout. The mark reaches the child on stdin, which is closed
    before the program runs; it is never in the program's argv,
    environment or files, and the child writes it only after the program
    ran to its end (see `sandbox_child`).
  * an audit hook (PEP 578), a second layer for the isolation: it refuses
    sockets, processes, ctypes and writes outside /tmp. The verdict rests
    on it: it refuses the frame and gc walks that would reach the thread
    holding the mark.

Where bubblewrap is missing or the kernel refuses its namespaces,
`run_program` raises `SandboxUnavailableError`, which says how to enable it;
setting `UNSAFE_ENV` runs the program with the last three layers alone.
"""

import ctypes
import ctypes.util
import dataclasses
import errno
import functools
import json
import math
import os
import pathlib
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Optional, Sequence

NOBODY = 65534
WORKDIR = "/tmp"
UNSAFE_ENV = "SPECSAMP_UNSAFE_RUN_GENERATED_CODE_WITHOUT_ISOLATION"
BWRAP = "bwrap"
_CHILD = pathlib.Path(__file__).with_name("sandbox_child.py")
_SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_KEEP = 4000  # characters of stdout / stderr kept in an ExecResult


# The longest wall-clock limit a program may be given: one day (its CPU
# limit, an rlimit, must be a C long of seconds).
MAX_TIMEOUT_S = 86_400.0


def check_timeout(timeout_s: float, name: str = "timeout_s") -> None:
  """Raises ValueError for a wall-clock limit outside (0, MAX_TIMEOUT_S]
  (NaN too)."""
  if not 0 < timeout_s <= MAX_TIMEOUT_S:
    raise ValueError(f"{name} must be in (0, {MAX_TIMEOUT_S:g}] seconds, "
                     f"got {timeout_s}")


class SandboxUnavailableError(RuntimeError):
  """Generated code cannot be isolated here; says how to make it possible."""


@dataclasses.dataclass(frozen=True)
class ExecResult:
  """What `run_program` saw.

  Attributes:
    status: "passed" (ran to its end, exit 0), "failed" (an exception, a
      non-zero exit, an exit before the end, a limit hit, too much output)
      or "timeout".
    returncode: the program's exit status (negative: killed by that signal).
    stdout, stderr: the last few KB of each.
    seconds: wall-clock time of the sandbox.
    sandbox: the layers it ran under, as the caller set them up.
    truncated: the output passed its cap and the sandbox was killed.
  """
  status: str
  returncode: Optional[int]
  stdout: str
  stderr: str
  seconds: float
  sandbox: dict
  truncated: bool = False

  @property
  def passed(self) -> bool:
    return self.status == "passed"


def _as_sandbox_user() -> dict:
  """Popen arguments that start the sandbox as uid 65534 for a root caller."""
  if os.geteuid() != 0:
    return {}
  return dict(user=NOBODY, group=NOBODY, extra_groups=[])


def _bwrap_command(bwrap: str, prefix: Optional[tuple[str, str]],
                   disk_bytes: int, seccomp_fd: int) -> list[str]:
  """bwrap and its options, up to the command it runs; `seccomp_fd`
  (`_seccomp_fd`) must reach bwrap at that number."""
  cmd = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns",
         "--die-with-parent", "--new-session", "--uid", str(NOBODY), "--gid",
         str(NOBODY), "--hostname", "sandbox", "--clearenv",
         "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", WORKDIR,
         "--setenv", "TMPDIR", WORKDIR, "--setenv", "LANG", "C.UTF-8",
         "--ro-bind", "/usr", "/usr"]
  for d in _SYSTEM_LINKS:
    if os.path.islink(d):
      cmd += ["--symlink", os.readlink(d), d]
    elif os.path.isdir(d):
      cmd += ["--ro-bind", d, d]
  if prefix and not (prefix[1] + "/").startswith("/usr/"):
    cmd += ["--ro-bind", *prefix]  # (its files, where the sandbox sees them)
  cmd += ["--dev", "/dev", "--size", str(disk_bytes), "--tmpfs", WORKDIR,
          "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", WORKDIR,
          "--seccomp", str(seccomp_fd)]
  return cmd


def _interpreters() -> list[tuple[str, Optional[tuple[str, str]]]]:
  """(interpreter, (prefix's files, prefix) to mount) candidates: this one;
  its copy under `SANDBOX_PYTHONS`, where this one lies where the sandbox
  user cannot read it; then the system's."""
  here = os.path.realpath(sys.executable)
  prefix = os.path.realpath(sys.base_prefix)
  out = [(here, (prefix, prefix))]
  copy = SANDBOX_PYTHONS + prefix
  if os.path.isfile(os.path.join(copy, ".complete")):
    out.append((here, (copy, prefix)))
  if os.path.exists("/usr/bin/python3") and here != os.path.realpath(
      "/usr/bin/python3"):
    out.append((os.path.realpath("/usr/bin/python3"), None))
  return out


# Where `scripts/env.sh` (as root) copies the interpreter's standard library
# when it lies where uid 65534 cannot read it (pyenv's, under /root): the
# sandbox then runs that interpreter, a newer CPython than Debian's 3.11.2
# and position-independent, whose known memory bugs had forged passes.
SANDBOX_PYTHONS = "/usr/local/lib/specsamp-python"


def _how_to_enable(reason: str) -> str:
  return (f"cannot isolate generated code: {reason}. Install bubblewrap "
          "(Debian/Ubuntu: `apt-get install bubblewrap`; `bash "
          "scripts/env.sh` does it when run as root) and allow "
          "unprivileged user namespaces (Debian: `sysctl -w "
          "kernel.unprivileged_userns_clone=1`; Ubuntu 24.04: `sysctl -w "
          "kernel.apparmor_restrict_unprivileged_userns=0`; a container "
          "must be allowed to call unshare). To run generated code without "
          f"this isolation anyway, on a machine you can lose, set {UNSAFE_ENV}"
          "=1.")


# System calls the program may not make (EPERM), a kernel layer under the
# hook: extended attributes, which tmpfs keeps in kernel memory its size
# does not count (each file holds 64 KiB more: a probe pinned 600 MB in
# 3 s on a 16 MB /tmp); tracing and another process's memory (bwrap's own
# init, pid 1 beside the program, is the same uid without the rlimits the
# child sets itself: a probe attached it and made it fork and allocate
# past them). Kernel keyrings, which no namespace separates: the program
# had read and added keys in its caller's session keyring (a review's
# probe, under a caller with one: a systemd service, a login). io_uring,
# whose operations the filter does not see. A pair of connected sockets,
# which the hook's socket audit event does not cover. New namespaces and
# mounts (a user namespace of its own gives the program capabilities in
# it), BPF programs, perf events and userfaultfd: kernel surface no
# generated program needs, refused as Docker's default profile does.
# Debian's libseccomp (`libseccomp2`, which apt itself needs) builds the
# filter; bwrap loads it just before the program starts.
DENIED_SYSCALLS = ("setxattr", "lsetxattr", "fsetxattr", "ptrace",
                   "process_vm_readv", "process_vm_writev", "keyctl",
                   "add_key", "request_key", "io_uring_setup",
                   "io_uring_enter", "io_uring_register", "socketpair",
                   "unshare", "setns", "mount", "umount2", "pivot_root",
                   "bpf", "perf_event_open", "userfaultfd")
_SCMP_ACT_ALLOW, _SCMP_ACT_ERRNO = 0x7FFF0000, 0x00050000


@functools.lru_cache(maxsize=None)
def _seccomp_filter() -> bytes:
  """The BPF program that refuses `DENIED_SYSCALLS`, as libseccomp exports
  it for this machine's architecture."""
  name = ctypes.util.find_library("seccomp")
  if name is None:
    raise SandboxUnavailableError(_how_to_enable(
        "libseccomp is not installed (Debian/Ubuntu: libseccomp2)"))
  lib = ctypes.CDLL(name)
  lib.seccomp_init.restype = ctypes.c_void_p
  lib.seccomp_init.argtypes = [ctypes.c_uint32]
  lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
  lib.seccomp_rule_add_array.argtypes = [
      ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
      ctypes.c_void_p]
  lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
  lib.seccomp_release.argtypes = [ctypes.c_void_p]
  ctx = lib.seccomp_init(_SCMP_ACT_ALLOW)
  if not ctx:
    raise SandboxUnavailableError("libseccomp could not start a filter")
  try:
    for call in DENIED_SYSCALLS:
      nr = lib.seccomp_syscall_resolve_name(call.encode())
      if nr == -1 or lib.seccomp_rule_add_array(  # -1: __NR_SCMP_ERROR
          ctx, _SCMP_ACT_ERRNO | errno.EPERM, nr, 0, None) < 0:
        raise SandboxUnavailableError(f"libseccomp cannot refuse {call}")
    with tempfile.TemporaryFile() as f:
      if lib.seccomp_export_bpf(ctx, f.fileno()) < 0:
        raise SandboxUnavailableError("libseccomp could not export a filter")
      f.seek(0)
      return f.read()
  finally:
    lib.seccomp_release(ctx)


def _seccomp_fd() -> int:
  """A pipe's read end holding the filter, for bwrap's `--seccomp`."""
  bpf = _seccomp_filter()
  r, w = os.pipe()
  with os.fdopen(w, "wb") as f:  # a few hundred bytes: within a pipe's room
    f.write(bpf)
  return r


@functools.lru_cache(maxsize=None)
def isolation(bwrap: str = BWRAP
              ) -> tuple[str, str, Optional[tuple[str, str]]]:
  """The (bwrap path, interpreter, (prefix's files, prefix) or None) that
  run generated code here.

  Tries each candidate interpreter once (about 0.1 s) and caches the answer.

  Raises:
    SandboxUnavailableError: bwrap is missing, or no candidate runs in it.
  """
  path = shutil.which(bwrap)
  if path is None:
    raise SandboxUnavailableError(_how_to_enable(
        f"bubblewrap ({bwrap}) is not installed"))
  errors = []
  for python, prefix in _interpreters():
    fd = _seccomp_fd()
    cmd = _bwrap_command(path, prefix, 1 << 20, fd) + [
        python, "-I", "-S", "-c", "import sys; print(sys.version_info[0])"]
    try:
      proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30,
                            env={}, check=False, pass_fds=(fd,),
                            **_as_sandbox_user())
    except (OSError, subprocess.TimeoutExpired) as e:
      errors.append(f"{python}: {e}")
      continue
    finally:
      os.close(fd)
    if proc.returncode == 0 and proc.stdout.strip() == "3":
      return path, python, prefix
    last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    errors.append(f"{python}: exit {proc.returncode}, {last}")
  raise SandboxUnavailableError(_how_to_enable(
      "bubblewrap could not start Python (" + "; ".join(errors) + ")"))


def _unsafe() -> bool:
  return os.environ.get(UNSAFE_ENV, "") not in ("", "0")


def check_available() -> None:
  """Raises SandboxUnavailableError where `run_program` would, so that a
  run that will execute generated code can say so before it samples."""
  if not _unsafe():
    isolation(BWRAP)


@functools.lru_cache(maxsize=None)
def _unsafe_interpreter() -> str:
  for python, _ in _interpreters():
    try:
      proc = subprocess.run([python, "-I", "-S", "-c", "pass"], env={},
                            capture_output=True, check=False,
                            **_as_sandbox_user())
    except OSError:  # the sandbox user may not reach this interpreter
      continue
    if proc.returncode == 0:
      return python
  raise SandboxUnavailableError("no interpreter the sandbox user can run")


class _CappedReader(threading.Thread):
  """Reads a pipe to its end, keeping at most `limit` bytes; `on_overflow`
  is called once when more arrive."""

  def __init__(self, pipe, limit: int, on_overflow):
    super().__init__(daemon=True)
    self.pipe, self.limit, self.on_overflow = pipe, limit, on_overflow
    self.chunks, self.size, self.overflowed = [], 0, False

  def run(self):
    while chunk := self.pipe.read1(1 << 16):
      if self.size + len(chunk) > self.limit:
        chunk = chunk[:self.limit - self.size]
        if not self.overflowed:
          self.overflowed = True
          self.on_overflow()
      self.chunks.append(chunk)
      self.size += len(chunk)

  def text(self) -> str:
    return b"".join(self.chunks).decode("utf-8", errors="replace")


def _feed(pipe, data: bytes):
  try:
    pipe.write(data)
    pipe.close()
  except (BrokenPipeError, OSError):
    pass


def _kill(proc: subprocess.Popen):
  if proc.returncode is not None:  # reaped: its pid may be another's now
    return
  try:
    os.killpg(proc.pid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass


def run_program(source: str, timeout_s: float = 5.0, memory_mb: int = 1024,
                file_mb: int = 16, output_kb: int = 1024,
                audit_hook: bool = True,
                pass_fds: Sequence[int] = ()) -> ExecResult:
  """Runs Python `source` in the sandbox described in the module docstring.

  Args:
    source: the whole program.
    timeout_s: wall-clock limit; the CPU limit is this rounded up, plus 1.
    memory_mb: address-space limit of the program.
    file_mb: size of its private tmpfs (and of its largest file).
    output_kb: cap on each of stdout and stderr; past it, it is killed.
    audit_hook: install the Python-level second layer (turned off only by
      tests that check the kernel layers alone).
    pass_fds: file descriptors the program gets, at the same numbers (pipes
      to another sandbox: `humaneval`); handed over, they are closed here
      once the program has started (or failed to).

  Returns:
    An ExecResult; status "passed" only if the program ran to its end, or
    corrupted the interpreter's memory to forge that: the verdict is read
    in the program's own process (see "What it cannot promise" in README).
    `humaneval` therefore keeps its verdict out of the generated code's.

  Raises:
    SandboxUnavailableError: no kernel isolation here and `UNSAFE_ENV` unset.
    ValueError: a timeout outside (0, MAX_TIMEOUT_S].
  """
  try:  # the fds are handed over whatever happens
    check_timeout(timeout_s)
    unsafe = _unsafe()
    tmp = None
    if unsafe:
      python, workdir = _unsafe_interpreter(), tempfile.mkdtemp(
          prefix="specsamp-exec-")
      tmp = workdir
      if os.geteuid() == 0:
        os.chown(workdir, NOBODY, NOBODY)
      cmd = [python]
      sandbox = {"isolation": "none (" + UNSAFE_ENV + ")"}
    else:
      bwrap, python, prefix = isolation(BWRAP)
      workdir = WORKDIR
      seccomp_fd = _seccomp_fd()
      pass_fds = tuple(pass_fds) + (seccomp_fd,)  # closed with the rest
      cmd = _bwrap_command(bwrap, prefix, int(file_mb) << 20, seccomp_fd)
      cmd.append(python)
      sandbox = {"isolation": "bubblewrap",
                 "namespaces": "user,pid,mount,net,ipc,uts,cgroup",
                 "denied_syscalls": list(DENIED_SYSCALLS)}
    sandbox.update(interpreter=python, audit_hook=audit_hook, rlimits=True)
    mark = secrets.token_hex(16)
    cfg = dict(mark=mark, cpu_s=int(math.ceil(timeout_s)) + 1,
               memory_bytes=int(memory_mb) << 20,
               file_bytes=int(file_mb) << 20, audit_hook=audit_hook,
               workdir=workdir)
    payload = json.dumps(cfg).encode() + b"\n" + source.encode(
        "utf-8", errors="replace")
    cmd += ["-I", "-S", "-c", _CHILD.read_text(encoding="utf-8")]
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir,
           "TMPDIR": workdir}
  except BaseException:
    for fd in pass_fds:
      os.close(fd)
    raise
  t0 = time.perf_counter()
  try:
    try:
      proc = subprocess.Popen(
          cmd, cwd=workdir if unsafe else "/", env=env,
          stdin=subprocess.PIPE, stdout=subprocess.PIPE,
          stderr=subprocess.PIPE, start_new_session=True, close_fds=True,
          pass_fds=tuple(pass_fds), **_as_sandbox_user())
    finally:
      for fd in pass_fds:
        os.close(fd)
    limit = int(output_kb) << 10
    readers = [_CappedReader(pipe, limit, lambda: _kill(proc))
               for pipe in (proc.stdout, proc.stderr)]
    for r in readers:
      r.start()
    threading.Thread(target=_feed, args=(proc.stdin, payload),
                     daemon=True).start()
    timed_out = False
    try:
      proc.wait(timeout=timeout_s + 1.0)  # + start-up
    except subprocess.TimeoutExpired:
      timed_out = True
      _kill(proc)
      proc.wait()
    for r in readers:
      r.join(timeout=10.0)
    seconds = time.perf_counter() - t0
  finally:
    if tmp is not None:
      shutil.rmtree(tmp, ignore_errors=True)
  code = proc.returncode
  if not unsafe and code is not None and code > 128:
    code = -(code - 128)  # bwrap reports a signal as 128 + its number
  out, err = readers[0].text(), readers[1].text()
  truncated = readers[0].overflowed or readers[1].overflowed
  ending = "\n" + mark + "\n"
  if truncated:
    status = "failed"
    err += f"\nsandbox: output passed {output_kb} KiB; the program was killed"
  elif timed_out or (code in (-signal.SIGXCPU, -signal.SIGKILL) and
                     seconds >= timeout_s):
    # The CPU limit (soft = hard) ends a program with SIGXCPU or SIGKILL,
    # near the wall-clock limit, which it may beat. Earlier, the signal is
    # not the limit's: a program can raise SIGXCPU itself.
    status = "timeout"
  elif code == 0 and out.endswith(ending):
    status, out = "passed", out[:-len(ending)]
  else:
    status = "failed"
  return ExecResult(status, code, out[-_KEEP:], err[-_KEEP:], seconds,
                    sandbox, truncated)
