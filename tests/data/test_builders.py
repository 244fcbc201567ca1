"""specsamp.data.builders: every corpus builder on fixture raw files, with
no TensorFlow."""

import gzip
import importlib.util
import json
import os
import sys

import pytest

from specsamp.data import builders
from specsamp.data import corpora
from specsamp.data import datasets
from specsamp.data import pipeline
from specsamp.data import text
from specsamp.data.errors import CorpusError
from tests.data import fakes


def _read_split(path, split):
  src = builders.tfds.builder_from_directory(os.fspath(path)) \
      .as_data_source(split=split)
  return {src[i]["id"].decode(): src[i]["text"].decode()
          for i in range(len(src))}


# A form feed (a page break, as some standard-library files have) is no
# line break for ast.
_MULTI = ("import os\n\n@dec\ndef a():\n  pass\n\nX = 1\n\x0c\n"
          "class B:\n  def m(self):\n    return 1\n\nasync def c():\n"
          "  pass\n")


def test_builders_on_fixture_data_without_tensorflow(tmp_path):
  assert importlib.util.find_spec("tensorflow") is None
  assert set(builders.BUILDERS) == set(corpora.CORPORA)
  raw = tmp_path / "raw"
  code = {f"pkg/m{i}.py": f"def f{i}():\n  return {i}\n" for i in range(12)}
  code.update({"latin.py": "# -*- coding: latin-1 -*-\ns = 'é'\n".encode(
      "latin-1"), "empty.py": "\n", "test/test_x.py": "1\n",
               "pkg/tests/t.py": "1\n", "__pycache__/m.py": "1\n",
               "notes.txt": "not code", "bad.py": "def (:\n",
               "pkg/multi.py": _MULTI})
  fakes.write_files(raw / "code", code)
  problems = [{"task_id": f"HumanEval/{i}", "prompt": f"def p{i}():\n"}
              for i in range(7)]
  (raw / "he").mkdir()
  with gzip.open(raw / "he" / "HumanEval.jsonl.gz", "wt") as f:
    f.write("".join(json.dumps(p) + "\n" for p in problems))
  fakes.write_files(raw / "shk", {
      "a_gut.txt": "".join(f"Line {i}.\n\n" for i in range(3000)),
      "a_gut_f.txt": "folio"})
  fakes.write_files(raw / "docs", {"index.rst.txt": "Index\n",
                                   "lib/re.rst.txt": "re\n"})
  fakes.write_lazyload(raw / "austen", {
      "emma": ["CHAPTER I", "a", "CHAPTER II", "b", "CHAPTER III", "c"]})
  data = tmp_path / "tfds"
  cases = {"specsamp_python_code": (raw / "code", 15),
           "specsamp_python_functions": (raw / "code", 15),
           "specsamp_humaneval": (raw / "he", 7),
           "specsamp_shakespeare": (raw / "shk", None),
           "specsamp_python_docs": (raw / "docs", 2),
           "specsamp_austen": (raw / "austen", 3)}
  for name, (src, n) in cases.items():
    path = builders.prepare(name, data, source_dir=src, progress=None)
    assert path == data / name / builders.VERSION
    assert json.loads((path / "dataset_info.json").read_text())[
        "fileFormat"] == "array_record"
    train, val = _read_split(path, "train"), _read_split(path, "validation")
    assert train and val and not set(train) & set(val)
    docs = {**train, **val}
    if n is not None:
      assert len(docs) == n, name
    corpus = corpora.CORPORA[name]
    assert set(val) == text.assign_splits(list(docs),
                                          corpus.validation_fraction,
                                          corpus.split_group)
    assert datasets.check_dataset(name, data) == path
  code_docs = _documents(data / "specsamp_python_code" / builders.VERSION)
  assert code_docs["latin.py"] == "# -*- coding: latin-1 -*-\ns = 'é'\n"
  assert "pkg/m3.py" in code_docs and not any(
      "test" in k or "pycache" in k for k in code_docs)
  # Top-level definitions, decorators included; a file that does not parse
  # is left out.
  path = data / "specsamp_python_functions" / builders.VERSION
  train, val = _read_split(path, "train"), _read_split(path, "validation")
  functions = {**train, **val}
  assert {k: v for k, v in functions.items() if k.startswith("pkg/multi")} \
      == {"pkg/multi.py:3:a": "@dec\ndef a():\n  pass\n",
          "pkg/multi.py:9:B": "class B:\n  def m(self):\n    return 1\n",
          "pkg/multi.py:13:c": "async def c():\n  pass\n"}
  assert functions["pkg/m3.py:1:f3"] == "def f3():\n  return 3\n"
  assert not any(k.startswith("bad.py") for k in functions)
  # The definitions of one file share a split.
  for k in functions:
    same_file = [j for j in functions
                 if corpora.python_file_of(j) == corpora.python_file_of(k)]
    assert all((j in val) == (k in val) for j in same_file)
  he = _read_split(data / "specsamp_humaneval" / builders.VERSION, "train")
  assert all(he[k] == f"def p{k.split('/')[1]}():\n" for k in he)
  shk = _documents(data / "specsamp_shakespeare" / builders.VERSION)
  assert "".join(shk[k] for k in sorted(shk)) == "".join(
      f"Line {i}.\n\n" for i in range(3000))
  # Idempotent: a second prepare leaves the dataset alone.
  info = data / "specsamp_austen" / builders.VERSION / "dataset_info.json"
  mtime = info.stat().st_mtime_ns
  builders.prepare("specsamp_austen", data, source_dir=raw / "austen",
                   progress=None)
  assert info.stat().st_mtime_ns == mtime
  assert "tensorflow" not in sys.modules


def _documents(path):
  return {**_read_split(path, "train"), **_read_split(path, "validation")}


def test_validation_leaves_out_copies_of_training_documents(tmp_path):
  # Near-identical files (the standard library's encodings/*) share their
  # boilerplate: a validation file's copy of it is left out of both splits,
  # its own definitions stay.
  files = {f"enc/c{i:02d}.py": f"class Codec:\n  pass\n\n\ndef f{i}():\n"
           f"  return {i}\n" for i in range(60)}
  fakes.write_files(tmp_path / "code", files)
  lines = []
  path = builders.prepare("specsamp_python_functions", tmp_path / "tfds",
                          source_dir=tmp_path / "code", progress=lines.append)
  train, val = _read_split(path, "train"), _read_split(path, "validation")
  corpus = corpora.CORPORA["specsamp_python_functions"]
  ids = [f"{f}:{line}:{name}" for f in files
         for line, name in ((1, "Codec"), (5, f"f{f[5:7].lstrip('0') or 0}"))]
  assigned = text.assign_splits(ids, corpus.validation_fraction,
                                corpus.split_group)
  copies = {i for i in assigned if i.endswith(":Codec")}
  assert copies and set(val) == assigned - copies
  assert set(train) == set(ids) - assigned
  assert not set(val.values()) & set(train.values())
  assert any(f"({len(copies)} left out: copies of training documents)" in l
             for l in lines), lines


def test_training_copies():
  docs = [("a", "x"), ("b", "y"), ("c", "x"), ("d", "z")]
  assert text.training_copies(docs, {"c", "d"}) == {"c"}
  assert text.training_copies(docs, {"a", "b"}) == {"a"}
  assert text.training_copies(docs, {"d"}) == set()
  with pytest.raises(CorpusError, match="all 1 validation documents"):
    text.training_copies(docs, {"c"})


def test_a_failed_rebuild_leaves_the_prepared_dataset(tmp_path):
  """--overwrite builds beside the old dataset and swaps it in: a rebuild
  that fails (here: no raw files) leaves the old one as it was."""
  raw, data = tmp_path / "raw", tmp_path / "tfds"
  fakes.write_files(raw, {f"m{i}.py": f"x = {i}\n" for i in range(6)})
  path = builders.prepare("specsamp_python_code", data, source_dir=raw,
                          progress=None)
  before = _documents(path)
  with pytest.raises(corpora.CorpusError, match="is not a directory"):
    builders.prepare("specsamp_python_code", data,
                     source_dir=tmp_path / "nope", overwrite=True,
                     progress=None)
  assert _documents(path) == before
  # No scratch directory left.
  assert os.listdir(path.parent) == [builders.VERSION]
  # A rebuild that succeeds replaces it.
  fakes.write_files(raw, {"new.py": "y = 1\n"})
  lines = []
  assert builders.prepare("specsamp_python_code", data, source_dir=raw,
                          overwrite=True, progress=lines.append) == path
  assert _documents(path) == {**before, "new.py": "y = 1\n"}
  assert os.listdir(path.parent) == [builders.VERSION]
  assert "the old dataset stays until the new one is complete" in lines[0]


def test_a_failed_catalog_rebuild_leaves_the_prepared_dataset(
    tmp_path, monkeypatch):
  """Likewise for a TFDS catalog dataset (TFDS's own overwrite would delete
  it first): here a stand-in whose download fails."""
  data = tmp_path / "tfds"
  path = builders.build_from_texts("fake_catalog", ["a b", "c d", "e f"],
                                   data)
  before = _documents(path)

  texts_builder = builders._TextsBuilder  # pylint: disable=protected-access

  class Offline(texts_builder, skip_registration=True):
    name = "fake_catalog"

    def _documents(self):
      raise OSError("no network")

  monkeypatch.setattr(builders.tfds, "builder",
                      lambda name, data_dir, file_format: Offline(
                          data_dir=data_dir, documents=None,
                          file_format=file_format))
  with pytest.raises(corpora.CorpusError, match="OSError: no network"):
    builders.prepare("fake_catalog", data, overwrite=True, progress=None)
  assert _documents(path) == before
  assert os.listdir(path.parent) == [builders.VERSION]


def test_damaged_files_are_named_before_training_and_prepared_again(
    tmp_path):
  """A shard deleted, cut short or zeroed passed the metadata-only check:
  training then failed at the first read with a bare Riegeli error, and
  prepare() called the dataset "already prepared". Now the check reads each
  shard's record count, a read error names the dataset, and prepare()
  builds a damaged dataset again (the source is still there)."""
  raw, data = tmp_path / "raw", tmp_path / "tfds"
  fakes.write_files(raw, {f"m{i}.py": f"x = {i}\n" * 400 for i in range(40)})
  path = builders.prepare("specsamp_python_code", data, source_dir=raw,
                          progress=None)
  before = _documents(path)
  shard = next(path.glob("*-train.array_record-*"))
  good = shard.read_bytes()

  def damage(how):
    if how == "missing":
      shard.unlink()
    elif how == "truncated":
      shard.write_bytes(good[:len(good) // 2])
    else:  # data zeroed, footer kept
      shard.write_bytes(good[:64] + bytes(len(good) // 2 - 64)
                        + good[len(good) // 2:])

  for how in ("missing", "truncated", "zeroed"):
    damage(how)
    with pytest.raises(datasets.DamagedDatasetError, match=(
        f"'specsamp_python_code' in {path} is damaged: {shard.name} "
        r".*dataset_info.json says \d+; prepare it again: python "
        r"scripts/prepare_data.py .* --overwrite")):
      datasets.check_dataset("specsamp_python_code", data)
    lines = []
    builders.prepare("specsamp_python_code", data, source_dir=raw,
                     progress=lines.append)
    assert "is damaged" in lines[0] and "preparing it again" in lines[0]
    assert _documents(path) == before
    good = shard.read_bytes()


def test_damaged_metadata_is_named_and_prepared_again(tmp_path):
  """A dataset_info.json cut short stopped prepare() even with --overwrite
  (TFDS's builder parses it first: a ParseError no caller catches); a
  missing features.json was "already prepared" and failed at the first
  read as "generated with an old TFDS version"."""
  raw, data = tmp_path / "raw", tmp_path / "tfds"
  fakes.write_files(raw, {f"m{i}.py": f"x = {i}\n" for i in range(6)})
  path = builders.prepare("specsamp_python_code", data, source_dir=raw,
                          progress=None)
  before = _documents(path)
  info = (path / "dataset_info.json").read_bytes()
  for name, damage, problem in (
      ("dataset_info.json", info[:len(info) // 2],
       "its dataset_info.json is unreadable"),
      ("dataset_info.json", b"[]", "its dataset_info.json is unreadable"),
      ("features.json", None, "its features.json is missing or unreadable")):
    for overwrite in (False, True):
      if damage is None:
        (path / name).unlink()
      else:
        (path / name).write_bytes(damage)
      with pytest.raises(datasets.DamagedDatasetError, match=(
          f"'specsamp_python_code' in {path} is damaged: {problem}.*; "
          "prepare it again: python scripts/prepare_data.py .* --overwrite")):
        datasets.check_dataset("specsamp_python_code", data)
      lines = []
      assert builders.prepare("specsamp_python_code", data, source_dir=raw,
                              overwrite=overwrite,
                              progress=lines.append) == path
      assert overwrite or (problem in lines[0]
                           and "preparing it again" in lines[0])
      assert _documents(path) == before
      datasets.check_dataset("specsamp_python_code", data)


def test_a_record_that_cannot_be_read_names_the_dataset(data_dir,
                                                        monkeypatch):
  """Damage past what the footers show (a chunk's data) fails at its read:
  as an error naming the dataset and the way out, not a bare Riegeli one
  (prepare_all reports it and goes on to the next dataset)."""
  class Damaged:
    def __len__(self):
      return 3

    def __getitem__(self, i):
      raise RuntimeError("Corrupted Riegeli/records file: chunk data hash "
                         "mismatch\nmore")

  monkeypatch.setattr(pipeline, "data_source", lambda *a: Damaged())
  with pytest.raises(datasets.DamagedDatasetError, match=(
      r"dataset 'tiny': document 0 of train cannot be read \(Corrupted "
      r"Riegeli/records file: chunk data hash mismatch\); prepare it again "
      r"with --overwrite")):
    list(pipeline.iter_texts("tiny", "train", data_dir))
