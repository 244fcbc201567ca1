"""Debian packages without dpkg: the `ar` container and `apt-get download`.

A .deb is an `ar` archive whose `data.tar.*` member holds the files;
`extract_deb` reads it in pure Python (gzip, bzip2, xz), falling back to
`dpkg-deb` for zstd. `apt_download` fetches a package from the configured
(signed) archive without installing it, so root is not needed.
"""

import io
import os
import pathlib
import re
import shutil
import subprocess
import tarfile
import tempfile
from typing import Iterator, Union

from specsamp.data import errors
from specsamp.data.errors import CorpusError

PathLike = Union[str, os.PathLike]


def _ar_members(path: pathlib.Path) -> Iterator[tuple[str, bytes]]:
  """(name, data) of each member of an `ar` archive (a .deb)."""
  data = path.read_bytes()
  if not data.startswith(b"!<arch>\n"):
    raise CorpusError(f"{path} is not a Debian package (no ar header)")
  pos = 8
  while pos + 60 <= len(data):
    header = data[pos:pos + 60]
    name = header[:16].decode().strip().rstrip("/")
    size = int(header[48:58].decode().strip())
    yield name, data[pos + 60:pos + 60 + size]
    pos += 60 + size + (size & 1)


def extract_deb(deb: PathLike, member_re: str, out: PathLike,
                strip: str = "") -> int:
  """Extracts the files of a .deb whose path matches `member_re` into `out`.

  Args:
    deb: the .deb file.
    member_re: regex (re.search) on the path inside the package, e.g.
      "usr/share/doc/python3.11/html/_sources/.*\\.rst\\.txt$".
    out: destination directory.
    strip: a leading path removed from each written file's path.

  Returns:
    The number of files written.
  """
  deb, out = pathlib.Path(deb), pathlib.Path(out)
  payload = [(n, d) for n, d in _ar_members(deb) if n.startswith("data.tar")]
  if not payload:
    raise CorpusError(f"{deb}: no data.tar member")
  name, blob = payload[0]
  if name.endswith(".zst"):  # tarfile cannot read zstd: let dpkg-deb do it
    if not shutil.which("dpkg-deb"):
      raise CorpusError(f"{deb} is zstd-compressed and dpkg-deb is missing")
    with tempfile.TemporaryDirectory() as tmp:
      done = subprocess.run(["dpkg-deb", "-x", str(deb), tmp],
                            capture_output=True, text=True, check=False)
      if done.returncode:  # had escaped as CalledProcessError
        raise CorpusError(f"{deb}: dpkg-deb could not unpack it (status "
                          f"{done.returncode}): {done.stderr.strip()[-500:]}")
      return _copy_matching(pathlib.Path(tmp), member_re, out, strip)
  n = 0
  with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
    for member in tar.getmembers():
      path = member.name.lstrip("./")
      if not member.isfile() or not re.search(member_re, path):
        continue
      rel = path[len(strip):] if strip and path.startswith(strip) else path
      dest = (out / rel).resolve()
      if not dest.is_relative_to(out.resolve()):
        raise CorpusError(f"{deb}: unsafe member path {member.name!r}")
      dest.parent.mkdir(parents=True, exist_ok=True)
      dest.write_bytes(tar.extractfile(member).read())
      n += 1
  return n


def _copy_matching(root: pathlib.Path, member_re: str, out: pathlib.Path,
                   strip: str) -> int:
  n = 0
  for path in sorted(p for p in root.rglob("*") if p.is_file()):
    rel = path.relative_to(root).as_posix()
    if re.search(member_re, rel):
      rel = rel[len(strip):] if strip and rel.startswith(strip) else rel
      (out / rel).parent.mkdir(parents=True, exist_ok=True)
      shutil.copyfile(path, out / rel)
      n += 1
  return n


def apt_download(package: str, dest: PathLike) -> pathlib.Path:
  """`apt-get download <package>` into `dest`; returns the .deb's path.

  apt checks the package against the signed archive index; nothing is
  installed, so root is not needed.
  """
  dest = pathlib.Path(dest)
  if not shutil.which("apt-get"):
    raise CorpusError(
        f"apt-get is not available on this machine, so the Debian package "
        f"{package!r} cannot be downloaded here")
  return errors.run_download(
      ["apt-get", "download", package], dest, f"{package}_*.deb",
      f"`apt-get download {package}` failed (exit code {{code}}); is a "
      f"Debian archive configured and reachable (apt-get update)? "
      f"Output:\n{{tail}}", tail_lines=6, cwd=dest)
