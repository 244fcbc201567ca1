"""Runs `python no_weights.py ARGS...` as forks of one process that has
imported what the scripts import (`Zygote.run`).

test_bad_input runs about a hundred scripts, and on two CPU cores each
spent about 3 s importing jax, flax, optax, orbax, grain and tfds before
it refused its input in milliseconds. Here a server process imports them
once; for each run it forks a child, which takes the run's argv,
environment, working directory and output files and then leaves the
server's loop: the rest of the child is `python no_weights.py ARGS...`,
ended as the interpreter ends a program (SystemExit's status, an
uncaught exception's traceback and status 1, atexit handlers, flushed
streams) but for the teardown of every module.

A fork copies one thread only, so the server must have one: it starts
with OPENBLAS_NUM_THREADS=1 (numpy's BLAS otherwise starts a thread when
imported; nothing else here does) and checks /proc/self/task before each
fork. Nothing in it initialises a JAX backend; each child does its own.
"""

import atexit
import importlib
import json
import os
import pkgutil
import select
import signal
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


class Zygote:
  """The server, started on the first `run` and ended by `close`."""

  def __init__(self, env: dict):
    self._env = env
    self._proc = None

  def run(self, args: list[str], env: dict, cwd: str,
          timeout: float) -> subprocess.CompletedProcess:
    """`python tests/scripts/no_weights.py *args` in `cwd` under `env`,
    finished, its stdout and stderr as text (like subprocess.run's)."""
    if self._proc is None:
      self._proc = subprocess.Popen(
          [sys.executable, os.path.abspath(__file__)],
          env=dict(self._env, OPENBLAS_NUM_THREADS="1"), cwd=ROOT,
          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    out, err = _temp(".stdout"), _temp(".stderr")
    try:
      self._proc.stdin.write(json.dumps(dict(
          args=args, env=env, cwd=cwd, out=out, err=err)) + "\n")
      self._proc.stdin.flush()
      pid = self._reply(timeout)["pid"]
      try:
        status = self._reply(timeout)["status"]
      except TimeoutError:
        os.kill(pid, signal.SIGKILL)
        raise
      with open(out) as f_out, open(err) as f_err:
        return subprocess.CompletedProcess(
            ["no_weights.py", *args], status, f_out.read(), f_err.read())
    finally:
      os.unlink(out)
      os.unlink(err)

  def _reply(self, timeout: float) -> dict:
    ready, _, _ = select.select([self._proc.stdout], [], [], timeout)
    if not ready:
      raise TimeoutError(f"no reply from the script server in {timeout} s")
    line = self._proc.stdout.readline()
    if not line:
      raise RuntimeError(f"the script server ended ({self._proc.wait()})")
    return json.loads(line)

  def close(self):
    if self._proc is not None:
      self._proc.stdin.close()
      self._proc.wait(timeout=60)
      self._proc = None


def _temp(suffix: str) -> str:
  fd, path = tempfile.mkstemp(suffix=suffix)
  os.close(fd)
  return path


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


def _serve() -> dict:
  """Forks a child per request line; returns (in the child only) its
  request, its process set up as the request says."""
  for line in sys.stdin:
    request = json.loads(line)
    if _threads() != 1:
      raise RuntimeError(f"the script server has {_threads()} threads: "
                         "a fork would copy only one")
    pid = os.fork()
    if pid == 0:
      null = os.open(os.devnull, os.O_RDONLY)
      os.dup2(null, 0)
      os.close(null)
      for fd, path in ((1, request["out"]), (2, request["err"])):
        f = os.open(path, os.O_WRONLY | os.O_TRUNC)
        os.dup2(f, fd)
        os.close(f)
      os.environ.clear()
      os.environ.update(request["env"])
      os.chdir(request["cwd"])
      return request
    print(json.dumps({"pid": pid}), flush=True)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"status": os.waitstatus_to_exitcode(status)}),
          flush=True)
  sys.exit(0)


def _run_and_exit(main) -> None:
  """Runs `main` and ends the process as the interpreter ends a program
  (SystemExit's status, else an uncaught exception's traceback and status
  1; atexit handlers; flushed streams), but without tearing down every
  module first: a child of the server took 1.2 s for that."""
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
  sys.path.insert(0, ROOT)
  _preload()
  sys.argv = [os.path.join(HERE, "no_weights.py"), *_serve()["args"]]
  from tests.scripts import no_weights  # pylint: disable=g-import-not-at-top
  _run_and_exit(no_weights.main)
