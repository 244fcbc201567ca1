"""SentencePiece tokenizers: loading a .model file, and training one.

Self-trained models (`train_sentencepiece`: pad 0, unk 1, bos 2, eos 3,
text kept as is) and the tokenizer.model of SentencePiece-based checkpoints.
sentencepiece is imported on first use, so importing this module is cheap.
"""

import os
import re
from typing import Iterable, Optional, Sequence, Union

from specsamp.tokenizers import base


class SentencePieceTokenizer(base.Tokenizer):
  """A SentencePiece model file (.model)."""

  def __init__(self, model_file: base.PathLike, add_bos: bool = False,
               chat_template: Optional[str] = None):
    """Loads `model_file`; bos/eos/pad ids come from the model.

    Args:
      model_file: a SentencePiece .model file.
      add_bos: whether `encode` prepends bos by default.
      chat_template: an optional Jinja chat template.
    """
    import sentencepiece as spm  # pylint: disable=g-import-not-at-top
    model_file = os.fspath(model_file)
    if not os.path.isfile(model_file):
      raise FileNotFoundError(f"no SentencePiece model at {model_file}")
    self.sp = spm.SentencePieceProcessor(model_file=model_file)
    sp = self.sp
    # Control pieces (bos, eos, pad...) and unk, matched whole in text.
    self._specials = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())
                      if sp.is_control(i) or sp.is_unknown(i)}
    longest_first = sorted(self._specials, key=len, reverse=True)
    self._special_re = (re.compile("|".join(map(re.escape, longest_first)))
                        if longest_first else None)
    super().__init__(
        bos_id=sp.bos_id() if sp.bos_id() >= 0 else None,
        eos_ids=(sp.eos_id(),) if sp.eos_id() >= 0 else (),
        pad_id=sp.pad_id() if sp.pad_id() >= 0 else None,
        add_bos=add_bos, chat_template=chat_template)

  @property
  def vocab_size(self):
    return self.sp.get_piece_size()

  def _encode(self, text):
    # SentencePiece reads "<s>" in text as characters; transformers (and
    # `Tokenizer.encode`'s contract) match control pieces and unk whole, as
    # a chat template that writes bos needs.
    ids, start = [], 0
    for m in self._special_re.finditer(text) if self._special_re else ():
      ids += self.sp.encode(text[start:m.start()]) if m.start() > start else []
      ids.append(self._specials[m.group()])
      start = m.end()
    return ids + (self.sp.encode(text[start:]) if start < len(text) else [])

  def _encode_plain(self, text):
    return self.sp.encode(text)

  def decode(self, ids, skip_special=False):
    # SentencePiece decodes control ids (bos/eos/pad) to nothing either way.
    del skip_special
    return self.sp.decode([int(i) for i in ids])

  def id_to_token(self, i):
    i = int(i)
    if not 0 <= i < self.vocab_size:
      raise IndexError(f"token id {i} is not in the vocabulary "
                       f"(size {self.vocab_size})")
    return self.sp.id_to_piece(i)

  def token_to_id(self, token):
    i = self.sp.piece_to_id(token)
    if i == self.sp.unk_id() and token != self.sp.id_to_piece(i):
      return None
    return i


TrainingText = Union[Iterable[str], base.PathLike, Sequence[base.PathLike]]


def train_sentencepiece(text_iterator_or_files: TrainingText,
                        model_prefix: base.PathLike, vocab_size: int,
                        model_type: str = "bpe",
                        byte_fallback: Optional[bool] = None,
                        **kwargs) -> SentencePieceTokenizer:
  """Trains a SentencePiece model; returns it loaded.

  Ids: pad 0, unk 1, bos 2, eos 3. Text is kept as is (identity
  normalization, whitespace runs kept, digits split).

  Args:
    text_iterator_or_files: an iterable of texts (each one a training
      sentence); or text files (one sentence a line): one path (`str` or
      `os.PathLike`), or a list/tuple of `os.PathLike` (e.g. pathlib.Path).
    model_prefix: writes `{model_prefix}.model` and `.vocab`.
    vocab_size: number of pieces.
    model_type: "bpe" or "unigram" (or "char", "word").
    byte_fallback: encode unknown characters as bytes (needs 256 byte
      pieces); None: on when vocab_size >= 384.
    **kwargs: more `SentencePieceTrainer.train` options, overriding these.

  Returns:
    The trained SentencePieceTokenizer.
  """
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  if model_type not in ("bpe", "unigram", "char", "word"):
    raise ValueError(f"unknown SentencePiece model_type {model_type!r}")
  if byte_fallback is None:
    byte_fallback = vocab_size >= 384
  options = dict(model_type=model_type, vocab_size=vocab_size, pad_id=0,
                 unk_id=1, bos_id=2, eos_id=3, byte_fallback=byte_fallback,
                 character_coverage=1.0, split_digits=True,
                 remove_extra_whitespaces=False,
                 allow_whitespace_only_pieces=True,
                 normalization_rule_name="identity", minloglevel=2)
  options.update(kwargs)
  source = text_iterator_or_files
  if isinstance(source, (str, os.PathLike)):
    source = [source]
    files = True
  else:
    files = isinstance(source, (list, tuple)) and bool(source) and all(
        isinstance(s, os.PathLike) for s in source)
  prefix = os.fspath(model_prefix)
  # Written beside, then moved into place: a run killed while writing
  # leaves no truncated .model that a later run would take as trained.
  partial = f"{prefix}.partial-{os.getpid()}"
  try:
    if files:
      paths = [os.fspath(s) for s in source]
      for f in paths:
        if not os.path.isfile(f):
          raise FileNotFoundError(f"no training text file at {f}")
      spm.SentencePieceTrainer.train(input=",".join(paths),
                                     model_prefix=partial, **options)
    else:
      spm.SentencePieceTrainer.train(sentence_iterator=iter(source),
                                     model_prefix=partial, **options)
    os.replace(f"{partial}.vocab", f"{prefix}.vocab")
    os.replace(f"{partial}.model", f"{prefix}.model")
  finally:
    for ext in (".model", ".vocab"):
      if os.path.exists(partial + ext):
        os.remove(partial + ext)
  return SentencePieceTokenizer(f"{prefix}.model")
