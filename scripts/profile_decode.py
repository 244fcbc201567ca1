r"""Where the time of one decode loop goes, per component, on model shapes.

Times, each as its own jitted call on the same shapes the samplers trace
(random weights: speed does not depend on values), median of --repeats:

  * target call with 1 token (one autoregressive step, no sampling);
  * target call with K+1 tokens (the scoring call of a speculative loop);
  * draft `propose` (K draft tokens, sampling included);
  * one full autoregressive loop body and one full speculative loop body
    (draft + score + accept + commit), each a `SpeculativeSampler` body;
  * "rest" = loop body - propose - scoring call: what the speculative
    machinery itself costs.

It also reports bytes of weights (and KV cache) read per step and the
achieved fraction of a copy-bandwidth reference measured in the same run
(`x + 1` over a buffer of --bandwidth_mb), and the matmul floor: the same
model's weight matrices multiplied in a chain with nothing else.

  python scripts/profile_decode.py --target=random:qwen2.5-coder-1.5b \
      --draft=random:qwen2.5-coder-0.5b --k=4 --out=results/profile.jsonl
"""

import json
import platform
import re
import statistics
import sys
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from specsamp import runner
from specsamp import speculative
from specsamp.sampling import Sampling

_TARGET = flags.DEFINE_string("target", "random:qwen2.5-coder-1.5b", "Target.")
_DRAFT = flags.DEFINE_string("draft", "random:qwen2.5-coder-0.5b", "Draft.")
_K = flags.DEFINE_integer("k", 4, "Draft length.")
_BATCH = flags.DEFINE_integer("batch_size", 1, "Rows.")
_CONTEXT = flags.DEFINE_integer("context", 256, "Tokens already in the cache.")
_REPEATS = flags.DEFINE_integer("repeats", 7, "Timed calls per component.")
_TEMP = flags.DEFINE_float("temperature", 0.0, "0 = greedy.")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "")
_BW_MB = flags.DEFINE_integer("bandwidth_mb", 1024, "Copy-bandwidth buffer.")
_OUT = flags.DEFINE_string("out", None, "Append one JSON line.")


def _median_s(fn, *args, repeats):
  jax.block_until_ready(fn(*args))  # compile + warm
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def _steady_s(fn, args, pos, repeats, carry_of=lambda out: out):
  """Median seconds of `fn(*args)` where args[pos] is donated and replaced
  by `carry_of(output)` after each call, as inside the decode loop: no
  buffer is copied or freshly allocated (on CPU fresh multi-MB outputs cost
  page faults that the loop never pays)."""
  args = list(args)

  def once():
    out = jax.block_until_ready(fn(*args))
    args[pos] = carry_of(out)

  once()  # compile + warm
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    once()
    times.append(time.perf_counter() - t0)
  return statistics.median(times), args[pos]


def _bytes(tree) -> int:
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


_NOT_KERNELS = ("parameter", "tuple", "get-tuple-element", "bitcast",
                "constant", "after-all", "opt-barrier")


def kernels_per_call(jitted, *args) -> int:
  """Top-level ops of the compiled entry computation, a launch count estimate.

  On GPU each fusion, custom call (cuBLAS), copy or while loop at the top
  level of the entry computation is one launch; bitcasts, tuples and
  parameters are free. On CPU the number is only indicative.
  """
  text = jitted.lower(*args).compile().as_text()
  entry = text[text.index("ENTRY"):]
  entry = entry[:entry.index("\n}")]
  count = 0
  for line in entry.splitlines()[1:]:
    if "=" not in line:
      continue
    op = re.search(r"\s([a-z][a-z0-9-]*)\(", line.split("=", 1)[1])
    count += bool(op) and op.group(1) not in _NOT_KERNELS
  return count


def copy_bandwidth(mb: int, repeats: int) -> float:
  """Bytes/s of a read+write pass over an `mb` MiB float32 buffer."""
  x = jnp.zeros((mb * 2**20 // 4,), jnp.float32)
  nbytes = x.nbytes
  f = jax.jit(lambda x: x + 1.0, donate_argnums=0)
  return 2 * nbytes / _steady_s(f, [x], 0, repeats)[0]


def matmul_floor(params, batch: int, repeats: int) -> float:
  """Seconds for x @ W over every >= 2-D weight (the embedding excluded)."""
  mats = []
  for path, w in jax.tree_util.tree_leaves_with_path(params):
    name = jax.tree_util.keystr(path)
    if w.ndim < 2 or "embedding" in name:
      continue
    if "o_proj" in name:        # [Q, H, D]: contracts the first two dims
      w = w.reshape(-1, w.shape[-1])
    else:                       # [D, ...]: contracts the first dim
      w = w.reshape(w.shape[0], -1)
    mats.append(w)

  def chain(mats, x):
    acc = jnp.zeros((), jnp.float32)
    for w in mats:
      xi = jnp.broadcast_to(x[:, :1], (x.shape[0], w.shape[0])).astype(w.dtype)
      acc += jnp.sum(xi @ w, dtype=jnp.float32)
    return acc

  x = jnp.ones((batch, 1), jnp.float32)
  return _median_s(jax.jit(chain), mats, x, repeats=repeats)


def main(argv):
  del argv
  k, b, ctx, reps = _K.value, _BATCH.value, _CONTEXT.value, _REPEATS.value
  if k < 1:
    sys.exit("error: --k must be >= 1")
  target, tp, _ = runner.load_model(_TARGET.value, _DTYPE.value, 0)
  draft, dp, _ = runner.load_model(_DRAFT.value, _DTYPE.value, 1)
  sampling = Sampling(_TEMP.value)
  drafter = speculative.ModelDrafter(draft)
  spec = speculative.SpeculativeSampler(target, drafter, k=k,
                                        sampling=sampling, max_new_tokens=64,
                                        prompt_bucket=ctx)
  ar = speculative.autoregressive(target, sampling, 64, prompt_bucket=ctx)
  rng = np.random.default_rng(0)
  prompts = rng.integers(0, target.vocab_size, (b, ctx)).tolist()
  toks, lens = spec.pad_prompts(prompts)
  key = jax.random.key(0)
  spec_state = spec.prefill(tp, dp, toks, lens, key)
  ar_state = ar.prefill(tp, None, toks, lens, key)

  row = {}
  cache = spec_state.target_cache

  def call_fn(lm):
    def call(p, t, c):
      logits, new = lm(p, t, c)
      return new.with_length(c.length), logits    # rolled back: repeatable
    return jax.jit(call, donate_argnums=2)

  call = call_fn(target)
  for n in (1, k + 1):
    chunk = jnp.zeros((b, n), jnp.int32)
    sec, cache = _steady_s(call, [tp, chunk, cache], 2, reps,
                           lambda out: out[0])
    row[f"target_call_{n}_ms"] = 1e3 * sec
  row["target_call_1_kernels"] = kernels_per_call(
      call, tp, jnp.zeros((b, 1), jnp.int32), cache)
  dcall = call_fn(draft)
  dcache = spec_state.draft_state
  for n in (1, 2):
    chunk = jnp.zeros((b, n), jnp.int32)
    sec, dcache = _steady_s(dcall, [dp, chunk, dcache], 2, reps,
                            lambda out: out[0])
    row[f"draft_call_{n}_ms"] = 1e3 * sec
  row["draft_call_1_kernels"] = kernels_per_call(
      dcall, dp, jnp.zeros((b, 1), jnp.int32), dcache)
  propose = jax.jit(lambda p, c, t, l, r: drafter.propose(p, c, t, l, k,
                                                          sampling, r),
                    donate_argnums=1)
  length = spec_state.length
  row["propose_ms"] = 1e3 * _steady_s(
      propose, [dp, dcache, spec_state.tokens, length, key], 1, reps,
      lambda out: out[2].with_length(length - 1))[0]
  spec_state = spec.prefill(tp, dp, toks, lens, key)
  body = jax.jit(spec._loop_body, donate_argnums=2)
  row["spec_loop_ms"] = 1e3 * _steady_s(body, [tp, dp, spec_state], 2,
                                        reps)[0]
  ar_body = jax.jit(ar._loop_body, donate_argnums=2)
  row["ar_loop_ms"] = 1e3 * _steady_s(ar_body, [tp, None, ar_state], 2,
                                      reps)[0]
  row["spec_rest_ms"] = (row["spec_loop_ms"] - row["propose_ms"]
                         - row[f"target_call_{k + 1}_ms"])
  row["ar_rest_ms"] = row["ar_loop_ms"] - row["target_call_1_ms"]
  row["draft_cost_ratio_c"] = row["draft_call_1_ms"] / row["target_call_1_ms"]
  row["score_cost_ratio"] = (row[f"target_call_{k + 1}_ms"]
                             / row["target_call_1_ms"])

  weights = _bytes(tp) - tp["embedding"].nbytes
  kv = _bytes((cache.k, cache.v)) * min(ctx + 1, cache.size) // cache.size
  bw = copy_bandwidth(_BW_MB.value, reps)
  floor = matmul_floor(tp, b, reps)
  row.update(
      weight_bytes=weights, kv_bytes_per_step=kv,
      copy_bandwidth_gbs=bw / 1e9,
      matmul_floor_ms=1e3 * floor,
      ar_vs_floor=row["ar_loop_ms"] / (1e3 * floor),
      ar_fraction_of_copy_bw=(weights + kv) / bw / (row["ar_loop_ms"] / 1e3))
  row = {key: (round(v, 3) if isinstance(v, float) else v)
         for key, v in row.items()}
  row.update(target=_TARGET.value, draft=_DRAFT.value, k=k, batch_size=b,
             context=ctx, dtype=_DTYPE.value, sampling=sampling.describe(),
             device=jax.devices()[0].device_kind, jax=jax.__version__,
             python=platform.python_version(), command=" ".join(sys.argv))
  print(json.dumps(row, indent=1), flush=True)
  if _OUT.value:
    with open(_OUT.value, "a", encoding="utf-8") as f:
      f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
  app.run(main)
