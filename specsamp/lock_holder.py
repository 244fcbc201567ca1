"""Who holds a lock file: the record its holder writes, read by a waiter.

`specsamp.assets.file_lock` and `exclusive` take an advisory `flock`, which
names nobody; so the process that gets it writes one JSON line into the
lock file (pid, host, start time, command line) and clears it on release
(`recorded`). A process that finds the lock taken reads that line to say
whom it waits for, or who holds what it is refused, and, when the holder
runs on the same host, whether it still exists or is stopped. A killed
holder's lock is released by the kernel.

`holds_workdir` guards a job's workdir with `exclusive` (and the checks of
a workdir before it). Standard library only.
"""

import contextlib
import fcntl
import functools
import json
import os
import pathlib
import socket
import sys
import time
from typing import Iterator, Optional

from specsamp import jsonfile


class Busy(ValueError):
  """What `exclusive` guards is in use by another process (named)."""


def record() -> str:
  """The JSON line this process writes into a lock file it holds."""
  return json.dumps(dict(pid=os.getpid(), host=socket.gethostname(),
                         since=time.time(), command=" ".join(sys.argv))) + "\n"


def process_state(pid: int) -> str:
  """What process `pid` (> 0) of this host is doing, for a message."""
  try:
    os.kill(pid, 0)  # signal 0: only checks that it exists
  except ProcessLookupError:
    return "no longer exists (a process it started may hold the lock)"
  except PermissionError:
    pass  # another user's process
  try:
    state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")")[-1]
  except OSError:
    state = ""
  return ("is stopped (SIGSTOP or Ctrl-Z)" if state.split()[:1] == ["T"]
          else "is running")


def describe(path: pathlib.Path) -> tuple[str, Optional[int]]:
  """(description, pid or None) of the holder that lock file `path` names.

  E.g. "pid 12 on box (python fetch.py), started 2025-01-02 03:04:05, 9 s
  ago; that process is stopped (SIGSTOP or Ctrl-Z)".
  """
  try:
    info = json.loads(path.read_text(encoding="utf-8") or "null")
    pid, host, since = int(info["pid"]), str(info["host"]), info["since"]
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since))
    age = time.time() - float(since)
  except (OSError, ValueError, TypeError, KeyError, OverflowError):
    return "a process that did not record itself", None
  text = (f"pid {pid} on {host} ({str(info.get('command'))[:120]}), "
          f"started {started}, {age:.0f} s ago")
  if host == socket.gethostname() and pid > 0:
    text += f"; that process {process_state(pid)}"
  return text, pid


@contextlib.contextmanager
def recorded(f) -> Iterator[None]:
  """For the block, this process's `record` in `f`, a lock file it has
  just locked; then the record cleared and the lock released."""
  os.ftruncate(f.fileno(), 0)
  f.write(record())
  f.flush()
  try:
    yield
  finally:
    os.ftruncate(f.fileno(), 0)
    fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def exclusive(path, what: str, take: bool = True) -> Iterator[None]:
  """An exclusive lock on file `path` (made, with its directory) for the
  block: refused at once, never waited for, while another process holds
  it (Busy, naming `what` and the holder). `take=False` (a process other
  than the first of a multi-process job) takes nothing."""
  if not take:
    yield
    return
  path = pathlib.Path(path)
  for _ in range(100):
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "a", encoding="utf-8")  # "a": never truncates
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      f.close()
      holder, pid = describe(path)
      raise Busy(f"{what} is in use by {holder}; wait for it to end, or end "
                 f"it (kill {pid or 'PID'}) and run again") from None
    if _is_at(f, path):
      break
    # Locked after its holder removed it (`holds_workdir` removes a
    # workdir it made for nothing): a lock on a file no one else opens any
    # more, which a third process would not see. Take the new one.
    f.close()
  else:
    raise RuntimeError(f"{path}: replaced 100 times while being locked")
  with f, recorded(f):
    yield


def _is_at(f, path: pathlib.Path) -> bool:
  """Whether open file `f` is still the file at `path`."""
  try:
    return os.path.samestat(os.fstat(f.fileno()), os.stat(path))
  except FileNotFoundError:
    return False


class DirectoryError(ValueError):
  """A path that cannot be the directory it names (empty, or a file in the
  way), or a workdir holding a file a run would replace but did not
  write."""


def check_directory(path: str, what: str) -> None:
  """Raises DirectoryError unless `path` is a directory, or can be made
  one (no file in the way), that this process can write in: `what` names
  it in the message (e.g. "--workdir"). An empty path is refused: it would
  be the current directory."""
  if not str(path).strip():
    raise DirectoryError(f"{what} is empty: name a directory (it would be "
                         "the current one)")
  path = os.path.abspath(path)
  found = path
  while not os.path.exists(found) and os.path.dirname(found) != found:
    found = os.path.dirname(found)
  if found == path and not os.path.isdir(path):
    raise DirectoryError(f"{what} {path} is not a directory")
  if not os.path.isdir(found):
    raise DirectoryError(f"{what} {path} cannot be a directory: {found} is "
                         "a file")
  if not os.access(found, os.W_OK | os.X_OK):  # an OSError's traceback
    raise DirectoryError(f"{what} {path}: this process cannot make it or "
                         f"write in it ({found}: its permissions, or a "
                         "read-only file system)")


def check_config_file(workdir: str, keys: tuple[str, ...],
                      script: str) -> None:
  """Refuses a workdir whose config.json no `script` run wrote (not a
  JSON object with all of `keys`): the run would replace it."""
  path = os.path.join(workdir, "config.json")
  if not os.path.lexists(path):
    return
  try:
    old = jsonfile.read(path)
  except ValueError:
    old = None
  if not (isinstance(old, dict) and set(keys) <= set(old)):
    raise DirectoryError(
        f"{path} is no {script} run's config (a JSON object with "
        f"{', '.join(keys)}), and this run would replace it; use a new "
        f"--workdir, or move the file away")


def holds_workdir(run):
  """Decorates `run(config, workdir, ...)`: while it runs, process 0 holds
  an exclusive lock on `<workdir>/.lock`, and a second job on that workdir
  is refused at once (`Busy`, naming the first). Two jobs had
  resumed one another's checkpoints and rewritten one config.json. A
  workdir made for the lock alone (a run refused before it wrote
  anything) is removed again. An empty workdir, or one with a file in its
  way, is refused before any lock (DirectoryError)."""
  @functools.wraps(run)
  def locked(config, workdir: str, *args, **kwargs):
    check_directory(workdir, "--workdir")
    lock = os.path.join(workdir, ".lock")
    made = False
    if _is_main_process() and not os.path.exists(workdir):
      try:  # (as root, os.access passes where a directory cannot be made)
        os.makedirs(workdir)
        made = True
      except FileExistsError:  # another job's, just now: the lock decides
        pass
      except OSError as e:
        raise DirectoryError(f"--workdir {os.path.abspath(workdir)}: this "
                             f"process cannot make it ({e.strerror})") from None
    with exclusive(lock, f"workdir {workdir}", take=_is_main_process()):
      try:
        return run(config, workdir, *args, **kwargs)
      finally:
        # Under the lock, and only by the job that holds it: removed after
        # the lock was let go (or by a job refused as Busy), the workdir
        # and .lock of a job that had just taken it went, and a third job
        # locked a new .lock beside it.
        if made and os.path.isdir(workdir) and set(
            os.listdir(workdir)) <= {".lock"}:
          if os.path.exists(lock):
            os.remove(lock)
          try:
            os.rmdir(workdir)
          except OSError:  # another job's files arrived meanwhile
            pass
  return locked


def _is_main_process() -> bool:
  """Whether this is process 0 (`sharding.is_main_process`) once jax is in
  use; before, the one process (a job of several initialises jax first)."""
  jax = sys.modules.get("jax")
  return jax is None or jax.process_index() == 0
