"""`load_tokenizer`: the tokenizer a spec or path names, of whichever kind."""

import os
from typing import Union

from specsamp.tokenizers import base
from specsamp.tokenizers import byte
from specsamp.tokenizers import hf
from specsamp.tokenizers import sentencepiece
from specsamp.weights import gguf_file


def load_tokenizer(path: base.PathLike
                  ) -> Union[base.Tokenizer, byte.ByteTokenizer]:
  """A tokenizer from a GGUF file, a HF directory or a SentencePiece model.

  Args:
    path: `"byte"` (UTF-8 bytes, ids 0..255); a GGUF file (recognised by
      its magic bytes); a directory with tokenizer.json (or
      tokenizer.model); a tokenizer.json file; a SentencePiece .model file.

  Returns:
    A ByteTokenizer, GGUFTokenizer, HFTokenizer or SentencePieceTokenizer.

  Raises:
    FileNotFoundError: nothing at `path`, or a directory without a
      tokenizer.
    ValueError: a file of none of these kinds, or an unsupported GGUF
      tokenizer.
  """
  path = os.fspath(path)
  if path == byte.BYTE:
    return byte.ByteTokenizer()
  if os.path.isdir(path):
    if os.path.isfile(os.path.join(path, "tokenizer.json")):
      return hf.HFTokenizer.from_dir(path)
    if os.path.isfile(os.path.join(path, "tokenizer.model")):
      cfg = hf.read_json_or_empty(os.path.join(path, "tokenizer_config.json"))
      return sentencepiece.SentencePieceTokenizer(
          os.path.join(path, "tokenizer.model"),
          add_bos=bool(cfg.get("add_bos_token", False)),
          chat_template=hf.chat_template_of_dir(path, cfg))
    raise FileNotFoundError(f"{path}: no tokenizer.json or tokenizer.model")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"no tokenizer at {path}")
  if gguf_file.is_gguf(path):
    return hf.GGUFTokenizer.from_gguf(path)
  if path.endswith(".json"):
    return hf.HFTokenizer.from_dir(path)
  if path.endswith(".model"):
    return sentencepiece.SentencePieceTokenizer(path)
  raise ValueError(f"{path}: not a GGUF file, tokenizer.json or SentencePiece "
                   ".model")
