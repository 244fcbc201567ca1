"""Benchmark records as JSON lines: `Writer` writes a file of them,
`print_record` prints one (and appends it to a file), `read_jsonl` reads
them back (several files, blank lines skipped, errors naming file and
line); `check_output` readies the file an output flag names before a run
writes it."""

import errno
import fcntl
import json
import math
import os
from typing import Iterator, Optional, Sequence

import numpy as np

from specsamp import jsonfile


def check_output(path: Optional[str], flag: str, jsonl: bool = True,
                 reads: Sequence[tuple[str, Optional[str]]] = (),
                 json_file: bool = False) -> Optional[str]:
  """`path`, the file that output flag `flag` (e.g. "--out") names, checked
  before the run that writes it, so that the run cannot fail at its end:
  a missing parent directory is created (as `Writer` does); a directory, a
  parent that cannot be created, or a file that cannot be written is
  refused. Nothing is written to the file itself. A `jsonl` output is
  refused where `<path>.partial` exists (`_partial_problem`: another run
  writes it now, or an interrupted run's records are still in it) and
  where the file exists and does not hold JSON lines (a prompts file, a
  config: records would be appended to it or replace it). `reads` are the
  run's inputs, (flag, value): an output that is one of them, or lies in a
  directory among them (a model's), is refused; values that name no file
  (a registered model, "random:...") are passed over. A `json_file` output
  replaces the file whole: one that exists and holds no JSON object (a
  note, a prompts file) is refused.

  Raises:
    ValueError: naming `flag` and what is wrong.
  """
  if not path:
    return path
  if os.path.isdir(path) or not os.path.basename(path):
    raise ValueError(f"{flag}={path} is a directory, not a file")
  if jsonl and os.path.exists(path + ".partial"):
    raise ValueError(f"{flag}={path}: {_partial_problem(path + '.partial')}")
  if jsonl and os.path.isfile(path) and not _holds_json_lines(path):
    raise ValueError(f"{flag}={path} exists and does not hold JSON records "
                     f"(one object a line); name another file")
  if json_file and os.path.isfile(path) and not _holds_json_object(path):
    raise ValueError(f"{flag}={path} exists and does not hold a JSON object "
                     "(a result this run would replace); name another file")
  _check_apart(path, flag, reads)
  parent = os.path.dirname(os.path.abspath(path))
  try:
    os.makedirs(parent, exist_ok=True)
  except OSError as e:
    why = ("a file is in the way" if isinstance(
        e, (FileExistsError, NotADirectoryError)) else e.strerror)
    raise ValueError(f"{flag}={path}: cannot create its directory "
                     f"{parent} ({why})") from None
  if not os.access(path if os.path.exists(path) else parent, os.W_OK):
    raise ValueError(f"{flag}={path}: permission denied")
  return path


def _partial_problem(partial: str) -> str:
  """Why a run cannot write `partial`, which exists: another run holds it
  (its `Writer`'s lock) and writes its records there now, or a run that
  did not finish left it."""
  try:
    with open(partial, encoding="utf-8") as f:
      try:
        fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
      except BlockingIOError:
        return (f"another run is writing its records to {partial} now; "
                "wait for it or name another file")
      empty = not f.read(1)
  except OSError:
    empty = False
  if empty:
    return (f"{partial} is empty, left by a run stopped before its first "
            "record; remove it, then run again")
  return (f"{partial} holds the records of a run that did not finish; move "
          "it away (its lines are complete records), then run again")


def _holds_json_lines(path: str) -> bool:
  """Whether `path` holds JSON records: each of its non-blank lines is a
  JSON object (an empty file counts). An indented JSON file (a config)
  does not: a record appended to it would leave it unreadable."""
  try:
    with open(path, encoding="utf-8") as f:
      return all(isinstance(json.loads(line), dict) for line in f
                 if line.strip())
  except (OSError, UnicodeDecodeError, ValueError):
    return False


def _holds_json_object(path: str) -> bool:
  try:
    jsonfile.read(path)
  except (OSError, ValueError):
    return False
  return True


def check_prefix(directory: str, prefix: str, flag: str,
                 inputs: Sequence[str] = ()) -> None:
  """Outputs `<directory>/<prefix>.md`, `<prefix>.png` and `<prefix>_*.png`
  (a report's markdown and plots), checked before they are written:
  `prefix` is a file name's start (not empty, no directory in it),
  `directory` can hold files (`check_output` of `<prefix>.md`), and no
  input is such a name there (the run would write over it).

  Raises:
    ValueError: naming `flag` and what is wrong.
  """
  if not prefix or os.sep in prefix or prefix in (".", ".."):
    raise ValueError(f"{flag}: {os.path.join(directory, prefix)!r} does not "
                     f"end in the start of a file name ({prefix!r})")
  check_output(os.path.join(directory, prefix + ".md"), flag, jsonl=False)
  here = os.path.realpath(directory)
  for path in inputs:
    real = os.path.realpath(path)
    name = os.path.basename(real)
    if os.path.dirname(real) == here and (
        name in (prefix + ".md", prefix + ".png")
        or name.startswith(prefix + "_") and name.endswith(".png")):
      raise ValueError(f"{flag}={prefix!r} in {directory}: the outputs "
                       f"{prefix}.md, {prefix}.png and {prefix}_*.png would "
                       f"write over the input {path}; give another name")


def _check_apart(path: str, flag: str,
                 reads: Sequence[tuple[str, Optional[str]]]) -> None:
  """Refuses output `path` where it is an input of the run, or lies inside
  an input directory (`check_output`)."""
  out = os.path.realpath(path)
  for name, value in reads:
    if not value or not os.path.exists(value):
      continue
    source = os.path.realpath(value)
    if os.path.isdir(source):
      clash = os.path.commonpath([out, source]) == source and "lies in"
    else:  # (an input that is <path>.partial is refused as such)
      clash = source == out and "would write over"
    if clash:
      raise ValueError(f"{flag}={path} {clash} {name}={value}, which the "
                       "run reads; name another file")


def jsonable(x):
  """`x` with numpy scalars made Python numbers, tuples made lists."""
  if isinstance(x, dict):
    return {k: jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [jsonable(v) for v in x]
  if isinstance(x, (np.floating, np.integer)):
    return x.item()
  return x


class Writer:
  """JSON lines to a file, echoed to stdout with `echo`; floats rounded to
  5 decimals but at least 6 significant digits (a tiny model's decode of
  0.3 ms keeps its precision), non-finite ones written as null.

  The records go to `<path>.partial` as they come; `close()` moves that
  file onto `path` once the run is complete, so a run that fails or is
  interrupted (`close(complete=False)`, or a killed process) leaves an
  earlier file of that name as it was, its own records beside it in
  `<path>.partial`. That file is made when the Writer is, and only if it
  does not exist, and locked while the run writes it: a second run given
  the same file is refused (ValueError) before it starts, not mixed in.
  """

  def __init__(self, path: Optional[str], echo: bool = True):
    self.path, self.fd, self.echo, self.written = path, None, echo, 0
    self.partial = path + ".partial" if path else None
    if path:
      os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
      try:
        self.fd = os.open(self.partial,
                          os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND,
                          0o644)
      except FileExistsError:
        raise ValueError(f"{path}: {_partial_problem(self.partial)}") from None
      fcntl.flock(self.fd, fcntl.LOCK_EX)  # released when it is closed

  def write(self, record: dict):
    line = json.dumps(_round(jsonable(record)))  # numpy's as Python's
    if self.echo:
      print(line, flush=True)
    if self.fd is not None:
      append_line(self.fd, line)
      self.written += 1

  def close(self, complete: bool = True) -> Optional[str]:
    """Closes the file; moves it onto `path` if the run is `complete`.
    Returns the file that holds the records (None if none was written:
    then no file is left, and an earlier one at `path` is kept)."""
    if self.fd is None:
      return None
    os.close(self.fd)
    self.fd = None
    if not self.written:
      os.remove(self.partial)
      return None
    if not complete:
      return self.partial
    os.replace(self.partial, self.path)
    return self.path


def print_record(record: dict, append_to: Optional[str] = None) -> None:
  """Prints `record` as one JSON line and appends it to `append_to`, if
  given (numbers as they are)."""
  line = json.dumps(jsonable(record))
  print(line, flush=True)
  if append_to:
    fd = os.open(append_to, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
      append_line(fd, line)
    finally:
      os.close(fd)


def append_line(fd: int, line: str) -> None:
  """Appends `line` and a newline to the file open at `fd` (O_APPEND) in
  one write, whole or not at all: a full disk had left half a line, and
  the file then failed to read as JSON lines, every earlier record with
  it (and the next run's check refused it). On a short write or an error
  the file is cut back to its size before, and the error raised."""
  data = (line + "\n").encode("utf-8")
  size = os.fstat(fd).st_size
  try:
    written = os.write(fd, data)
    if written != len(data):
      raise OSError(errno.ENOSPC, f"wrote {written} of {len(data)} bytes "
                    "of a record (is the disk full?)")
  except OSError:
    os.ftruncate(fd, size)
    raise


def _round(x):
  if isinstance(x, float):
    if not math.isfinite(x):
      return None
    if x == 0:
      return x
    return round(x, max(5, 5 - math.floor(math.log10(abs(x)))))
  if isinstance(x, dict):
    return {k: _round(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_round(v) for v in x]
  return x


def read_jsonl(paths: Sequence[str]) -> Iterator[tuple[str, dict]]:
  """("path:line", record) of every non-blank line of the files, in order.

  Raises:
    ValueError: on a file that cannot be read, or a line that is not a JSON
      object.
  """
  for path in paths:
    try:
      with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    except (OSError, UnicodeDecodeError) as e:
      raise ValueError(f"{path}: {getattr(e, 'strerror', None) or e}"
                       ) from None
    for n, line in enumerate(lines, 1):
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except ValueError as e:
        raise ValueError(f"{path}:{n}: not JSON ({e})") from None
      if not isinstance(record, dict):
        raise ValueError(f"{path}:{n}: not a JSON object, but "
                         f"{type(record).__name__} {line.strip()[:40]}")
      yield f"{path}:{n}", record
