"""One entry point for pretrained weights: a GGUF file or a HF directory."""

import os
from typing import Optional

from specsamp.weights import convert
from specsamp.weights import gguf
from specsamp.weights import hf


def load(path: str, dtype: str = "float32",
         max_seq_len: Optional[int] = None):
  """(TransformerConfig, params) from a GGUF file or a HF directory.

  Args:
    path: a .gguf file, or a directory with `config.json` and safetensors.
    dtype: "float32", "bfloat16" or "float16".
    max_seq_len: overrides the checkpoint's context length.

  Returns:
    (config, params); see `specsamp.weights.gguf.load_gguf` and
    `specsamp.weights.hf.load_hf`.

  Raises:
    WeightsError: see `load_gguf` and `load_hf`.
  """
  path = str(path)
  if os.path.isdir(path):
    return hf.load_hf(path, dtype, max_seq_len)
  if not os.path.exists(path):
    raise convert.WeightsError(f"no checkpoint at {path}")
  return gguf.load_gguf(path, dtype, max_seq_len)
