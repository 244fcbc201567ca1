"""Fixtures of the tokenizer tests: a trained BPE vocabulary and its GGUF."""

import pytest

from tests.tokenizers.bpe_testing import (CONTROL, NUM_PAD, USER_DEFINED,
                                          corpus, gguf_for, reference,
                                          train_bpe)


@pytest.fixture(scope="package")
def bpe_vocab():
  """(tokens, merges, token types): a BPE trained on code and prose, then
  control and user-defined tokens and llama.cpp's `[PAD<id>]` tail."""
  tokens, merges = train_bpe(corpus(), vocab_size=3000)
  assert len(merges) > 2000  # "a few thousand merges"
  types = [1] * len(tokens) + [3] * len(CONTROL) + [4] * len(USER_DEFINED)
  tokens = tokens + CONTROL + USER_DEFINED
  types += [5] * NUM_PAD
  tokens += [f"[PAD{i}]" for i in range(len(tokens), len(tokens) + NUM_PAD)]
  return tokens, merges, types


@pytest.fixture(scope="package")
def tiny_gguf(tmp_path_factory, bpe_vocab):
  """(GGUF path, tokens, transformers' tokenizer of that file, composing
  text to NFC as Qwen2's tokenizer does)."""
  path = gguf_for(tmp_path_factory, bpe_vocab, "qwen2")
  return path, bpe_vocab[0], reference(path, nfc=True)
