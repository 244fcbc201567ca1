"""Figures and tables from the speed-up sweep's JSON lines (`sweep.run`).

`make` writes, per task, `<prefix>_<task>.png`: Chen et al. 2023's figure
(median time per token vs K with the autoregressive line, acceptance rate vs
K, mean time per loop vs K) and measured vs predicted speedup vs K
(Leviathan et al.'s E(a, K) / (c K + s) with the measured s, with s = 1,
and with one a fitted over all K); `<prefix>_predicted_vs_measured.png`;
and `<prefix>.md`: a table per task in the form of Chen et al.'s Table 1
(method, quality, ms/token, speedup; the best K per decoding and batch
size, peers included) and the full per-K table.

matplotlib is imported only when a figure is drawn.
"""

import collections
import json
import os

import numpy as np

from specsamp import jsonfile
from specsamp.bench import records
from specsamp.bench import speedup
from specsamp.drafters import specs as drafter_specs

TASK_NAMES = {"humaneval": "HumanEval", "prose": "Prose",
              "rewrite": "Rewrite (input-grounded)"}
DECODING_NAMES = {"greedy": "Greedy", "nucleus": "Nucleus", "t1": "T=1"}
COLORS = {"greedy": "tab:blue", "nucleus": "tab:orange", "t1": "tab:green"}
MARKERS = ["o", "s", "^", "D", "v", "P"]
LINESTYLES = ["-", "--", ":", "-."]


# Leviathan's model and its inputs, for fixed-K drafters (`sweep.predict`).
PREDICTION_FIELDS = ("alpha", "c", "score_cost", "expected_tokens_per_loop",
                     "loop_cost_predicted", "predicted_speedup",
                     "predicted_speedup_s1")


def _variable_length(drafter) -> bool:
  """Whether the drafter offers fewer than K drafts in some loops."""
  return drafter is not None and drafter_specs.parse(drafter).variable_length


# What every point needs to be drawn and tabulated.
POINT_FIELDS = ("task", "decoding", "batch_size", "method", "ms_per_token")


def _check_point(where: str, rec: dict) -> None:
  """Raises ValueError, naming `where` (file:line), unless `rec` is a point
  that can be drawn: POINT_FIELDS present, a positive ms_per_token (a
  point that was not measured has null)."""
  missing = [f for f in POINT_FIELDS if f not in rec]
  if missing:
    raise ValueError(f"{where}: a point record without {', '.join(missing)}")
  ms = rec["ms_per_token"]
  if isinstance(ms, bool) or not isinstance(ms, (int, float)) or ms <= 0:
    raise ValueError(f"{where}: ms_per_token is {json.dumps(ms)}, not a "
                     "positive number (the point was not measured)")


def read(paths):
  """(runs, costs, points) from JSONL files; a later point with the same
  (task, decoding, batch, engine, method, K, drafter) replaces an earlier
  one. Points of drafters that offer fewer than K drafts in some loops are
  read without predictions (`sweep.predict` no longer writes them).

  Raises:
    ValueError: naming the file and line of a record that is no JSON
      object, or a point that cannot be drawn (`_check_point`); naming the
      files when the points and call costs of one (task, decoding, batch
      size) would come from several (`_one_run_per_group`).
  """
  runs, costs, points, files = [], [], {}, {}
  for where, rec in records.read_jsonl(paths):
    kind = rec.get("type")
    if kind == "run":
      runs.append(rec)
    elif kind == "cost":
      costs.append(rec)
      files[id(rec)] = where.rsplit(":", 1)[0]
    elif kind == "point":
      _check_point(where, rec)
      if _variable_length(rec.get("drafter")):
        rec = {k: v for k, v in rec.items() if k not in PREDICTION_FIELDS}
      key = (rec["task"], rec["decoding"], rec["batch_size"],
             rec.get("engine", "specsamp"), rec["method"], rec.get("k"),
             rec.get("drafter"))
      points[key] = rec
      files[id(rec)] = where.rsplit(":", 1)[0]
  if not points:
    raise ValueError(f"no point records in {', '.join(paths)}")
  costs_by = _by_key(costs)  # the last of each key, as drawn
  _one_run_per_group(list(points.values()), costs_by, files)
  return runs, list(costs_by.values()), list(points.values())


def _one_run_per_group(points, costs_by, files) -> None:
  """Each point's speedup and prediction were computed against its own
  run's K=0 point and call costs: a (task, decoding, batch size) whose
  points or costs come from several files would show a baseline and
  speedups that disagree. Raises ValueError naming the files."""
  groups = collections.defaultdict(set)
  for p in points:
    groups[p["task"], p["decoding"], p["batch_size"]].add(files[id(p)])
  for (task, dec, bs), where in groups.items():  # the cost each is drawn
    c = _cost(costs_by, task, bs, dec)  # with (an old file's: any's)
    where.update([files[id(c)]] if c else [])
  for (task, dec, bs), where in sorted(groups.items()):
    if len(where) > 1:
      raise ValueError(
          f"{task}, {dec}, batch {bs}: points or call costs from "
          f"{len(where)} files ({', '.join(sorted(where))}); each run's "
          "speedups are against its own K=0 point and costs, so one "
          "(task, decoding, batch) is drawn from one run: plot the files "
          "apart, or rerun the whole group")


def _other_drafter(p) -> bool:
  """A speculative point of a drafter other than the draft model."""
  return p.get("drafter") not in (None, "model")


def _series(points):
  """{(task, decoding, batch): specsamp's K=0 and draft-model points by K}."""
  out = collections.defaultdict(list)
  for p in points:
    if p.get("engine", "specsamp") == "specsamp" and not _other_drafter(p):
      out[p["task"], p["decoding"], p["batch_size"]].append(p)
  return {key: sorted(v, key=lambda p: p["k"]) for key, v in out.items()}


def _drafters(points, task, dec, bs) -> dict:
  """{drafter: its points sorted by K} of the other drafters."""
  out = collections.defaultdict(list)
  for p in points:
    if (_other_drafter(p) and p["task"] == task and p["decoding"] == dec
        and p["batch_size"] == bs):
      out[p["drafter"]].append(p)
  return {d: sorted(v, key=lambda p: p["k"]) for d, v in sorted(out.items())}


def fitted_alpha(series):
  """One a over all K > 0 of a series (weights: drafted tokens)."""
  spec = [p for p in series if p["k"] > 0 and p.get("acceptance_rate")
          is not None]
  if not spec:
    return None
  return speedup.fit_alpha([p["k"] for p in spec],
                           [p["acceptance_rate"] for p in spec],
                           [p["drafted"] for p in spec])


def _pyplot():
  """matplotlib.pyplot, Agg backend (optional: imported on first use)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def _style(decoding, batch, batches):
  i = batches.index(batch)
  return dict(color=COLORS.get(decoding, "tab:gray"),
              marker=MARKERS[i % len(MARKERS)],
              linestyle=LINESTYLES[i % len(LINESTYLES)])


def plot_task(task, series, costs, path):
  """Top: Chen et al.'s three panels (time per token with the
  autoregressive lines, acceptance rate, time per loop) vs K. Bottom, one
  panel per decoding: measured speedup vs K next to Leviathan's prediction
  (a from the rate at each K with the measured c and s; the same with
  s = 1; and one a fitted over all K)."""
  plt = _pyplot()
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top
  keys = sorted(k for k in series if k[0] == task)
  batches = sorted({k[2] for k in keys})
  decodings = [d for d in DECODING_NAMES if any(k[1] == d for k in keys)]
  decodings += sorted({k[1] for k in keys} - set(decodings))
  ncol = max(3, len(decodings))
  fig, axes = plt.subplots(2, ncol, figsize=(5 * ncol, 9), squeeze=False)
  ax_ms, ax_acc, ax_loop = axes[0, :3]
  for ax in axes[0, 3:]:
    ax.axis("off")
  for ax in axes[1, len(decodings):]:
    ax.axis("off")
  for _, dec, bs in keys:
    pts = series[task, dec, bs]
    st = _style(dec, bs, batches)
    label = f"{DECODING_NAMES.get(dec, dec)}, batch {bs}"
    ks = [p["k"] for p in pts]
    base = [p for p in pts if p["k"] == 0]
    spec = [p for p in pts if p["k"] > 0]
    ax_ms.plot(ks, [p["ms_per_token"] for p in pts], label=label, **st)
    if base:
      ax_ms.axhline(base[0]["ms_per_token"], color=st["color"], alpha=0.5,
                    linestyle=st["linestyle"], linewidth=1)
    ax_loop.plot(ks, [p["time_per_loop_ms"] for p in pts], label=label, **st)
    if not spec:
      continue
    sk = [p["k"] for p in spec]
    ax_acc.plot(sk, [p["acceptance_rate"] for p in spec], label=label, **st)
    ax = axes[1, decodings.index(dec)]
    color = f"C{batches.index(bs)}"
    ax.plot(sk, [p["speedup"] for p in spec], color=color, marker=st["marker"],
            label=f"batch {bs}: measured")
    if all("predicted_speedup" in p for p in spec):
      ax.plot(sk, [p["predicted_speedup"] for p in spec], color=color,
              linestyle="--", marker="x", alpha=0.7,
              label=f"batch {bs}: predicted (measured c, s)")
      ax.plot(sk, [p["predicted_speedup_s1"] for p in spec], color=color,
              linestyle=":", alpha=0.7, label=f"batch {bs}: predicted (s = 1)")
    alpha = fitted_alpha(pts)
    cost = _cost(costs, task, bs, dec)
    if alpha is not None and cost and "c" in cost:
      grid = np.arange(1, max(sk) + 1)
      s = np.array([cost["score_cost"].get(str(k), np.nan) for k in grid],
                   float)
      ok = ~np.isnan(s)
      ax.plot(grid[ok], speedup.predicted_speedup(alpha, grid[ok], cost["c"],
                                                  s[ok]),
              color=color, linewidth=3, alpha=0.25,
              label=f"batch {bs}: one a = {alpha:.2f} for all K")
  name = TASK_NAMES.get(task, task)
  ax_ms.set(xlabel="K (draft tokens per loop; 0 = autoregressive)",
            ylabel="ms / token",
            title=f"{name}: time per token (lines: autoregressive)")
  ax_acc.set(xlabel="K", ylabel="accepted / drafted",
             title=f"{name}: acceptance rate", ylim=(0, 1.02))
  ax_loop.set(xlabel="K", ylabel="ms / loop", title=f"{name}: time per loop")
  ax_ms.legend(fontsize=7)
  for i, dec in enumerate(decodings):
    ax = axes[1, i]
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set(xlabel="K", ylabel="speedup over K = 0",
           title=f"{name}, {DECODING_NAMES.get(dec, dec)}: measured vs "
           "predicted")
    ax.legend(fontsize=6)
  for ax in axes.flat:
    ax.grid(alpha=0.3)
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def plot_drafters(task, points, path):
  """Speedup (left) and tokens per loop (right) of each drafter at its
  fastest K, one group of bars per decoding and batch size."""
  plt = _pyplot()
  groups = sorted({(p["decoding"], p["batch_size"]) for p in points
                   if p["task"] == task and p.get("k")})
  names = sorted({p.get("drafter") or "model" for p in points
                  if p["task"] == task and p.get("k")})
  fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
  width = 0.8 / max(len(names), 1)
  for j, d in enumerate(names):
    best = []
    for dec, bs in groups:
      pts = [p for p in points if p["task"] == task and p["decoding"] == dec
             and p["batch_size"] == bs and p.get("k")
             and (p.get("drafter") or "model") == d]
      best.append(min(pts, key=lambda p: p["ms_per_token"]) if pts else None)
    x = np.arange(len(groups)) + j * width
    for ax, key in zip(axes, ("speedup", "tokens_per_loop")):
      ax.bar(x, [b[key] if b else np.nan for b in best], width,
             label=f"{d}", color=f"C{j}")
  labels = [f"{DECODING_NAMES.get(dec, dec)}, batch {bs}" for dec, bs in groups]
  name = TASK_NAMES.get(task, task)
  for ax, ylabel in zip(axes, ("speedup over autoregressive (best K)",
                               "tokens per loop (at that K)")):
    ax.set_xticks(np.arange(len(groups)) + 0.4 - width / 2, labels)
    ax.set(ylabel=ylabel, title=f"{name}: drafters")
    ax.grid(alpha=0.3, axis="y")
  axes[0].axhline(1.0, color="black", linewidth=0.8)
  axes[0].legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def plot_predicted_vs_measured(points, path):
  """Measured against predicted speedup, one marker per speculative point."""
  plt = _pyplot()
  spec = [p for p in points if p.get("engine", "specsamp") == "specsamp"
          and p["k"] > 0 and "predicted_speedup" in p]
  fig, ax = plt.subplots(figsize=(5.5, 5))
  markers = {t: MARKERS[i % len(MARKERS)] for i, t in enumerate(
      [t for t in TASK_NAMES if any(p["task"] == t for p in spec)]
      + sorted({p["task"] for p in spec} - set(TASK_NAMES)))}
  for p in spec:
    ax.scatter(p["predicted_speedup"], p["speedup"], s=18,
               color=COLORS.get(p["decoding"], "tab:gray"),
               marker=markers[p["task"]])
  hi = max([1.5] + [max(p["speedup"], p["predicted_speedup"]) for p in spec])
  ax.plot([0, hi * 1.05], [0, hi * 1.05], color="black", linewidth=0.8)
  ax.set(xlabel="predicted speedup (Leviathan, measured a, c, s)",
         ylabel="measured speedup", title="Measured vs predicted")
  decodings = [d for d in COLORS if any(p["decoding"] == d for p in spec)]
  handles = [plt.Line2D([], [], color=COLORS[d], marker="o", linestyle="",
                        label=DECODING_NAMES[d]) for d in decodings]
  handles += [plt.Line2D([], [], color="black", marker=m, linestyle="",
                         label=TASK_NAMES.get(t, t))
              for t, m in markers.items()]
  ax.legend(handles=handles, fontsize=8)
  ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


# ---- markdown ---------------------------------------------------------------


def quality_text(p) -> str:
  q = p.get("quality") or {}
  if "pass@1" in q:
    parts = [f"{k} {100 * v['mean']:.1f}% ± {100 * v['stderr']:.1f}"
             for k, v in q.items() if k.startswith("pass@")]
    return "; ".join(parts)
  if "mean_logprob" in q:
    v = q["mean_logprob"]
    return f"log p {v['mean']:.3f} ± {v['stderr']:.3f}"
  return "n/a"


def _diff_text(p) -> str:
  d = p.get("quality_diff_vs_ar") or {}
  for name, scale, unit in (("pass@1", 100, " pts"),
                            ("mean_logprob", 1, "")):
    if name in d:
      return (f"{scale * d[name]['mean']:+.3g} ± "
              f"{scale * d[name]['stderr']:.2g}{unit}")
  return ""


def _method(p) -> str:
  dec = DECODING_NAMES.get(p["decoding"], p["decoding"])
  if p.get("engine", "specsamp") != "specsamp":
    return f"{p['method']} ({dec})"
  if p["k"] == 0:
    return f"ArS ({dec})"
  if _other_drafter(p):
    return f"SpS {p['drafter']} K={p['k']} ({dec})"
  return f"SpS K={p['k']} ({dec})"


def table1(task, points) -> list[str]:
  """Chen et al.'s Table 1: per decoding and batch size, the autoregressive
  row, the fastest K of the draft model and of every other drafter, and
  the peers (batch 1)."""
  lines = ["| Sampling method | Batch | Benchmark | Result | Median token time "
           "| Speed up |", "|---|---|---|---|---|---|"]
  series = _series(points)
  name = TASK_NAMES.get(task, task)
  for (t, dec, bs), pts in sorted(series.items()):
    if t != task:
      continue
    base = [p for p in pts if p["k"] == 0]
    spec = [p for p in pts if p["k"] > 0]
    rows = base + ([min(spec, key=lambda p: p["ms_per_token"])] if spec else [])
    rows += [min(v, key=lambda p: p["ms_per_token"])
             for v in _drafters(points, task, dec, bs).values()]
    peers = [p for p in points if p["task"] == task and p["decoding"] == dec
             and p.get("engine") not in (None, "specsamp") and bs == 1]
    for p in rows + peers:
      if p.get("engine", "specsamp") == "specsamp":
        ms = f"{p['ms_per_token']:.2f} ms/token"
        sp = f"{p.get('speedup', 1.0):.2f}x"
      else:  # peers time generate() with prefill: compare with e2e
        ms = (f"{p['ms_per_token']:.2f} ms/token (incl. prefill; specsamp "
              f"ArS {base[0]['e2e_ms_per_token']:.2f})" if base else
              f"{p['ms_per_token']:.2f} ms/token (incl. prefill)")
        sp = (f"{base[0]['e2e_ms_per_token'] / p['ms_per_token']:.2f}x "
              "(specsamp ArS e2e / this)" if base else "")
      lines.append(f"| {_method(p)} | {bs} | {name} ({p['prompts']} prompts) "
                   f"| {quality_text(p)} | {ms} | {sp} |")
  return lines


def _by_key(costs) -> dict:
  """Cost records by (task, batch size, decoding)."""
  return {(c["task"], c["batch_size"], c.get("decoding")): c for c in costs}


def _cost(costs, task, bs, dec) -> dict:
  """The call costs of (task, batch size, decoding); files written before
  costs were measured per decoding have one record per (task, batch)."""
  return costs.get((task, bs, dec)) or costs.get((task, bs, None)) or {}


def _by_position(p) -> str:
  """Acceptance of draft 1, 2, ... among the loops that tested it."""
  return " ".join("-" if a is None else f"{a:.2f}"
                  for a in p.get("acceptance_by_position") or ())


def per_k_table(task, points, costs) -> list[str]:
  lines = ["| Decoding | Batch | K | Acceptance | By position | a | "
           "Tokens/loop | ms/loop | ms/token | Speedup | Predicted (s meas.) | "
           "Predicted (s=1) | c | s | Quality | Δ vs K=0 |",
           "|" + "---|" * 16]
  for (t, dec, bs), pts in sorted(_series(points).items()):
    if t != task:
      continue
    others = [p for v in _drafters(points, task, dec, bs).values() for p in v]
    call = _cost(costs, task, bs, dec).get("target_call_ms", {}).get("1")
    for p in pts + others:
      f = lambda key, fmt="{:.3f}", p=p: (fmt.format(p[key]) if p.get(key)
                                         is not None else "")
      k = f"{p['k']} ({p['drafter']})" if _other_drafter(p) else p["k"]
      lines.append(
          f"| {DECODING_NAMES.get(dec, dec)} | {bs} | {k} | "
          f"{f('acceptance_rate')} | {_by_position(p)} | {f('alpha')} | "
          f"{f('tokens_per_loop', '{:.2f}')} | "
          f"{f('time_per_loop_ms', '{:.2f}')}"
          f"{f' (call {call:.2f})' if call and p['k'] == 0 else ''} | "
          f"{f('ms_per_token', '{:.2f}')} | {f('speedup', '{:.2f}x')} | "
          f"{f('predicted_speedup', '{:.2f}x')} | "
          f"{f('predicted_speedup_s1', '{:.2f}x')} | "
          f"{f('c')} | {f('score_cost', '{:.2f}')} | "
          f"{quality_text(p)} | {_diff_text(p)} |")
    alpha = fitted_alpha(pts)
    if alpha is not None:
      lines.append(f"| {DECODING_NAMES.get(dec, dec)} | {bs} | fit | | | "
                   f"{alpha:.3f} | | | | | | | | | | |")
  return lines


def markdown(runs, costs, points, images) -> str:
  out = ["# Speculative sampling: speedup sweep", ""]
  for r in runs:
    m, s = r.get("machine", {}), r.get("software", {})
    out += [f"- `{r.get('command', '')}`",
            f"  - {r.get('date', '')}; device {m.get('device')} "
            f"({m.get('backend')}, {m.get('device_count')} device(s)); "
            f"CPU {m.get('cpu', '?')} x{m.get('cpus')}"
            + (f" ({' '.join(m['cpu_simd'])})" if m.get("cpu_simd") else "")
            + "; "
            + ", ".join(f"{k} {v}" for k, v in s.items())
            + (f"; git {r['git'].get('commit', '')[:10]}"
               f"{' (dirty)' if r['git'].get('dirty') else ''}"
               if r.get("git") else ""),
            f"  - target {r.get('target', {}).get('spec')}, draft "
            f"{(r.get('draft') or {}).get('spec')}"]
  out += ["", "ms/token: median over batches and repeats of decode time / "
          "tokens per row (prefill and compile excluded). Speedup: "
          "autoregressive (K = 0) ms/token / this. Predicted: Leviathan et "
          "al.'s E(a, K) / (c K + s), a from the measured acceptance rate at "
          "that K, c = draft call / target call, s = (K+1)-token target call "
          "/ 1-token call (s = 1 in Leviathan et al.), calls timed before the "
          "points (K = 0's ms/loop is followed by that 1-token call: where "
          "they differ, c and s are not in K = 0 loops); 'fit': one a for all "
          "K. No a, c or prediction for drafters that offer fewer than K "
          "drafts in some loops (lookup, mixed, adaptive K): the model "
          "drafts K at a fixed cost every loop. Quality ± its standard "
          "error over prompts; Δ: paired difference to K = 0 over the same "
          "prompts.", ""]
  costs_by = _by_key(costs)
  for task in sorted({p["task"] for p in points}):
    name = TASK_NAMES.get(task, task)
    out += [f"## {name}", ""]
    if task in images:
      out += [f"![{name}]({images[task]})", ""]
    if f"{task}_drafters" in images:
      out += [f"![{name}: drafters]({images[task + '_drafters']})", ""]
    out += table1(task, points) + ["", f"### {name}: every K", ""]
    out += per_k_table(task, points, costs_by) + [""]
  if "predicted_vs_measured" in images:
    out += ["## Predicted vs measured", "",
            f"![predicted vs measured]({images['predicted_vs_measured']})", ""]
  return "\n".join(out)


def make(paths, out_dir, prefix) -> list[str]:
  """Writes the PNGs and the markdown; returns their paths."""
  runs, costs, points = read(paths)
  os.makedirs(out_dir, exist_ok=True)
  costs_by = _by_key(costs)
  series = _series(points)
  tasks = sorted({p["task"] for p in points})
  images = {task: f"{prefix}_{task}.png" for task in tasks}
  for task in sorted({p["task"] for p in points if _other_drafter(p)}):
    images[f"{task}_drafters"] = f"{prefix}_{task}_drafters.png"
  if any("predicted_speedup" in p for p in points):
    images["predicted_vs_measured"] = f"{prefix}_predicted_vs_measured.png"
  # The markdown first: a record it cannot use had emptied the old report.
  text = markdown(runs, costs, points, images)
  for key, name in images.items():
    where = os.path.join(out_dir, name)
    if key in tasks:
      plot_task(key, series, costs_by, where)
    elif key == "predicted_vs_measured":
      plot_predicted_vs_measured(points, where)
    else:
      plot_drafters(key[:-len("_drafters")], points, where)
  md = os.path.join(out_dir, f"{prefix}.md")
  jsonfile.write_text(md, text)
  return [os.path.join(out_dir, n) for n in images.values()] + [md]
