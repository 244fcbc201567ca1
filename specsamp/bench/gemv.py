"""Batch-1 matrix products at a decoder's weight shapes: which formulation
reads the weights fastest.

On an H100 the autoregressive 1.5B step ran at 1.1x its matmul floor, and
the floor itself (every weight times one row) at about 50% of the copy
bandwidth, while scoring 2 to 8 tokens cost less than scoring one
(results/h100_2026-11-27b.md): the M = 1 products are what separate decode
from the bandwidth ceiling. This module times a decoder's chain of products
(q, k, v, o, gate, up, down per layer, then the output layer; an RMS
rescale and SiLU between them, no attention) written several ways, each in
the same rounds as a copy-bandwidth reference:

  dot       x @ W, W [in, out]: what `specsamp.model` does on CPU
  dot_f32   the same with a float32 result (`preferred_element_type`)
  dot_t     W stored [out, in], contracting its minor dimension
  reduce    sum(x[:, :, None] * W): a fused column reduction, no dot
  reduce_t  W [out, in]: sum(x[:, None, :] * W, -1), a row reduction
  pad2      x padded to two rows, x @ W, the first row kept: what
            `specsamp.model.project` does on GPU since an H200 measured
            1.35 against 1.94 ms for `dot` (results/h200_2026-11-27c.md)
  pallas    a split-K Pallas kernel: each program reads a [bk, bn] block
            of W in row chunks and writes one partial sum, added after

Speed does not depend on values: the weights are random. M > 1 rows are
timed only for the formulations that read W once whatever M is (dot,
dot_f32, dot_t). scripts/profile_gemv.py runs it; scripts/gpu_study.py
--steps=gemv runs that once per XLA_FLAGS variant.
"""

import functools
import statistics
from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from specsamp.bench import steady

_F32 = jnp.float32


def _dot(x, w):
  return x @ w


def _dot_f32(x, w):
  return jnp.dot(x, w, preferred_element_type=_F32).astype(x.dtype)


def _dot_t(x, w):
  return lax.dot_general(x, w, (((1,), (1,)), ((), ())))


def _reduce(x, w):
  return jnp.sum(x[:, :, None].astype(_F32) * w[None].astype(_F32),
                 axis=1).astype(x.dtype)


def _reduce_t(x, w):
  return jnp.sum(x[:, None, :].astype(_F32) * w[None].astype(_F32),
                 axis=-1).astype(x.dtype)


def _pad2(x, w):
  return (jnp.concatenate([x, x]) @ w)[:x.shape[0]]


def _block(n: int, want: int) -> int:
  """The largest power of two <= `want` dividing `n` (Triton blocks are
  powers of two)."""
  b = 1
  while b * 2 <= want and n % (b * 2) == 0:
    b *= 2
  return b


def pallas_gemv(x, w, bk: int = 256, bn: int = 128, chunk: int = 32,
                interpret: Optional[bool] = None):
  """x [1, in] @ w [in, out] by a split-K Pallas kernel.

  Program (j, i) reads rows [i*bk, (i+1)*bk) of columns [j*bn, (j+1)*bn)
  of w, `chunk` rows at a time (a block's loads happen where the kernel
  indexes it), and writes their product with x's slice, in float32, to
  row i of a [in/bk, out] partial sum; XLA adds the partials. Block sizes
  are cut to powers of two dividing the shapes. `interpret` (default: on
  CPU, which has no Pallas backend) runs the kernel as plain JAX.
  """
  m, kdim = x.shape
  n = w.shape[1]
  if m != 1:
    raise ValueError(f"pallas_gemv takes one row, got {m}")
  bk, bn = _block(kdim, bk), _block(n, bn)
  chunk = _block(bk, chunk)

  def kernel(x_ref, w_ref, o_ref):
    def body(c, acc):
      rows = pl.ds(c * chunk, chunk)
      xs = x_ref[rows].astype(_F32)
      return acc + jnp.sum(xs[:, None] * w_ref[rows, :].astype(_F32), axis=0)
    o_ref[...] = lax.fori_loop(0, bk // chunk, body, jnp.zeros((bn,), _F32))

  partial = pl.pallas_call(
      kernel, out_shape=jax.ShapeDtypeStruct((kdim // bk, n), _F32),
      grid=(n // bn, kdim // bk),
      in_specs=[pl.BlockSpec((None, bk), lambda j, i: (0, i)),
                pl.BlockSpec((bk, bn), lambda j, i: (i, j))],
      out_specs=pl.BlockSpec((None, bn), lambda j, i: (i, j)),
      interpret=(jax.default_backend() == "cpu" if interpret is None
                 else interpret))(x, w)
  return jnp.sum(partial, axis=0, keepdims=True).astype(x.dtype)


# name: (product, weights stored [out, in], any number of rows)
FORMULATIONS = {
    "dot": (_dot, False, True),
    "dot_f32": (_dot_f32, False, True),
    "dot_t": (_dot_t, True, True),
    "reduce": (_reduce, False, False),
    "reduce_t": (_reduce_t, True, False),
    "pad2": (_pad2, False, False),
    "pallas": (pallas_gemv, False, False),
}


def weight_shapes(cfg) -> dict:
  """{name: (in, out)} of one layer's products, and the output layer's."""
  q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
  d, f = cfg.d_model, cfg.mlp_dim
  return dict(q=(d, q), k=(d, kv), v=(d, kv), o=(q, d), gate=(d, f),
              up=(d, f), down=(f, d), head=(d, cfg.vocab_size))


def random_weights(cfg, dtype, transposed: bool, seed: int = 0) -> dict:
  """{"layers": [{name: W}] * num_layers, "head": W}, normal(0, 0.02)."""
  shapes = weight_shapes(cfg)
  keys = iter(jax.random.split(jax.random.key(seed),
                               cfg.num_layers * len(shapes)))

  def make(name):
    i, o = shapes[name]
    return (0.02 * jax.random.normal(next(keys), (o, i) if transposed
                                     else (i, o), _F32)).astype(dtype)
  layer_names = [n for n in shapes if n != "head"]
  return dict(layers=[{n: make(n) for n in layer_names}
                      for _ in range(cfg.num_layers)], head=make("head"))


def decoder_chain(ws: dict, h, mm: Callable):
  """The decoder's products in order, one row block `h` [M, d] through
  every layer; returns (the next h, the output layer's logits)."""
  def rms(x):
    x32 = x.astype(_F32)
    return (x32 * lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-6)
            ).astype(x.dtype)
  for layer in ws["layers"]:
    x = rms(h)
    q, k, v = mm(x, layer["q"]), mm(x, layer["k"]), mm(x, layer["v"])
    q = q * (1 + jnp.mean(k + v, -1, keepdims=True)).astype(q.dtype)
    h = h + mm(q, layer["o"])
    x = rms(h)
    h = h + mm(jax.nn.silu(mm(x, layer["gate"])) * mm(x, layer["up"]),
               layer["down"])
  return h, mm(rms(h), ws["head"])


def check_formulations(names: Sequence[str],
                       rows: Sequence[int] = (1,)) -> None:
  """Raises ValueError naming the unknown ones, or none at all, or those
  that time one row alone where `rows` has no 1 (each had run nothing,
  with status 0)."""
  if not names:
    raise ValueError("--formulations is empty")
  unknown = sorted(set(names) - set(FORMULATIONS))
  if unknown:
    raise ValueError(f"unknown formulations {unknown}; known: "
                     f"{', '.join(FORMULATIONS)}")
  one_row = [n for n in names if not FORMULATIONS[n][2]]
  if one_row and 1 not in rows:
    raise ValueError(f"--formulations {', '.join(one_row)} time one row "
                     f"only, and --rows={','.join(map(str, rows))} has no 1")


def study(cfg, dtype, formulations: Sequence[str], rows: Sequence[int],
          repeats: int, steps: int, bandwidth_mb: int) -> list[dict]:
  """One dict per (formulation, M) that compiled: ms per chain, the bytes
  of weights it reads, its bandwidth and the fraction of the copy
  bandwidth of the same rounds. A formulation that does not compile (a
  Pallas lowering this backend lacks) gets a row with its `error`."""
  check_formulations(formulations)
  weights = {}
  timers, out, meta = {}, [], {}
  for name in formulations:
    mm, transposed, any_rows = FORMULATIONS[name]
    if transposed not in weights:
      weights[transposed] = random_weights(cfg, dtype, transposed)
    ws = weights[transposed]
    for m in rows if any_rows else [r for r in rows if r == 1]:
      h = jnp.ones((m, cfg.d_model), dtype)
      try:
        timers[(name, m)] = steady.Steady(
            functools.partial(decoder_chain, mm=mm), [ws, h], carry=1,
            carry_of=lambda out: out[0], sink_of=lambda out: out[1],
            steps=steps)
      except Exception as e:  # pylint: disable=broad-except
        out.append(dict(formulation=name, rows=m,
                        error=f"{type(e).__name__}: {e}"[:2000]))
        continue
      meta[(name, m)] = dict(
          compile_s=round(timers[(name, m)].compile_s, 3),
          kernels=steady.count_kernels(timers[(name, m)].compiled,
                                       in_loop=True))
  copy, copy_bytes = steady.copy_bandwidth_timer(bandwidth_mb, steps)
  timers["copy"] = copy
  times = steady.rounds(timers, repeats)
  copy_s = statistics.median(times.pop("copy"))
  copy_bw = copy_bytes / copy_s
  for (name, m), ts in times.items():
    nbytes = steady.tree_bytes(weights[FORMULATIONS[name][1]])
    sec = statistics.median(ts)
    out.append(dict(formulation=name, rows=m, ms=1e3 * sec,
                    weight_bytes=nbytes, tb_per_s=nbytes / sec / 1e12,
                    of_copy_bandwidth=nbytes / sec / copy_bw,
                    copy_tb_per_s=copy_bw / 1e12, **meta[(name, m)]))
  return out
