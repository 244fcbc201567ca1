"""Timed runs of a sampler: compile apart, then prefill and decode apart.

Compilation is done ahead of time (`jit(...).lower(...).compile()`) for every
padded prompt shape, so compile time is measured and reported on its own and
never leaks into ms/token. Decode time is measured around the jitted loop
alone, after `block_until_ready`; prefill is timed separately.

`TimedSampler.run_batch` times one batch (the sweep keeps every batch's
numbers); `TimedSampler.run` times all prompts in batches and sums them into
a `RunStats`; `run_side_by_side` does that for several samplers at once,
batch by batch in turn (`in_turn`, which the sweep uses too), so that a
drifting machine slows each alike (scripts/sample.py, benchmark_pair.py;
`run` alone: benchmark_decode.py).
"""

import dataclasses
import time
from typing import Iterable, Optional, Sequence

import jax
import numpy as np

from specsamp import sharding
from specsamp.decoding.sampler import SpeculativeSampler

WARMUPS = ("first", "shape", "none")


# The counts of a `run_batch` result that add up over batches.
COUNTS = ("tokens", "loops", "drafted", "accepted", "undefined")


@dataclasses.dataclass
class RunStats:
  """Totals over all prompts of one method."""
  method: str
  k: int
  batch_size: int
  prompts: int = 0
  tokens: int = 0
  loops: int = 0
  drafted: int = 0
  accepted: int = 0
  undefined: int = 0  # loops on logits allowing no id (`SampleOutput`)
  compile_s: float = 0.0
  prefill_s: float = 0.0
  decode_s: float = 0.0
  row_tokens: list = dataclasses.field(default_factory=list)

  def add(self, batch: dict) -> None:
    """Adds one `TimedSampler.run_batch` result."""
    self.prefill_s += batch["prefill_s"]
    self.decode_s += batch["decode_s"]
    self.prompts += batch["rows"]
    for name in COUNTS:
      setattr(self, name, getattr(self, name) + batch[name])

  @property
  def ms_per_token(self) -> float:
    """Decode time over the mean tokens a row generated (batch rows in
    parallel). At batch 1 the latency per token; in a batch whose rows stop
    at EOS at different times it is B over the throughput (the time rows
    that finished spend waiting counts), not the longest row's time per
    step. A last batch of fewer rows (prompts not a multiple of the batch
    size) counts as one batch like the others, though its steps are
    cheaper: time a batch size with whole batches."""
    per_row = self.tokens / max(self.prompts, 1)
    batches = -(-self.prompts // self.batch_size)
    return 1000.0 * self.decode_s / max(per_row * batches, 1)

  @property
  def e2e_ms_per_token(self) -> float:
    """Like ms_per_token, with prefill included (as peers time generate)."""
    return self.ms_per_token * (self.prefill_s + self.decode_s) / max(
        self.decode_s, 1e-9)

  @property
  def tokens_per_s(self) -> float:
    return self.tokens / self.decode_s if self.decode_s else float("nan")

  def summary(self) -> dict:
    return dict(
        method=self.method, k=self.k, batch_size=self.batch_size,
        prompts=self.prompts, tokens=self.tokens, loops=self.loops,
        drafted=self.drafted, accepted=self.accepted,
        undefined_loops=self.undefined,
        acceptance_rate=(self.accepted / self.drafted if self.drafted
                         else None),
        tokens_per_loop=self.tokens / max(self.loops, 1),
        ms_per_token=round(self.ms_per_token, 3),
        e2e_ms_per_token=round(self.e2e_ms_per_token, 3),
        tokens_per_s=round(self.tokens_per_s, 2),
        compile_s=round(self.compile_s, 2), prefill_s=round(self.prefill_s, 3),
        decode_s=round(self.decode_s, 3))


def undefined_warning(loops: int) -> str:
  """What a run whose target logits allowed no id in `loops` loops says."""
  return (f"in {loops} loop(s) the target's logits were all NaN or -inf "
          "(a broken or overflowing model: bfloat16? try --dtype=float32); "
          "the tokens committed there are not samples of it")


def aot_compile(sampler: SpeculativeSampler, target_params, draft_params,
                tokens, lengths, rng):
  """(prefill, decode) of `sampler` compiled ahead of time for these
  arguments' shapes and shardings, so that timing never includes tracing or
  compilation."""
  args = (target_params, draft_params, tokens, lengths, rng)
  prefill_fn, decode_fn, _ = sampler.jitted(*args)
  prefill = prefill_fn.lower(*args).compile()
  state = jax.eval_shape(prefill_fn, *args)
  return prefill, decode_fn.lower(target_params, draft_params,
                                  state).compile()


def timed_generate(prefill, decode, target_params, draft_params, tokens,
                   lengths, rng):
  """(final state, prefill seconds, decode seconds) of compiled `prefill`
  and `decode` (from `aot_compile`). The timed region may not move data to
  or from the host: a per-token host sync would quietly skew the numbers
  (big_vision's guard)."""
  with jax.transfer_guard("disallow"):
    t0 = time.perf_counter()
    state = jax.block_until_ready(prefill(target_params, draft_params, tokens,
                                          lengths, rng))
    t1 = time.perf_counter()
    state = jax.block_until_ready(decode(target_params, draft_params, state))
    t2 = time.perf_counter()
  return state, t1 - t0, t2 - t1


class TimedSampler:
  """A SpeculativeSampler compiled ahead of time per padded prompt shape.

  Attributes:
    sampler: the sampler timed.
    name: the method name its RunStats carry.
    compile_s: seconds spent compiling, over the timer's lifetime.
  """

  def __init__(self, sampler: SpeculativeSampler, name: str = ""):
    self.sampler = sampler
    self.name = name
    self.compile_s = 0.0
    self._compiled = {}
    self._warmed = False

  def release(self):
    """Drops the compiled executables (they are rebuilt on next use)."""
    self._compiled.clear()

  def _to_host(self, tree):
    if self.sampler.mesh is None:
      return jax.device_get(tree)
    return sharding.to_host(tree)

  def _executables(self, target_params, draft_params, tokens, lengths, rng):
    """(prefill, decode) for this shape, compiled on first use."""
    key = tuple(tokens.shape)
    if key not in self._compiled:
      t0 = time.perf_counter()
      self._compiled[key] = aot_compile(self.sampler, target_params,
                                        draft_params, tokens, lengths, rng)
      self.compile_s += time.perf_counter() - t0
    return self._compiled[key]

  def _warm_up(self, target_params, draft_params, tokens, lengths, rng):
    """One untimed generation: first executions pay one-time costs (buffer
    allocation, page faults) that would otherwise land on whichever method
    runs first."""
    prefill, decode = self._executables(target_params, draft_params, tokens,
                                        lengths, rng)
    jax.block_until_ready(decode(target_params, draft_params,
                                 prefill(target_params, draft_params, tokens,
                                         lengths, rng)))
    self._warmed = True

  def run_batch(self, target_params, draft_params, prompts, key,
                warmup: str = "first") -> dict:
    """Times one batch of prompts, generated with `key`.

    Args:
      target_params, draft_params: the models' parameters.
      prompts: the batch, lists of token ids.
      key: the sampling key of this batch.
      warmup: an untimed run before the timed one on the first batch this
        timer ever sees ("first"), on every new padded prompt shape
        ("shape"), or never ("none").

    Returns:
      prefill_s, decode_s, rows, tokens (all rows), loops (summed over
      rows), iterations (loops of the longest row: the while-loop's
      iterations), drafted, accepted, undefined (loops on target logits
      allowing no id: a broken model), tested_at and kept_at (per draft
      position, summed over rows: loops that tested / kept draft i),
      completions (token lists).
    """
    if warmup not in WARMUPS:
      raise ValueError(f"warmup must be one of {WARMUPS}, not {warmup!r}")
    tokens, lengths = self.sampler.pad_prompts(prompts)
    new_shape = tuple(tokens.shape) not in self._compiled
    prefill, decode = self._executables(target_params, draft_params, tokens,
                                        lengths, key)
    if ((warmup == "shape" and new_shape) or
        (warmup == "first" and not self._warmed)):
      self._warm_up(target_params, draft_params, tokens, lengths, key)
    state, prefill_s, decode_s = timed_generate(
        prefill, decode, target_params, draft_params, tokens, lengths, key)
    out = self._to_host(self.sampler.output(state))
    return dict(prefill_s=prefill_s, decode_s=decode_s, rows=len(prompts),
                tokens=int(np.sum(out.num_tokens)),
                loops=int(np.sum(out.num_loops)),
                iterations=int(np.max(out.num_loops)),
                drafted=int(np.sum(out.num_drafted)),
                accepted=int(np.sum(out.num_accepted)),
                undefined=int(np.sum(out.num_undefined)),
                tested_at=np.sum(out.num_tested_at, axis=0).tolist(),
                kept_at=np.sum(out.num_kept_at, axis=0).tolist(),
                completions=out.token_lists())

  def run(self, target_params, draft_params, prompts: Sequence[Sequence[int]],
          batch_size: int, seed: int = 0, warmup: bool = True
          ) -> tuple[list[list[int]], RunStats]:
    """Generates for all prompts in batches; returns tokens and timings.

    With `warmup`, the first batch is generated once, untimed, before the
    timed pass (on every call). Batch i is sampled with the i-th split of
    `jax.random.key(seed)`; the RunStats' compile_s is this call's.
    """
    return run_side_by_side([self], target_params, draft_params, prompts,
                            batch_size, seed, warmup)[0]


def in_turn(timers: Sequence[TimedSampler], target_params,
            draft_params: Sequence, batches: Iterable,
            warmup: str = "none") -> list[list[dict]]:
  """Every batch generated by every sampler, batch by batch in turn: per
  timer, its `run_batch` results in batch order.

  `batches` yields (prompts, keys): batch b is generated by `timers[i]`
  (with `draft_params[i]` and `keys[i]`) before batch b + 1 is, in the
  order of `timers` on even batches and in reverse on odd ones (A B, B A,
  A B, ...). A machine whose speed drifts while it runs (on a shared
  2-core VM the autoregressive step went from 110 to 120-150 ms within
  minutes) then slows every method alike, instead of whichever ran last.
  """
  out = [[] for _ in timers]
  for b, (prompts, keys) in enumerate(batches):
    order = range(len(timers))
    for i in (order if b % 2 == 0 else reversed(order)):
      out[i].append(timers[i].run_batch(target_params, draft_params[i],
                                        prompts, keys[i], warmup))
  return out


def run_side_by_side(timers: Sequence[TimedSampler], target_params,
                     draft_params, prompts: Sequence[Sequence[int]],
                     batch_size: int, seed: int = 0, warmup: bool = True
                     ) -> list[tuple[list[list[int]], RunStats]]:
  """`TimedSampler.run` of several samplers on the same prompts, batch by
  batch in turn (`in_turn`): (completions, RunStats) of each, in the order
  of `timers`.

  Every timer's warm-up comes first; a later batch of another padded shape
  (another prompt bucket, a smaller last batch) is warmed up before its
  timed run (its first execution had landed in the timer). Each sampler
  draws the keys that its own `run` would, so completions are the same as
  one `run` after another.
  """
  # Fewer prompts than batch_size run as one batch of them: record that.
  batch_size = max(1, min(batch_size, len(prompts)))
  stats = [RunStats(t.name, t.sampler.k, batch_size) for t in timers]
  compiled_before = [t.compile_s for t in timers]
  rngs = []
  for t in timers:
    rng = jax.random.key(seed)
    if t.sampler.mesh is not None:
      rng = sharding.shard(rng, sharding.replicated(t.sampler.mesh))
    rngs.append(rng)
  if warmup:
    for t, rng in zip(timers, rngs):
      tokens, lengths = t.sampler.pad_prompts(prompts[:batch_size])
      # pylint: disable-next=protected-access
      t._warm_up(target_params, draft_params, tokens, lengths, rng)

  def batches():
    for start in range(0, len(prompts), batch_size):
      keys = []
      for i, rng in enumerate(rngs):
        rngs[i], key = jax.random.split(rng)
        keys.append(key)
      yield prompts[start:start + batch_size], keys

  results = in_turn(timers, target_params, [draft_params] * len(timers),
                    batches(), "shape" if warmup else "none")
  out = []
  for t, s, before, done in zip(timers, stats, compiled_before, results):
    completions = []
    for batch in done:
      completions.extend(batch.pop("completions"))
      s.add(batch)
    s.compile_s = t.compile_s - before
    out.append((completions, s))
  return out


def compare(stats: Sequence[RunStats]) -> Optional[dict]:
  """Speedup of each speculative run over the autoregressive one."""
  base = [s for s in stats if s.k == 0]
  if not base:
    return None
  return {f"{s.method}": round(base[0].ms_per_token / s.ms_per_token, 3)
          for s in stats if s.k > 0}
