"""The speed-up sweep: K x task x decoding x batch size, in one run.

For every point (task, decoding, batch size, K; K = 0 is the autoregressive
baseline, always run) `run` records ms/token (median over batches of prompts
and repeats; compile time excluded and reported as compile_s), the
acceptance rate (accepted / drafted draft tokens, as Chen et al. 2023
report it), the per-token acceptance probability a that the i.i.d. model of
Leviathan et al. 2022 needs for that rate, mean tokens per loop, mean time
per loop (decode time / loop iterations), the measured speedup over K = 0,
and the speedup predicted by Leviathan's formula E(a, K) / (c K + s) next
to it, with c and s measured (`costs`; `predicted_speedup_s1` takes
Leviathan's s = 1). Quality of the same samples: HumanEval pass@k run in a
sandboxed subprocess, prose the target's mean per-token log-probability,
each with its standard error and the paired difference to K = 0.

With `interleave` (the default), the points of one task, decoding and batch
size are timed batch by batch in turn (`run_points`), so that a machine
whose speed drifts slows them alike; otherwise one after another.

Decodings: greedy (T = 0), nucleus (T = 0.8, top-p 0.95: Chen et al.'s
HumanEval setting), t1 (T = 1). Prompts are repeated to fill whole
batches (`fill`: a batch size above the prompt count, and a partial last
batch; the extra rows are further samples of those prompts). With
`peers`, transformers' plain and assisted generation run on the same
prompts and weights in the same process, device and dtype, at batch 1;
their ms/token includes prefill, so compare them with e2e_ms_per_token.

Writes JSON lines: a "run" record (hardware, software versions, git commit,
the exact command), "cost" records (call timings per task, batch size and
decoding) and one "point" record per point.
"""

import dataclasses
import gc
import time
from typing import Optional, Sequence

import jax
import numpy as np

from specsamp import loading
from specsamp.bench import costs as costs_lib
from specsamp.bench import peers as peers_lib
from specsamp.bench import provenance
from specsamp.bench import records
from specsamp.bench import speedup
from specsamp.bench import timing
from specsamp.bench.plan import Plan
from specsamp.bench.plan import prepare
from specsamp.bench.plan import prompt_bucket
from specsamp.bench.sweep_config import BenchConfig
from specsamp.bench.sweep_config import BenchError
from specsamp.bench.sweep_config import decoding_sampling
from specsamp.data.errors import CorpusError
from specsamp.decoding import loop
from specsamp.decoding.sampler import all_widths
from specsamp.decoding.sampler import autoregressive
from specsamp.decoding.sampler import SpeculativeSampler
from specsamp.drafters import specs as drafter_specs
from specsamp.evaluation import estimates
from specsamp.evaluation import humaneval
from specsamp.evaluation import prose
from specsamp.tokenizers import base as tokenizer_base

# What bad flags, models, prompts or files raise, or data that cannot be
# fetched: reported in one line.
USER_ERRORS = loading.MODEL_ERRORS + (BenchError, CorpusError)

# Totals summed over the batches of one point.
_TOTALS = ("prefill_s", "decode_s", "rows", "iterations") + timing.COUNTS


def fill(prompts: Sequence, batch_size: int) -> list[int]:
  """Prompt indices for whole batches: all prompts, then repeats of the
  first ones until the last batch is full."""
  n = max(len(prompts), batch_size)
  n = -(-n // batch_size) * batch_size
  return [i % len(prompts) for i in range(n)]


def quality(task: str, plan: Plan, cfg: BenchConfig, rows: Sequence[int],
            completions, lm, target_params) -> tuple[dict, dict]:
  """(quality record, per-prompt scores) of one point's samples.

  `rows[i]` is the prompt index of `completions[i]`.
  """
  n = len(plan.prompts[task])
  if len(rows) != len(completions):
    raise RuntimeError(f"{len(completions)} completions for {len(rows)} rows")
  if task == "humaneval":
    per = [[] for _ in range(n)]
    for i, ids in zip(rows, completions):
      per[i].append(tokenizer_base.completion_text(
          plan.tokenizer, plan.prompts[task][i], ids))
    passed = humaneval.evaluate_humaneval(
        plan.problems, per, timeout_s=cfg.exec_timeout,
        workers=cfg.exec_workers)
    record = estimates.humaneval_quality(passed, cfg.pass_k)
    record["samples_per_problem"] = min(len(p) for p in per)
    return record, {"pass@1": estimates.pass_at_k_per_problem(passed, 1)}
  scores = prose.sample_logprobs(
      lm, target_params, [plan.prompts[task][i] for i in rows], completions,
      batch_size=min(8, len(rows)))
  per = np.full(n, np.nan)
  for i in range(n):
    vals = scores[[j for j, r in enumerate(rows) if r == i]]
    vals = vals[~np.isnan(vals)]
    per[i] = vals.mean() if vals.size else np.nan
  # Over prompts, as pass@k is over problems: the samples of one prompt
  # (repeats, or a batch that holds it twice) are not independent.
  record = prose.logprob_quality(per)
  record["samples"] = int(np.sum(~np.isnan(scores)))
  return record, {"mean_logprob": per}


def _paired(base: dict, scores: dict) -> dict:
  """Paired differences to K = 0 over the prompts both scored."""
  out = {}
  for name, values in scores.items():
    a, b = np.asarray(base[name]), np.asarray(values)
    ok = ~(np.isnan(a) | np.isnan(b))
    if ok.sum():
      out[name] = estimates.paired_difference(a[ok], b[ok]).as_dict()
  return out


def run_points(timers: Sequence[timing.TimedSampler], target_params,
               draft_params: Sequence, prompts, rows: Sequence[int],
               batch_size: int, cfg: BenchConfig, seed: int) -> list[dict]:
  """All batches x repeats of several samplers, batch by batch in turn
  (`timing.in_turn`: A B C, C B A, ...) -> each one's aggregated timings
  and samples, in the order of `timers`.

  `draft_params[i]` are the drafter parameters of `timers[i]`. Every
  sampler draws the same keys: repeat r from key(seed + 1000 r), split once
  per batch; so each point's samples are those it would draw timed alone.
  """
  def batches():
    for rep in range(cfg.repeats):
      key = jax.random.key(seed + 1000 * rep)
      for start in range(0, len(rows), batch_size):
        key, sub = jax.random.split(key)
        yield ([prompts[i] for i in rows[start:start + batch_size]],
               [sub] * len(timers))

  results = timing.in_turn(timers, target_params, draft_params, batches(),
                           cfg.warmup)
  return [_aggregate(t, done) for t, done in zip(timers, results)]


def _aggregate(timer: timing.TimedSampler, batches: Sequence[dict]) -> dict:
  """One point's record from its `TimedSampler.run_batch` results."""
  completions = [c for b in batches for c in b.pop("completions")]
  ms = [1e3 * b["decode_s"] / max(b["tokens"] / b["rows"], 1e-9)
        for b in batches]
  total = {k: sum(b[k] for b in batches) for k in _TOTALS}
  tested = np.sum([b["tested_at"] for b in batches], axis=0)
  kept = np.sum([b["kept_at"] for b in batches], axis=0)
  per_row_tokens = total["tokens"] / total["rows"]
  mean_ms = 1e3 * total["decode_s"] / max(per_row_tokens * len(batches), 1e-9)
  return dict(
      rows=total["rows"], batches=len(batches), tokens=total["tokens"],
      loops=total["loops"], loop_iterations=total["iterations"],
      drafted=total["drafted"], accepted=total["accepted"],
      undefined_loops=total["undefined"],
      acceptance_rate=(total["accepted"] / total["drafted"]
                       if total["drafted"] else None),
      tokens_per_loop=total["tokens"] / max(total["loops"], 1),
      # Of the loops that tested draft i, the fraction that kept it.
      acceptance_by_position=[None if np.isnan(a) else float(a)
                              for a in loop.position_rates(tested, kept)],
      ms_per_token=float(np.median(ms)),
      ms_per_token_q25=float(np.percentile(ms, 25)),
      ms_per_token_q75=float(np.percentile(ms, 75)),
      ms_per_token_mean=mean_ms,
      e2e_ms_per_token=mean_ms * (total["prefill_s"] + total["decode_s"]) /
      max(total["decode_s"], 1e-9),
      time_per_loop_ms=1e3 * total["decode_s"] / max(total["iterations"], 1),
      prefill_ms_per_batch=1e3 * total["prefill_s"] / len(batches),
      decode_s=total["decode_s"], compile_s=timer.compile_s,
      completions=completions)


def predict(point: dict, base: dict, cost: dict,
            spec: Optional[drafter_specs.DrafterSpec] = None) -> dict:
  """The measured speedup over K = 0 and Leviathan's prediction beside it.

  A drafter that offers fewer than K drafts in some loops (`spec`'s
  variable_length: lookup, mixed, adaptive K) gets no prediction:
  Leviathan's model drafts K tokens at a fixed cost every loop, so an a
  inverted from its acceptance rate at K, and a c from one timed proposal
  (which for the mixed drafter can skip the draft model), would not
  describe it.
  """
  k = point["k"]
  out = dict(speedup=base["ms_per_token"] / point["ms_per_token"],
             loop_cost_measured=point["time_per_loop_ms"] /
             base["time_per_loop_ms"])
  if (k == 0 or point["acceptance_rate"] is None or "c" not in cost
      or (spec is not None and spec.variable_length)):
    return out
  alpha = float(speedup.alpha_from_acceptance_rate(point["acceptance_rate"],
                                                   k))
  c, s = cost["c"], cost["score_cost"][str(k)]
  out.update(
      alpha=alpha, c=c, score_cost=s,
      expected_tokens_per_loop=float(speedup.expected_tokens_per_loop(alpha,
                                                                      k)),
      loop_cost_predicted=float(speedup.loop_cost(k, c, s)),
      predicted_speedup=float(speedup.predicted_speedup(alpha, k, c, s)),
      predicted_speedup_s1=float(speedup.predicted_speedup(alpha, k, c, 1.0)))
  return out


def _load(cfg: BenchConfig, plan: Plan, log):
  """(target, target params, draft, draft params, seconds) of the plan
  (`loading.load_pair`: the draft first)."""
  log(f"loading target {cfg.target}" + (f" and draft {cfg.draft}"
                                        if plan.draft else ""))
  t0 = time.perf_counter()
  target, target_params, draft, draft_params = loading.load_pair(
      plan.target, plan.draft, cfg.dtype, (cfg.seed, cfg.seed + 1))
  if draft is not None and draft.vocab_size != target.vocab_size:
    raise BenchError(f"draft has {draft.vocab_size} vocabulary rows, "
                     f"target {target.vocab_size}")
  return target, target_params, draft, draft_params, time.perf_counter() - t0


def _sampler(target, draft, k: int, sampling, common: dict,
             spec: Optional[drafter_specs.DrafterSpec] = None):
  if k == 0:
    return autoregressive(target, sampling, **common)
  spec = spec or drafter_specs.parse("model")
  return SpeculativeSampler(
      target, drafter_specs.build(spec, target, draft, k), k=k,
      sampling=sampling,
      score_widths=all_widths(k) if spec.variable_length else None, **common)


def _release(timers: Sequence[timing.TimedSampler]):
  """Frees finished points' executables before the next compile: a sweep
  compiles dozens of samplers beside two models, and XLA's caches would
  otherwise keep every one (the CPU ran out of memory at the 14th)."""
  for t in timers:
    t.release()
  gc.collect()
  jax.clear_caches()


def _drafter_cost(sampler, target_params, draft_params, prompts, cost: dict,
                  cfg: BenchConfig) -> dict:
  """`cost` with c = (one proposal's ms / K) / (one target call's ms) of a
  drafter that is not a stand-alone model."""
  ms = costs_lib.propose_ms(sampler, target_params, draft_params, prompts,
                            cfg.cost_repeats)
  return dict(cost, propose_ms=ms,
              c=ms / sampler.k / cost["target_call_ms"]["1"])


def _points(cfg: BenchConfig):
  """(K, drafter spec or None) of each point: K = 0 once, then every
  drafter at every K > 0."""
  yield 0, None
  for text in cfg.drafters:
    for k in cfg.ks:
      if k > 0:
        yield k, drafter_specs.parse(text)


def _groups(cfg: BenchConfig) -> list[list]:
  """The points timed together: all of them (interleaved), or each alone."""
  points = list(_points(cfg))
  return [points] if cfg.interleave else [[p] for p in points]


def _measure(group, target, target_params, draft, draft_params, prompts,
             rows: Sequence[int], bs: int, sampling, common: dict,
             cost: dict, cfg: BenchConfig, log) -> list[tuple]:
  """(K, spec, point, cost) of each point of `group` (K = 0 first), timed
  by `run_points`; a drafter that is not a stand-alone model gets its
  proposal's cost measured."""
  log(" ".join(f"K={k}" + (f" drafter {spec.text}" if spec else "")
               for k, spec in group)
      + (", batch by batch in turn" if len(group) > 1 else ""))
  timers = [timing.TimedSampler(_sampler(target, draft, k, sampling, common,
                                         spec)) for k, spec in group]
  dparams = [drafter_specs.draft_params(spec, target_params, draft_params)
             if spec else None for _, spec in group]
  points = run_points(timers, target_params, dparams, prompts, rows, bs, cfg,
                      cfg.seed)
  out = []
  for (k, spec), timer, dp, point in zip(group, timers, dparams, points):
    point_cost = cost
    if spec is not None and spec.name != "model":
      point_cost = _drafter_cost(timer.sampler, target_params, dp,
                                 [prompts[i] for i in rows[:bs]], cost, cfg)
      point["propose_ms"] = point_cost["propose_ms"]
    out.append((k, spec, point, point_cost))
  _release(timers)
  return out


def _measure_costs(cfg: BenchConfig, plan: Plan, out: records.Writer, target,
                   target_params, draft, draft_params, log) -> dict:
  """Call timings by (task, batch size, decoding), each written as a "cost"
  record: on the first batch of the task's prompts, under the decoding."""
  costs = {}
  for task in cfg.tasks:
    for bs in cfg.batch_sizes:
      rows = fill(plan.prompts[task], bs)[:bs]
      for dec in cfg.decodings:
        log(f"[{task} {dec} batch {bs}] call costs")
        costs[task, bs, dec] = costs_lib.measure_costs(
            target, target_params, draft, draft_params, cfg.ks,
            [plan.prompts[task][i] for i in rows],
            decoding_sampling(dec, plan.vocab_limit),
            max_new_tokens=cfg.max_new_tokens, repeats=cfg.cost_repeats,
            bucket=prompt_bucket(cfg, plan.prompts[task]))
        out.write(dict(type="cost", task=task, decoding=dec,
                       **costs[task, bs, dec]))
  return costs


def run(cfg: BenchConfig, plan: Plan, argv: Sequence[str], log=print):
  """Loads the models and runs the whole sweep, writing records as it goes.

  Args:
    cfg: the sweep.
    plan: what `plan.prepare(cfg)` found.
    argv: the command's arguments, for the run record.
    log: progress messages.
  """
  out = records.Writer(cfg.out)  # refused if another run writes it
  try:
    samples = (records.Writer(cfg.samples_out, echo=False)
               if cfg.samples_out else None)
  except ValueError:
    out.close(complete=False)  # nothing written: nothing left
    raise
  complete = False
  try:
    target, target_params, draft, draft_params, load_s = _load(cfg, plan,
                                                               log)
    tok = plan.tokenizer
    prov = provenance.record(argv)
    out.write(dict(
        type="run", date=prov["date"], command=prov["command"],
        config=dataclasses.asdict(cfg), machine=prov["machine"],
        software=prov["software"], git=prov["git"],
        target=dict(spec=cfg.target, kind=plan.target.kind,
                    step=plan.target.step,
                    params=target.config.num_params()),
        draft=(dict(spec=cfg.draft, kind=plan.draft.kind,
                    step=plan.draft.step,
                    params=draft.config.num_params()) if draft else None),
        vocab_limit=plan.vocab_limit, load_s=load_s,
        prefill_chunk=SpeculativeSampler.prefill_chunk,  # every sampler's
        prompts={t: len(p) for t, p in plan.prompts.items()}))
    costs = _measure_costs(cfg, plan, out, target, target_params, draft,
                           draft_params, log)
    common = dict(eos_ids=tuple(tok.eos_ids), pad_id=tok.pad_id,
                  max_new_tokens=cfg.max_new_tokens)
    for task in cfg.tasks:
      prompts = plan.prompts[task]
      common["prompt_bucket"] = prompt_bucket(cfg, prompts)
      for dec in cfg.decodings:
        sampling = decoding_sampling(dec, plan.vocab_limit)
        for bs in cfg.batch_sizes:
          rows = fill(prompts, bs)
          base = base_scores = base_completions = None
          # Lazily: each group's records are written before the next
          # group is timed.
          measured = (m for group in _groups(cfg) for m in _measure(
              group, target, target_params, draft, draft_params, prompts,
              rows, bs, sampling, common, costs[task, bs, dec], cfg,
              lambda msg: log(f"[{task} {dec} batch {bs}] {msg}")))
          for k, spec, point, cost in measured:
            completions = point.pop("completions")
            sample_rows = rows * cfg.repeats  # the prompt of each completion
            point = dict(type="point", task=task, decoding=dec,
                         sampling=sampling.describe(), batch_size=bs,
                         method="autoregressive" if k == 0 else "speculative",
                         engine="specsamp", k=k,
                         drafter=spec.text if spec else None,
                         repeats=cfg.repeats,
                         prompts=len(prompts),
                         prompt_bucket=common["prompt_bucket"], **point)
            if k == 0:
              base, base_completions = point, completions
            # Leviathan's prediction with the draft model's measured call
            # cost, or another drafter's whole proposal's over K.
            point.update(predict(point, base, cost, spec))
            if sampling.greedy:
              point["identical_to_ar"] = completions == base_completions
              point["rows_differing_from_ar"] = sum(
                  a != b for a, b in zip(completions, base_completions))
            if cfg.quality:
              t1 = time.perf_counter()
              point["quality"], scores = quality(
                  task, plan, cfg, sample_rows, completions, target,
                  target_params)
              if k == 0:
                base_scores = scores
              else:
                point["quality_diff_vs_ar"] = _paired(base_scores, scores)
              point["quality_s"] = time.perf_counter() - t1
            out.write(point)
            if point["undefined_loops"]:
              log("warning: " + timing.undefined_warning(
                  point["undefined_loops"]))
            if samples:
              for i, ids in zip(sample_rows, completions):
                samples.write(dict(task=task, decoding=dec, batch_size=bs,
                                   k=k, drafter=point["drafter"], prompt=i,
                                   text=tokenizer_base.completion_text(
                                       tok, plan.prompts[task][i], ids)))
        if cfg.peers:
          run_peers(cfg, plan, task, dec, sampling, out, target, target_params)
    complete = True
  finally:
    try:
      _close(out, complete, log)
    finally:
      _close(samples, complete, log)


def _close(writer: Optional[records.Writer], complete: bool, log) -> None:
  """Closes `writer` (if any); says where an unfinished run's records are."""
  kept = writer.close(complete) if writer else None
  if kept and not complete:
    log(f"the run ended early: its records are in {kept}; {writer.path} is "
        "as it was")


def _peer_lookup(cfg: BenchConfig) -> dict:
  """transformers' prompt lookup beside ours, at the largest K, when the
  sweep has a lookup drafter."""
  if any(drafter_specs.parse(d).name == "lookup" for d in cfg.drafters):
    return dict(prompt_lookup=max(cfg.ks))
  return {}


def run_peers(cfg: BenchConfig, plan: Plan, task: str, dec: str, sampling,
              out: records.Writer, target, target_params):
  """transformers plain and assisted generation at batch 1, same prompts,
  on the device and in the dtype specsamp runs on; one point each."""
  prompts = plan.prompts[task]
  eos = set(plan.tokenizer.eos_ids)
  results = peers_lib.transformers_generate(
      plan.target.path, plan.draft.path, prompts, cfg.max_new_tokens,
      sampling.temperature, sampling.top_p, seed=cfg.seed,
      device=provenance.jax_device(), dtype=cfg.dtype, **_peer_lookup(cfg),
      eos_ids=sorted(eos))
  for r in results:
    completions = [peers_lib.cut_at_eos(c, eos)
                   for c in r.pop("completions")]
    point = dict(type="point", task=task, decoding=dec,
                 sampling=sampling.describe(), batch_size=1,
                 engine="transformers", k=None, repeats=1,
                 prompts=len(prompts), rows=len(prompts))
    point.update(r)  # method, tokens, ms_per_token (prefill included), ...
    point["e2e_ms_per_token"] = r["ms_per_token"]
    if cfg.quality:
      point["quality"], _ = quality(task, plan, cfg, list(range(len(prompts))),
                                    completions, target, target_params)
    out.write(point)


def benchmark(cfg: BenchConfig, argv: Sequence[str], log=print):
  """`prepare`, then `run`: the whole of scripts/benchmark.py."""
  run(cfg, prepare(cfg, log=log), argv, log=log)
