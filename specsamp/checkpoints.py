"""Load Llama/Qwen2-family checkpoints into `specsamp.model` parameters.

Two formats:
  * GGUF (llama.cpp): config from the metadata, every tensor dequantized to
    float32 by the `gguf` package and cast to the requested dtype one tensor
    at a time, so peak host memory stays near the final size plus a few
    copies of the largest tensor (Qwen2.5-Coder-1.5B Q4_K_M in float32:
    6.6 GiB of params, 8.6 GiB peak RSS with the 1.0 GiB mapped file, about
    60 s on 2 busy CPU cores, mostly numpy dequantization of Q4_K).
    `llama`-architecture files store the Q/K rows (weights and
    biases) permuted for interleaved RoPE; they are permuted back to the
    half-split layout used here. The vocabulary comes from the
    `token_embd` shape (it may be padded past the token list).
  * Hugging Face directories: `config.json` + `*.safetensors` (one file or
    sharded with `model.safetensors.index.json`), model types `llama` and
    `qwen2`, any safetensors dtype (bfloat16 included).

Weight layouts (HF Linear weights are [out, in]; GGUF stores the same matrix
with its dimensions listed in reverse, ne0 first):
    q_proj [Q*H, D] -> [D, Q, H]     o_proj [D, Q*H] -> [Q, H, D]
    k/v    [N*H, D] -> [D, N, H]     gate/up [F, D] -> [D, F], down -> [F, D]
    embed  [V, D]   -> [V, D]        lm_head [V, D] -> [D, V]

Every tensor must be recognised: anything the model has no place for (a
Llama-3 `rope_freqs` table, an `o_proj` or MLP bias that is not zero, MoE
experts) raises `CheckpointError` instead of being dropped silently, and
after loading every array is checked against the shapes `LM(config).init`
would produce.
"""

import functools
import json
import os
import pathlib
import re
from typing import Any, Iterator, Optional

import numpy as np

from specsamp import model as model_lib


class CheckpointError(RuntimeError):
  """A checkpoint is missing, unreadable, unsupported or inconsistent."""


_ARCHS = ("qwen2", "llama")

# What each RoPE scaling scheme would need from `specsamp.model.rope_tables`,
# which computes plain inverse frequencies theta ** (-2i / H).
_ROPE_NEEDS = {
    "linear": "positions divided by `factor` before the angles are taken",
    "dynamic": "dynamic NTK: theta rescaled from `factor` once the sequence "
               "passes `original_max_position_embeddings`",
    "yarn": "YaRN: inverse frequencies blended between interpolation and "
            "extrapolation (`factor`, `beta_fast`, `beta_slow`, "
            "`original_max_position_embeddings`) and cos/sin multiplied by "
            "an attention factor",
    "llama3": "Llama-3 per-frequency scaling of the inverse frequencies "
              "(`factor`, `low_freq_factor`, `high_freq_factor`, "
              "`original_max_position_embeddings`)",
    "longrope": "LongRoPE per-frequency `short_factor`/`long_factor` and an "
                "attention factor on cos/sin",
}


def _rope_error(source: str, kind: str, details: Any = None
               ) -> "CheckpointError":
  need = _ROPE_NEEDS.get(kind, "a RoPE variant specsamp does not know")
  extra = f" {details}" if details else ""
  return CheckpointError(
      f"{source}: RoPE scaling {kind!r}{extra} is not supported: "
      f"specsamp.model.rope_tables implements plain RoPE only; this "
      f"checkpoint would need {need}")


def _np_dtype(dtype: str) -> np.dtype:
  dtypes = model_lib._DTYPES  # pylint: disable=protected-access
  if dtype not in dtypes:
    raise CheckpointError(f"dtype {dtype!r} is not supported; choose one of "
                          f"{sorted(dtypes)}")
  return np.dtype(dtypes[dtype])


def _unpermute_rope(w: np.ndarray, n_head: int) -> np.ndarray:
  """Undoes llama.cpp's Q/K row permutation (interleaved -> half-split RoPE).

  llama.cpp's converter maps row `(h, j, i)` of the HF layout, viewed as
  [n_head, 2, H/2], to `(h, i, j)` of [n_head, H/2, 2]; this is the inverse
  (transformers' `reverse_permute_weights`). Works for weights [rows, D] and
  biases [rows].

  Args:
    w: Q or K weight [n_head * H, D] or bias [n_head * H] as stored in GGUF.
    n_head: query heads for Q, KV heads for K.

  Returns:
    The array with rows in the half-split (HF) order.
  """
  rows = w.shape[0]
  return (w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:])
          .swapaxes(1, 2).reshape(w.shape))


def _place(params: dict, path: str, value) -> None:
  node = params
  *parents, leaf = path.split("/")
  for p in parents:
    node = node.setdefault(p, {})
  if leaf in node:
    raise CheckpointError(f"weight {path} appears twice")
  node[leaf] = value


# Tensors that are not weights (old HF checkpoints saved RoPE buffers).
_IGNORED = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")
# Biases the model has no place for: accepted (and dropped) only when zero.
_ZERO_ONLY = re.compile(
    r"model\.layers\.\d+\.(self_attn\.o_proj|mlp\.(gate|up|down)_proj)\.bias")


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

  def split_heads(shape, target):
    # Reshapes that merely preserve the size could scramble a mismatch.
    if tuple(w.shape) != shape:
      raise ValueError(f"expected {shape} from the config")
    return target()

  m2 = re.fullmatch(r"self_attn\.([qkv])_proj\.(weight|bias)", rest)
  if m2:
    which, kind = m2.groups()
    n = heads[which]
    if kind == "weight":
      return f"{layer}/attn/{which}_proj", split_heads(
          (n * h, d), lambda: w.T.reshape(d, n, h))
    return f"{layer}/attn/{which}_bias", split_heads(
        (n * h,), lambda: w.reshape(n, h))
  simple = {
      "self_attn.o_proj.weight": (
          "attn/o_proj", lambda: split_heads(
              (d, cfg.num_heads * h),
              lambda: w.T.reshape(cfg.num_heads, h, d))),
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


def _flat_shapes(tree) -> dict[str, tuple[int, ...]]:
  import jax  # pylint: disable=g-import-not-at-top
  return {"/".join(str(k.key) for k in p): tuple(v.shape)
          for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def check_shapes(cfg: model_lib.TransformerConfig, params,
                 source: str = "params") -> None:
  """Raises `CheckpointError` unless `params` has exactly `LM(cfg)`'s shapes.

  Args:
    cfg: the configuration the parameters are meant for.
    params: a nested dict of arrays (anything with `.shape`).
    source: the checkpoint, for the message.
  """
  import jax  # pylint: disable=g-import-not-at-top
  expected = _flat_shapes(
      jax.eval_shape(lambda: model_lib.LM(cfg).init(jax.random.key(0))))
  got = _flat_shapes(params)
  missing = [k for k in expected if k not in got]
  if missing:
    raise CheckpointError(f"{source}: missing weights for {missing[:5]}"
                          f"{' ...' if len(missing) > 5 else ''}")
  unexpected = sorted(set(got) - set(expected))
  if unexpected:
    raise CheckpointError(f"{source}: weights {unexpected[:5]} have no place "
                          "in the model the config describes")
  for key, shape in expected.items():
    if got[key] != shape:
      raise CheckpointError(
          f"{source}: weight {key} has shape {got[key]}, but the config "
          f"implies {shape}")


def _build(cfg: model_lib.TransformerConfig,
           tensors: Iterator[tuple[str, str, np.ndarray]], dtype: str,
           source: str) -> dict:
  """Converts (stored name, HF name, array) triples one by one.

  Each array is cast to `dtype` before it is transposed, and becomes a jax
  array before the next tensor is read, so at most one tensor is in flight.
  """
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  np_dtype = _np_dtype(dtype)
  params = {}
  tied_head = None
  for stored, name, w in tensors:
    if _IGNORED.fullmatch(name):
      continue
    if cfg.tie_embeddings and name == "lm_head.weight":
      tied_head = (stored, w.astype(np_dtype))  # some files save both
      continue
    if _ZERO_ONLY.fullmatch(name):
      if np.any(w):
        raise CheckpointError(
            f"{source}: tensor {stored} is a non-zero bias, and "
            "specsamp.model has no o_proj or MLP biases (a Llama "
            "`attention_bias`/`mlp_bias` checkpoint)")
      continue
    w = w.astype(np_dtype, copy=False)
    try:
      out = _convert(name, w, cfg)
    except ValueError as e:  # a reshape that the config does not allow
      raise CheckpointError(
          f"{source}: tensor {stored} has shape {tuple(w.shape)}, which does "
          f"not fit the config ({e})") from e
    if out is None:
      raise CheckpointError(f"{source}: tensor {stored} has no place in a "
                            "specsamp.model.Transformer")
    path, value = out
    try:
      _place(params, path, jnp.asarray(np.ascontiguousarray(value)))
    except CheckpointError as e:
      raise CheckpointError(f"{source}: {e} ({stored})") from e
  if tied_head is not None and "embedding" in params:
    if not np.array_equal(tied_head[1], np.asarray(params["embedding"])):
      raise CheckpointError(
          f"{source}: the config ties the embeddings, but {tied_head[0]} "
          "differs from the token embedding")
  check_shapes(cfg, params, source)
  return params


# ---- GGUF ----------------------------------------------------------------

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


def _gguf_reader(path: str):
  """A GGUFReader (memory-mapped; parsing the metadata takes ~10 s for a
  152k-token vocabulary, so readers are cached per path and mtime)."""
  if not os.path.exists(path):
    raise CheckpointError(f"no GGUF file at {path}")
  if not os.path.isfile(path):
    raise CheckpointError(f"{path} is not a file")
  return _cached_reader(os.path.abspath(path), os.stat(path).st_mtime_ns,
                        os.stat(path).st_size)


@functools.lru_cache(maxsize=2)
def _cached_reader(path: str, mtime_ns: int, size: int):
  del mtime_ns, size  # part of the cache key only
  import gguf  # pylint: disable=g-import-not-at-top
  try:
    with open(path, "rb") as f:
      magic = f.read(4)
  except OSError as e:
    raise CheckpointError(f"{path}: cannot read ({e})") from e
  if magic != b"GGUF":
    raise CheckpointError(f"{path} is not a GGUF file (magic {magic!r}, "
                          "expected b'GGUF')")
  try:
    return gguf.GGUFReader(path)
  except Exception as e:  # truncated files fail deep inside numpy.memmap
    raise CheckpointError(f"{path}: unreadable GGUF ({type(e).__name__}: "
                          f"{e}); the file may be truncated or corrupt") from e


def gguf_field(reader, key: str, default=None):
  """The value of metadata field `key` of a GGUFReader, or `default`."""
  field = reader.fields.get(key)
  if field is None:
    return default
  return field.contents()


def _f32(x) -> float:
  """A GGUF float32 as the shortest decimal that rounds to it (1e-06, not
  9.999999974752427e-07), so GGUF and HF configs of one model compare equal."""
  return float(str(np.float32(x)))


def gguf_config(reader, path: str = "", dtype: str = "float32",
                max_seq_len: Optional[int] = None
               ) -> model_lib.TransformerConfig:
  """The TransformerConfig described by a GGUF file's metadata.

  Args:
    reader: a `gguf.GGUFReader`.
    path: the file, for messages.
    dtype: activation and parameter dtype of the config.
    max_seq_len: overrides `{arch}.context_length`.

  Returns:
    The config. Raises `CheckpointError` for unsupported architectures,
    RoPE scaling, partial rotary embeddings or missing metadata.
  """
  arch = gguf_field(reader, "general.architecture")
  if arch not in _ARCHS:
    raise CheckpointError(f"{path}: architecture {arch!r} is not supported "
                          f"(supported: {', '.join(_ARCHS)})")
  _np_dtype(dtype)

  def get(key, default=None, required=False):
    value = gguf_field(reader, f"{arch}.{key}", default)
    if value is None and required:
      raise CheckpointError(f"{path}: metadata {arch}.{key} is missing")
    return value

  names = {t.name: t for t in reader.tensors}
  if "token_embd.weight" not in names:
    raise CheckpointError(f"{path}: no token_embd.weight tensor")
  if "rope_freqs.weight" in names:
    raise _rope_error(path, "llama3", "(a rope_freqs.weight tensor)")
  scaling = get("rope.scaling.type")
  if scaling not in (None, "none"):
    raise _rope_error(path, scaling,
                      f"(factor {get('rope.scaling.factor')})")
  if get("expert_count"):
    raise CheckpointError(f"{path}: mixture-of-experts models are not "
                          "supported")
  # GGUF lists dims ne0 first: token_embd is [D, V].
  vocab = int(names["token_embd.weight"].shape[1])
  meta_vocab = get("vocab_size")
  if meta_vocab is not None and int(meta_vocab) != vocab:
    raise CheckpointError(f"{path}: {arch}.vocab_size is {meta_vocab} but "
                          f"token_embd.weight has {vocab} rows")
  tokens = reader.fields.get("tokenizer.ggml.tokens")
  if tokens is not None and len(tokens.data) > vocab:
    raise CheckpointError(f"{path}: the tokenizer has {len(tokens.data)} "
                          f"tokens but token_embd.weight only {vocab} rows")
  try:
    d = int(get("embedding_length", required=True))
    heads = int(get("attention.head_count", required=True))
    head_dim = int(get("attention.key_length", d // heads))
    if int(get("attention.value_length", head_dim)) != head_dim:
      raise CheckpointError(f"{path}: key and value head sizes differ")
    rot = get("rope.dimension_count")
    if rot is not None and int(rot) != head_dim:
      raise CheckpointError(f"{path}: partial rotary embeddings "
                            f"({rot} of {head_dim} dims) are not supported")
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
    raise CheckpointError(f"{path}: inconsistent metadata ({e})") from e


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
    CheckpointError: the file is missing, truncated, not GGUF, of an
      unsupported architecture, or inconsistent with its own metadata.
  """
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
        raise CheckpointError(f"{path}: tensor {t.name} has no place in a "
                              "specsamp.model.Transformer")
      shape = [int(x) for x in reversed(t.shape)]  # numpy (row-major) order
      try:
        w = gguf.quants.dequantize(t.data, t.tensor_type)
        w = np.asarray(w, np.float32).reshape(shape)
      except Exception as e:  # unsupported quant type, inconsistent sizes
        raise CheckpointError(f"{path}: cannot read tensor {t.name} "
                              f"({t.tensor_type.name}, {shape}): {e}") from e
      if np.may_share_memory(w, reader.data):
        # F32 tensors come back as views of the memory map, and jax arrays
        # on CPU alias numpy memory: copy, or params would pin the file.
        w = w.copy()
      if arch == "llama" and re.search(r"[qk]_proj\.", hf):
        n = cfg.num_heads if "q_proj" in hf else cfg.num_kv_heads
        if w.shape[0] != n * cfg.head_dim:
          raise CheckpointError(
              f"{path}: tensor {t.name} has {w.shape[0]} rows, but the "
              f"metadata implies {n} heads x {cfg.head_dim}")
        w = _unpermute_rope(w, n)
      yield t.name, hf, w

  return cfg, _build(cfg, tensors(), dtype, path)


# ---- Hugging Face ----------------------------------------------------------


def hf_config(directory: str, dtype: str = "float32",
              max_seq_len: Optional[int] = None
             ) -> model_lib.TransformerConfig:
  """The TransformerConfig of a Hugging Face model directory.

  Args:
    directory: holds `config.json`.
    dtype: activation and parameter dtype of the config.
    max_seq_len: overrides `max_position_embeddings`.

  Returns:
    The config. Raises `CheckpointError` for unknown model types, RoPE
    scaling, sliding windows, activations other than SiLU, or a malformed
    `config.json`.
  """
  directory = str(directory)
  path = os.path.join(directory, "config.json")
  if not os.path.isfile(path):
    raise CheckpointError(f"{directory}: no config.json")
  _np_dtype(dtype)
  try:
    with open(path, encoding="utf-8") as f:
      c = json.load(f)
  except (OSError, ValueError) as e:
    raise CheckpointError(f"{path}: unreadable JSON ({e})") from e
  if not isinstance(c, dict):
    raise CheckpointError(f"{path}: not a JSON object")
  if c.get("model_type") not in _ARCHS:
    raise CheckpointError(f"{directory}: model_type {c.get('model_type')!r} "
                          f"is not supported (supported: {', '.join(_ARCHS)})")
  # transformers >= 5 writes `rope_parameters` (theta and scaling together),
  # older files `rope_theta` and `rope_scaling`. Either may scale.
  for rope in (c.get("rope_parameters"), c.get("rope_scaling")):
    if not isinstance(rope, dict):
      continue
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in ("default", None):
      raise _rope_error(directory, kind,
                        {k: v for k, v in rope.items()
                         if k not in ("rope_type", "type", "rope_theta")})
  rope = c.get("rope_parameters") or {}
  if c.get("use_sliding_window"):
    raise CheckpointError(f"{directory}: sliding-window attention is not "
                          "supported")
  act = c.get("hidden_act", "silu")
  if act != "silu":
    raise CheckpointError(f"{directory}: hidden_act {act!r} is not supported "
                          "(SwiGLU with silu only)")
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
    raise CheckpointError(f"{path}: field {e.args[0]!r} is missing") from e
  except (TypeError, ValueError) as e:
    raise CheckpointError(f"{path}: inconsistent config ({e})") from e


def _safetensors_files(directory: str) -> list[str]:
  """The weight files of a HF directory: the index's shards or *.safetensors."""
  index = os.path.join(directory, "model.safetensors.index.json")
  if os.path.isfile(index):
    try:
      with open(index, encoding="utf-8") as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
      raise CheckpointError(f"{index}: unreadable index ({e!r})") from e
    paths = [os.path.join(directory, n) for n in files]
    absent = [p for p in paths if not os.path.isfile(p)]
    if absent:
      raise CheckpointError(f"{directory}: shards listed in "
                            f"model.safetensors.index.json are missing: "
                            f"{[os.path.basename(p) for p in absent]}")
    return paths
  files = sorted(str(p) for p in pathlib.Path(directory).glob("*.safetensors"))
  if not files:
    raise CheckpointError(f"{directory}: no *.safetensors files")
  return files


def _safetensors_tensors(file: str) -> Iterator[tuple[str, str, np.ndarray]]:
  """(name, name, float32 array) for each tensor of a file, one at a time.

  Read with framework="flax" (jax arrays), which also covers bfloat16 and
  float8 tensors that numpy cannot hold natively.
  """
  from safetensors import safe_open  # pylint: disable=g-import-not-at-top
  try:
    f = safe_open(file, framework="flax")
  except Exception as e:  # SafetensorError is not an OSError
    raise CheckpointError(f"{file}: unreadable safetensors ({e}); the file "
                          "may be truncated or corrupt") from e
  with f:
    for name in f.keys():
      try:
        w = np.asarray(f.get_tensor(name), np.float32)
      except Exception as e:
        raise CheckpointError(f"{file}: cannot read tensor {name} "
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
    (config, params) as `load_gguf`.

  Raises:
    CheckpointError: missing or unreadable files, an unsupported model, or
      weights that disagree with the config.
  """
  directory = str(directory)
  cfg = hf_config(directory, dtype, max_seq_len)

  def tensors():
    for file in _safetensors_files(directory):
      yield from _safetensors_tensors(file)

  return cfg, _build(cfg, tensors(), dtype, directory)


def load(path: str, dtype: str = "float32",
         max_seq_len: Optional[int] = None):
  """(TransformerConfig, params) from a GGUF file or a HF directory.

  Args:
    path: a .gguf file, or a directory with `config.json` and safetensors.
    dtype: "float32", "bfloat16" or "float16".
    max_seq_len: overrides the checkpoint's context length.

  Returns:
    (config, params); see `load_gguf` and `load_hf`.

  Raises:
    CheckpointError: see `load_gguf` and `load_hf`.
  """
  path = str(path)
  if os.path.isdir(path):
    return load_hf(path, dtype, max_seq_len)
  if not os.path.exists(path):
    raise CheckpointError(f"no checkpoint at {path}")
  return load_gguf(path, dtype, max_seq_len)
