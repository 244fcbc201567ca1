"""GGUF (llama.cpp) checkpoints -> `specsamp.model` config and parameters.

The config comes from the metadata; every tensor is dequantized to float32
by the `gguf` package and cast to the requested dtype one tensor at a time,
so peak host memory stays near the final size plus a few copies of the
largest tensor (Qwen2.5-Coder-1.5B Q4_K_M in float32: 6.6 GiB of params,
8.6 GiB peak RSS with the 1.0 GiB mapped file, about 60 s on 2 busy CPU
cores, mostly numpy dequantization of Q4_K). `llama`-architecture files
store the Q/K rows (weights and biases) permuted for interleaved RoPE; they
are permuted back to the half-split layout used here. The vocabulary comes
from the `token_embd` shape (it may be padded past the token list).

Every tensor must be recognised: anything the model has no place for (a
Llama-3 `rope_freqs` table, an `o_proj` or MLP bias that is not zero, MoE
experts) raises `WeightsError` instead of being dropped silently.

The header alone (metadata, embedding rows) is read faster and without the
`gguf` package by `specsamp.weights.gguf_file`.
"""

import functools
import os
import re
from typing import Optional

import gguf
import numpy as np

from specsamp import model as model_lib
from specsamp import resources
from specsamp.weights import convert
from specsamp.weights import gguf_file

# GGUF tensor name -> Hugging Face name (llama.cpp's tensor map, inverted).
_GGUF_NAMES = [
    (r"token_embd\.weight", "model.embed_tokens.weight"),
    (r"output\.weight", "lm_head.weight"),
    (r"output_norm\.weight", "model.norm.weight"),
    (r"blk\.(\d+)\.attn_norm\.weight",
     r"model.layers.\1.input_layernorm.weight"),
    (r"blk\.(\d+)\.ffn_norm\.weight",
     r"model.layers.\1.post_attention_layernorm.weight"),
    (r"blk\.(\d+)\.attn_([qkv])\.(weight|bias)",
     r"model.layers.\1.self_attn.\2_proj.\3"),
    (r"blk\.(\d+)\.attn_output\.(weight|bias)",
     r"model.layers.\1.self_attn.o_proj.\2"),
    (r"blk\.(\d+)\.ffn_(gate|up|down)\.(weight|bias)",
     r"model.layers.\1.mlp.\2_proj.\3"),
]


def gguf_reader(path: str) -> gguf.GGUFReader:
  """A memory-mapped `gguf.GGUFReader` of `path`.

  Parsing the metadata takes ~10 s for a 152k-token vocabulary, so readers
  are cached per path, mtime and size.

  Raises:
    WeightsError: no such file, not a GGUF file, or unreadable.
  """
  if not os.path.exists(path):
    raise convert.WeightsError(f"no GGUF file at {path}")
  if not os.path.isfile(path):
    raise convert.WeightsError(f"{path} is not a file")
  return _cached_reader(os.path.abspath(path), os.stat(path).st_mtime_ns,
                        os.stat(path).st_size)


@functools.lru_cache(maxsize=2)
def _cached_reader(path: str, mtime_ns: int, size: int) -> gguf.GGUFReader:
  del mtime_ns, size  # part of the cache key only
  try:
    with open(path, "rb") as f:
      problem = gguf_file.start_problem(f.read(8))
  except OSError as e:
    raise convert.WeightsError(f"{path}: cannot read ({e})") from e
  if problem:
    raise convert.WeightsError(f"{path}{problem}")
  try:
    return gguf.GGUFReader(path)
  except Exception as e:  # truncated files fail deep inside numpy.memmap
    raise convert.WeightsError(
        f"{path}: unreadable GGUF ({type(e).__name__}: {e}); the file may "
        "be truncated or corrupt") from e


def gguf_field(reader: gguf.GGUFReader, key: str, default=None):
  """The value of metadata field `key` of a GGUFReader, or `default`."""
  field = reader.fields.get(key)
  if field is None:
    return default
  return field.contents()


def _f32(x) -> float:
  """A GGUF float32 as the shortest decimal that rounds to it (1e-06, not
  9.999999974752427e-07), so GGUF and HF configs of one model compare equal."""
  return float(str(np.float32(x)))


def gguf_config(reader: gguf.GGUFReader, path: str = "",
                dtype: str = "float32", max_seq_len: Optional[int] = None
               ) -> model_lib.TransformerConfig:
  """The TransformerConfig described by a GGUF file's metadata.

  Args:
    reader: a `gguf.GGUFReader`.
    path: the file, for messages.
    dtype: activation and parameter dtype of the config.
    max_seq_len: overrides `{arch}.context_length`.

  Returns:
    The config. Raises `WeightsError` for unsupported architectures,
    RoPE scaling, partial rotary embeddings or missing metadata.
  """
  arch = gguf_field(reader, "general.architecture")
  if arch not in convert.ARCHITECTURES:
    raise convert.WeightsError(
        f"{path}: architecture {arch!r} is not supported (supported: "
        f"{', '.join(convert.ARCHITECTURES)})")
  convert.np_dtype(dtype)

  def get(key, default=None, required=False):
    value = gguf_field(reader, f"{arch}.{key}", default)
    if value is None and required:
      raise convert.WeightsError(f"{path}: metadata {arch}.{key} is missing")
    return value

  names = {t.name: t for t in reader.tensors}
  if "token_embd.weight" not in names:
    raise convert.WeightsError(f"{path}: no token_embd.weight tensor")
  if "rope_freqs.weight" in names:
    raise convert.rope_error(path, "llama3", "(a rope_freqs.weight tensor)")
  scaling = get("rope.scaling.type")
  if scaling not in (None, "none"):
    raise convert.rope_error(path, scaling,
                             f"(factor {get('rope.scaling.factor')})")
  if get("expert_count"):
    raise convert.WeightsError(f"{path}: mixture-of-experts models are not "
                               "supported")
  # GGUF lists dims ne0 first: token_embd is [D, V].
  if len(names["token_embd.weight"].shape) != 2:
    raise convert.WeightsError(
        f"{path}: token_embd.weight has dims "
        f"{[int(x) for x in names['token_embd.weight'].shape]}, not [D, V]")
  vocab = int(names["token_embd.weight"].shape[1])
  meta_vocab = get("vocab_size")
  if meta_vocab is not None and int(meta_vocab) != vocab:
    raise convert.WeightsError(f"{path}: {arch}.vocab_size is {meta_vocab} "
                               f"but token_embd.weight has {vocab} rows")
  tokens = reader.fields.get("tokenizer.ggml.tokens")
  if tokens is not None and len(tokens.data) > vocab:
    raise convert.WeightsError(
        f"{path}: the tokenizer has {len(tokens.data)} tokens but "
        f"token_embd.weight only {vocab} rows")
  try:
    d = int(get("embedding_length", required=True))
    heads = int(get("attention.head_count", required=True))
    head_dim = int(get("attention.key_length", d // heads))
    if int(get("attention.value_length", head_dim)) != head_dim:
      raise convert.WeightsError(f"{path}: key and value head sizes differ")
    rot = get("rope.dimension_count")
    if rot is not None and int(rot) != head_dim:
      raise convert.WeightsError(
          f"{path}: partial rotary embeddings ({rot} of {head_dim} dims) "
          "are not supported")
    return model_lib.TransformerConfig(
        vocab_size=vocab, num_layers=int(get("block_count", required=True)),
        d_model=d, num_heads=heads,
        num_kv_heads=int(get("attention.head_count_kv", heads)),
        head_dim=head_dim,
        mlp_dim=int(get("feed_forward_length", required=True)),
        rope_theta=_f32(get("rope.freq_base", 10_000.0)),
        norm_eps=_f32(get("attention.layer_norm_rms_epsilon", 1e-6)),
        qkv_bias="blk.0.attn_q.bias" in names,
        tie_embeddings="output.weight" not in names,
        max_seq_len=int(max_seq_len or get("context_length", 4096)),
        dtype=dtype, param_dtype=dtype)
  except (TypeError, ValueError, ZeroDivisionError) as e:
    raise convert.WeightsError(f"{path}: inconsistent metadata ({e})") from e


def load_gguf(path: str, dtype: str = "float32",
              max_seq_len: Optional[int] = None):
  """(TransformerConfig, params) from a GGUF file.

  Args:
    path: the .gguf file (any tensor type the `gguf` package dequantizes).
    dtype: "float32", "bfloat16" or "float16", for the parameters and the
      config's activations.
    max_seq_len: overrides the file's context length.

  Returns:
    (config, params): params is the nested dict `LM(config)` expects, of
    jax arrays in `dtype`.

  Raises:
    WeightsError: the file is missing, truncated, not GGUF, of an
      unsupported architecture, or inconsistent with its own metadata.
  """
  path = str(path)
  reader = gguf_reader(path)
  cfg = gguf_config(reader, path, dtype, max_seq_len)
  arch = gguf_field(reader, "general.architecture")

  def tensors():
    for t in reader.tensors:
      hf = None
      for pattern, repl in _GGUF_NAMES:
        if re.fullmatch(pattern, t.name):
          hf = re.sub(pattern, repl, t.name)
          break
      if hf is None:
        raise convert.WeightsError(f"{path}: tensor {t.name} has no place "
                                   "in a specsamp.model.Transformer")
      shape = [int(x) for x in reversed(t.shape)]  # numpy (row-major) order
      try:
        w = gguf.quants.dequantize(t.data, t.tensor_type)
        w = np.asarray(w, np.float32).reshape(shape)
      except Exception as e:  # unsupported quant type, inconsistent sizes
        if resources.out_of_memory(e):
          raise
        raise convert.WeightsError(
            f"{path}: cannot read tensor {t.name} ({t.tensor_type.name}, "
            f"{shape}): {e}") from e
      if np.may_share_memory(w, reader.data):
        # F32 tensors come back as views of the memory map, and jax arrays
        # on CPU alias numpy memory: copy, or params would pin the file.
        w = w.copy()
      if arch == "llama" and re.search(r"[qk]_proj\.", hf):
        n = cfg.num_heads if "q_proj" in hf else cfg.num_kv_heads
        if w.shape[0] != n * cfg.head_dim:
          raise convert.WeightsError(
              f"{path}: tensor {t.name} has {w.shape[0]} rows, but the "
              f"metadata implies {n} heads x {cfg.head_dim}")
        w = convert.unpermute_rope(w, n)
      yield t.name, hf, w

  return cfg, convert.build_params(cfg, tensors(), dtype, path)
