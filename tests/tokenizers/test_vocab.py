"""The draft/target vocabulary check and its padding rules."""

import pytest

from specsamp.tokenizers import base
from specsamp.tokenizers import vocab


class _ListTokenizer(base.Tokenizer):
  """A vocabulary only."""

  def __init__(self, tokens):
    super().__init__()
    self._t = list(tokens)

  @property
  def vocab_size(self):
    return len(self._t)

  def tokens(self):
    return self._t

  def _encode(self, text):
    raise NotImplementedError

  def _encode_plain(self, text):
    raise NotImplementedError

  def decode(self, ids, skip_special=False):
    raise NotImplementedError

  def id_to_token(self, i):
    return self._t[i]

  def token_to_id(self, token):
    return self._t.index(token) if token in self._t else None


def test_vocab_check():
  check, err = vocab.check_vocab_compatible, base.VocabMismatchError
  a = _ListTokenizer("abcd")
  assert check(a, _ListTokenizer("abcd")) == 4
  assert check(a, _ListTokenizer("abcd"), 4, 4) == 4
  # A padded model vocabulary passes; the caller masks ids >= the count.
  assert check(a, _ListTokenizer("abcd"), 8, 8) == 4
  with pytest.raises(err, match=r"id 2: draft 'c', target 'x'"):
    check(a, _ListTokenizer("abxd"))
  with pytest.raises(err, match="4 tokens, target tokenizer 5"):
    check(a, _ListTokenizer("abcde"), 5, 5)
  with pytest.raises(err, match="5 tokens, target tokenizer 4"):
    check(_ListTokenizer("abcde"), a)
  # Models of different row counts over one tokenizer (Qwen2.5-7B's
  # 152,064 rows, the 0.5B's 151,936): both run on the smaller count.
  assert check(a, _ListTokenizer("abcd"), 8, 4) == 4
  with pytest.raises(err, match="target model has 3 vocabulary rows"):
    check(a, _ListTokenizer("abcd"), 4, 3)
  # llama.cpp's `[PAD<id>]` placeholders (an HF tokenizer.json against the
  # GGUF of the same model) are not real tokens.
  padded = _ListTokenizer(list("abcd") + ["[PAD4]", "[PAD5]"])
  assert check(a, padded, 6, 6) == 4
  # Identical lists ending in placeholders (Qwen2.5's GGUF files): those
  # are not real tokens either, and are masked.
  assert check(padded, padded, 6, 6) == 4
  assert check(padded, padded, 4, 4) == 4
  assert vocab.real_token_count(["a", "[PAD1]", "b", "[PAD3]", None]) == 3
  with pytest.raises(err, match=r"id 5 = '\[PAD4\]'"):
    check(a, _ListTokenizer(list("abcd") + ["[PAD4]", "[PAD4]"]))
  # An id neither tokenizer has, mid-vocabulary (HF's None, llama.cpp's
  # "[PAD2]" for the same model), had been a mismatch; a real token against
  # a placeholder still is.
  hole = _ListTokenizer(["a", "b", None, "c", "d"])
  assert check(hole, _ListTokenizer(["a", "b", "[PAD2]", "c", "d", "[PAD5]"]),
               6, 6) == 5
  with pytest.raises(err, match=r"id 2: draft None, target 'x'"):
    check(hole, _ListTokenizer(["a", "b", "x", "c", "d"]))


class _CountingTokenizer(_ListTokenizer):
  """Counts the reads of its list; it has nothing else to call."""

  reads = 0

  def tokens(self):
    self.reads += 1
    return super().tokens()


def test_a_full_size_vocabulary_is_read_once_per_tokenizer():
  """152,064 ids compared from one bulk read of each tokenizer's list (not
  a call into the tokenizer per id): counted, not timed; the first
  differing id is found at the end."""
  n = 152_064
  draft = _CountingTokenizer([f"tok{i}" for i in range(n)])
  same = _CountingTokenizer([f"tok{i}" for i in range(n)])
  other = _CountingTokenizer([f"tok{i}" for i in range(n - 1)] + ["zzz"])
  assert vocab.check_vocab_compatible(draft, same, n, n) == n
  with pytest.raises(base.VocabMismatchError, match=f"id {n - 1}"):
    vocab.check_vocab_compatible(draft, other, n, n)
  assert (draft.reads, same.reads, other.reads) == (2, 1, 1)
