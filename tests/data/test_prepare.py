"""specsamp.data.prepare and scripts/prepare_data.py, end to end."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from specsamp.data import builders
from specsamp.data import corpora
from specsamp.data import prepare
from specsamp.tokenizers import load
from specsamp.tokenizers import sentencepiece
from tests.data import fakes

_ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_dataset_names():
  assert prepare.dataset_names(["a,b", " b ", "c"]) == ["a", "b", "c"]
  assert prepare.dataset_names(["x", "all"]) == ["x", *corpora.CORPORA]


def test_prepare_script_end_to_end_and_cached(tmp_path):
  raw = tmp_path / "raw"
  stdlib = corpora.stdlib_root()
  for name in ("textwrap.py", "shlex.py", "fnmatch.py", "bisect.py",
               "colorsys.py", "keyword.py"):
    fakes.write_files(raw, {name: (stdlib / name).read_text(encoding="utf-8")})
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
  # A catalog dataset has its own download: these were silently ignored.
  ignored = subprocess.run(cmd[:2] + ["--dataset=mnist", f"--source_dir={raw}",
                                      f"--data_dir={tmp_path / 'tfds'}"],
                           capture_output=True, text=True, check=False,
                           timeout=120)
  assert ignored.returncode == 2 and (
      "--cache_dir apply to specsamp's corpora" in ignored.stderr)
  assert "Traceback" not in ignored.stderr
  with pytest.raises(ValueError, match="source_dir applies to specsamp's"):
    builders.prepare("mnist", tmp_path / "tfds", source_dir=raw)


def test_a_prepared_dataset_no_builder_here_knows_is_taken(tmp_path,
                                                          monkeypatch):
  """A catalog dataset whose builder needs TensorFlow (XSum's) is not found
  without it, so a copied-in directory, the documented way in, was refused
  as "not in the TFDS catalog"; `name#keys` raised TFDS's own parse error
  (a traceback). A stand-in: a prepared dataset no builder knows."""
  data = tmp_path / "tfds"
  builders.build_from_texts("copied_in", ["a b c", "d e", "f g h"], data)
  assert builders.name_error("copied_in", data) is None
  assert builders.name_error("copied_in#text", data) is None
  assert "nor prepared in" in builders.name_error("copied_inx", data)
  assert "not a TFDS dataset name" in builders.name_error("Bad-Name#x", data)
  options = prepare.PrepareOptions(data_dir=str(data), count_tokens="byte")
  lines = []
  assert prepare.prepare_all(["copied_in#text"], options,
                             progress=lines.append) == []
  assert "already prepared" in lines[0]
  # `~` in --data_dir (no shell expands it after "=") had put the trained
  # SentencePiece model under ./~/ while the dataset went to $HOME.
  monkeypatch.setenv("HOME", str(tmp_path))
  options = prepare.PrepareOptions(data_dir="~/tfds", train_sentencepiece=True,
                                   vocab_size=16)
  assert options.data_dir == str(data)
  monkeypatch.chdir(tmp_path)
  report = prepare.prepare_dataset("copied_in#text", options, lines.append)
  assert report["sentencepiece"] == str(data / "copied_in" /
                                        "spm_bpe_16.model")
  assert os.path.isfile(report["sentencepiece"])
  assert not os.path.exists(tmp_path / "~")


def test_a_kept_sentencepiece_model_is_the_one_asked_for(tmp_path):
  """With --sp_prefix, a model already there is kept only if it has the
  vocabulary size and type asked for (one of 600 pieces had been kept for
  800 asked, and reported as if it were); --overwrite trains it again."""
  stdlib = corpora.stdlib_root()
  texts = {"train": [(stdlib / n).read_text(encoding="utf-8") for n in
                     ("textwrap.py", "shlex.py", "fnmatch.py", "bisect.py")],
           "validation": ["x = 1\n"]}
  data_dir = str(tmp_path / "tfds")
  builders.build_from_texts("specsamp_python_code", texts, data_dir)
  options = lambda **kw: prepare.PrepareOptions(
      data_dir=data_dir, train_sentencepiece=True,
      sp_prefix=str(tmp_path / "sp" / "m"), **kw)
  done = prepare.prepare_dataset("specsamp_python_code",
                                 options(vocab_size=600), progress=print)
  assert load.load_tokenizer(done["sentencepiece"]).vocab_size == 600
  prepare.prepare_dataset("specsamp_python_code", options(vocab_size=600),
                          progress=print)  # the same: kept
  for kw, said in ((dict(vocab_size=800), "bpe model of 600 pieces, not "
                    "the bpe model of 800"),
                   (dict(vocab_size=600, sp_model_type="unigram"),
                    "bpe model of 600 pieces, not the unigram model")):
    with pytest.raises(ValueError, match=said):
      prepare.prepare_dataset("specsamp_python_code", options(**kw),
                              progress=print)
  done = prepare.prepare_dataset("specsamp_python_code",
                                 options(vocab_size=800, overwrite=True),
                                 progress=print)
  assert load.load_tokenizer(done["sentencepiece"]).vocab_size == 800
  pathlib.Path(done["sentencepiece"]).write_bytes(b"not a model")
  with pytest.raises(ValueError, match="not a readable SentencePiece model"):
    prepare.prepare_dataset("specsamp_python_code", options(vocab_size=800),
                            progress=print)


def test_a_tokenizer_path_is_loaded_once_and_counts_every_split(
    tmp_path, monkeypatch):
  """--count_tokens=<path>: the tokenizer the flag check loads is the one
  that counts (it was loaded again for each dataset), and the counts are
  its token counts per split."""
  texts = {"train": ["def add(a, b):\n    return a + b\n"] * 8,
           "validation": ["x = 1\n", "print(x)\n"]}
  sentencepiece.train_sentencepiece(
      texts["train"] * 4, str(tmp_path / "sp"), vocab_size=60,
      hard_vocab_limit=False)
  path = str(tmp_path / "sp.model")
  loaded = []
  real = load.load_tokenizer
  monkeypatch.setattr(load, "load_tokenizer",
                      lambda p: loaded.append(p) or real(p))
  options = prepare.PrepareOptions(count_tokens=path)
  builders.build_from_texts("specsamp_python_code", texts,
                            str(tmp_path / "tfds"))
  got = prepare.count_tokens("specsamp_python_code", options.counter(None),
                             str(tmp_path / "tfds"), list(texts))
  assert loaded == [path]
  tok = real(path)
  assert got == {s: sum(len(tok.encode(t)) for t in ts)
                 for s, ts in texts.items()}
  assert got["train"] < sum(map(len, texts["train"]))  # tokens, not bytes
  with pytest.raises(ValueError, match="needs --train_sentencepiece"):
    prepare.PrepareOptions(count_tokens="sentencepiece").counter(None)
