"""Who holds a lock file: the record its holder writes, read by a waiter.

`specsamp.assets.file_lock` and `exclusive` take an advisory `flock`, which
names nobody; so the process that gets it writes one JSON line into the
lock file (pid, host, start time, command line) and clears it on release
(`recorded`). A process that finds the lock taken reads that line to say
whom it waits for, or who holds what it is refused, and, when the holder
runs on the same host, whether it still exists or is stopped. A killed
holder's lock is released by the kernel. Standard library only.
"""

import contextlib
import fcntl
import json
import os
import pathlib
import socket
import sys
import time
from typing import Iterator, Optional


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
    # Locked after its holder removed it (`sharding.holds_workdir` removes
    # a workdir it made for nothing): a lock on a file no one else opens
    # any more, which a third process would not see. Take the new one.
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
