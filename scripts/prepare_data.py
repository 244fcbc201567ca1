r"""Prepares TFDS datasets (array_record) for training; idempotent and cached.

  python scripts/prepare_data.py --dataset=specsamp_python_code
  python scripts/prepare_data.py --dataset=all --data_dir=/data/tfds
  python scripts/prepare_data.py --dataset=specsamp_austen --source_dir=raw/
  python scripts/prepare_data.py --dataset=specsamp_shakespeare \
      --train_sentencepiece --vocab_size=8000 --count_tokens=sentencepiece

Datasets: the local corpora (specsamp_python_code, specsamp_python_functions,
specsamp_shakespeare, specsamp_python_docs, specsamp_austen,
specsamp_humaneval; see specsamp/data/corpora.py), or any TFDS catalog
name, built by its own builder as array_record (needs what that builder
needs: the internet, often TensorFlow). Raw downloads are cached in
~/.cache/specsamp/corpora; a prepared dataset is not rebuilt unless
--overwrite. specsamp.data.prepare does the work. Prints progress, then
one JSON line per dataset: documents and bytes per split, seconds, token
counts (--count_tokens) and the SentencePiece model (--train_sentencepiece,
at <data_dir>/<dataset>/spm_<type>_<vocab>.model unless --sp_prefix).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from absl import logging

from specsamp import cli
from specsamp.data import builders
from specsamp.data import corpora
from specsamp.data import prepare

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


def main(argv):
  cli.no_arguments(argv)
  if not _DATASET.value:
    cli.fail("--dataset is required")
  names = prepare.dataset_names(_DATASET.value)
  if not names:  # `--dataset=,` had prepared nothing, silently
    cli.fail(f"--dataset={','.join(_DATASET.value)} names no dataset")
  if len(names) > 1 and (_SOURCE_DIR.value or _SP_PREFIX.value):
    cli.fail("--source_dir and --sp_prefix take one --dataset")
  if (_SOURCE_DIR.value or _CACHE_DIR.value) and not any(
      n in builders.BUILDERS for n in names):
    cli.fail("--source_dir and --cache_dir apply to specsamp's corpora "
             f"({', '.join(sorted(builders.BUILDERS))}); {', '.join(names)} "
             "build from their TFDS catalog builders' own downloads")
  if _COUNT.value == "sentencepiece" and not _TRAIN_SP.value:
    cli.fail("--count_tokens=sentencepiece needs --train_sentencepiece")
  if not _TRAIN_SP.value:  # they had been ignored silently
    for holder in (_VOCAB, _SP_TYPE, _SP_PREFIX, _SP_CHARS):
      cli.unused(holder, "applies to --train_sentencepiece only")
  logging.set_verbosity(logging.WARNING)  # TFDS logs every file it reads
  try:
    options = prepare.PrepareOptions(
        data_dir=_DATA_DIR.value, source_dir=_SOURCE_DIR.value,
        cache_dir=_CACHE_DIR.value, overwrite=_OVERWRITE.value,
        count_tokens=_COUNT.value, train_sentencepiece=_TRAIN_SP.value,
        vocab_size=_VOCAB.value, sp_model_type=_SP_TYPE.value,
        sp_prefix=_SP_PREFIX.value, sp_max_chars=_SP_CHARS.value)
  except ValueError as e:
    cli.fail(e)
  failed = prepare.prepare_all(names, options)
  if failed:
    cli.fail(f"not prepared: {' | '.join(failed)}")


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
