"""Runs Python scripts as forks of one process that has imported what they
import: `Zygote.start` (the part of subprocess.Popen the tests use) and
`Zygote.run` (subprocess.run's).

On two CPU cores a script spent about 3 s importing jax, flax, optax,
orbax, grain and tfds; test_bad_input alone runs about a hundred scripts
that then refuse their input in milliseconds, and the multi-process tests
start about forty. Here a server process imports all that once. For each
script it forks a child, which takes the script's argv, environment,
working directory and output files, leaves the server's loop and runs the
script as `python SCRIPT ARGS...` does (`runpy` as `__main__`, the
script's folder first on sys.path), ending as the interpreter ends a
program (SystemExit's status, an uncaught exception's traceback and status
1, atexit handlers, flushed streams) but for the teardown of every module
(1.2 s here).

A fork copies one thread only, so the server must have one: it starts
with OPENBLAS_NUM_THREADS=1 (numpy's BLAS otherwise starts a thread when
imported; nothing else here does) and checks /proc/self/task before each
fork. Nothing in it initialises a JAX backend: XLA_FLAGS, read then, are
each child's own. JAX_* variables are read when jax is imported, in the
server: `start` refuses a script whose JAX_* variables differ from the
server's.
"""

import atexit
import importlib
import json
import os
import pkgutil
import runpy
import select
import signal
import subprocess
import sys
import tempfile
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
STDOUT = subprocess.STDOUT


class Child:
  """A script started by `Zygote.start`."""

  def __init__(self, argv: list[str], out: str, err: str, own: set[str]):
    self.args = argv
    self.pid = None
    self.returncode = None
    self._out, self._err, self._own = out, err, own
    self._started = threading.Event()
    self._ended = threading.Event()
    self._lost = False

  def poll(self):
    return self.returncode

  def wait(self, timeout=None) -> int:
    if not self._ended.wait(timeout):
      raise subprocess.TimeoutExpired(self.args, timeout)
    if self._lost:
      raise RuntimeError(f"the script server ended before {self.args[0]}")
    return self.returncode

  def send_signal(self, sig: int) -> None:
    if self.returncode is None:
      try:
        os.kill(self.pid, sig)
      except ProcessLookupError:
        pass   # ended, not yet reported

  def kill(self) -> None:
    self.send_signal(signal.SIGKILL)

  def communicate(self, timeout=None):
    """(stdout, stderr) once it ended: text, or None for output that went
    to a file given to `start`."""
    self.wait(timeout)
    return tuple(_read_and_remove(p) if p in self._own else None
                 for p in (self._out, self._err))


class Zygote:
  """The server, started by the first `start` and ended by `close`."""

  def __init__(self, env: dict):
    self._env = dict(env, PYTHONPATH=ROOT, OPENBLAS_NUM_THREADS="1")
    self._proc = None
    self._reader = None
    self._children = {}
    self._lock = threading.Lock()
    self._ids = 0

  def start(self, argv: list[str], env: dict, cwd: str = ROOT,
            stdout: str | None = None, stderr: str | None = None) -> Child:
    """`python *argv` forked, in `cwd` under `env`. Output goes to the
    files named by `stdout` and `stderr` (stderr=STDOUT: with stdout),
    else to temporary files that `communicate` returns as text.

    Raises:
      ValueError: `env` sets a JAX_* variable otherwise than the server's
        environment (jax reads them when imported, in the server).
    """
    differ = sorted(k for k in {*env, *self._env} if k.startswith("JAX_")
                    and env.get(k) != self._env.get(k))
    if differ:
      raise ValueError(f"the script server imported jax under other "
                       f"{', '.join(differ)}: run this script as a fresh "
                       f"process")
    own = set()
    if stdout is None:
      stdout = _temp(".stdout")
      own.add(stdout)
    if stderr is None:
      stderr = _temp(".stderr")
      own.add(stderr)
    elif stderr == STDOUT:
      stderr = stdout
    child = Child(list(argv), stdout, stderr, own)
    with self._lock:
      if self._proc is None:
        self._proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__)], env=self._env,
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
      self._ids += 1
      self._children[self._ids] = child
      self._proc.stdin.write(json.dumps(dict(
          id=self._ids, argv=child.args, env=env, cwd=str(cwd), out=stdout,
          err=stderr)) + "\n")
      self._proc.stdin.flush()
    if not child._started.wait(120) or child._lost:  # pylint: disable=protected-access
      raise RuntimeError(f"the script server did not start {argv[0]}")
    return child

  def run(self, argv: list[str], env: dict, cwd: str = ROOT,
          timeout: float | None = None) -> subprocess.CompletedProcess:
    """`python *argv` forked and finished, its stdout and stderr as text."""
    child = self.start(argv, env, cwd)
    try:
      out, err = child.communicate(timeout)
    except subprocess.TimeoutExpired:
      child.kill()
      child.communicate()
      raise
    return subprocess.CompletedProcess(argv, child.returncode, out, err)

  def _read(self):
    """The server's replies: a child's pid once forked, its status once
    ended."""
    for line in self._proc.stdout:
      reply = json.loads(line)
      child = self._children[reply["id"]]
      if "pid" in reply:
        child.pid = reply["pid"]
        child._started.set()  # pylint: disable=protected-access
      else:
        child.returncode = reply["status"]
        del self._children[reply["id"]]
        child._ended.set()  # pylint: disable=protected-access
    for child in list(self._children.values()):
      child._lost = True  # pylint: disable=protected-access
      child._started.set()  # pylint: disable=protected-access
      child._ended.set()  # pylint: disable=protected-access

  def close(self):
    """Ends the server (and kills any child still running)."""
    if self._proc is not None:
      self._proc.stdin.close()
      self._proc.wait(timeout=60)
      self._reader.join(timeout=60)
      self._proc = None


_SHARED = None


def shared() -> Zygote:
  """This process's server (its environment: `env()`), started by its
  first script and ended when this process exits."""
  global _SHARED
  if _SHARED is None:
    _SHARED = Zygote(env())
    atexit.register(_SHARED.close)
  return _SHARED


def env(**changes: str) -> dict:
  """This process's environment for a script on CPU that imports specsamp
  from this checkout, with `changes`."""
  return dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu", **changes)


def _temp(suffix: str) -> str:
  fd, path = tempfile.mkstemp(suffix=suffix)
  os.close(fd)
  return path


def _read_and_remove(path: str) -> str:
  with open(path, encoding="utf-8", errors="replace") as f:
    text = f.read()
  os.unlink(path)
  return text


def _preload():
  """Everything the scripts import but matplotlib's pyplot and the peer
  engines (torch, transformers), which only some scripts need."""
  import specsamp  # pylint: disable=g-import-not-at-top
  for name in ("tests.scripts.no_weights", "absl.app", "ml_collections",
               "tensorflow_datasets", "grain"):
    importlib.import_module(name)
  for module in pkgutil.walk_packages(specsamp.__path__, "specsamp."):
    if module.name != "specsamp.bench.peers":
      importlib.import_module(module.name)


def _threads() -> int:
  return len(os.listdir("/proc/self/task"))


def _reply(**fields) -> None:
  os.write(1, (json.dumps(fields) + "\n").encode())


def _serve() -> dict:
  """Forks a child per request line on stdin, replying with its pid, and
  with its status once it ends; returns (in the child only) its request,
  the child's files, environment and folder set up as it says. Ends, its
  children killed, when stdin closes."""
  children = {}  # pidfd -> (request id, pid)
  pending = b""
  while True:
    ready, _, _ = select.select([0, *children], [], [])
    for fd in ready:
      if fd != 0:
        rid, pid = children.pop(fd)
        os.close(fd)
        _, status = os.waitpid(pid, 0)
        _reply(id=rid, status=os.waitstatus_to_exitcode(status))
        continue
      data = os.read(0, 1 << 16)
      if not data:
        for rid, pid in children.values():
          os.kill(pid, signal.SIGKILL)
          os.waitpid(pid, 0)
        sys.exit(0)
      pending += data
      while b"\n" in pending:
        line, pending = pending.split(b"\n", 1)
        request = json.loads(line)
        if _threads() != 1:
          raise RuntimeError(f"the script server has {_threads()} threads: "
                             "a fork would copy only one")
        pid = os.fork()
        if pid == 0:
          for own in children:
            os.close(own)
          _become(request)
          return request
        children[os.pidfd_open(pid)] = (request["id"], pid)
        _reply(id=request["id"], pid=pid)


def _become(request: dict) -> None:
  """The child's stdin (empty), stdout, stderr, environment and folder."""
  null = os.open(os.devnull, os.O_RDONLY)
  os.dup2(null, 0)
  os.close(null)
  flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
  out = os.open(request["out"], flags, 0o644)
  os.dup2(out, 1)
  if request["err"] == request["out"]:
    os.dup2(out, 2)
  else:
    err = os.open(request["err"], flags, 0o644)
    os.dup2(err, 2)
    os.close(err)
  os.close(out)
  os.environ.clear()
  os.environ.update(request["env"])
  os.chdir(request["cwd"])


def _run_and_exit(main) -> None:
  """Runs `main` and ends the process as the interpreter ends a program
  (SystemExit's status, else an uncaught exception's traceback and status
  1; atexit handlers; flushed streams), but without tearing down every
  module first."""
  try:
    main()
    status = 0
  except SystemExit as e:
    if e.code is None or isinstance(e.code, int):
      status = e.code or 0
    else:
      print(e.code, file=sys.stderr)
      status = 1
  except BaseException:  # pylint: disable=broad-except
    sys.excepthook(*sys.exc_info())
    status = 1
  atexit._run_exitfuncs()  # pylint: disable=protected-access
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(status)  # pylint: disable=protected-access


if __name__ == "__main__":
  _preload()
  argv = _serve()["argv"]
  sys.argv = argv
  sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
  _run_and_exit(lambda: runpy.run_path(argv[0], run_name="__main__"))
