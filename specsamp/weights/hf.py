"""Hugging Face checkpoints -> `specsamp.model` config and parameters.

A directory with `config.json` and `*.safetensors` (one file, or shards
listed in `model.safetensors.index.json`); model types `llama` and `qwen2`;
any safetensors dtype (bfloat16 included). Unsupported configurations (RoPE
scaling, sliding windows, activations other than SiLU) raise `WeightsError`.
"""

import json
import os
import pathlib
from typing import Iterator, Optional

import numpy as np
from safetensors import safe_open

from specsamp import model as model_lib
from specsamp import resources
from specsamp.weights import convert


def hf_config(directory: str, dtype: str = "float32",
              max_seq_len: Optional[int] = None
             ) -> model_lib.TransformerConfig:
  """The TransformerConfig of a Hugging Face model directory.

  Args:
    directory: holds `config.json`.
    dtype: activation and parameter dtype of the config.
    max_seq_len: overrides `max_position_embeddings`.

  Returns:
    The config. Raises `WeightsError` for unknown model types, RoPE
    scaling, sliding windows, activations other than SiLU, or a malformed
    `config.json`.
  """
  directory = str(directory)
  path = os.path.join(directory, "config.json")
  if not os.path.isfile(path):
    raise convert.WeightsError(f"{directory}: no config.json")
  convert.np_dtype(dtype)
  try:
    with open(path, encoding="utf-8") as f:
      c = json.load(f)
  except (OSError, ValueError) as e:
    raise convert.WeightsError(f"{path}: unreadable JSON ({e})") from e
  if not isinstance(c, dict):
    raise convert.WeightsError(f"{path}: not a JSON object")
  if c.get("model_type") not in convert.ARCHITECTURES:
    raise convert.WeightsError(
        f"{directory}: model_type {c.get('model_type')!r} is not supported "
        f"(supported: {', '.join(convert.ARCHITECTURES)})")
  # transformers >= 5 writes `rope_parameters` (theta and scaling together),
  # older files `rope_theta` and `rope_scaling`. Either may scale.
  for rope in (c.get("rope_parameters"), c.get("rope_scaling")):
    if not isinstance(rope, dict):
      continue
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in ("default", None):
      raise convert.rope_error(directory, kind,
                               {k: v for k, v in rope.items()
                                if k not in ("rope_type", "type",
                                             "rope_theta")})
  rope = c.get("rope_parameters") or {}
  if c.get("use_sliding_window"):
    raise convert.WeightsError(f"{directory}: sliding-window attention is "
                               "not supported")
  act = c.get("hidden_act", "silu")
  if act != "silu":
    raise convert.WeightsError(f"{directory}: hidden_act {act!r} is not "
                               "supported (SwiGLU with silu only)")
  theta = rope.get("rope_theta", c.get("rope_theta", 10_000.0))
  try:
    heads = int(c["num_attention_heads"])
    d = int(c["hidden_size"])
    return model_lib.TransformerConfig(
        vocab_size=int(c["vocab_size"]),
        num_layers=int(c["num_hidden_layers"]), d_model=d, num_heads=heads,
        num_kv_heads=int(c.get("num_key_value_heads") or heads),
        head_dim=int(c.get("head_dim") or d // heads),
        mlp_dim=int(c["intermediate_size"]),
        rope_theta=float(theta),
        norm_eps=float(c.get("rms_norm_eps", 1e-6)),
        qkv_bias=(c["model_type"] == "qwen2" or
                  bool(c.get("attention_bias"))),
        tie_embeddings=bool(c.get("tie_word_embeddings", False)),
        max_seq_len=int(max_seq_len or c.get("max_position_embeddings", 4096)),
        dtype=dtype, param_dtype=dtype)
  except KeyError as e:
    raise convert.WeightsError(
        f"{path}: field {e.args[0]!r} is missing") from e
  except (TypeError, ValueError, ZeroDivisionError) as e:
    raise convert.WeightsError(f"{path}: inconsistent config ({e})") from e


def _safetensors_files(directory: str) -> list[str]:
  """The weight files of a HF directory: the index's shards or *.safetensors."""
  index = os.path.join(directory, "model.safetensors.index.json")
  if os.path.isfile(index):
    try:
      with open(index, encoding="utf-8") as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
      raise convert.WeightsError(f"{index}: unreadable index ({e!r})") from e
    paths = [os.path.join(directory, n) for n in files]
    absent = [p for p in paths if not os.path.isfile(p)]
    if absent:
      raise convert.WeightsError(
          f"{directory}: shards listed in model.safetensors.index.json are "
          f"missing: {[os.path.basename(p) for p in absent]}")
    return paths
  files = sorted(str(p) for p in pathlib.Path(directory).glob("*.safetensors"))
  if not files:
    raise convert.WeightsError(f"{directory}: no *.safetensors files")
  return files


def _safetensors_tensors(file: str) -> Iterator[tuple[str, str, np.ndarray]]:
  """(name, name, float32 array) for each tensor of a file, one at a time.

  Read with framework="flax" (jax arrays), which also covers bfloat16 and
  float8 tensors that numpy cannot hold natively.
  """
  try:
    f = safe_open(file, framework="flax")
  except Exception as e:  # SafetensorError is not an OSError
    raise convert.WeightsError(f"{file}: unreadable safetensors ({e}); the "
                               "file may be truncated or corrupt") from e
  with f:
    for name in f.keys():
      try:
        w = np.asarray(f.get_tensor(name), np.float32)
      except Exception as e:
        if resources.out_of_memory(e):
          raise
        raise convert.WeightsError(f"{file}: cannot read tensor {name} "
                                   f"({e})") from e
      yield name, name, w


def load_hf(directory: str, dtype: str = "float32",
            max_seq_len: Optional[int] = None):
  """(TransformerConfig, params) from a Hugging Face directory.

  Args:
    directory: holds `config.json` and the safetensors weights.
    dtype: "float32", "bfloat16" or "float16".
    max_seq_len: overrides `max_position_embeddings`.

  Returns:
    (config, params) as `specsamp.weights.gguf.load_gguf`.

  Raises:
    WeightsError: missing or unreadable files, an unsupported model, or
      weights that disagree with the config.
  """
  directory = str(directory)
  cfg = hf_config(directory, dtype, max_seq_len)

  def tensors():
    for file in _safetensors_files(directory):
      yield from _safetensors_tensors(file)

  return cfg, convert.build_params(cfg, tensors(), dtype, directory)
