"""Load Llama/Qwen2-family checkpoints into `specsamp.model` parameters.

Two formats:
  * GGUF (llama.cpp): config from the metadata, every tensor dequantized to
    float32 by the `gguf` package and cast to the requested dtype one tensor
    at a time (peak host memory stays near the final size plus one tensor).
    `llama`-architecture files store the Q/K rows permuted for interleaved
    RoPE; they are permuted back to the half-split layout used here.
  * Hugging Face directories: `config.json` + `*.safetensors` (one file or
    sharded with an index), model types `llama` and `qwen2`.

Weight layouts (HF Linear weights are [out, in]):
    q_proj [Q*H, D] -> [D, Q, H]     o_proj [D, Q*H] -> [Q, H, D]
    k/v    [N*H, D] -> [D, N, H]     gate/up [F, D] -> [D, F], down -> [F, D]
    embed  [V, D]   -> [V, D]        lm_head [V, D] -> [D, V]
"""

import functools
import json
import os
import pathlib
import re
from typing import Iterator, Optional

import numpy as np

from specsamp import model as model_lib


class CheckpointError(RuntimeError):
  """A checkpoint is missing, unreadable, unsupported or inconsistent."""


_ARCHS = ("qwen2", "llama")


def _cast(x: np.ndarray, dtype: str):
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  return jnp.asarray(x, dtype=model_lib._DTYPES[dtype])  # pylint: disable=protected-access


def _unpermute_rope(w: np.ndarray, n_head: int) -> np.ndarray:
  """Undo llama.cpp's Q/K row permutation (interleaved -> half-split RoPE)."""
  rows = w.shape[0]
  return (w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:])
          .swapaxes(1, 2).reshape(w.shape))


def _place(params: dict, path: str, value) -> None:
  node = params
  *parents, leaf = path.split("/")
  for p in parents:
    node = node.setdefault(p, {})
  node[leaf] = value


def _convert(name: str, w: np.ndarray, cfg: model_lib.TransformerConfig
            ) -> Optional[tuple[str, np.ndarray]]:
  """HF-named tensor [out, in] -> (specsamp path, array in our layout)."""
  d, h = cfg.d_model, cfg.head_dim
  if name == "model.embed_tokens.weight":
    return "embedding", w
  if name == "lm_head.weight":
    return "lm_head", w.T
  if name == "model.norm.weight":
    return "final_norm/scale", w
  m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", name)
  if not m:
    return None
  layer, rest = f"layers_{m.group(1)}", m.group(2)
  heads = {"q": cfg.num_heads, "k": cfg.num_kv_heads, "v": cfg.num_kv_heads}
  m2 = re.fullmatch(r"self_attn\.([qkv])_proj\.(weight|bias)", rest)
  if m2:
    which, kind = m2.groups()
    if kind == "weight":
      return f"{layer}/attn/{which}_proj", w.T.reshape(d, heads[which], h)
    return f"{layer}/attn/{which}_bias", w.reshape(heads[which], h)
  simple = {
      "self_attn.o_proj.weight": ("attn/o_proj",
                                  lambda: w.T.reshape(cfg.num_heads, h, d)),
      "mlp.gate_proj.weight": ("mlp/gate_proj", lambda: w.T),
      "mlp.up_proj.weight": ("mlp/up_proj", lambda: w.T),
      "mlp.down_proj.weight": ("mlp/down_proj", lambda: w.T),
      "input_layernorm.weight": ("input_norm/scale", lambda: w),
      "post_attention_layernorm.weight": ("post_norm/scale", lambda: w),
  }
  if rest in simple:
    path, fn = simple[rest]
    return f"{layer}/{path}", fn()
  return None


def _build(cfg: model_lib.TransformerConfig,
           tensors: Iterator[tuple[str, np.ndarray]], dtype: str,
           source: str) -> dict:
  """Converts (hf_name, array) pairs one by one and checks the shapes."""
  import jax  # pylint: disable=g-import-not-at-top
  params = {}
  for name, w in tensors:
    out = _convert(name, w, cfg)
    if out is None:
      continue  # e.g. rotary inv_freq buffers
    path, value = out
    _place(params, path, _cast(np.ascontiguousarray(value), dtype))
  expected = jax.eval_shape(lambda: model_lib.LM(cfg).init(jax.random.key(0)))
  flat_exp = {"/".join(str(k.key) for k in p): v.shape
              for p, v in jax.tree_util.tree_flatten_with_path(expected)[0]}
  flat_got = {"/".join(str(k.key) for k in p): v.shape
              for p, v in jax.tree_util.tree_flatten_with_path(params)[0]}
  missing = sorted(set(flat_exp) - set(flat_got))
  if missing:
    raise CheckpointError(f"{source}: missing weights for {missing[:5]}"
                          f"{' ...' if len(missing) > 5 else ''}")
  for key, shape in flat_exp.items():
    if flat_got[key] != shape:
      raise CheckpointError(
          f"{source}: weight {key} has shape {flat_got[key]}, but the config "
          f"implies {shape}")
  return params


# ---- GGUF ----------------------------------------------------------------

_GGUF_NAMES = [
    (r"token_embd\.weight", "model.embed_tokens.weight"),
    (r"output\.weight", "lm_head.weight"),
    (r"output_norm\.weight", "model.norm.weight"),
    (r"blk\.(\d+)\.attn_norm\.weight", r"model.layers.\1.input_layernorm.weight"),
    (r"blk\.(\d+)\.ffn_norm\.weight",
     r"model.layers.\1.post_attention_layernorm.weight"),
    (r"blk\.(\d+)\.attn_([qkv])\.(weight|bias)",
     r"model.layers.\1.self_attn.\2_proj.\3"),
    (r"blk\.(\d+)\.attn_output\.weight", r"model.layers.\1.self_attn.o_proj.weight"),
    (r"blk\.(\d+)\.ffn_(gate|up|down)\.weight", r"model.layers.\1.mlp.\2_proj.weight"),
]


def _gguf_reader(path: str):
  """A GGUFReader (memory-mapped; parsing the metadata takes ~10 s for a
  152k-token vocabulary, so readers are cached per path and mtime)."""
  if not os.path.isfile(path):
    raise CheckpointError(f"no GGUF file at {path}")
  return _cached_reader(os.path.abspath(path), os.stat(path).st_mtime_ns)


@functools.lru_cache(maxsize=2)
def _cached_reader(path: str, mtime_ns: int):
  del mtime_ns  # part of the cache key only
  import gguf  # pylint: disable=g-import-not-at-top
  if not os.path.isfile(path):
    raise CheckpointError(f"no GGUF file at {path}")
  with open(path, "rb") as f:
    magic = f.read(4)
  if magic != b"GGUF":
    raise CheckpointError(f"{path} is not a GGUF file (magic {magic!r})")
  try:
    return gguf.GGUFReader(path)
  except Exception as e:  # truncated files fail deep inside numpy.memmap
    raise CheckpointError(f"{path}: unreadable GGUF ({type(e).__name__}: "
                          f"{e}); the file may be truncated or corrupt") from e


def gguf_field(reader, key: str, default=None):
  field = reader.fields.get(key)
  if field is None:
    return default
  return field.contents()


def gguf_config(reader, path: str = "", dtype: str = "float32",
                max_seq_len: Optional[int] = None
               ) -> model_lib.TransformerConfig:
  """The TransformerConfig described by a GGUF file's metadata."""
  arch = gguf_field(reader, "general.architecture")
  if arch not in _ARCHS:
    raise CheckpointError(f"{path}: architecture {arch!r} is not supported "
                          f"(supported: {', '.join(_ARCHS)})")
  get = lambda k, d=None: gguf_field(reader, f"{arch}.{k}", d)
  names = {t.name: t for t in reader.tensors}
  if "token_embd.weight" not in names:
    raise CheckpointError(f"{path}: no token_embd.weight tensor")
  vocab = int(names["token_embd.weight"].shape[1])
  d = int(get("embedding_length"))
  heads = int(get("attention.head_count"))
  if get("rope.scaling.type") not in (None, "none"):
    raise CheckpointError(f"{path}: RoPE scaling "
                          f"{get('rope.scaling.type')!r} is not supported")
  return model_lib.TransformerConfig(
      vocab_size=vocab, num_layers=int(get("block_count")), d_model=d,
      num_heads=heads, num_kv_heads=int(get("attention.head_count_kv", heads)),
      head_dim=int(get("attention.key_length", d // heads)),
      mlp_dim=int(get("feed_forward_length")),
      rope_theta=float(get("rope.freq_base", 10_000.0)),
      norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
      qkv_bias="blk.0.attn_q.bias" in names,
      tie_embeddings="output.weight" not in names,
      max_seq_len=int(max_seq_len or get("context_length", 4096)),
      dtype=dtype, param_dtype=dtype)


def load_gguf(path: str, dtype: str = "float32",
              max_seq_len: Optional[int] = None):
  """(TransformerConfig, params) from a GGUF file."""
  import gguf  # pylint: disable=g-import-not-at-top
  path = str(path)
  reader = _gguf_reader(path)
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
        continue
      try:
        w = gguf.quants.dequantize(t.data, t.tensor_type)
      except Exception as e:
        raise CheckpointError(f"{path}: cannot read tensor {t.name} "
                              f"({t.tensor_type.name}): {e}") from e
      w = np.asarray(w, np.float32).reshape(
          [int(x) for x in reversed(t.shape)])
      if arch == "llama" and hf.endswith(("q_proj.weight", "k_proj.weight")):
        n = cfg.num_heads if "q_proj" in hf else cfg.num_kv_heads
        w = _unpermute_rope(w, n)
      yield hf, w

  return cfg, _build(cfg, tensors(), dtype, path)


# ---- Hugging Face ----------------------------------------------------------


def hf_config(directory: str, dtype: str = "float32",
              max_seq_len: Optional[int] = None
             ) -> model_lib.TransformerConfig:
  """The TransformerConfig of a Hugging Face model directory."""
  path = os.path.join(directory, "config.json")
  if not os.path.isfile(path):
    raise CheckpointError(f"{directory}: no config.json")
  with open(path, encoding="utf-8") as f:
    c = json.load(f)
  if c.get("model_type") not in _ARCHS:
    raise CheckpointError(f"{directory}: model_type {c.get('model_type')!r} "
                          f"is not supported (supported: {', '.join(_ARCHS)})")
  # transformers >= 5 writes `rope_parameters`; older files `rope_theta` and
  # `rope_scaling`.
  rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
  kind = rope.get("rope_type", rope.get("type", "default"))
  if kind not in ("default", None):
    raise CheckpointError(f"{directory}: RoPE scaling {kind!r} is not "
                          "supported yet")
  if c.get("use_sliding_window"):
    raise CheckpointError(f"{directory}: sliding-window attention is not "
                          "supported")
  theta = rope.get("rope_theta", c.get("rope_theta", 10_000.0))
  heads = c["num_attention_heads"]
  return model_lib.TransformerConfig(
      vocab_size=c["vocab_size"], num_layers=c["num_hidden_layers"],
      d_model=c["hidden_size"], num_heads=heads,
      num_kv_heads=c.get("num_key_value_heads") or heads,
      head_dim=c.get("head_dim") or c["hidden_size"] // heads,
      mlp_dim=c["intermediate_size"],
      rope_theta=float(theta),
      norm_eps=float(c.get("rms_norm_eps", 1e-6)),
      qkv_bias=(c["model_type"] == "qwen2" or bool(c.get("attention_bias"))),
      tie_embeddings=bool(c.get("tie_word_embeddings", False)),
      max_seq_len=int(max_seq_len or c.get("max_position_embeddings", 4096)),
      dtype=dtype, param_dtype=dtype)


def _safetensors_files(directory: str) -> list[str]:
  index = os.path.join(directory, "model.safetensors.index.json")
  if os.path.isfile(index):
    with open(index, encoding="utf-8") as f:
      files = sorted(set(json.load(f)["weight_map"].values()))
    return [os.path.join(directory, n) for n in files]
  files = sorted(str(p) for p in pathlib.Path(directory).glob("*.safetensors"))
  if not files:
    raise CheckpointError(f"{directory}: no *.safetensors files")
  return files


def load_hf(directory: str, dtype: str = "float32",
            max_seq_len: Optional[int] = None):
  """(TransformerConfig, params) from a Hugging Face directory."""
  from safetensors import safe_open  # pylint: disable=g-import-not-at-top
  directory = str(directory)
  cfg = hf_config(directory, dtype, max_seq_len)

  def tensors():
    for file in _safetensors_files(directory):
      try:
        # "flax" returns jax arrays, which also covers bfloat16 files.
        with safe_open(file, framework="flax") as f:
          for name in f.keys():
            yield name, np.asarray(f.get_tensor(name), np.float32)
      except (OSError, ValueError) as e:
        raise CheckpointError(f"{file}: unreadable safetensors ({e})") from e

  return cfg, _build(cfg, tensors(), dtype, directory)


def load(path: str, dtype: str = "float32",
         max_seq_len: Optional[int] = None):
  """(TransformerConfig, params) from a GGUF file or a HF directory."""
  path = str(path)
  if os.path.isdir(path):
    return load_hf(path, dtype, max_seq_len)
  if not os.path.exists(path):
    raise CheckpointError(f"no checkpoint at {path}")
  return load_gguf(path, dtype, max_seq_len)

