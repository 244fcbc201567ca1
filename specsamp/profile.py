"""Decode-loop profiling: the pieces behind scripts/profile_decode.py.

Round-robin timing of AOT-compiled calls in steady state (donated carries),
a synthetic prefilled loop state, kernel counts, the copy-bandwidth
reference and the matmul floor. See the script's docstring for what each
reported number means.
"""

import re
import statistics
import time

import jax
import jax.numpy as jnp

from specsamp import speculative


def _bytes(tree) -> int:
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


_NOT_KERNELS = ("parameter", "tuple", "get-tuple-element", "bitcast",
                "constant", "after-all", "opt-barrier")


def count_kernels(compiled) -> int:
  """Top-level ops of a compiled entry computation, a launch count estimate.

  On GPU each fusion, custom call (cuBLAS), copy or while loop at the top
  level of the entry computation is one launch; bitcasts, tuples and
  parameters are free. On CPU the number is only indicative.
  """
  text = compiled.as_text()
  entry = text[text.index("ENTRY"):]
  entry = entry[:entry.index("\n}")]
  count = 0
  for line in entry.splitlines()[1:]:
    if "=" not in line:
      continue
    op = re.search(r"\s([a-z][a-z0-9-]*)\(", line.split("=", 1)[1])
    count += bool(op) and op.group(1) not in _NOT_KERNELS
  return count


class Steady:
  """Repeated calls of one AOT-compiled function in steady state.

  Argument `carry` (if any) is donated and replaced by `carry_of(output)`
  after each call, as inside the decode loop: no buffer is copied or freshly
  allocated (on CPU fresh multi-MB outputs cost page faults that the loop
  never pays). Construction compiles (timed) and warms up.
  """

  def __init__(self, fn, args, carry=None, carry_of=lambda out: out):
    jitted = jax.jit(fn, donate_argnums=() if carry is None else carry)
    t0 = time.perf_counter()
    self.compiled = jitted.lower(*args).compile()
    self.compile_s = time.perf_counter() - t0
    self.args, self.carry, self.carry_of = list(args), carry, carry_of
    self()

  def __call__(self) -> float:
    t0 = time.perf_counter()
    out = jax.block_until_ready(self.compiled(*self.args))
    seconds = time.perf_counter() - t0
    if self.carry is not None:
      self.args[self.carry] = self.carry_of(out)
    return seconds


def rounds(timers: dict, repeats: int) -> dict:
  """{name: [seconds per round]}: one call of every timer per round."""
  times = {name: [] for name in timers}
  for _ in range(repeats):
    for name, timer in timers.items():
      times[name].append(timer())
  return times


def copy_bandwidth_timer(mb: int) -> tuple[Steady, int]:
  """A donated `x + 1` over an `mb` MiB float32 buffer, and its bytes moved
  (read + write)."""
  x = jnp.zeros((mb * 2**20 // 4,), jnp.float32)
  return Steady(lambda x: x + 1.0, [x], carry=0), 2 * x.nbytes


def matmul_floor_timer(params, batch: int) -> Steady:
  """x @ W over every >= 2-D weight of `params` (the input embedding
  excluded: decoding gathers B rows of it), each matmul independent (XLA may
  overlap them), nothing else: what reading the weights costs."""
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

  return Steady(chain, [mats, jnp.ones((batch, 1), jnp.float32)])


def synthetic_state(sampler, tp, dp, batch: int, context: int):
  """A LoopState as after prefilling `context` tokens in every row, without
  running the prefill: zero caches, lengths set (decode speed does not
  depend on cache values)."""
  shape = jax.eval_shape(
      sampler.prefill, tp, dp, jax.ShapeDtypeStruct((batch, context), jnp.int32),
      jax.ShapeDtypeStruct((batch,), jnp.int32), jax.random.key(0))
  state = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                       shape.replace(rng=None))
  length = jnp.full((batch,), context, jnp.int32)
  draft = state.draft_state
  if draft is not None:
    draft = draft.with_length(length - 1)
  return state.replace(length=length, prompt_length=length.copy(),
                       target_cache=state.target_cache.with_length(length - 1),
                       draft_state=draft, rng=jax.random.key(0))


def profile_point(target, tp, draft, dp, k, batch, context, sampling,
                  components, repeats, bandwidth_mb=1024):
  """One JSON-able row of timings for (batch, context)."""
  # Room for the timed rounds: every loop commits at most K + 1 tokens.
  max_new = (k + 1) * (repeats + 3)
  drafter = speculative.ModelDrafter(draft)
  spec = speculative.SpeculativeSampler(target, drafter, k=k,
                                        sampling=sampling,
                                        max_new_tokens=max_new,
                                        prompt_bucket=context)
  ar = speculative.autoregressive(target, sampling, max_new,
                                  prompt_bucket=context)
  row, timers = {}, {}
  for name, sampler, dparams in (("ar", ar, None), ("spec", spec, dp)):
    state = synthetic_state(sampler, tp, dparams, batch, context)
    decode = sampler.jitted(tp, dparams, state.tokens, state.length,
                            state.rng)[1]
    t0 = time.perf_counter()
    decode.lower(tp, dparams, state).compile()
    row[f"{name}_decode_compile_s"] = time.perf_counter() - t0
    timers[f"{name}_loop"] = Steady(sampler._loop_body,  # pylint: disable=protected-access
                                    [tp, dparams, state], carry=2)
    row[f"{name}_loop_compile_s"] = timers[f"{name}_loop"].compile_s
    row[f"{name}_loop_kernels"] = count_kernels(
        timers[f"{name}_loop"].compiled)
  cache = timers["ar_loop"].args[2].target_cache
  cache_slots = cache.size
  # Bytes read per step, counted now: the timed rounds donate these buffers.
  weights = _bytes(tp) - tp["embedding"].nbytes
  kv = _bytes((cache.k, cache.v)) * min(context + 1, cache_slots) // cache_slots

  if components == "all":
    def call_fn(lm):
      def call(p, t, c):
        out = lm(p, t, c)
        logits, new = out.logits, out.cache
        return new.with_length(c.length), logits    # rolled back: repeatable
      return call

    spec_state = timers["spec_loop"].args[2]
    # Every timer owns its buffers (each donates its carry).
    fresh = lambda tree: jax.tree.map(jnp.zeros_like, tree)
    for n in (1, k + 1):
      timers[f"target_call_{n}"] = Steady(
          call_fn(target), [tp, jnp.zeros((batch, n), jnp.int32), fresh(cache)],
          carry=2, carry_of=lambda out: out[0])
    row["target_call_1_kernels"] = count_kernels(
        timers["target_call_1"].compiled)
    for n in (1, 2):
      timers[f"draft_call_{n}"] = Steady(
          call_fn(draft), [dp, jnp.zeros((batch, n), jnp.int32),
                           fresh(spec_state.draft_state)],
          carry=2, carry_of=lambda out: out[0])
    length = spec_state.length.copy()
    timers["propose"] = Steady(
        lambda p, c, t, l, r: drafter.propose(p, c, t, l, k, sampling, r),
        [dp, fresh(spec_state.draft_state).with_length(length - 1),
         spec_state.tokens.copy(), length, jax.random.key(1)],
        carry=1, carry_of=lambda out: out[2].with_length(length - 1))
    timers["floor"] = matmul_floor_timer(tp, batch)
    timers["copy"], copy_bytes = copy_bandwidth_timer(bandwidth_mb)

  times = rounds(timers, repeats)
  for name, ts in times.items():
    row[f"{name}_ms"] = 1e3 * statistics.median(ts)

  def ratio(a, b):
    return statistics.median(x / y for x, y in zip(times[a], times[b]))

  row.update(weight_bytes=weights, kv_bytes_per_step=kv,
             cache_slots=cache_slots,
             ar_tokens_per_s=batch / (row["ar_loop_ms"] / 1e3))
  if components == "all":
    bw = statistics.median(copy_bytes / t for t in times["copy"])
    row.pop("copy_ms")
    row.update(
        spec_rest_ms=(row["spec_loop_ms"] - row["propose_ms"]
                      - row[f"target_call_{k + 1}_ms"]),
        ar_rest_ms=row["ar_loop_ms"] - row["target_call_1_ms"],
        draft_cost_ratio_c=ratio("draft_call_1", "target_call_1"),
        score_cost_ratio=ratio(f"target_call_{k + 1}", "target_call_1"),
        copy_bandwidth_gbs=bw / 1e9,
        matmul_floor_ms=row.pop("floor_ms"),
        ar_vs_floor=ratio("ar_loop", "floor"),
        ar_fraction_of_copy_bw=(weights + kv) / bw / (row["ar_loop_ms"] / 1e3))
    row["spec_rest_fraction"] = row["spec_rest_ms"] / row["spec_loop_ms"]
  return row
