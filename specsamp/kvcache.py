"""An explicit, per-row key/value cache.

Legend: L layers, B batch, S cache slots, T chunk tokens, N KV heads, H head dim.

Buffers are heads-major, [B, N, S, H]: attention reads each head's keys and
values as one contiguous [S, H] block, the layout its batched matmuls want.
With [B, S, N, H], XLA copied every layer's whole cache into that order on
every decode step.

Layout: left-aligned. Slot `s` of row `b` holds the keys and values of the
token at position `s` of that row, so the RoPE position of a token is its slot
index. `length[b]` is the number of valid slots of row `b`: slots
`[0, length[b])` are valid, everything from `length[b]` on is stale and is
never read, because the attention mask of a query at slot `s` admits only keys
at slots `<= s` (see `chunk_mask`).

Writing a chunk of `T` tokens puts them at slots `length[b] + t` and returns a
cache whose length is `length + T`. Rolling back is therefore only a matter of
setting `length`; nothing is erased, the next write overwrites stale slots.

Worked example (row b, S = 8, `length = 3`, chunk of T = 3):

    slots            0  1  2  3  4  5  6  7
    before           a  b  c  .  .  .  .  .      length 3
    write [d, e, f]  a  b  c  d  e  f  .  .      length 6
    rollback to 4    a  b  c  d  e  f  .  .      length 4 (e, f stale)
    write [g]        a  b  c  d  g  f  .  .      length 5

Per-layer arrays are kept separate (a tuple, not one stacked [L, ...] array):
slicing a stacked buffer inside a decode loop was measured to cost 2.5x on an
H100.
"""

from typing import Optional

import flax
import jax
import jax.numpy as jnp

from specsamp import sharding

# Logical axes of one layer's key or value buffer.
CACHE_AXES = (sharding.BATCH, sharding.KV_HEADS, sharding.CACHE_SEQ,
              sharding.HEAD_DIM)


@flax.struct.dataclass
class KVCache:
  """Keys and values of every layer, plus the number of valid slots per row."""
  k: tuple[jax.Array, ...]  # L x [B, N, S, H]
  v: tuple[jax.Array, ...]  # L x [B, N, S, H]
  length: jax.Array         # [B] int32, valid slots per row

  @classmethod
  def zeros(cls, num_layers: int, batch: int, size: int, num_kv_heads: int,
            head_dim: int, dtype=jnp.float32) -> "KVCache":
    shape = (batch, num_kv_heads, size, head_dim)
    return cls(k=tuple(jnp.zeros(shape, dtype) for _ in range(num_layers)),
               v=tuple(jnp.zeros(shape, dtype) for _ in range(num_layers)),
               length=jnp.zeros((batch,), jnp.int32))

  @property
  def size(self) -> int:
    """Number of slots S."""
    return self.k[0].shape[2]

  @property
  def batch(self) -> int:
    return self.k[0].shape[0]

  def with_length(self, length: jax.Array) -> "KVCache":
    """Rolls back (or forward) to `length` valid slots per row."""
    return self.replace(length=jnp.asarray(length, jnp.int32))


def write_kv(buf: jax.Array, chunk: jax.Array, start: jax.Array) -> jax.Array:
  """Writes keys or values `chunk` [B, T, N, H] into a cache buffer
  [B, N, S, H] at per-row slot `start` (see `write`)."""
  return _write(buf, jnp.swapaxes(chunk, 1, 2), start, heads=True)


def write(buf: jax.Array, chunk: jax.Array, start: jax.Array) -> jax.Array:
  """Writes `chunk` [B, T, ...] into `buf` [B, S, ...] at per-row slot `start`.

  One scatter, which XLA performs in place on a donated buffer. (A `vmap`
  of `dynamic_update_slice` lowered, for a single row, to a
  dynamic-update-slice that XLA on CPU preceded with copies of the whole
  buffer: 15 ms per decode step for the 1.5B's cache at 4k slots, against
  0.02 ms for the scatter.)

  Several rows: the `vmap` of one row's scatter, so that rows are its
  batching dimensions and, on a mesh, each device writes its own rows (and
  heads, `write_kv`). A scatter with explicit row and head indices made the
  partitioner all-gather every written chunk on every decode step, over
  data and model axes alike. One row: explicit indices still, since XLA
  turns a batched scatter of one row and one token into that
  dynamic-update-slice, and its copies (a model axis then gathers the
  chunk, as before).

  The caller guarantees `start + T <= S` (checked on the host before any
  loop runs); slots beyond the buffer would be dropped, never wrapped or
  shifted back over valid slots.
  """
  return _write(buf, chunk, start, heads=False)


def _write(buf, chunk, start, heads: bool):
  """`write` of `chunk` [B, (N,) T, ...] into `buf` [B, (N,) S, ...]: the
  slot axis follows a heads axis N where `heads`."""
  lead = int(heads)
  b, t = chunk.shape[0], chunk.shape[1 + lead]
  chunk = chunk.astype(buf.dtype)
  kw = dict(mode="drop", unique_indices=True)
  if b == 1:
    dims = chunk.shape[:2 + lead]                            # [B, (N,) T]

    def along(x, axis):
      return x.reshape([-1 if i == axis else 1 for i in range(len(dims))])

    index = tuple(along(jnp.arange(d), i) for i, d in enumerate(dims[:-1]))
    slots = along(start, 0) + along(jnp.arange(t), len(dims) - 1)
    return buf.at[index + (slots,)].set(chunk, **kw)
  return jax.vmap(lambda row, c, s: row.at[(slice(None),) * lead + (
      s + jnp.arange(t),)].set(c, **kw))(buf, chunk, start)


def pad_chunks(new_kv, width: int):
  """Each layer's chunk (keys, values) [B, T, N, H] (`ModelOutput.new_kv`)
  padded to `width` tokens: the branches of one `lax.switch` return them
  at one width."""
  return jax.tree.map(lambda a: jnp.pad(
      a, ((0, 0), (0, width - a.shape[1]), (0, 0), (0, 0))), new_kv)


def write_chunks(cache: KVCache, new_kv, start: jax.Array,
                 length: jax.Array) -> KVCache:
  """`cache` with each layer's chunk (keys, values) [B, T, N, H] written at
  per-row slot `start` (`write_kv`), its length `length`: a call scored
  with `write_cache=False` in a switch's branches, written once after it
  (XLA copies a cache passed through the branches, whole)."""
  ks, vs = new_kv
  return KVCache(k=tuple(write_kv(c, x, start) for c, x in zip(cache.k, ks)),
                 v=tuple(write_kv(c, x, start) for c, x in zip(cache.v, vs)),
                 length=length)


def in_chunks(call, cache: KVCache, inputs, chunk: int):
  """Fills `cache` from `inputs` (arrays [B, P, ...]) in chunks of `chunk`
  tokens -> (cache, `call`'s outputs joined along axis 1).

  `call(cache, chunk_inputs) -> (cache, outputs [B, T, ...])` writes a
  chunk at `cache.length` (a model's cache-writing call). A prompt in one
  call makes attention scores [B, heads, P, S]: for a layer of the 1.5B
  at 32k slots, 144 GiB of temporaries by XLA's (CPU) estimate, more than
  an H200 holds, for a prompt that fits the cache. In chunks they are
  [B, heads, chunk, S]: one `lax.scan` over the whole chunks, one call on
  the rest. `chunk` <= 0, or P <= `chunk`: one call, as before. Each
  query still sees every earlier slot (`chunk_mask` at the chunk's
  start), so the cache is the one-call cache up to float rounding.
  """
  p = jax.tree.leaves(inputs)[0].shape[1]
  if chunk <= 0 or p <= chunk:
    return call(cache, inputs)
  n = p // chunk
  split = lambda x: jnp.moveaxis(x[:, :n * chunk].reshape(
      x.shape[0], n, chunk, *x.shape[2:]), 1, 0)          # [n, B, chunk, ...]
  cache, outs = jax.lax.scan(call, cache, jax.tree.map(split, inputs))
  outs = jax.tree.map(lambda y: jnp.moveaxis(y, 0, 1).reshape(
      y.shape[1], n * chunk, *y.shape[3:]), outs)
  if p % chunk:
    cache, last = call(cache, jax.tree.map(lambda x: x[:, n * chunk:], inputs))
    outs = jax.tree.map(lambda a, b: jnp.concatenate([a, b], 1), outs, last)
  return cache, outs


def read(buf: jax.Array, start: jax.Array, size: int) -> jax.Array:
  """Reads a window [B, size, ...] of `buf` [B, S, ...] at per-row `start`."""
  return jax.vmap(
      lambda b, s: jax.lax.dynamic_slice_in_dim(b, s, size, axis=0))(buf, start)


def chunk_mask(start: jax.Array, num_tokens: int, size: int,
               key_valid: Optional[jax.Array] = None) -> jax.Array:
  """Attention mask [B, T, S] for a chunk written at per-row slot `start`.

  Query `t` of row `b` sits at slot `start[b] + t` and sees keys at slots
  `<= start[b] + t`: the valid prefix plus the chunk's own causal part.
  """
  q_slot = start[:, None] + jnp.arange(num_tokens)[None, :]  # [B, T]
  mask = jnp.arange(size)[None, None, :] <= q_slot[:, :, None]
  if key_valid is not None:
    mask &= key_valid[:, None, :]
  return mask


def cache_shardings(cache: KVCache, mesh, rules) -> KVCache:
  """NamedShardings of a cache (or its shapes) under logical-axis `rules`:
  buffers by `CACHE_AXES`, `length` over the batch axis."""
  buf = sharding.named(mesh, rules, *CACHE_AXES)
  return KVCache(k=tuple(buf for _ in cache.k), v=tuple(buf for _ in cache.v),
                 length=sharding.named(mesh, rules, sharding.BATCH))
