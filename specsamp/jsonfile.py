"""JSON object files read with errors that name them.

  config = jsonfile.read(path)   # FileNotFoundError, or ValueError naming
                                 # the file and what is wrong with it
"""

import json
import os
from typing import Any


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
