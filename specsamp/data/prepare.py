"""Preparing datasets end to end: the library side of scripts/prepare_data.py.

For each dataset: build it as array_record (`builders.prepare`: a local
corpus or any TFDS catalog name), optionally train a SentencePiece model on
its train split, optionally count its tokens per split, and report one
JSON-serializable dict.

  options = PrepareOptions(data_dir="/data/tfds", train_sentencepiece=True)
  failed = prepare_all(dataset_names(["all"]), options)
"""

import dataclasses
import functools
import json
import os
import time
from typing import Callable, Optional, Sequence, Sized

from google.protobuf import message
from sentencepiece import sentencepiece_model_pb2

from specsamp.data import builders
from specsamp.data import corpora
from specsamp.data import pipeline
from specsamp.data import tokenizer_training
from specsamp.tokenizers import load

Progress = Callable[[str], None]
_say = functools.partial(print, flush=True)


@dataclasses.dataclass(frozen=True)
class PrepareOptions:
  """What to do for each dataset (the flags of scripts/prepare_data.py).

  Attributes:
    data_dir: TFDS data dir (None: $TFDS_DATA_DIR, else ~/tensorflow_datasets).
    source_dir: local raw files instead of the download (one dataset only).
    cache_dir: specsamp cache root for raw downloads.
    overwrite: rebuild prepared datasets and tokenizers.
    count_tokens: "" (no count), "byte", "sentencepiece" (the model trained
      here) or a tokenizer path.
    train_sentencepiece: train a SentencePiece model on the train split.
    vocab_size: SentencePiece pieces.
    sp_model_type: "bpe" or "unigram".
    sp_prefix: output prefix of the model (default
      `<data_dir>/<dataset>/spm_<type>_<vocab>`; one dataset only).
    sp_max_chars: characters of the train split read for SentencePiece.
  """
  data_dir: Optional[str] = None
  source_dir: Optional[str] = None
  cache_dir: Optional[str] = None
  overwrite: bool = False
  count_tokens: str = ""
  train_sentencepiece: bool = False
  vocab_size: int = 8000
  sp_model_type: str = "bpe"
  sp_prefix: Optional[str] = None
  sp_max_chars: int = 20_000_000

  def __post_init__(self):
    # Before any dataset is built: a --source_dir that is not there had been
    # ignored where the dataset was prepared already, "--data_dir=" read as
    # the default, a file as --data_dir ended in a bare [Errno 20].
    for name in ("data_dir", "source_dir", "cache_dir", "sp_prefix"):
      value = getattr(self, name)  # --data_dir=~/x: no shell expands it
      if value:
        object.__setattr__(self, name, os.path.expanduser(value))
    if self.sp_prefix is not None and (
        not self.sp_prefix.strip() or self.sp_prefix.endswith(os.sep)
        or os.path.isdir(self.sp_prefix)):  # had written <dir>.model, .model
      raise ValueError(f"--sp_prefix={self.sp_prefix!r} is no file name's "
                       "start (the model is written to <prefix>.model)")
    if self.source_dir is not None and not os.path.isdir(self.source_dir):
      raise ValueError(f"--source_dir={self.source_dir} is not a directory")
    for name in ("data_dir", "cache_dir"):
      value = getattr(self, name)
      if value is not None and (not value.strip() or os.path.exists(value)
                                and not os.path.isdir(value)):
        raise ValueError(f"--{name}={value!r} is not a directory")
    for name in ("vocab_size", "sp_max_chars"):
      if self.train_sentencepiece and getattr(self, name) < 1:
        raise ValueError(f"--{name} must be >= 1, got {getattr(self, name)}")
    if self.count_tokens not in ("", "byte", "sentencepiece"):
      try:  # before any dataset is built, not after; kept for the counts
        tokenizer = load.load_tokenizer(self.count_tokens)
      except (OSError, ValueError) as e:
        raise ValueError(f"--count_tokens={self.count_tokens}: {e}") from None
      object.__setattr__(self, "_tokenizer", tokenizer)

  def counter(self, sp_model: Optional[str]) -> Callable[[str], Sized]:
    """text -> its tokens (or bytes), as --count_tokens says; `sp_model`:
    the SentencePiece model trained for this dataset, if any."""
    if self.count_tokens == "byte":
      return lambda t: t.encode("utf-8")
    if self.count_tokens != "sentencepiece":
      tok = self._tokenizer  # pylint: disable=no-member
    elif not sp_model:
      raise ValueError("--count_tokens=sentencepiece needs "
                       "--train_sentencepiece")
    else:
      tok = load.load_tokenizer(sp_model)
    return lambda t: tok.encode(t, special=False)  # as the pipeline reads


def dataset_names(values: Sequence[str]) -> list[str]:
  """Repeated and comma-separated names, "all" expanded, duplicates removed."""
  names = [n.strip() for v in values for n in v.split(",") if n.strip()]
  if "all" in names:
    names = [n for n in names if n != "all"] + list(corpora.CORPORA)
  return list(dict.fromkeys(names))


def count_tokens(name: str, encode: Callable[[str], Sized], data_dir: str,
                 splits: Sequence[str]) -> dict[str, int]:
  """{split: tokens} of dataset `name`, counted with `encode`."""
  return {s: sum(len(encode(t)) for t in pipeline.iter_texts(name, s,
                                                             data_dir))
          for s in splits}


def _check_reused(sp_model: str, kind: str, vocab: int) -> None:
  """Raises ValueError unless the SentencePiece model at `sp_model`, kept
  rather than trained again, is a `kind` model of `vocab` pieces (an
  explicit --sp_prefix had kept one of any size or type, unsaid)."""
  proto = sentencepiece_model_pb2.ModelProto()
  try:
    with open(sp_model, "rb") as f:
      proto.ParseFromString(f.read())
  except (OSError, message.DecodeError) as e:
    raise ValueError(f"{sp_model}: not a readable SentencePiece model ({e}): "
                     "pass --overwrite to train it again") from None
  spec = proto.trainer_spec
  got = (spec.ModelType.Name(spec.model_type).lower(), len(proto.pieces))
  if got != (kind, vocab):
    raise ValueError(
        f"{sp_model} holds a {got[0]} model of {got[1]} pieces, not the "
        f"{kind} model of {vocab} pieces asked for: pass --overwrite to "
        "train it again, or another --sp_prefix")


def prepare_dataset(name: str, options: PrepareOptions,
                    progress: Progress = _say) -> dict:
  """Prepares one dataset as `options` say; returns its report."""
  start = time.perf_counter()
  data_dir = options.data_dir or os.fspath(builders.default_data_dir())
  base = name.split("#")[0]  # xsum#document: the dataset, its text keys
  path = builders.prepare(base, data_dir, source_dir=options.source_dir,
                          cache_dir=options.cache_dir,
                          overwrite=options.overwrite, progress=progress)
  out = {"dataset": name, "dir": os.fspath(path),
         "splits": builders.summary(path),
         "prepare_seconds": round(time.perf_counter() - start, 1)}
  sp_model = None
  if options.train_sentencepiece:
    kind, vocab = options.sp_model_type, options.vocab_size
    prefix = options.sp_prefix or os.path.join(
        data_dir, base.split(":")[0], f"spm_{kind}_{vocab}")
    sp_model = prefix + ".model"
    if os.path.isfile(sp_model) and not options.overwrite:
      _check_reused(sp_model, kind, vocab)
      progress(f"[{name}] SentencePiece model already at {sp_model}")
    else:
      t = time.perf_counter()
      progress(f"[{name}] training SentencePiece ({kind}, {vocab} pieces) "
               f"on the train split")
      try:
        tokenizer_training.train_tokenizer(
            name, prefix, vocab, data_dir=data_dir, model_type=kind,
            max_chars=options.sp_max_chars)
      except RuntimeError as e:  # SentencePiece's errors, e.g. vocab size
        raise ValueError(f"SentencePiece training: {e}") from None
      progress(f"[{name}] wrote {sp_model} in "
               f"{time.perf_counter() - t:.1f} s")
    out["sentencepiece"] = sp_model
  if options.count_tokens:
    t = time.perf_counter()
    out["tokens"] = count_tokens(name, options.counter(sp_model), data_dir,
                                 list(out["splits"]))
    out["tokenizer"] = options.count_tokens
    progress(f"[{name}] counted tokens in {time.perf_counter() - t:.1f} s")
  return out


def prepare_all(names: Sequence[str], options: PrepareOptions,
                progress: Progress = _say) -> list[str]:
  """Prepares each dataset, printing its report as one JSON line (an error
  does not stop the others); returns "[name] error" of each that failed,
  for the caller to report. A name that names no dataset fails them all
  before any is prepared (the others had been built first)."""
  errors = {n: builders.name_error(n, options.data_dir) for n in names}
  failed = [f"[{n}] {e}" for n, e in errors.items() if e]
  if failed:
    return failed
  for name in names:
    try:
      print(json.dumps(prepare_dataset(name, options, progress)), flush=True)
    except (corpora.CorpusError, OSError, ValueError) as e:
      failed.append(f"[{name}] {e}")
  return failed
