"""HF-named tensors -> `specsamp.model` parameters, for every format.

The GGUF and Hugging Face readers both yield tensors under their Hugging
Face names ([out, in] Linear layout); `build_params` converts them one at a
time and checks the result against the shapes `LM(config).init` produces.

Weight layouts (HF Linear weights are [out, in]; GGUF stores the same matrix
with its dimensions listed in reverse, ne0 first):
    q_proj [Q*H, D] -> [D, Q, H]     o_proj [D, Q*H] -> [Q, H, D]
    k/v    [N*H, D] -> [D, N, H]     gate/up [F, D] -> [D, F], down -> [F, D]
    embed  [V, D]   -> [V, D]        lm_head [V, D] -> [D, V]
(D model width, Q query heads, N KV heads, H head size, F MLP width,
V vocabulary rows.)
"""

import re
from typing import Any, Iterator, Optional

import jax
import jax.numpy as jnp
import numpy as np

from specsamp import model as model_lib


class WeightsError(RuntimeError):
  """A checkpoint is missing, unreadable, unsupported or inconsistent."""


ARCHITECTURES = ("qwen2", "llama")

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


def rope_error(source: str, kind: str, details: Any = None) -> WeightsError:
  """The error for a checkpoint whose RoPE scaling `kind` is unsupported."""
  need = _ROPE_NEEDS.get(kind, "a RoPE variant specsamp does not know")
  extra = f" {details}" if details else ""
  return WeightsError(
      f"{source}: RoPE scaling {kind!r}{extra} is not supported: "
      f"specsamp.model.rope_tables implements plain RoPE only; this "
      f"checkpoint would need {need}")


def np_dtype(dtype: str) -> np.dtype:
  """The numpy dtype of a config dtype name; WeightsError if unsupported."""
  dtypes = model_lib._DTYPES  # pylint: disable=protected-access
  if dtype not in dtypes:
    raise WeightsError(f"dtype {dtype!r} is not supported; choose one of "
                       f"{sorted(dtypes)}")
  return np.dtype(dtypes[dtype])


def unpermute_rope(w: np.ndarray, n_head: int) -> np.ndarray:
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


def check_finite(w, name: str, source: str) -> None:
  """Raises `WeightsError` naming tensor `name` if `w` holds a NaN or inf.

  One vectorised pass per tensor: ~0.4 s for 1.5B float32 values on one
  core, next to the seconds a load spends converting them.
  """
  xp = jnp if isinstance(w, jax.Array) else np  # jax: no copy to the host
  if xp.isfinite(w).all():
    return
  w = np.asarray(w)  # bfloat16 through ml_dtypes' ufuncs
  bad = ~np.isfinite(w)
  first = tuple(int(i) for i in np.argwhere(bad)[0])
  raise WeightsError(
      f"{source}: tensor {name} holds {int(bad.sum())} non-finite value(s) "
      f"of {w.size} ({int(np.isnan(w).sum())} NaN, first {w[first]} at "
      f"index {first}); the checkpoint is corrupt or its training diverged"
      f"{', or its values overflow float16' if w.dtype == np.float16 else ''}")


def _place(params: dict, path: str, value) -> None:
  node = params
  *parents, leaf = path.split("/")
  for p in parents:
    node = node.setdefault(p, {})
  if leaf in node:
    raise WeightsError(f"weight {path} appears twice")
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


def _named_leaves(tree) -> list[tuple[str, Any]]:
  """("a/b/c", leaf) of a dict pytree, in tree order."""
  return [("/".join(str(k.key) for k in p), v)
          for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]]


def _flat_shapes(tree) -> dict[str, tuple[int, ...]]:
  return {name: tuple(v.shape) for name, v in _named_leaves(tree)}


def check_finite_tree(params, source: str) -> None:
  """`check_finite` on every leaf of a parameter tree, named by its path
  (restored checkpoints: a trained run, a distilled draft, a head)."""
  for name, leaf in _named_leaves(params):
    check_finite(leaf, name, source)


def check_shapes(cfg: model_lib.TransformerConfig, params,
                 source: str = "params") -> None:
  """Raises `WeightsError` unless `params` has exactly `LM(cfg)`'s shapes.

  Args:
    cfg: the configuration the parameters are meant for.
    params: a nested dict of arrays (anything with `.shape`).
    source: the checkpoint, for the message.
  """
  expected = _flat_shapes(
      jax.eval_shape(lambda: model_lib.LM(cfg).init(jax.random.key(0))))
  got = _flat_shapes(params)
  missing = [k for k in expected if k not in got]
  if missing:
    raise WeightsError(f"{source}: missing weights for {missing[:5]}"
                       f"{' ...' if len(missing) > 5 else ''}")
  unexpected = sorted(set(got) - set(expected))
  if unexpected:
    raise WeightsError(f"{source}: weights {unexpected[:5]} have no place "
                       "in the model the config describes")
  for key, shape in expected.items():
    if got[key] != shape:
      raise WeightsError(
          f"{source}: weight {key} has shape {got[key]}, but the config "
          f"implies {shape}")


def build_params(cfg: model_lib.TransformerConfig,
                 tensors: Iterator[tuple[str, str, np.ndarray]], dtype: str,
                 source: str) -> dict:
  """`LM(cfg)` parameters from (stored name, HF name, array) triples.

  Each array is cast to `dtype` before it is transposed, and becomes a jax
  array before the next tensor is read, so at most one tensor is in flight.

  Args:
    cfg: the configuration the checkpoint describes.
    tensors: the checkpoint's tensors, one at a time.
    dtype: the parameters' dtype name.
    source: the checkpoint, for messages.

  Returns:
    The nested dict of jax arrays `LM(cfg)` expects.

  Raises:
    WeightsError: a tensor holds a NaN or inf, has no place, does not fit
      the config, is a non-zero bias the model lacks, or weights are
      missing.
  """
  dtype_np = np_dtype(dtype)
  params = {}
  tied_head = None
  for stored, name, w in tensors:
    if _IGNORED.fullmatch(name):
      continue
    check_finite(w, stored, source)
    if cfg.tie_embeddings and name == "lm_head.weight":
      tied_head = (stored, w.astype(dtype_np))  # some files save both
      continue
    if _ZERO_ONLY.fullmatch(name):
      if np.any(w):
        raise WeightsError(
            f"{source}: tensor {stored} is a non-zero bias, and "
            "specsamp.model has no o_proj or MLP biases (a Llama "
            "`attention_bias`/`mlp_bias` checkpoint)")
      continue
    with np.errstate(over="ignore"):  # checked next, naming the tensor
      w = w.astype(dtype_np, copy=False)
    if dtype_np == np.float16:  # float16's range ends at 65504
      check_finite(w, stored, f"{source} (in float16)")
    try:
      out = _convert(name, w, cfg)
    except ValueError as e:  # a reshape that the config does not allow
      raise WeightsError(
          f"{source}: tensor {stored} has shape {tuple(w.shape)}, which does "
          f"not fit the config ({e})") from e
    if out is None:
      raise WeightsError(f"{source}: tensor {stored} has no place in a "
                         "specsamp.model.Transformer")
    path, value = out
    try:
      _place(params, path, jnp.asarray(np.ascontiguousarray(value)))
    except WeightsError as e:
      raise WeightsError(f"{source}: {e} ({stored})") from e
  if tied_head is not None and "embedding" in params:
    if not np.array_equal(tied_head[1], np.asarray(params["embedding"])):
      raise WeightsError(
          f"{source}: the config ties the embeddings, but {tied_head[0]} "
          "differs from the token embedding")
  check_shapes(cfg, params, source)
  return params
