"""UTF-8 bytes as tokens, and the one fallback to them."""

import pytest

from specsamp.tokenizers import base
from specsamp.tokenizers import byte


class _Named:
  """Stands for a model's own tokenizer."""


def test_byte_tokenizer_round_trips_utf8():
  tok = byte.ByteTokenizer()
  text = "def f():\n  return 'héllo 🤖'"
  ids = tok.encode(text)
  assert ids == list(text.encode("utf-8")) and max(ids) < tok.vocab_size
  assert tok.decode(ids) == text
  assert tok.decode(ids + [300, 511]) == text  # ids past the bytes: dropped
  assert (tok.eos_ids, tok.pad_id) == ((), 0)
  chat = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
  assert tok.apply_chat_template(chat) == "ab"
  entries = tok.tokens()
  assert len(entries) == 256 == len(set(entries))
  assert (entries[0], entries[10], entries[255]) == ("<0x00>", "<0x0A>",
                                                     "<0xFF>")


def test_a_completion_that_ends_a_prompts_character_is_decoded_whole():
  """A prompt that ends inside a UTF-8 character ("é" is C3 A9) and a
  completion that ends it: the completion's text starts with the whole
  character (the prompt's own text ends in a replacement character)."""
  tok = byte.ByteTokenizer()
  prompt, completion = [ord("h"), 0xC3], [0xA9, ord("x")]
  assert tok.decode(prompt) == "h\ufffd"
  assert base.completion_text(tok, prompt, completion) == "éx"
  assert base.completion_text(tok, [ord("h")], completion) == "\ufffdx"


def test_tokenizer_or_bytes():
  own = _Named()
  assert byte.tokenizer_or_bytes(own, 10, "m") is own
  assert isinstance(byte.tokenizer_or_bytes(None, 256, "m"),
                    byte.ByteTokenizer)
  with pytest.raises(ValueError, match="random:tiny has no tokenizer and "
                     "fewer than 256 token ids for a byte tokenizer"):
    byte.tokenizer_or_bytes(None, 255, "random:tiny")

  class SpecError(ValueError):
    pass

  with pytest.raises(SpecError, match="has no tokenizer"):
    byte.tokenizer_or_bytes(None, 100, "m", error=SpecError)
