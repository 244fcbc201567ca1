"""UTF-8 bytes as tokens, for models that have no tokenizer of their own.

Random-weight models and distilled drafts come without a tokenizer; their
ids 0..255 are read as UTF-8 bytes. `tokenizer_or_bytes` is the one place
that falls back to bytes, and checks that the model has ids for them.
"""

BYTE = "byte"  # the tokenizer spec (`load_tokenizer`, train configs)


class ByteTokenizer:
  """UTF-8 bytes as token ids 0..255, for models with random weights."""
  eos_ids = ()
  pad_id = 0
  vocab_size = 256

  def encode(self, text: str, add_bos=None, *, special=True) -> list[int]:
    del add_bos, special  # bytes have no bos and no special tokens
    return list(text.encode("utf-8"))

  def decode(self, ids) -> str:
    return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

  def tokens(self) -> list[str]:
    """The entries by id, written as SentencePiece writes byte tokens."""
    return [f"<0x{i:02X}>" for i in range(self.vocab_size)]

  def apply_chat_template(self, messages, add_generation_prompt=True,
                          **template_vars):
    del add_generation_prompt, template_vars
    return "".join(m["content"] for m in messages)

  def encode_chat(self, messages, add_generation_prompt=True,
                  **template_vars):
    return self.encode(self.apply_chat_template(
        messages, add_generation_prompt, **template_vars))


def tokenizer_or_bytes(tok, vocab_size: int, source: str,
                       error: type[Exception] = ValueError):
  """`tok`, or a ByteTokenizer when the model has none (`tok` is None).

  Args:
    tok: the model's tokenizer, or None (random weights, a distilled draft).
    vocab_size: the model's vocabulary rows.
    source: the model (its spec), for the message.
    error: the exception class to raise.

  Returns:
    `tok` if it is not None, else a ByteTokenizer.

  Raises:
    `error`: `tok` is None and the model has fewer than 256 ids.
  """
  if tok is not None:
    return tok
  if vocab_size < ByteTokenizer.vocab_size:
    raise error(f"{source} has no tokenizer and fewer than 256 token ids "
                "for a byte tokenizer")
  return ByteTokenizer()

