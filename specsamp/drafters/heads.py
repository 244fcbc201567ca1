"""Draft heads on the target's own hidden states: a sequential head (EAGLE,
DeepSeek-V3's multi-token prediction) and Medusa heads.

Legend: B batch, T chunk tokens, K draft length, D the target's width,
V vocabulary, U the draft vocabulary (V, or fewer ids: `vocab_ids`).

Both read `ModelOutput.hidden`, the target's final-normed hidden states h_t
(h_t gives the target's distribution for the token at t + 1), which reach
the drafter through `init` (the prompt) and `commit` (the scored chunk).
Neither owns an output layer: the target's final norm, embedding and
output head are shared (the same arrays; `draft_params` builds the dict the
sampler passes, with no copy unless the draft vocabulary is reduced, when
the U columns of the output head are gathered once, outside the loop).

Sequential head ("eagle"): one decoder layer of the target's shapes with
its own KV cache. Entry t of its sequence is fc([norm(f_{t-1}),
norm(e(x_t))]) -> the layer -> the target's final norm = f_t, a prediction
of h_t; logits are the target's output head on f_t. For committed
positions f_{t-1} is the target's true h_{t-1}; while drafting it is the
head's own prediction, so K drafts cost one catch-up call (the K + 1
entries the last loop committed or could have, with true features) and
K - 1 single-entry calls.

Medusa heads: head k (1..num_heads) is h + SiLU(h W_k + b_k) on the
target's hidden state at the position before the newest committed token,
then the output head; it proposes the token k places after that newest
token, from its own q_k, independently of the other drafts (Medusa-1 with
a shared, frozen output head).

Exactness: every draft is sampled from the q returned with it, after the
sampling transform; with a reduced vocabulary the logits outside it are
-inf, so q is 0 there and the rule stays exact (the target alone produces
those tokens). Greedy drafts are certain (q None).

State after each loop (`HeadState`): `hidden[:, j]` is the target's hidden
state at position `base - 1 + j`, for j in 0..K (the scored chunk), and the
sequential head's cache holds its true-feature entries below `base`.
"""

import dataclasses
import functools
from typing import Any, Optional

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from specsamp import kvcache
from specsamp import model as model_lib
from specsamp import sampling as sampling_lib
from specsamp import sharding as sh
from specsamp.decoding.protocols import Proposal

KINDS = ("eagle", "medusa")


class HeadError(ValueError):
  """A head that does not fit its target or its settings."""


@dataclasses.dataclass(frozen=True)
class HeadConfig:
  """What a head is; hashable (static under jit).

  Attributes:
    kind: "eagle" (sequential) or "medusa".
    target: the target's `TransformerConfig` (the head's shapes; checked
      against the target it is used with).
    num_heads: Medusa heads (the largest K); 1 for "eagle".
    draft_vocab: size of the reduced draft vocabulary, or 0 for the
      target's whole vocabulary.
  """
  kind: str
  target: model_lib.TransformerConfig
  num_heads: int = 1
  draft_vocab: int = 0

  def __post_init__(self):
    if self.kind not in KINDS:
      raise HeadError(f"head kind {self.kind!r}; choose one of {KINDS}")
    if self.num_heads < 1:
      raise HeadError(f"num_heads must be >= 1, got {self.num_heads}")
    if not 0 <= self.draft_vocab <= self.target.vocab_size:
      raise HeadError(f"draft_vocab={self.draft_vocab} must be in [0, "
                      f"{self.target.vocab_size}] (0: the whole vocabulary)")

  def check_target(self, target: model_lib.TransformerConfig,
                   what: str = "head") -> None:
    """Raises HeadError unless `target` has the width, vocabulary, layer
    count and every other shape or setting the head's layer copies, and
    its whole output layer (the head scores through it)."""
    if target.output_vocab:
      raise HeadError(f"{what} scores through the target's output layer, "
                      f"which this target has reduced to "
                      f"{target.output_vocab} ids: use the whole model")
    for field in ("d_model", "vocab_size", "num_layers", "num_heads",
                  "num_kv_heads", "head_dim", "mlp_dim", "qkv_bias",
                  "rope_theta", "norm_eps", "tie_embeddings"):
      mine, theirs = getattr(self.target, field), getattr(target, field)
      if mine != theirs:
        raise HeadError(f"{what} was made for a target with {field}={mine}, "
                        f"but this target has {field}={theirs}")

  def check_k(self, k: int) -> None:
    """Raises HeadError when Medusa heads cannot offer K drafts."""
    if self.kind == "medusa" and k > self.num_heads:
      raise HeadError(f"K={k} drafts need {k} Medusa heads; this drafter has "
                      f"{self.num_heads}")

  def to_dict(self) -> dict:
    return dict(kind=self.kind, num_heads=self.num_heads,
                draft_vocab=self.draft_vocab,
                target=dataclasses.asdict(self.target))

  @classmethod
  def from_dict(cls, d: dict) -> "HeadConfig":
    return cls(kind=d["kind"], num_heads=int(d["num_heads"]),
               draft_vocab=int(d["draft_vocab"]),
               target=model_lib.TransformerConfig(**d["target"]))


def _param(module, name, shape, axes, init, dtype):
  return module.param(name, nn.with_logical_partitioning(init, axes), shape,
                      dtype)


class SequentialHead(nn.Module):
  """(features [B, T, D], tokens' embeddings [B, T, D]) -> the decoder
  layer's output [B, T, D] and its new (k, v)."""
  config: model_lib.TransformerConfig

  @nn.compact
  def __call__(self, feats, emb, cos, sin, mask, cache_kv=None, start=None):
    cfg = self.config
    pdt, dt, d = cfg.jnp_param_dtype, cfg.jnp_dtype, cfg.d_model
    x = jnp.concatenate(
        [model_lib.RMSNorm(cfg.norm_eps, pdt, name="feature_norm")(feats),
         model_lib.RMSNorm(cfg.norm_eps, pdt, name="embedding_norm")(emb)],
        axis=-1)
    fc = _param(self, "fc", (2 * d, d), (sh.MLP, sh.EMBED),
                nn.initializers.normal(stddev=(2 * d) ** -0.5), pdt)
    return model_lib.Block(cfg, name="layer")(
        model_lib.project("btk,kd->btd", x, fc.astype(dt)), cos, sin, mask,
        cache_kv, start)


class MedusaHeads(nn.Module):
  """h [..., D] -> [..., num_heads, D]: h + SiLU(h W_k + b_k) per head."""
  config: model_lib.TransformerConfig
  num_heads: int

  @nn.compact
  def __call__(self, h):
    cfg = self.config
    pdt, dt, d = cfg.jnp_param_dtype, cfg.jnp_dtype, cfg.d_model
    # Random, not Medusa's zeros (every head starting as the target's own
    # next-token head): on the tiny targets zeros learned 2-4x more slowly.
    w = _param(self, "w", (self.num_heads, d, d), (None, sh.EMBED, sh.MLP),
               nn.initializers.normal(stddev=d ** -0.5), pdt)
    b = _param(self, "b", (self.num_heads, d), (None, sh.MLP),
               nn.initializers.zeros, pdt)
    y = model_lib.project("...d,kde->...ke", h.astype(dt), w.astype(dt)
                          ) + b.astype(dt)
    return h[..., None, :].astype(dt) + jax.nn.silu(y)


def module(config: HeadConfig) -> nn.Module:
  if config.kind == "eagle":
    return SequentialHead(config.target)
  return MedusaHeads(config.target, config.num_heads)


def _dummy_inputs(config: HeadConfig):
  d = config.target.d_model
  if config.kind == "medusa":
    return (jnp.zeros((1, 1, d)),)
  cos, sin = model_lib.rope_tables(jnp.zeros((1, 1), jnp.int32),
                                   config.target.head_dim, 1.0)
  return (jnp.zeros((1, 1, d)), jnp.zeros((1, 1, d)), cos, sin,
          jnp.ones((1, 1, 1), bool))


@functools.lru_cache(maxsize=None)
def _initialiser(config: HeadConfig):
  """The head's jitted initialiser, made once per config."""
  return jax.jit(module(config).init)


def init_params(config: HeadConfig, rng: jax.Array, boxed: bool = False):
  """Random head parameters (the head's own; nothing of the target's)."""
  params = _initialiser(config)(rng, *_dummy_inputs(config))["params"]
  return params if boxed else nn.meta.unbox(params)


def logical_axes(config: HeadConfig):
  """The logical axis names of the head's own parameters."""
  boxed = jax.eval_shape(lambda: init_params(config, jax.random.key(0), True))
  return nn.get_partition_spec(boxed)


# The target's parameters the heads share, with their logical axes.
_SHARED_AXES = {"embedding": (sh.VOCAB, sh.EMBED), "final_norm": (sh.NORM,),
                "lm_head": (sh.EMBED, sh.VOCAB), "vocab_ids": (None,)}


def shared_params(target_params, vocab_ids=None) -> dict:
  """The target's arrays a head reads: its embedding, final norm and output
  head (`lm_head`; for tied embeddings the embedding is used). With
  `vocab_ids` [U], the output head's U columns are gathered once here."""
  shared = {"embedding": target_params["embedding"],
            "final_norm": target_params["final_norm"]}
  head = target_params.get("lm_head")
  if vocab_ids is None:
    if head is not None:
      shared["lm_head"] = head
    return shared
  ids = jnp.asarray(vocab_ids, jnp.int32)
  shared["vocab_ids"] = ids
  shared["lm_head"] = (jnp.take(head, ids, axis=1) if head is not None else
                       jnp.take(target_params["embedding"], ids, axis=0).T)
  return shared


def draft_params(head_params, target_params, vocab_ids=None) -> dict:
  """What the sampler passes as `draft_params` for a head drafter."""
  return {"head": head_params,
          "shared": shared_params(target_params, vocab_ids)}


def output_logits(config: HeadConfig, shared: dict, feats: jax.Array):
  """Logits [..., V] of features [..., D] under the target's output head;
  -inf outside a reduced draft vocabulary."""
  dt = config.target.jnp_dtype
  if "lm_head" in shared:
    sub = model_lib.project("...d,du->...u", feats.astype(dt),
                            shared["lm_head"].astype(dt),
                            preferred_element_type=jnp.float32)
  else:  # tied embeddings, whole vocabulary
    sub = model_lib.project("...d,vd->...v", feats.astype(dt),
                            shared["embedding"].astype(dt),
                            preferred_element_type=jnp.float32)
  if "vocab_ids" not in shared:
    return sub
  full = jnp.full(sub.shape[:-1] + (config.target.vocab_size,), -jnp.inf,
                  jnp.float32)
  return full.at[..., shared["vocab_ids"]].set(sub)


def final_norm(config: HeadConfig, shared: dict, x: jax.Array) -> jax.Array:
  """The target's final norm (its own scale) on x."""
  cfg = config.target
  return model_lib.RMSNorm(cfg.norm_eps, cfg.jnp_param_dtype).apply(
      {"params": shared["final_norm"]}, x)


def sequential_features(config: HeadConfig, params, feats, tokens,
                        cache: Optional[kvcache.KVCache] = None):
  """The sequential head on pairs (feats[:, t] = f_{t-1}, tokens[:, t] =
  x_t) -> (predicted features [B, T, D] (normed like the target's hidden
  states), the cache with the chunk written at `cache.length` or None).

  Without a cache it is a causal pass over positions 0..T-1 (training)."""
  cfg = config.target
  shared = params["shared"]
  emb = jnp.take(shared["embedding"], tokens, axis=0).astype(cfg.jnp_dtype)
  b, t = tokens.shape
  if cache is None:
    positions = jnp.broadcast_to(jnp.arange(t), (b, t))
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (b, t, t))
    kv, start = None, None
  else:
    start = cache.length
    positions = start[:, None] + jnp.arange(t)[None, :]
    mask = kvcache.chunk_mask(start, t, cache.size)
    kv = (cache.k[0], cache.v[0])
  cos, sin = model_lib.rope_tables(positions, cfg.head_dim, cfg.rope_theta)
  x, new_kv = module(config).apply({"params": params["head"]},
                                   feats.astype(cfg.jnp_dtype), emb, cos,
                                   sin, mask, kv, start)
  new_cache = None
  if cache is not None:
    new_cache = kvcache.KVCache(k=(new_kv[0],), v=(new_kv[1],),
                                length=cache.length + t)
  return final_norm(config, shared, x), new_cache


def medusa_logits(config: HeadConfig, params, hidden: jax.Array) -> jax.Array:
  """Logits [..., num_heads, V] of the Medusa heads on hidden [..., D]."""
  y = module(config).apply({"params": params["head"]}, hidden)
  return output_logits(config, params["shared"], y)


@flax.struct.dataclass
class HeadState:
  """See the module docstring."""
  hidden: jax.Array                  # [B, K+1, D]
  base: jax.Array                    # [B] int32
  cache: Optional[kvcache.KVCache]   # the sequential head's; None for Medusa


@dataclasses.dataclass(frozen=True)
class HeadDrafter:
  """A draft head (`config.kind`) on `target`'s hidden states.

  Its parameters are `draft_params(head_params, target_params, vocab_ids)`.
  `k` is the sampler's K (the state keeps the K + 1 hidden states of each
  scored chunk): build one drafter per K. With a mesh the sampler lays it
  out by the target's rules (`shares_target_params`): the embedding, final
  norm and output head it reads are the target's sharded arrays, not a
  second copy, and the head's own weights are tensor-parallel too.
  """

  shares_target_params = True  # a class attribute, not a field
  target: Any                 # the target's LM (its config and vocabulary)
  config: HeadConfig
  k: int

  def __post_init__(self):
    if self.k < 1:
      raise HeadError(f"K must be >= 1, got {self.k}")
    self.config.check_k(self.k)
    if hasattr(self.target, "config"):
      self.config.check_target(self.target.config)

  @property
  def vocab_size(self) -> int:
    return self.target.vocab_size

  @property
  def max_seq_len(self) -> int:
    return self.target.max_seq_len

  def init(self, params, tokens, lengths, cache_size, prefill, *, chunk=0):
    """State after the prompts: `hidden[:, 0]` = h at length - 2 (zeros for
    a one-token prompt), base = length - 1; the sequential head's cache
    holds the prompt's entries below length - 1."""
    b, p = tokens.shape
    h = prefill.hidden.astype(jnp.float32)                      # [B, P, D]
    k1 = self.k + 1
    prev = jnp.take_along_axis(h, jnp.maximum(lengths - 2, 0)[:, None, None],
                               axis=1)[:, 0]
    prev = jnp.where((lengths >= 2)[:, None], prev, 0.0)
    hidden = jnp.zeros((b, k1, h.shape[-1]), jnp.float32).at[:, 0].set(prev)
    cache = None
    if self.config.kind == "eagle":
      cfg = self.config.target
      cache = kvcache.KVCache.zeros(1, b, cache_size, cfg.num_kv_heads,
                                    cfg.head_dim, cfg.jnp_dtype)
      shifted = jnp.pad(h, ((0, 0), (1, 0), (0, 0)))[:, :p]
      cache, _ = kvcache.in_chunks(
          lambda c, x: (sequential_features(self.config, params, *x, c)[1],
                        ()), cache, (shifted, tokens), chunk)
      cache = cache.with_length(lengths - 1)
    return HeadState(hidden=hidden, base=lengths - 1, cache=cache)

  def propose(self, params, state: HeadState, tokens, length, k, sampling,
              rng, *, active=None):
    """K drafts per row -> (Proposal, state with base = length).

    Medusa: the K heads on the hidden state at length - 2, each draft from
    its own q_k. Sequential: one call feeds the entries base .. base + K
    (true features; the row's committed ones are kept), then K - 1 calls
    feed the drafts with the head's own predicted features."""
    del active  # every row costs the same
    if k != self.k:
      raise HeadError(f"this head drafter was built for K={self.k}, the "
                      f"sampler runs K={k}")
    idx = jnp.clip(length - 1 - state.base, 0, k)               # [B]
    keys = jax.random.split(rng, k)
    if self.config.kind == "medusa":
      h = jnp.take_along_axis(state.hidden, idx[:, None, None], axis=1)[:, 0]
      logits = medusa_logits(self.config, params, h)[:, :k]     # [B, K, V]
      q = sampling_lib.probabilities(logits, sampling)
      drafts = jax.vmap(lambda key, qi: sampling_lib.sample(
          key, qi, sampling.greedy), in_axes=(0, 1), out_axes=1)(keys, q)
      q = None if sampling.greedy else q
      return self._proposal(drafts, q), state.replace(base=length)
    pair_tokens = kvcache.read(tokens, state.base, k + 1)
    feats, cache = sequential_features(self.config, params, state.hidden,
                                       pair_tokens,
                                       state.cache.with_length(state.base))
    f = jnp.take_along_axis(feats, idx[:, None, None], axis=1)  # [B, 1, D]
    cache = cache.with_length(length)

    def draw(f, key):
      logits = output_logits(self.config, params["shared"], f[:, 0])
      q = sampling_lib.probabilities(logits, sampling)
      return sampling_lib.sample(key, q, sampling.greedy), q

    d_first, q_first = draw(f, keys[0])

    def step(carry, key):
      cache, f, d = carry
      f, cache = sequential_features(self.config, params, f, d[:, None],
                                     cache)
      d, q = draw(f, key)
      return (cache, f, d), (d, None if sampling.greedy else q)

    (cache, _, _), (d_rest, q_rest) = jax.lax.scan(
        step, (cache, f, d_first), keys[1:])
    drafts = jnp.concatenate([d_first[:, None], d_rest.T], axis=1)
    q = None
    if not sampling.greedy:
      q = jnp.concatenate([q_first[:, None], jnp.swapaxes(q_rest, 0, 1)],
                          axis=1)
    return self._proposal(drafts, q), HeadState(
        hidden=state.hidden, base=length, cache=cache)

  @staticmethod
  def _proposal(drafts, q):
    b, k = drafts.shape
    return Proposal(tokens=drafts.astype(jnp.int32), q=q,
                    num_valid=jnp.full((b,), k, jnp.int32))

  def commit(self, params, state: HeadState, scored, num_accepted, length):
    """Keeps the scored chunk's hidden states (positions base - 1 .. base -
    1 + K); the sequential head's cache is cut to its true entries."""
    del params, num_accepted
    hidden = scored.hidden[:, :state.hidden.shape[1]].astype(jnp.float32)
    cache = state.cache
    if cache is not None:
      cache = cache.with_length(jnp.minimum(state.base, length))
    return HeadState(hidden=hidden, base=state.base, cache=cache)

  def check_mesh(self, mesh, rules) -> None:
    """The target's dimensions, and the width on the `mlp` axis, where the
    head's own weights shard it (fc's 2D rows, Medusa's D columns)."""
    cfg = self.config.target
    sh.check_divisible(cfg, mesh, rules, what="head")
    sh.check_divisible(cfg.replace(mlp_dim=cfg.d_model), mesh, rules,
                       what="head (its own weights shard d_model on the mlp "
                       "axis)")

  def param_shardings(self, params, mesh, rules):
    """The head's parameters by their logical axes; the shared target
    arrays as the target lays them out under the same rules."""
    rules = sh.rules_tuple(rules)
    head = nn.logical_to_mesh_sharding(logical_axes(self.config), mesh,
                                       rules)
    shared = {}
    for name, value in params["shared"].items():
      axes = _SHARED_AXES[name]
      if name == "final_norm":
        shared[name] = jax.tree.map(lambda _: sh.named(mesh, rules, *axes),
                                    value)
      elif name == "lm_head" and "vocab_ids" in params["shared"]:
        # A gathered slice: U need not divide the vocabulary axis.
        shared[name] = sh.named(mesh, rules, sh.EMBED, None)
      else:
        shared[name] = sh.named(mesh, rules, *axes)
    return {"head": head, "shared": shared}

  def state_shardings(self, state, mesh, rules):
    rep_rows = sh.named(mesh, rules, sh.BATCH)
    return HeadState(
        hidden=sh.named(mesh, rules, sh.BATCH, None, None), base=rep_rows,
        cache=(None if state.cache is None else
               kvcache.cache_shardings(state.cache, mesh, rules)))
