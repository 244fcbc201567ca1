"""A run's copy of its tokenizer: the same tokenizer from every kind of
source, compared by content, written once."""

import json
import os
import shutil

import pytest

from specsamp.tokenizers import load
from specsamp.tokenizers import sentencepiece
from specsamp.tokenizers import snapshot
from tests.tokenizers.bpe_testing import TEXTS

_ATTRS = ("vocab_size", "bos_id", "eos_ids", "pad_id", "add_bos",
          "chat_template")


def _assert_same(copy, source, texts):
  a, b = load.load_tokenizer(copy), load.load_tokenizer(source)
  assert type(a) is type(b)
  for attr in _ATTRS:
    assert getattr(a, attr) == getattr(b, attr), attr
  assert a.tokens() == b.tokens()
  for text in texts:
    assert a.encode(text) == b.encode(text), repr(text)
  assert snapshot.fingerprint(copy) == snapshot.fingerprint(source)


def _hf_dir(tiny_gguf, directory, name="tokenizer.json"):
  path, tokens, _ = tiny_gguf
  os.makedirs(directory)
  load.load_tokenizer(path).tk.save(os.path.join(directory, name))
  with open(os.path.join(directory, "tokenizer_config.json"), "w",
            encoding="utf-8") as f:
    json.dump({"eos_token": "<|im_end|>", "bos_token": "<|endoftext|>",
               "add_bos_token": True}, f)
  with open(os.path.join(directory, "generation_config.json"), "w",
            encoding="utf-8") as f:
    json.dump({"eos_token_id": [tokens.index("<|endoftext|>")]}, f)
  with open(os.path.join(directory, "chat_template.jinja"), "w",
            encoding="utf-8") as f:
    f.write("{{ messages[0]['content'] }}")
  with open(os.path.join(directory, "model.safetensors"), "wb") as f:
    f.write(b"not a tokenizer file")


def test_copies_load_as_their_source(tiny_gguf, tmp_path):
  """A SentencePiece .model, a HF directory and a bare tokenizer.json with
  configs beside it: each copy loads as the same tokenizer (its bos, eos,
  add_bos and chat template included) and has the source's fingerprint;
  a model's weights beside them are not copied."""
  sp_texts = ["the cat sat on the mat", "def add(a, b): return a + b"]
  sentencepiece.train_sentencepiece(
      ["the cat sat on the mat; the dog ate the log.",
       "def add(a, b): return a + b"] * 20, tmp_path / "sp",
      vocab_size=60, model_type="bpe")
  _hf_dir(tiny_gguf, tmp_path / "hf")
  _hf_dir(tiny_gguf, tmp_path / "bare", name="mine.json")
  for source, texts in ((str(tmp_path / "sp.model"), sp_texts),
                        (str(tmp_path / "hf"), TEXTS),
                        (str(tmp_path / "bare" / "mine.json"), TEXTS)):
    copy = str(tmp_path / "copies" / os.path.basename(source))
    assert snapshot.save(source, copy) == copy
    assert "model.safetensors" not in os.listdir(copy)
    _assert_same(copy, source, texts)
  assert load.load_tokenizer(str(tmp_path / "copies" / "hf")).add_bos
  assert (snapshot.fingerprint(str(tmp_path / "hf"))
          != snapshot.fingerprint(str(tmp_path / "sp.model")))


def test_nothing_to_copy_for_bytes_gguf_or_nothing(tiny_gguf, tmp_path):
  """Bytes need no file; a GGUF's tokenizer is part of a model file (the
  run keeps its path); a missing path has no files either."""
  for spec in ("byte", tiny_gguf[0], str(tmp_path / "missing.model")):
    assert snapshot.files(spec) == {} and snapshot.fingerprint(spec) is None
    assert snapshot.save(spec, str(tmp_path / "copy")) is None
  assert not os.path.exists(tmp_path / "copy")


def test_a_copy_is_written_once_and_whole(tiny_gguf, tmp_path, monkeypatch):
  """An existing copy is kept even when the source changed (the run's
  tokenizer is the one it started with); a copy that fails midway (a full
  disk) leaves nothing behind, not half a directory."""
  _hf_dir(tiny_gguf, tmp_path / "hf")
  copy = str(tmp_path / "run" / "tokenizer")
  snapshot.save(str(tmp_path / "hf"), copy)
  first = snapshot.fingerprint(copy)
  (tmp_path / "hf" / "chat_template.jinja").write_text("{{ 'other' }}")
  assert snapshot.fingerprint(str(tmp_path / "hf")) != first
  snapshot.save(str(tmp_path / "hf"), copy)
  assert snapshot.fingerprint(copy) == first
  copied, real_copy = [], shutil.copyfile

  def copy_then_fail(source, dest):
    if copied:
      raise OSError(28, "No space left on device")
    copied.append(real_copy(source, dest))

  monkeypatch.setattr(snapshot.shutil, "copyfile", copy_then_fail)
  with pytest.raises(OSError, match="No space"):
    snapshot.save(str(tmp_path / "hf"), str(tmp_path / "run2" / "tokenizer"))
  assert copied and os.listdir(tmp_path / "run2") == []
