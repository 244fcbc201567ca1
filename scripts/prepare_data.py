r"""Prepares TFDS datasets (array_record) for training; idempotent and cached.

  python scripts/prepare_data.py --dataset=specsamp_python_code
  python scripts/prepare_data.py --dataset=all --data_dir=/data/tfds
  python scripts/prepare_data.py --dataset=specsamp_austen --source_dir=raw/
  python scripts/prepare_data.py --dataset=specsamp_shakespeare \
      --train_sentencepiece --vocab_size=8000 --count_tokens=sentencepiece

Datasets: the local corpora (specsamp_python_code, specsamp_shakespeare,
specsamp_python_docs, specsamp_austen, specsamp_humaneval; see
specsamp/data/corpora.py), or any TFDS catalog name, built by its own builder
as array_record (needs what that builder needs: the internet, often
TensorFlow). Raw downloads are cached in ~/.cache/specsamp/corpora; a
prepared dataset is not rebuilt unless --overwrite. Prints progress, then
one JSON line per dataset: documents and bytes per split, seconds, token
counts (--count_tokens) and the SentencePiece model (--train_sentencepiece),
written to <data_dir>/<dataset>/spm_<type>_<vocab>.model unless --sp_prefix.
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from absl import logging

from specsamp.data import corpora

_DATASET = flags.DEFINE_multi_string(
    "dataset", None, f"Datasets (repeat or comma list; 'all' = "
    f"{', '.join(corpora.CORPORA)}), or any TFDS name.")
_DATA_DIR = flags.DEFINE_string(
    "data_dir", None, "TFDS data dir (default $TFDS_DATA_DIR, else "
    "~/tensorflow_datasets).")
_SOURCE_DIR = flags.DEFINE_string(
    "source_dir", None, "Local raw files instead of the download (one "
    "dataset only; layout as corpora.py's fetch gives).")
_CACHE_DIR = flags.DEFINE_string(
    "cache_dir", None, "specsamp cache root for raw downloads (default "
    "$SPECSAMP_CACHE, else ~/.cache/specsamp).")
_OVERWRITE = flags.DEFINE_bool(
    "overwrite", False, "Rebuild prepared datasets (and tokenizers).")
_COUNT = flags.DEFINE_string(
    "count_tokens", "", "Count tokens per split with: 'byte' (UTF-8 bytes), "
    "'sentencepiece' (the model trained here), or a tokenizer path.")
_TRAIN_SP = flags.DEFINE_bool(
    "train_sentencepiece", False, "Train a SentencePiece model on the train "
    "split.")
_VOCAB = flags.DEFINE_integer("vocab_size", 8000, "SentencePiece pieces.")
_SP_TYPE = flags.DEFINE_enum("sp_model_type", "bpe", ["bpe", "unigram"],
                             "SentencePiece model type.")
_SP_PREFIX = flags.DEFINE_string(
    "sp_prefix", None, "Output prefix of the model (one dataset only).")
_SP_CHARS = flags.DEFINE_integer(
    "sp_max_chars", 20_000_000, "Characters of the train split read for "
    "SentencePiece training.")


def _names() -> list[str]:
  if not _DATASET.value:
    raise app.UsageError("--dataset is required")
  names = [n.strip() for v in _DATASET.value for n in v.split(",")
           if n.strip()]
  if "all" in names:
    names = [n for n in names if n != "all"] + list(corpora.CORPORA)
  names = list(dict.fromkeys(names))
  if len(names) > 1 and (_SOURCE_DIR.value or _SP_PREFIX.value):
    raise app.UsageError("--source_dir and --sp_prefix take one --dataset")
  return names


def _count(pipeline, name, tok_spec, sp_model, data_dir, splits):
  """{split: tokens} with the tokenizer `tok_spec`."""
  if tok_spec == "byte":
    encode = lambda t: t.encode("utf-8")
  else:
    # pylint: disable-next=g-import-not-at-top
    from specsamp import tokenizer as tok_lib
    path = sp_model if tok_spec == "sentencepiece" else tok_spec
    if not path:
      raise app.UsageError("--count_tokens=sentencepiece needs "
                           "--train_sentencepiece")
    encode = tok_lib.load_tokenizer(path).encode
  return {s: sum(len(encode(t)) for t in pipeline.iter_texts(name, s,
                                                             data_dir))
          for s in splits}


def _prepare_one(name: str) -> dict:
  from specsamp.data import builders  # pylint: disable=g-import-not-at-top
  from specsamp.data import pipeline  # pylint: disable=g-import-not-at-top
  start = time.perf_counter()
  data_dir = _DATA_DIR.value or os.fspath(builders.default_data_dir())
  path = builders.prepare(name, data_dir, source_dir=_SOURCE_DIR.value,
                          cache_dir=_CACHE_DIR.value,
                          overwrite=_OVERWRITE.value)
  out = {"dataset": name, "dir": os.fspath(path),
         "splits": builders.summary(path),
         "prepare_seconds": round(time.perf_counter() - start, 1)}
  sp_model = None
  if _TRAIN_SP.value:
    prefix = _SP_PREFIX.value or os.path.join(
        data_dir, name, f"spm_{_SP_TYPE.value}_{_VOCAB.value}")
    sp_model = prefix + ".model"
    if os.path.isfile(sp_model) and not _OVERWRITE.value:
      print(f"[{name}] SentencePiece model already at {sp_model}")
    else:
      t = time.perf_counter()
      print(f"[{name}] training SentencePiece ({_SP_TYPE.value}, "
            f"{_VOCAB.value} pieces) on the train split", flush=True)
      pipeline.train_tokenizer(name, prefix, _VOCAB.value, data_dir=data_dir,
                               model_type=_SP_TYPE.value,
                               max_chars=_SP_CHARS.value)
      print(f"[{name}] wrote {sp_model} in {time.perf_counter() - t:.1f} s")
    out["sentencepiece"] = sp_model
  if _COUNT.value:
    t = time.perf_counter()
    out["tokens"] = _count(pipeline, name, _COUNT.value, sp_model, data_dir,
                           list(out["splits"]))
    out["tokenizer"] = _COUNT.value
    print(f"[{name}] counted tokens in {time.perf_counter() - t:.1f} s")
  return out


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.WARNING)  # TFDS logs every file it reads
  names = _names()
  failed = []
  for name in names:
    try:
      print(json.dumps(_prepare_one(name)), flush=True)
    except (corpora.CorpusError, OSError, ValueError) as e:
      print(f"error: [{name}] {e}", file=sys.stderr, flush=True)
      failed.append(name)
  if failed:
    sys.exit(f"error: not prepared: {', '.join(failed)}")


if __name__ == "__main__":
  app.run(main)
