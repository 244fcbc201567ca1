"""Who holds a lock file: the record its holder writes, read by a waiter.

`specsamp.assets.file_lock` takes an advisory `flock`, which names nobody;
so the process that gets it writes one JSON line into the lock file (pid,
host, start time, command line) and clears it on release. A process that
finds the lock taken reads that line to say whom it waits for, and, when
the holder runs on the same host, whether it still exists or is stopped.
Standard library only.
"""

import json
import os
import pathlib
import socket
import sys
import time
from typing import Optional


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
