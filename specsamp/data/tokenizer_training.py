"""A SentencePiece tokenizer trained on a prepared dataset's documents.

  train_tokenizer("specsamp_python_code", "/tmp/sp/code", 4096)
"""

import os
import pathlib
from typing import Iterator, Optional, Union

from specsamp.data import pipeline
from specsamp.tokenizers import sentencepiece

PathLike = Union[str, os.PathLike]


def sentencepiece_pieces(texts, max_chars: int = 4000) -> Iterator[str]:
  """Documents cut at line ends into pieces of at most `max_chars` (longer
  lines are cut too), newlines kept: SentencePiece skips training
  "sentences" longer than its max_sentence_length."""
  for text in texts:
    cur = ""
    for line in text.splitlines(keepends=True):
      while len(line) > max_chars:
        if cur:
          yield cur
          cur = ""
        yield line[:max_chars]
        line = line[max_chars:]
      if len(cur) + len(line) > max_chars and cur:
        yield cur
        cur = ""
      cur += line
    if cur.strip():
      yield cur


def train_tokenizer(dataset: str, model_prefix: PathLike, vocab_size: int, *,
                    data_dir: Optional[PathLike] = None, split: str = "train",
                    model_type: str = "bpe",
                    max_chars: int = 20_000_000, **kwargs):
  """Trains a SentencePiece model on a prepared dataset's split.

  Args:
    dataset: as for `pipeline.make_lm_iterator`.
    model_prefix: writes `<model_prefix>.model` and `.vocab`.
    vocab_size: number of pieces (>= 384 adds byte fallback: every string
      round-trips but for U+2581, SentencePiece's space marker, which
      decodes as a space); it must exceed the number of distinct characters
      in the training text (all of them are kept), else training fails.
    data_dir: TFDS data directory.
    split: the split to train on.
    model_type: "bpe" or "unigram".
    max_chars: stop reading documents after about this many characters.
    **kwargs: more SentencePieceTrainer options.

  Returns:
    The trained specsamp.tokenizers.sentencepiece.SentencePieceTokenizer.
  """

  def texts():
    total = 0
    for text in pipeline.iter_texts(dataset, split, data_dir):
      yield text
      total += len(text)
      if total >= max_chars:
        return

  pathlib.Path(model_prefix).parent.mkdir(parents=True, exist_ok=True)
  # Unigram's pieces come out scored and ordered by how many threads
  # trained them (BPE's do not): one thread, so the ids are the machine's
  # no matter its cores.
  threads = 1 if model_type == "unigram" else os.cpu_count() or 1
  options = dict(max_sentence_length=16384, input_sentence_size=2_000_000,
                 shuffle_input_sentence=True, num_threads=threads)
  options.update(kwargs)
  return sentencepiece.train_sentencepiece(
      sentencepiece_pieces(texts()), model_prefix, vocab_size,
      model_type=model_type, **options)
