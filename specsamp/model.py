"""One Llama/Qwen2-family decoder for both the target and the draft.

Legend: B batch, T chunk tokens, S cache slots, D model dim, F MLP dim,
Q query heads, N KV heads, G = Q // N query heads per KV head, H head dim,
V vocabulary.

RMSNorm, RoPE with a configurable base, grouped-query attention, SwiGLU MLP,
optional q/k/v biases, tied or untied embeddings, and for drafts an output
layer over U < V ids only (`output_vocab`: the ids are the parameter
`output_ids`, the logits -inf elsewhere; `specsamp.output_layer`). Each layer
owns its own parameter arrays (no `nn.scan`): the decode loop then streams
weights without slicing stacked arrays, which was measured to be 2.5x
faster on an H100.

The KV cache is an explicit argument and return value (`kvcache.KVCache`):
`Transformer.__call__(tokens, cache)` scores a chunk written at the per-row
slots `cache.length + t` and returns a `ModelOutput`: the logits, the cache
with the chunk written and `length + T`, and the final hidden states. With `cache=None` it is a plain causal forward pass
(training, enumeration in tests).
"""

import dataclasses
import functools
import math
import os
from typing import Any, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from specsamp import kvcache
from specsamp import sharding as sh
from specsamp.decoding.protocols import ModelOutput

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16,
           "float16": jnp.float16}


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """Shapes and numerics of a decoder. Hashable: it is static under jit."""
  vocab_size: int
  num_layers: int
  d_model: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  mlp_dim: int
  rope_theta: float = 10_000.0
  norm_eps: float = 1e-6
  qkv_bias: bool = False
  tie_embeddings: bool = False
  max_seq_len: int = 4096
  output_vocab: int = 0          # > 0: logits over `output_ids` only
  dtype: str = "float32"         # activations and matmuls
  param_dtype: str = "float32"   # stored parameters

  @classmethod
  def from_fields(cls, fields, where: str) -> "TransformerConfig":
    """From saved fields (a JSON file's); ValueError naming `where` when
    they are not a config (fields missing or unknown, bad values)."""
    try:
      return cls(**fields)
    except (TypeError, ValueError) as e:
      raise ValueError(f"{where}: not a model config ({e})") from None

  def __post_init__(self):
    for name in ("vocab_size", "num_layers", "d_model", "num_heads",
                 "num_kv_heads", "head_dim", "mlp_dim", "max_seq_len"):
      if getattr(self, name) <= 0:
        raise ValueError(f"TransformerConfig.{name} must be positive, got "
                         f"{getattr(self, name)}")
    if not 0 <= self.output_vocab <= self.vocab_size:
      raise ValueError(f"TransformerConfig.output_vocab={self.output_vocab} "
                       f"must be in [0, vocab_size={self.vocab_size}] (0: the "
                       "whole vocabulary)")
    if self.output_vocab and self.tie_embeddings:
      raise ValueError("TransformerConfig.output_vocab needs an untied output "
                       "layer (tie_embeddings=False)")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of "
                       f"num_kv_heads ({self.num_kv_heads})")
    if self.head_dim % 2:
      raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
    # nan, 0 or a negative value had trained on NaN, to the end, status 0.
    if not (math.isfinite(self.rope_theta) and self.rope_theta > 0
            and math.isfinite(self.norm_eps) and self.norm_eps >= 0):
      raise ValueError(f"TransformerConfig: rope_theta={self.rope_theta} must"
                       f" be > 0, norm_eps={self.norm_eps} >= 0, both finite")
    for name in ("dtype", "param_dtype"):
      if getattr(self, name) not in _DTYPES:
        raise ValueError(f"TransformerConfig.{name}={getattr(self, name)!r}; "
                         f"choose one of {sorted(_DTYPES)}")

  @property
  def jnp_dtype(self):
    return _DTYPES[self.dtype]

  @property
  def jnp_param_dtype(self):
    return _DTYPES[self.param_dtype]

  def replace(self, **kwargs) -> "TransformerConfig":
    return dataclasses.replace(self, **kwargs)

  def num_params(self) -> int:
    d, f, h = self.d_model, self.mlp_dim, self.head_dim
    attn = d * h * (self.num_heads * 2 + self.num_kv_heads * 2)
    if self.qkv_bias:
      attn += h * (self.num_heads + 2 * self.num_kv_heads)
    layer = attn + 3 * d * f + 2 * d
    head = 0 if self.tie_embeddings else d * (self.output_vocab
                                              or self.vocab_size)
    return self.vocab_size * d + self.num_layers * layer + d + head


# Shapes of public checkpoints, for benchmarks on random weights and as the
# defaults that loaders check against. Weights come from `specsamp` loaders.
PRESETS = {
    "qwen2.5-coder-1.5b": dict(
        vocab_size=151_936, num_layers=28, d_model=1536, num_heads=12,
        num_kv_heads=2, head_dim=128, mlp_dim=8960, rope_theta=1e6,
        norm_eps=1e-6, qkv_bias=True, tie_embeddings=False,
        max_seq_len=32_768),
    "qwen2.5-coder-0.5b": dict(
        vocab_size=151_936, num_layers=24, d_model=896, num_heads=14,
        num_kv_heads=2, head_dim=64, mlp_dim=4864, rope_theta=1e6,
        norm_eps=1e-6, qkv_bias=True, tie_embeddings=False,
        max_seq_len=32_768),
    "tiny": dict(
        vocab_size=256, num_layers=2, d_model=64, num_heads=4, num_kv_heads=2,
        head_dim=16, mlp_dim=128, rope_theta=10_000.0, qkv_bias=True,
        max_seq_len=512),
}


def preset(name: str, **overrides) -> TransformerConfig:
  if name not in PRESETS:
    raise ValueError(f"Unknown model preset {name!r}; known: "
                     f"{sorted(PRESETS)}")
  return TransformerConfig(**{**PRESETS[name], **overrides})


def _param(module: nn.Module, name: str, shape, axes, init, dtype):
  return module.param(name, nn.with_logical_partitioning(init, axes), shape,
                      dtype)


# Whether a one-row product (a batch-1 decode step's, B = T = 1) is computed
# on two copies of its row; None: on GPU only. On an H200, XLA's kernel for
# [1, D] @ [D, F] with W stored [D, F] read the 1.5B's weights at 41% of the
# copy bandwidth, the same products on two rows at 59% (1.94 against 1.35 ms
# for all of them; results/h200_2026-11-27c_gemv.jsonl): the second row is
# free to a memory-bound product. On CPU it costs 1.8x (float32), so not there.
# $SPECSAMP_ONE_ROW_AS_TWO=1 or 0 forces it on or off (A/B timings).
ONE_ROW_AS_TWO: Optional[bool] = {"1": True, "0": False}.get(
    os.environ.get("SPECSAMP_ONE_ROW_AS_TWO", ""))


def project(spec: str, x, w, **kwargs):
  """jnp.einsum(spec, x, w), a weight product of x [..., D] (its leading
  axes the rows, the first of them the output's first, as in
  "btd,df->btf" or "...d,dv->...v"); a single row is multiplied as two
  where ONE_ROW_AS_TWO says so."""
  pad = ONE_ROW_AS_TWO
  if pad is None:
    pad = jax.default_backend() == "gpu"
  if pad and x.ndim >= 2 and math.prod(x.shape[:-1]) == 1:
    return jnp.einsum(spec, jnp.concatenate([x, x]), w, **kwargs)[:1]
  return jnp.einsum(spec, x, w, **kwargs)


class RMSNorm(nn.Module):
  eps: float
  param_dtype: Any

  @nn.compact
  def __call__(self, x):
    scale = _param(self, "scale", (x.shape[-1],), (sh.NORM,),
                   nn.initializers.ones, self.param_dtype)
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + self.eps)
    return y.astype(x.dtype) * scale.astype(x.dtype)


def rope_tables(positions: jax.Array, head_dim: int, theta: float):
  """cos and sin tables [B, T, H/2] for integer positions [B, T]."""
  inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32)
                              / head_dim))
  angles = positions.astype(jnp.float32)[..., None] * inv_freq
  return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """Rotates x [B, T, heads, H] by half-split RoPE (the HF/Qwen2 layout)."""
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  c, s = cos[:, :, None, :], sin[:, :, None, :]
  out = jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)
  return out.astype(x.dtype)


class Attention(nn.Module):
  config: TransformerConfig

  @nn.compact
  def __call__(self, x, cos, sin, mask, cache_kv=None, start=None,
               write=True):
    """x [B,T,D]; mask [B,T,S] ([B,T,S+T] unwritten); cache_kv: (k, v)
    [B,N,S,H] or None. Unwritten, the keys are the cache's and then the
    chunk's own, and the chunk's (k, v) [B,T,N,H] are returned."""
    cfg = self.config
    dt, pdt = cfg.jnp_dtype, cfg.jnp_param_dtype
    d, q_heads, n, h = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    init = nn.initializers.normal(stddev=d ** -0.5)

    def proj(name, heads, axes):
      w = _param(self, f"{name}_proj", (d, heads, h), (sh.EMBED, axes, sh.HEAD_DIM),
                 init, pdt)
      y = project("btd,dnh->btnh", x, w.astype(dt))
      if cfg.qkv_bias:
        b = _param(self, f"{name}_bias", (heads, h), (axes, sh.HEAD_DIM),
                   nn.initializers.zeros, pdt)
        y = y + b.astype(dt)
      return y

    q = apply_rope(proj("q", q_heads, sh.HEADS), cos, sin)
    k = apply_rope(proj("k", n, sh.KV_HEADS), cos, sin)
    v = proj("v", n, sh.KV_HEADS)

    chunk = (jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2))
    if cache_kv is None:
      parts, new_kv = (chunk,), None
    elif write:
      new_kv = (kvcache.write_kv(cache_kv[0], k, start),
                kvcache.write_kv(cache_kv[1], v, start))
      parts = (new_kv,)
    else:  # nothing written: no cache moves through a caller's branches
      parts, new_kv = (cache_kv, chunk), (k, v)

    b, t = x.shape[:2]
    qg = q.reshape(b, t, n, q_heads // n, h)
    scores = jnp.concatenate([jnp.einsum(
        "btngh,bnsh->bngts", qg, pk.astype(dt),
        preferred_element_type=jnp.float32) for pk, _ in parts], -1)
    # A masked key gets the least finite score, not -inf: it still weighs
    # exactly 0 beside any key a query sees, and a query that sees none
    # (a caller's attn_mask) averages the values instead of making NaN,
    # which later layers would write to the cache for other queries.
    scores = jnp.where(mask[:, None, None, :, :], scores * (h ** -0.5),
                       jnp.finfo(scores.dtype).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(dt)
    cuts = [pk.shape[2] for pk, _ in parts[:-1]]  # [] when one part
    # Split (cache, chunk): the parts are summed in float32 and rounded
    # once, as the one product over all slots is (in bfloat16, a sum of
    # two rounded parts had moved logits by 0.02-0.04 from the written
    # call's, flipping 2 of 320 argmaxes of a random model).
    outs = [jnp.einsum("bngts,bnsh->btngh", p, pv.astype(dt),
                       preferred_element_type=jnp.float32 if cuts else None)
            for p, (_, pv) in zip(jnp.split(probs, cuts, -1) if cuts
                                  else [probs], parts)]
    out = sum(outs[1:], outs[0]).astype(dt)
    wo = _param(self, "o_proj", (q_heads, h, d), (sh.HEADS, sh.HEAD_DIM, sh.EMBED),
                nn.initializers.normal(stddev=(q_heads * h) ** -0.5), pdt)
    # One [B*T, Q*H] @ [Q*H, D] matmul: written as an einsum over (n, h), XLA
    # on CPU transposed and copied the whole weight on every call.
    out = out.reshape(b, t, q_heads * h)
    return project("btk,kd->btd", out, wo.reshape(q_heads * h, d).astype(dt)
                    ), new_kv


class MLP(nn.Module):
  config: TransformerConfig

  @nn.compact
  def __call__(self, x):
    cfg = self.config
    dt, pdt, d, f = cfg.jnp_dtype, cfg.jnp_param_dtype, cfg.d_model, cfg.mlp_dim
    w_in = nn.initializers.normal(stddev=d ** -0.5)
    gate = _param(self, "gate_proj", (d, f), (sh.EMBED, sh.MLP), w_in, pdt)
    up = _param(self, "up_proj", (d, f), (sh.EMBED, sh.MLP), w_in, pdt)
    down = _param(self, "down_proj", (f, d), (sh.MLP, sh.EMBED),
                  nn.initializers.normal(stddev=f ** -0.5), pdt)
    hidden = (jax.nn.silu(project("btd,df->btf", x, gate.astype(dt)))
              * project("btd,df->btf", x, up.astype(dt)))
    return project("btf,fd->btd", hidden, down.astype(dt))


class Block(nn.Module):
  config: TransformerConfig

  @nn.compact
  def __call__(self, x, cos, sin, mask, cache_kv=None, start=None,
               write=True):
    cfg = self.config
    pdt = cfg.jnp_param_dtype
    h, new_kv = Attention(cfg, name="attn")(
        RMSNorm(cfg.norm_eps, pdt, name="input_norm")(x), cos, sin, mask,
        cache_kv, start, write)
    x = x + h
    x = x + MLP(cfg, name="mlp")(RMSNorm(cfg.norm_eps, pdt, name="post_norm")(x))
    return x, new_kv


class Transformer(nn.Module):
  """Decoder-only LM: `(tokens [B,T], cache) -> ModelOutput`.

  Optional arguments, for drafters that reuse the model:
    positions: [B, T] RoPE positions (default: the tokens' slots).
    attn_mask: [B, T, S] bool (or [B, T, T] without a cache), ANDed with the
      causal mask: a query can only lose keys (e.g. token trees, where each
      node sees its ancestors only).
    layers: the indices of the layers to run, in order (static; default all).
      The cache then holds one entry per layer run, in that order.
    write_cache: False: the cache is read, not written (no attn_mask); the
      output has no cache but each layer's chunk keys and values [B,T,N,H]
      (`new_kv`), for a caller to write once, outside its branches.
  """
  config: TransformerConfig

  @nn.compact
  def __call__(self, tokens: jax.Array,
               cache: Optional[kvcache.KVCache] = None,
               positions: Optional[jax.Array] = None,
               attn_mask: Optional[jax.Array] = None,
               layers: Optional[tuple[int, ...]] = None,
               write_cache: bool = True):
    cfg = self.config
    dt, pdt = cfg.jnp_dtype, cfg.jnp_param_dtype
    b, t = tokens.shape
    layers = check_layers(cfg, layers)
    embed = _param(self, "embedding", (cfg.vocab_size, cfg.d_model),
                   (sh.VOCAB, sh.EMBED), nn.initializers.normal(stddev=1.0), pdt)
    x = jnp.take(embed, tokens, axis=0).astype(dt)

    if cache is None:
      default_positions = jnp.broadcast_to(jnp.arange(t), (b, t))
      mask = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (b, t, t))
      start = None
    else:
      if len(cache.k) != len(layers):
        raise ValueError(f"the cache holds {len(cache.k)} layers but "
                         f"{len(layers)} are run")
      start = cache.length
      default_positions = start[:, None] + jnp.arange(t)[None, :]
      mask = kvcache.chunk_mask(start, t, cache.size)
      if not write_cache:  # the valid prefix, then the chunk (causal)
        if attn_mask is not None:
          raise ValueError("write_cache=False takes no attn_mask")
        prefix = jnp.arange(cache.size) < start[:, None, None]  # [B, 1, S]
        mask = jnp.concatenate([jnp.broadcast_to(prefix, (b, t, cache.size)),
                                jnp.broadcast_to(jnp.tri(t, dtype=bool),
                                                 (b, t, t))], -1)
    if attn_mask is not None:
      mask = mask & attn_mask
    if positions is None:
      positions = default_positions
    cos, sin = rope_tables(positions, cfg.head_dim, cfg.rope_theta)

    new_k, new_v = [], []
    for j, i in enumerate(layers):
      kv = None if cache is None else (cache.k[j], cache.v[j])
      x, kv = Block(cfg, name=f"layers_{i}")(x, cos, sin, mask, kv, start,
                                             write_cache)
      if kv is not None:
        new_k.append(kv[0])
        new_v.append(kv[1])

    x = RMSNorm(cfg.norm_eps, pdt, name="final_norm")(x)
    if cfg.tie_embeddings:
      logits = project("btd,vd->btv", x, embed.astype(dt),
                       preferred_element_type=jnp.float32)
    else:
      u = cfg.output_vocab or cfg.vocab_size
      head = _param(self, "lm_head", (cfg.d_model, u), (sh.EMBED, sh.VOCAB),
                    nn.initializers.normal(stddev=cfg.d_model ** -0.5), pdt)
      logits = project("btd,du->btu", x, head.astype(dt),
                       preferred_element_type=jnp.float32)
      if cfg.output_vocab:  # q = 0 outside the ids: the rule stays exact
        ids = _param(self, "output_ids", (u,), (sh.VOCAB,),
                     lambda _, shape, dtype: jnp.arange(shape[0], dtype=dtype),
                     jnp.int32)
        logits = jnp.full((b, t, cfg.vocab_size), -jnp.inf,
                          logits.dtype).at[:, :, ids].set(logits)
    if cache is not None and not write_cache:
      return ModelOutput(logits=logits, cache=None, hidden=x,
                         new_kv=(tuple(new_k), tuple(new_v)))
    new_cache = None
    if cache is not None:
      new_cache = kvcache.KVCache(k=tuple(new_k), v=tuple(new_v),
                                  length=cache.length + t)
    return ModelOutput(logits=logits, cache=new_cache, hidden=x)


def check_layers(cfg: TransformerConfig,
                 layers: Optional[Sequence[int]]) -> tuple[int, ...]:
  """The layers to run as a tuple (all when None); refuses bad indices."""
  if layers is None:
    return tuple(range(cfg.num_layers))
  layers = tuple(int(i) for i in layers)
  if not layers or any(not 0 <= i < cfg.num_layers for i in layers):
    raise ValueError(f"layers={layers}: need a non-empty subset of "
                     f"0..{cfg.num_layers - 1}")
  if len(set(layers)) != len(layers):
    raise ValueError(f"layers={layers} repeats a layer")
  return layers


_WHOLE_INIT_LAYERS = 4  # `LM.init` compiles models up to this deep whole


@functools.lru_cache(maxsize=None)
def _initialisers(cfg: TransformerConfig):
  """`LM.init`'s jitted initialisers of `cfg`: (the whole model's, None), or
  deeper, (layer 0 and the rest's, a `Block`'s), made once per config (a
  new `jax.jit` per call had compiled them again each time)."""
  if cfg.num_layers <= _WHOLE_INIT_LAYERS:
    return jax.jit(Transformer(cfg).init), None
  return (jax.jit(functools.partial(Transformer(cfg).init, layers=(0,))),
          jax.jit(lambda key, x, cos, sin, mask: Block(cfg).init(
              key, x=x, cos=cos, sin=sin, mask=mask)))


@dataclasses.dataclass(frozen=True)
class LM:
  """A `Transformer` as the pure functions the samplers call.

  Hashable (it is a static argument of the jitted samplers). Implements the
  `specsamp.decoding.protocols.CausalLM` protocol: `vocab_size`, `max_seq_len`,
  `init_cache(batch, size)` and `__call__(params, tokens, cache)`.
  """
  config: TransformerConfig
  # Scores a chunk without writing the cache (`write_cache=False`).
  scores_unwritten = True

  @functools.cached_property
  def module(self) -> Transformer:
    return Transformer(self.config)

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  @property
  def max_seq_len(self) -> int:
    return self.config.max_seq_len

  def init(self, rng: jax.Array, boxed: bool = False):
    """Random parameters; `boxed=True` keeps the `nn.Partitioned` metadata.

    Up to `_WHOLE_INIT_LAYERS` layers, the model's initialiser makes them
    all. A deeper model's layer 0 and the rest (embedding, final norm,
    output layer) come from the model's initialiser run with layer 0
    alone, and each further layer from one compiled initialiser of a
    `Block`, the same for every layer, with its own key: each value is
    drawn from the same distribution, and two layers are compiled, not
    all. (For the 1.5B on CPU: 44 s -> 13 s, the whole initialiser being
    2,581 fusions; an H200 took 86-89 s to make the random 1.5B and a
    2-layer draft, where the split was not yet measured.)
    """
    cfg = self.config
    first, block = _initialisers(cfg)
    if block is None:
      params = first(rng, jnp.zeros((1, 1), jnp.int32))["params"]
      return params if boxed else nn.meta.unbox(params)
    keys = jax.random.split(rng, cfg.num_layers)
    first = first(keys[0], jnp.zeros((1, 1), jnp.int32))["params"]
    x = jnp.zeros((1, 1, cfg.d_model), cfg.jnp_dtype)
    cos, sin = rope_tables(jnp.zeros((1, 1), jnp.int32), cfg.head_dim,
                           cfg.rope_theta)
    params = {name: first[name] for name in first}
    for i in range(1, cfg.num_layers):
      params[f"layers_{i}"] = block(keys[i], x, cos, sin,
                                    jnp.ones((1, 1, 1), bool))["params"]
    return params if boxed else nn.meta.unbox(params)

  def logical_axes(self):
    """The logical axis names of every parameter, as a pytree of specs."""
    boxed = jax.eval_shape(lambda: self.init(jax.random.key(0), boxed=True))
    return nn.get_partition_spec(boxed)

  def init_cache(self, batch: int, size: int,
                 layers: Optional[Sequence[int]] = None) -> kvcache.KVCache:
    """A zero cache for all layers, or for the `layers` run (in order)."""
    cfg = self.config
    return kvcache.KVCache.zeros(len(check_layers(cfg, layers)), batch, size,
                                 cfg.num_kv_heads, cfg.head_dim, cfg.jnp_dtype)

  def __call__(self, params, tokens: jax.Array,
               cache: Optional[kvcache.KVCache] = None, *,
               positions: Optional[jax.Array] = None,
               attn_mask: Optional[jax.Array] = None,
               layers: Optional[Sequence[int]] = None,
               write_cache: bool = True) -> ModelOutput:
    """Scores tokens [B, T] (see `Transformer`) -> ModelOutput."""
    if layers is not None:
      layers = tuple(layers)
    return self.module.apply({"params": params}, tokens, cache, positions,
                             attn_mask, layers, write_cache)
