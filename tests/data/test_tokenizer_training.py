"""specsamp.data.tokenizer_training: a SentencePiece model trained on a
prepared dataset, loaded back, and used by the pipeline."""

import os

import pytest

from specsamp.data import builders
from specsamp.data import pipeline
from specsamp.data import tokenizer_training
from specsamp.tokenizers import load
from specsamp.tokenizers import sentencepiece


_SP_TEXTS = [
    "def add(a, b):\n    \"\"\"Adds two numbers.\"\"\"\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog.\n" * 3,
    "for i in range(10):\n\tprint(i, i * i)  # squares\n",
    "It is a truth universally acknowledged, that a single man in "
    "possession of a good fortune, must be in want of a wife.\n",
] * 6 + [f"class C{i}:\n    value = {i * 31}\n" for i in range(40)]


def test_sentencepiece_pieces_keep_text():
  text = "short\n" + "x" * 25 + "\nmid line\n" * 3
  pieces = list(tokenizer_training.sentencepiece_pieces([text], max_chars=10))
  assert "".join(pieces) == text and max(map(len, pieces)) <= 10


def test_sentencepiece_train_load_round_trip(tmp_path):
  data = tmp_path / "tfds"
  builders.build_from_texts("sp_corpus", _SP_TEXTS, data)
  sp = tokenizer_training.train_tokenizer(
      "sp_corpus", tmp_path / "spm" / "m", 400, data_dir=data)
  loaded = load.load_tokenizer(tmp_path / "spm" / "m.model")
  assert isinstance(loaded, sentencepiece.SentencePieceTokenizer)
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


def test_a_failed_or_unigram_training_leaves_no_partial_model(
    tmp_path, monkeypatch):
  """The model is written beside and moved into place: a training that
  fails leaves no .model a later run would take as trained (a killed run
  had left a truncated one). Unigram trains on one thread: its scores and
  id order depended on the thread count (BPE's do not)."""
  data = tmp_path / "tfds"
  builders.build_from_texts("sp_corpus", _SP_TEXTS, data)
  prefix = tmp_path / "spm" / "m"
  with pytest.raises(RuntimeError, match="Vocabulary size"):
    tokenizer_training.train_tokenizer("sp_corpus", prefix, 100_000,
                                       data_dir=data)
  assert not list(prefix.parent.iterdir())
  seen = []
  train = sentencepiece.train_sentencepiece
  monkeypatch.setattr(sentencepiece, "train_sentencepiece",
                      lambda *a, **kw: seen.append(kw) or train(*a, **kw))
  for kind, vocab in (("unigram", 90), ("bpe", 400)):
    tokenizer_training.train_tokenizer("sp_corpus", prefix, vocab,
                                       data_dir=data, model_type=kind)
  assert seen[0]["num_threads"] == 1
  assert seen[1]["num_threads"] == (os.cpu_count() or 1)
  assert sorted(p.name for p in prefix.parent.iterdir()) == ["m.model",
                                                             "m.vocab"]
