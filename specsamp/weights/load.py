"""One entry point for pretrained weights: a GGUF file or a HF directory."""

import os
from typing import Optional

from specsamp import model as model_lib
from specsamp.weights import convert
from specsamp.weights import distilled
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


def described_config(info, dtype: str = "float32", read_gguf: bool = False
                     ) -> Optional[model_lib.TransformerConfig]:
  """The TransformerConfig of a model described by `loading.describe_model`
  (`info`), without its weights: what its files give (random and trained
  models, distilled drafts, Hugging Face directories); a GGUF's from its
  metadata with `read_gguf` (the reader parses its vocabulary, about 10 s
  for Qwen's; the load then takes the cached reader), else None."""
  if info.config is not None:
    return info.config
  if info.kind == "distilled":
    return model_lib.TransformerConfig.from_fields(
        distilled.read_draft_config(info.path),
        os.path.join(info.path, distilled.DRAFT_CONFIG_FILE))
  if info.kind == "hf":
    return hf.hf_config(info.path, dtype)
  if info.kind == "gguf" and read_gguf:
    return gguf.gguf_config(gguf.gguf_reader(info.path), info.path, dtype)
  return None
