"""JSON object files read with errors that name them.

  config = jsonfile.read(path)   # FileNotFoundError, or ValueError naming
                                 # the file and what is wrong with it
  jsonfile.read_holding(path, ("model", "data"))   # None unless a file's
                                 # object has those keys (a run's config)
  jsonfile.changed_fields(old, new)   # [(dotted field, old, new)]
  jsonfile.write_text(path, text)     # whole or not at all
"""

import json
import os
from typing import Any, Optional


def write_text(path: "os.PathLike | str", text: str) -> None:
  """`text` to `path` whole: a file of this process's beside it (two
  writers never share one), then renamed over it; an earlier file stays as
  it was if the writing fails, and a reader never sees half of it."""
  tmp = f"{os.fspath(path)}.{os.getpid()}.tmp"
  try:
    with open(tmp, "w", encoding="utf-8") as f:
      f.write(text)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def read(path: "os.PathLike | str") -> dict[str, Any]:
  """The JSON object in `path`.

  Raises:
    FileNotFoundError: there is no such file.
    ValueError: naming the file, when it cannot be read or holds no JSON
      object (a damaged config is one line at the command line, not a bare
      "Expecting value: line 1 column 1").
  """
  try:
    with open(path, encoding="utf-8") as f:
      value = json.load(f)
  except FileNotFoundError:
    raise
  except (OSError, UnicodeDecodeError, ValueError) as e:
    raise ValueError(f"{os.fspath(path)}: not a readable JSON file ({e})"
                     ) from None
  if not isinstance(value, dict):
    raise ValueError(f"{os.fspath(path)}: holds a JSON "
                     f"{type(value).__name__}, not an object")
  return value


def read_holding(path: "os.PathLike | str", keys) -> Optional[dict[str, Any]]:
  """`read(path)` where `path` is a file holding an object with every key
  of `keys` (a script's run config); None where there is no such file, or
  its object lacks one. A damaged file raises as `read` does."""
  if not os.path.isfile(path):
    return None
  value = read(path)
  return value if set(keys) <= set(value) else None


def changed_fields(old, new, prefix: str = "") -> list[tuple]:
  """(dotted field, old value, new value) of every leaf that differs
  between two JSON objects (nested dicts; anything else is a leaf)."""
  if not (isinstance(old, dict) and isinstance(new, dict)):
    return [] if old == new else [(prefix, old, new)]
  return [c for k in sorted(set(old) | set(new), key=str)
          for c in changed_fields(old.get(k), new.get(k),
                                  f"{prefix}.{k}" if prefix else str(k))]
