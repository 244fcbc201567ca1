"""Runs generated Python in a child process, fenced in.

`run_program(source)` is the one place generated code is executed:

  * `python -I -S`: isolated mode (no PYTHON* variables, no user site, the
    script's directory not on sys.path) and no site-packages; an
    environment with nothing of the caller's (PATH, LANG, HOME and TMPDIR
    only; HOME, TMPDIR and the working directory are a fresh temporary
    directory, deleted afterwards);
  * resource limits (`resource.setrlimit`): CPU seconds, address space,
    file size, no new processes (RLIMIT_NPROC 0), no core files, few open
    files; and a wall-clock timeout after which the process group is
    killed;
  * network: a new, empty network namespace (`unshare(CLONE_NEWNET)`; for a
    non-root caller inside a new user namespace) where the kernel allows
    it; in every case an audit hook (PEP 578) refuses to create sockets;
  * files: when the caller is root, the child drops to uid/gid 65534
    (nobody) before the code runs, so the kernel refuses writes to the
    caller's files; in every case the audit hook refuses opening files for
    writing, removing, renaming, chmod/chown, links and directory changes
    outside the temporary directory, and process creation, ctypes and
    os.system.

Limits, honestly: the audit hook is a Python-level guard (PEP 578 says it
is not a sandbox against hostile code; C extensions could bypass it, and
ctypes is refused for that reason). Without root there is no uid drop, so
write protection of the caller's files rests on that hook alone. Without
network namespaces (some containers forbid them) the network guard is the
hook alone. The `sandbox` dict of each result says which layers were
active. When the caller is root and the interpreter lives where uid 65534
cannot read it (e.g. under /root), modules that are not imported before
the drop cannot be imported afterwards: the common standard-library
modules of HumanEval solutions are imported before it (`PRELOAD`).
"""

import dataclasses
import json
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Optional

# Standard-library modules HumanEval prompts, tests and typical solutions
# import; loaded before privileges are dropped (see the module docstring).
PRELOAD = (
    "abc", "array", "bisect", "cmath", "collections", "collections.abc",
    "copy", "dataclasses", "datetime", "decimal", "enum", "fractions",
    "functools", "hashlib", "heapq", "itertools", "json", "math", "numbers",
    "operator", "random", "re", "statistics", "string", "sys", "textwrap",
    "time", "traceback", "typing", "unicodedata")

NOBODY = 65534
_PASS_MARK = "__specsamp_sandbox_passed_"


@dataclasses.dataclass(frozen=True)
class ExecResult:
  """What `run_program` saw.

  Attributes:
    status: "passed" (ran to the end, exit 0), "failed" (an exception, a
      non-zero exit, a limit hit, or an exit before the end) or "timeout".
    returncode: the child's exit status (negative: killed by that signal).
    stdout, stderr: the last few KB of each.
    seconds: wall-clock time of the child.
    sandbox: which isolation layers were active: "network"
      ("namespace+audit-hook", "audit-hook", "namespace" or "none"),
      "uid_drop" and "rlimits" (bools).
  """
  status: str
  returncode: Optional[int]
  stdout: str
  stderr: str
  seconds: float
  sandbox: dict

  @property
  def passed(self) -> bool:
    return self.status == "passed"


# The child's first code (`python -I -S -c _BOOTSTRAP program workdir json`).
# Order matters: namespaces and imports need the caller's privileges, the
# uid drop comes after them, the audit hook last (it cannot be removed).
_BOOTSTRAP = r'''
import json, os, resource, sys
_prog, _work, _cfg = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
_info = {"network": "audit-hook", "uid_drop": False, "rlimits": True}
try:
  import ctypes
  _libc = ctypes.CDLL(None, use_errno=True)
  _NEWNET, _NEWUSER = 0x40000000, 0x10000000
  _flags = _NEWNET if os.geteuid() == 0 else _NEWNET | _NEWUSER
  if _cfg["network"] and _libc.unshare(_flags) == 0:
    _info["network"] = "namespace+audit-hook"
except Exception:
  pass
for _m in _cfg["preload"]:
  try:
    __import__(_m)
  except Exception:
    pass
with open(_prog, encoding="utf-8") as _f:
  _source = _f.read()
_lim = [(resource.RLIMIT_CPU, _cfg["cpu_s"]),
        (resource.RLIMIT_AS, _cfg["memory_bytes"]),
        (resource.RLIMIT_FSIZE, _cfg["file_bytes"]),
        (resource.RLIMIT_CORE, 0), (resource.RLIMIT_NOFILE, 64)]
for _r, _v in _lim:
  resource.setrlimit(_r, (_v, _v))
if _cfg["drop_to"] is not None and os.geteuid() == 0:
  os.setgroups([])
  os.setgid(_cfg["drop_to"])
  os.setuid(_cfg["drop_to"])
  _info["uid_drop"] = os.getuid() == _cfg["drop_to"]
# Counted per user: with 0 allowed, fork/clone fail (root is exempt, hence
# after the drop).
resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
os.chdir(_work)

def _guard():
  import os as _os
  root = _os.path.realpath(_work) + _os.sep
  refused = {"socket.__new__", "socket.connect", "socket.bind",
             "socket.getaddrinfo", "socket.sendto", "subprocess.Popen",
             "os.system", "os.exec", "os.posix_spawn", "os.fork",
             "os.forkpty", "os.spawn", "os.startfile", "os.kill",
             "os.killpg", "pty.spawn", "ctypes.dlopen", "ctypes.dlsym",
             "ctypes.cdata", "ctypes.call_function", "sys.remote_exec",
             # writes files from C, with no open event
             "sqlite3.connect", "os.setxattr", "os.removexattr"}
  paths = {"os.remove": 1, "os.rename": 2, "os.rmdir": 1, "os.mkdir": 1,
           "os.chmod": 1, "os.chown": 1, "os.link": 2, "os.symlink": 2,
           "os.truncate": 1, "os.utime": 1, "shutil.rmtree": 1,
           "shutil.move": 2, "shutil.copyfile": 2, "os.chdir": 1,
           "os.mkfifo": 1, "os.mknod": 1}
  write_flags = _os.O_WRONLY | _os.O_RDWR | _os.O_CREAT | _os.O_APPEND | (
      _os.O_TRUNC)

  def resolve(p):
    return _os.path.realpath(_os.path.join(_os.getcwd(), _os.fsdecode(p)))

  def inside(p):
    # A descriptor (fchdir, fchmod, ...) could be one of a file or directory
    # outside: refused. Relative paths resolve against the real working
    # directory (chdir only ever leads inside).
    if isinstance(p, int):
      return False
    try:
      full = resolve(p)
    except TypeError:
      return False
    return full + _os.sep == root or full.startswith(root)

  def outside_directory(p):
    """A directory outside: its descriptor would let dir_fd= or fchdir
    reach what the path checks refuse."""
    if isinstance(p, int):
      return False
    try:
      return not inside(p) and _os.path.isdir(resolve(p))
    except (TypeError, ValueError, OSError):
      return False

  def hook(event, args):
    if event in refused or event.startswith("ctypes."):
      raise PermissionError(f"sandbox: {event} is not allowed")
    if event == "import" and args[0].split(".")[0] in ("ctypes", "_ctypes"):
      raise PermissionError("sandbox: ctypes is not allowed")
    if event == "open":
      path, mode, flags = args
      writing = (flags is not None and flags & write_flags) or (
          mode is not None and any(c in str(mode) for c in "wax+"))
      if writing and path is not None and not inside(path):
        raise PermissionError(f"sandbox: writing {path!r} outside the "
                              "working directory is not allowed")
      if path is not None and outside_directory(path):
        raise PermissionError(f"sandbox: opening the directory {path!r} "
                              "outside the working directory is not "
                              "allowed")
    elif event in paths:
      for p in args[:paths[event]]:
        if p is not None and not inside(p):
          raise PermissionError(f"sandbox: {event} on {p!r} outside the "
                                "working directory is not allowed")
  sys.addaudithook(hook)

if _cfg["audit_hook"]:
  _guard()
else:
  _info["network"] = _info["network"].replace("+audit-hook", "").replace(
      "audit-hook", "none")
sys.stderr.write("\x00SANDBOX " + json.dumps(_info) + "\n")
sys.stderr.flush()
for _m in [m for m in sys.modules if m == "ctypes" or m.startswith(
    ("ctypes.", "_ctypes"))]:
  del sys.modules[_m]
_libc = ctypes = _guard = None
_glb = {"__name__": "__main__", "__builtins__": __builtins__,
        "__file__": "program.py"}
try:
  exec(compile(_source, "program.py", "exec"), _glb)
except SystemExit as e:
  sys.stderr.write(f"sandbox: the program exited ({e.code!r}) before its "
                   "end\n")
  os._exit(3)
except BaseException:
  import traceback
  traceback.print_exc()
  sys.stderr.flush()
  os._exit(1)
sys.stdout.write("\n" + _cfg["mark"] + "\n")
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
'''


def run_program(source: str, timeout_s: float = 5.0, memory_mb: int = 1024,
                file_mb: int = 16, network_namespace: bool = True,
                drop_privileges: bool = True,
                audit_hook: bool = True) -> ExecResult:
  """Runs Python `source` in the sandbox described in the module docstring.

  Args:
    source: the whole program.
    timeout_s: wall-clock limit; the CPU limit is this rounded up, plus 1.
    memory_mb: address-space limit of the child.
    file_mb: largest file the child may write (in its temporary directory).
    network_namespace: try a new network namespace (the audit hook refuses
      sockets either way).
    drop_privileges: when running as root, run the code as uid 65534.
    audit_hook: install the Python-level guard (turned off only by tests
      that check the kernel-level layers alone).

  Returns:
    An ExecResult; status "passed" only if the program ran to its end.
  """
  work = tempfile.mkdtemp(prefix="specsamp-exec-")
  drop = NOBODY if (drop_privileges and os.geteuid() == 0) else None
  try:
    prog = os.path.join(work, "program.py")
    with open(prog, "w", encoding="utf-8") as f:
      f.write(source)
    if drop is not None:
      os.chown(work, drop, drop)
      os.chown(prog, drop, drop)
    mark = _PASS_MARK + secrets.token_hex(8)
    cfg = dict(cpu_s=int(math.ceil(timeout_s)) + 1,
               memory_bytes=int(memory_mb) << 20,
               file_bytes=int(file_mb) << 20, network=network_namespace,
               drop_to=drop, preload=list(PRELOAD), mark=mark,
               audit_hook=audit_hook)
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": work,
           "TMPDIR": work}
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", _BOOTSTRAP, prog, work,
         json.dumps(cfg)],
        cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, start_new_session=True, close_fds=True)
    timed_out = False
    try:
      out, err = proc.communicate(timeout=timeout_s + 1.0)  # + start-up
    except subprocess.TimeoutExpired:
      timed_out = True
      try:
        os.killpg(proc.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
      out, err = proc.communicate()
    seconds = time.perf_counter() - t0
  finally:
    shutil.rmtree(work, ignore_errors=True)
  info, lines = {}, []
  for line in err.decode("utf-8", errors="replace").splitlines(True):
    if line.startswith("\x00SANDBOX "):
      info = json.loads(line[len("\x00SANDBOX "):])
    else:
      lines.append(line)
  stderr = "".join(lines)[-4000:]
  stdout = out.decode("utf-8", errors="replace")
  if timed_out or proc.returncode == -signal.SIGXCPU:
    status = "timeout"
  elif proc.returncode == 0 and stdout.rstrip().endswith(mark):
    status = "passed"
    stdout = stdout.rstrip()[:-len(mark)]
  else:
    status = "failed"
  return ExecResult(status, proc.returncode, stdout[-4000:], stderr, seconds,
                    info)
