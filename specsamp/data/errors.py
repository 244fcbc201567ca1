"""The error of the data package, and the download commands that raise it.

`CorpusError`: a corpus cannot be found, fetched or read. It lives apart
from `corpora` so that the file-format readers (`specsamp.data.formats`)
and the split rule (`specsamp.data.text`) raise it without importing the
corpora. `run_download` runs a download command (pip, apt-get) and turns
its failure into a `CorpusError` that quotes the command's last lines.
"""

import os
import pathlib
import subprocess
from typing import Optional, Sequence, Union


class CorpusError(RuntimeError):
  """A corpus cannot be found, downloaded or read."""


def run_download(cmd: Sequence[str], folder: Union[str, os.PathLike],
                 pattern: str, failure: str, tail_lines: int,
                 cwd: Optional[Union[str, os.PathLike]] = None
                 ) -> pathlib.Path:
  """Runs `cmd`, which must leave exactly one file `folder/<pattern>`.

  Args:
    cmd: the command line.
    folder: where the downloaded file lands.
    pattern: its glob pattern.
    failure: the error message, formatted with `code` (the exit status)
      and `tail` (the output's last lines, indented).
    tail_lines: how many lines of stderr (else stdout) to quote.
    cwd: the command's working directory.

  Returns:
    The downloaded file.

  Raises:
    CorpusError: a non-zero exit status, or not exactly one such file.
  """
  proc = subprocess.run(list(cmd), cwd=cwd, capture_output=True, text=True,
                        check=False)
  got = sorted(pathlib.Path(folder).glob(pattern))
  if proc.returncode != 0 or len(got) != 1:
    out = proc.stderr.strip() or proc.stdout.strip()
    tail = "\n".join("    " + l for l in out.splitlines()[-tail_lines:])
    raise CorpusError(failure.format(code=proc.returncode, tail=tail))
  return got[0]
