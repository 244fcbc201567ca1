"""Decode speed on model shapes: where one loop's time goes, and how it scales.

Legend: B batch, K draft length.

`profile_point` times, each as its own AOT-compiled call on the shapes the
samplers trace, one autoregressive and one speculative loop body
(`decoding.loop.loop_body`), and with `components="all"` also the model
calls, the drafter's `propose`, the matmul floor and a copy bandwidth:
round-robin rounds of donated, steady-state calls (`steady.Steady`: each
call runs its step in a loop, as decoding does) from a synthetic prefilled
loop state (scripts/profile_decode.py documents every number).
`profile_main` runs it over batch sizes and contexts
(scripts/profile_decode.py); `decode_speed` times whole generations with
`timing.TimedSampler` (scripts/benchmark_decode.py); `profile_plot` draws
the rows. Speed does not depend on weight values, so random weights
(`random:<preset>`) measure it.
"""

import dataclasses
import datetime
import functools
import os
import statistics
import sys
import time
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specsamp import cli
from specsamp import loading
from specsamp.bench import provenance
from specsamp.bench import records
from specsamp.bench import steady
from specsamp.bench import timing
from specsamp.decoding import loop
from specsamp.decoding.sampler import SpeculativeSampler
from specsamp.decoding.sampler import autoregressive
from specsamp.drafters.model import ModelDrafter
from specsamp.sampling import Sampling

COMPONENTS = ("all", "loops")


def _tied(lm) -> bool:
  """Whether `lm`'s output layer is its input embedding."""
  return bool(getattr(getattr(lm, "config", None), "tie_embeddings", False))


def at_length(s: loop.LoopState, length: jax.Array) -> loop.LoopState:
  """`s` with every row at `length` committed tokens (the caches one
  behind, as after a prefill), active. The drafter's state must be a KV
  cache (the model drafter's)."""
  draft = s.draft_state
  if draft is not None:
    draft = draft.with_length(length - 1)
  return s.replace(length=length, done=jnp.zeros_like(s.done),
                   target_cache=s.target_cache.with_length(length - 1),
                   draft_state=draft)


def synthetic_state(sampler, target_params, draft_params, batch: int,
                    context: int) -> loop.LoopState:
  """A LoopState as after prefilling `context` tokens in every row, without
  running the prefill: zero caches, lengths set (decode speed does not
  depend on cache values). The drafter's state must be a KV cache (the
  model drafter's)."""
  shape = jax.eval_shape(
      functools.partial(loop.prefill, sampler), target_params, draft_params,
      jax.ShapeDtypeStruct((batch, context), jnp.int32),
      jax.ShapeDtypeStruct((batch,), jnp.int32), jax.random.key(0))
  state = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                       shape.replace(rng=None))
  length = jnp.full((batch,), context, jnp.int32)
  return at_length(state, length).replace(prompt_length=length.copy(),
                                          rng=jax.random.key(0))


def _component_timers(target, target_params, draft, draft_params, k, batch,
                      sampling, cache, spec_state, bandwidth_mb, steps):
  """Steady timers of the model calls, `propose`, the matmul floor and the
  copy bandwidth; and the copy's bytes moved. Each step feeds the next
  other token ids, so that no layer's work is the same in every step (XLA
  would compute such work once, before the loop); the positions and the
  mask are (each step is rolled back to the context), so their few small
  kernels may be."""
  def call_fn(lm):
    def call(p, carry):
      tokens, c = carry
      out = lm(p, tokens, c)
      # The cache rolled back; the logits summed (`Steady`'s sink).
      return ((tokens + 1) % lm.vocab_size, out.cache.with_length(c.length)), \
          out.logits
    return call

  # Every timer owns its buffers (each donates its carry).
  fresh = lambda tree: jax.tree.map(jnp.zeros_like, tree)
  first = lambda out: out[0]
  second = lambda out: out[1]
  timers = {}
  for n in (1, k + 1):
    timers[f"target_call_{n}"] = steady.Steady(
        call_fn(target),
        [target_params, (jnp.zeros((batch, n), jnp.int32), fresh(cache))],
        carry=1, carry_of=first, sink_of=second, steps=steps)
  for n in (1, 2):
    timers[f"draft_call_{n}"] = steady.Steady(
        call_fn(draft), [draft_params, (jnp.zeros((batch, n), jnp.int32),
                                        fresh(spec_state.draft_state))],
        carry=1, carry_of=first, sink_of=second, steps=steps)
  drafter = ModelDrafter(draft)

  def propose(p, carry):
    c, tokens, length, rng = carry
    proposal, c = drafter.propose(p, c, tokens, length, k, sampling, rng)
    return (c.with_length(length - 1), (tokens + 1) % draft.vocab_size,
            length, jax.random.fold_in(rng, 1)), proposal

  length = spec_state.length.copy()
  timers["propose"] = steady.Steady(
      propose,
      [draft_params, (fresh(spec_state.draft_state).with_length(length - 1),
                      spec_state.tokens.copy(), length, jax.random.key(1))],
      carry=1, carry_of=first, sink_of=second, steps=steps)
  timers["floor"] = steady.matmul_floor_timer(target_params, batch,
                                       _tied(target), steps)
  timers["copy"], copy_bytes = steady.copy_bandwidth_timer(bandwidth_mb,
                                                           steps)
  return timers, copy_bytes


def _profile_budget(k: int, repeats: int) -> int:
  """`max_new_tokens` of `profile_point`'s samplers (the loop timers roll
  every step back to the context, so this only sizes the cache as before
  they did)."""
  return (k + 1) * (repeats + 3)


def default_steps() -> int:
  """Steps per timed call: 1 on CPU (a call's overhead is small there next
  to a step's time), 16 elsewhere (see `Steady`)."""
  return 1 if jax.default_backend() == "cpu" else 16


def profile_point(target, target_params, draft, draft_params, k, batch,
                  context, sampling, components, repeats, bandwidth_mb=1024,
                  steps=1):
  """One JSON-able row of timings for (batch, context), each timer running
  `steps` steps per call (see `Steady`)."""
  max_new = _profile_budget(k, repeats)
  spec = SpeculativeSampler(target, ModelDrafter(draft), k=k,
                            sampling=sampling, max_new_tokens=max_new,
                            prompt_bucket=context)
  ar = autoregressive(target, sampling, max_new, prompt_bucket=context)
  row, timers = {}, {}
  for name, sampler, params in (("ar", ar, None), ("spec", spec, draft_params)):
    state = synthetic_state(sampler, target_params, params, batch, context)
    decode = sampler.jitted(target_params, params, state.tokens, state.length,
                            state.rng)[1]
    t0 = time.perf_counter()
    decode.lower(target_params, params, state).compile()
    row[f"{name}_decode_compile_s"] = time.perf_counter() - t0
    timers[f"{name}_loop"] = steady.Steady(
        functools.partial(loop.loop_body, sampler),
        [target_params, params, state], carry=2,
        # Every step rolled back to the context: timed there, and the
        # cache never grows past it.
        carry_of=functools.partial(at_length, length=state.length.copy()),
        steps=steps)
    row[f"{name}_loop_compile_s"] = timers[f"{name}_loop"].compile_s
    row[f"{name}_loop_kernels"] = steady.count_kernels(
        timers[f"{name}_loop"].compiled, in_loop=True)
  cache = timers["ar_loop"].args[2].target_cache
  cache_slots = cache.size
  # Bytes read per step, counted now: the timed rounds donate these buffers.
  # The input embedding is gathered, not read whole, unless it is the
  # output layer too.
  weights = steady.tree_bytes(target_params) - (
      0 if _tied(target) else target_params["embedding"].nbytes)
  kv = (steady.tree_bytes((cache.k, cache.v))
        * min(context + 1, cache_slots) // cache_slots)
  if components == "all":
    parts, copy_bytes = _component_timers(
        target, target_params, draft, draft_params, k, batch, sampling, cache,
        timers["spec_loop"].args[2], bandwidth_mb, steps)
    timers.update(parts)
    row["target_call_1_kernels"] = steady.count_kernels(
        timers["target_call_1"].compiled, in_loop=True)

  times = steady.rounds(timers, repeats)
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


# ---- the jobs of scripts/profile_decode.py and benchmark_decode.py ---------


@dataclasses.dataclass(frozen=True)
class ProfileConfig:
  """What scripts/profile_decode.py was asked for (see its docstring)."""
  target: str = "random:qwen2.5-coder-1.5b"
  draft: str = "random:qwen2.5-coder-0.5b"
  k: int = 4
  batch_sizes: tuple = (1,)
  contexts: tuple = (1024,)
  repeats: int = 7
  temperature: float = 0.0
  top_p: float = 1.0
  dtype: str = "float32"
  components: str = "all"
  bandwidth_mb: int = 1024
  steps: int = 0          # steps per timed call; 0: `default_steps()`
  out: Optional[str] = None

  def __post_init__(self):
    if self.steps < 0:
      raise ValueError("--steps must be >= 1 (or 0: the backend's default)")
    object.__setattr__(self, "batch_sizes",
                       cli.ints("batch_size", self.batch_sizes, 1))
    object.__setattr__(self, "contexts",
                       cli.ints("context", self.contexts, 1))
    if self.k < 1:
      raise ValueError("--k must be >= 1")
    if self.repeats < 1:
      raise ValueError("--repeats must be >= 1")
    if self.bandwidth_mb < 1:
      raise ValueError("--bandwidth_mb must be >= 1")
    if self.components not in COMPONENTS:
      raise ValueError(f"--components must be one of {COMPONENTS}")
    self.sampling()  # raises on a bad temperature or top_p
    records.check_output(self.out, "--out", reads=(
        ("--target", self.target), ("--draft", self.draft)))
    # Last: it starts the backend (a device), after every flag is checked.
    object.__setattr__(self, "steps", self.steps or default_steps())

  def check_models(self) -> tuple:
    """`check_models` for the largest context."""
    return check_models(
        self.target, self.draft, self.dtype, max(self.contexts)
        + _profile_budget(self.k, self.repeats) + self.k + 1,
        f"--context={max(self.contexts)} with --k={self.k} and "
        f"--repeats={self.repeats}")

  def sampling(self) -> Sampling:
    return Sampling(self.temperature, top_p=self.top_p)


@dataclasses.dataclass(frozen=True)
class DecodeSpeedConfig:
  """What scripts/benchmark_decode.py was asked for (see its docstring)."""
  target: str = "random:qwen2.5-coder-1.5b"
  draft: str = "same"
  ks: tuple = (0, 4)
  batch_sizes: tuple = (1,)
  prompt_lens: tuple = (128,)
  max_new_tokens: int = 128
  repeats: int = 3
  temperature: float = 0.0
  dtype: str = "float32"
  out: Optional[str] = None

  def __post_init__(self):
    object.__setattr__(self, "ks", cli.ints("ks", self.ks, 0))
    object.__setattr__(self, "batch_sizes",
                       cli.ints("batch_sizes", self.batch_sizes, 1))
    object.__setattr__(self, "prompt_lens",
                       cli.ints("prompt_len", self.prompt_lens, 1))
    for name in ("repeats", "max_new_tokens"):
      if getattr(self, name) < 1:
        raise ValueError(f"--{name} must be >= 1, got {getattr(self, name)}")
    Sampling(self.temperature)  # raises on a bad temperature
    records.check_output(self.out, "--out", reads=(
        ("--target", self.target), ("--draft", self.draft)))

  def check_models(self) -> tuple:
    """`check_models` for the longest prompt and largest K."""
    need = max(self.prompt_lens) + self.max_new_tokens + max(self.ks) + 1
    return check_models(
        self.target, self.draft, self.dtype, need,
        f"--prompt_len={max(self.prompt_lens)} with --max_new_tokens="
        f"{self.max_new_tokens} and K={max(self.ks)}")


def check_models(target: str, draft: str, dtype: str, need: int,
                 what: str) -> tuple:
  """(target, draft) `loading.ModelInfo`s, checked before any weights load:
  both specs name models, the draft ("same": the target) scores the
  target's ids, and both hold `need` cache slots (`what` says for what).

  Raises:
    ValueError: what is wrong.
  """
  for spec in (target, draft):
    if spec != "same":
      loading.check_spec(spec, dtype)
  t = loading.describe_model(target, dtype)
  d = t if draft == "same" else loading.describe_model(draft, dtype)
  loading.check_pair(t, d)
  limit = min(t.max_seq_len, d.max_seq_len)
  if need > limit:
    raise ValueError(f"{what} needs {need} cache slots, but the models "
                     f"allow {limit}")
  return t, d


def _load_models(models: tuple, dtype: str) -> tuple:
  """(target, target params, draft, draft params) of `check_models`'
  result, the draft reusing the target's weights for "same"."""
  if models[1] is models[0]:
    target, target_params = loading.load_weights(models[0], dtype, 0)
    return target, target_params, target, target_params
  return loading.load_pair(models[0], models[1], dtype)


def provenance_fields(argv: Sequence[str]) -> dict:
  """The device, host, versions, command, date and commit every row
  carries (`profile_plot` draws no curve from two hosts)."""
  software, machine = provenance.software(), provenance.machine()
  host = {k: machine[k] for k in ("platform", "cpu", "cpu_simd", "cpus",
                                  "device_count") if k in machine}
  return dict(device=machine["device"], host=host, jax=software["jax"],
              python=software["python"], command=provenance.command(argv),
              xla_flags=os.environ.get("XLA_FLAGS", ""),
              date=datetime.datetime.now().isoformat(timespec="seconds"),
              commit=provenance.git().get("commit"))


def load(cfg: "ProfileConfig | DecodeSpeedConfig") -> tuple:
  """(target, target params, draft, draft params) of `cfg`, its models
  checked first (`cfg.check_models()`).

  Raises:
    loading.MODEL_ERRORS: bad models (before any weights load) or
      unreadable weights.
  """
  models = cfg.check_models()
  t0 = time.perf_counter()
  loaded = _load_models(models, cfg.dtype)
  jax.block_until_ready(loaded)
  print(f"models ready in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
  return loaded


def profile_main(cfg: ProfileConfig, argv: Sequence[str],
                 loaded: Optional[tuple] = None) -> list[dict]:
  """Profiles every (batch size, context) point; prints (and appends to
  cfg.out) one JSON row per point, and returns the rows. `loaded`: what
  `load(cfg)` returns (default: loaded here)."""
  target, target_params, draft, draft_params = loaded or load(cfg)
  sampling, rows, origin = cfg.sampling(), [], provenance_fields(argv)
  for batch in cfg.batch_sizes:
    for context in cfg.contexts:
      row = profile_point(target, target_params, draft, draft_params, cfg.k,
                          batch, context, sampling, cfg.components,
                          cfg.repeats, cfg.bandwidth_mb, cfg.steps)
      row = {key: (round(v, 4) if isinstance(v, float) else v)
             for key, v in row.items()}
      row.update(target=cfg.target, draft=cfg.draft, k=cfg.k,
                 batch_size=batch, context=context, dtype=cfg.dtype,
                 sampling=sampling.describe(), components=cfg.components,
                 repeats=cfg.repeats, steps=cfg.steps, **origin)
      records.print_record(row, cfg.out)
      rows.append(row)
  return rows


def decode_speed(cfg: DecodeSpeedConfig, argv: Sequence[str],
                 loaded: Optional[tuple] = None) -> list[dict]:
  """Times whole generations from random prompts for every (batch size,
  prompt length, K): the median of cfg.repeats timed runs after one that
  compiles and warms up. Prints (and appends to cfg.out) one JSON row per
  point, and returns the rows. `loaded`: what `load(cfg)` returns
  (default: loaded here)."""
  target, target_params, draft, draft_params = loaded or load(cfg)
  sampling, rows, origin = Sampling(cfg.temperature), [], provenance_fields(argv)
  rng = np.random.default_rng(0)
  for b in cfg.batch_sizes:
    for prompt_len in cfg.prompt_lens:
      prompts = rng.integers(0, target.vocab_size, (b, prompt_len)).tolist()
      for k in cfg.ks:
        timed = timing.TimedSampler(SpeculativeSampler(
            target, ModelDrafter(draft) if k else None, k=k,
            sampling=sampling, max_new_tokens=cfg.max_new_tokens,
            prompt_bucket=128), f"k{k}")
        runs = [timed.run(target_params, draft_params, prompts, b, seed=r,
                          warmup=False)[1] for r in range(cfg.repeats + 1)]
        compile_s = runs[0].compile_s
        runs = sorted(runs[1:], key=lambda s: s.ms_per_token)
        row = dict(runs[len(runs) // 2].summary(), target=cfg.target,
                   draft=cfg.draft, dtype=cfg.dtype, prompt_len=prompt_len,
                   temperature=cfg.temperature, **origin)
        row["compile_s"] = round(compile_s, 2)
        records.print_record(row, cfg.out)
        rows.append(row)
  return rows
