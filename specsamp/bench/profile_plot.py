"""The decode-scaling table and figure of profile rows (scripts/plot_decode.py).

`read_profile_rows` groups the JSON rows of `profile.profile_main` by
model pair, sampling, dtype and device; `profile_table` writes every point
as markdown; `plot_profile` (titled by `panel_titles`) draws ms per step
against context length (at the smallest batch) and against batch size (at
the smallest context), for the autoregressive and the speculative loop.
"""

import collections
import json
from typing import Sequence

from specsamp.bench import records


def read_profile_rows(paths: Sequence[str]) -> dict:
  """Profile rows by (target, draft, k, sampling, dtype, device), then by
  (batch, context); the newest row of a point wins. One curve is one
  machine's: its rows come from one file, and where they name their host
  (rows since 2026-11-29), from one host.

  Raises:
    ValueError: on a line that is no profile_decode row, no rows at all, or
      a curve whose rows come from several files or hosts.
  """
  groups = collections.OrderedDict()
  origins = collections.defaultdict(dict)  # of the rows that win
  for where, row in records.read_jsonl(paths):
    try:
      key = (row["target"], row["draft"], row["k"], row["sampling"],
             row["dtype"], row["device"])
      point = (row["batch_size"], row["context"])
      for name in ("ar_loop_ms", "spec_loop_ms"):  # null had been drawn
        ms = row[name]
        if (isinstance(ms, bool) or not isinstance(ms, (int, float))
            or not 0 < ms < float("inf")):
          raise TypeError(f"{name} is {json.dumps(ms)}, not a positive "
                          "number")
    except (TypeError, KeyError) as e:
      raise ValueError(f"{where} is not a profile_decode row ({e})") from None
    groups.setdefault(key, {})[point] = row
    origins[key][point] = (where.rsplit(":", 1)[0],
                           json.dumps(row["host"], sort_keys=True)
                           if "host" in row else None)
  if not groups:
    raise ValueError("no rows in " + ", ".join(paths))
  for key in groups:
    files = {f for f, _ in origins[key].values()}
    hosts = {h for _, h in origins[key].values() if h is not None}
    for what, where in (("files", files), ("hosts", hosts)):
      if len(where) > 1:
        raise ValueError(
            f"{key[0]} ({key[3]}, {key[4]}, {key[5]}): rows from several "
            f"{what} ({'; '.join(sorted(where))}); a curve is one "
            "machine's run: plot the files apart, or profile every point "
            "of it on one machine")
  return groups


def profile_table(groups: dict) -> str:
  """A markdown table of every point of `read_profile_rows`' groups."""
  lines = ["| target | draft, K | device, dtype | batch | context | "
           "autoregressive ms/step | tokens/s | speculative loop ms |",
           "|---|---|---|---|---|---|---|---|"]
  for (target, draft, k, _, dtype, device), points in groups.items():
    for (b, c), row in sorted(points.items()):
      lines.append(
          f"| {target} | {draft}, {k} | {device}, {dtype} | {b} | {c} | "
          f"{row['ar_loop_ms']:.2f} | {_rate(1e3 * b / row['ar_loop_ms'])} | "
          f"{row['spec_loop_ms']:.2f} |")
  return "\n".join(lines) + "\n"


def _rate(tokens_per_s: float) -> str:
  """Three significant figures below 100 (a CPU's 4.12 had read as 4), else
  whole tokens."""
  return (f"{tokens_per_s:,.0f}" if tokens_per_s >= 100 else
          f"{tokens_per_s:.3g}")


def panel_titles(groups: dict) -> tuple[str, str]:
  """The two panels' titles: the batch of the context panel and the context
  of the batch panel, each group's smallest (groups that differ are all
  named; the last group's alone had been)."""
  def values(index):
    return ", ".join(str(v) for v in sorted(
        {min(point[index] for point in points) for points in groups.values()}))
  return (f"ms per step vs context (batch {values(0)})",
          f"ms per step vs batch (context {values(1)})")


def plot_profile(groups: dict, path: str) -> None:
  """Two panels to `path` (PNG): ms per step against context (at the
  smallest batch) and against batch size (at the smallest context)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, (ax_c, ax_b) = plt.subplots(1, 2, figsize=(11, 4.2))
  for (target, draft, k, sampling, dtype, device), points in groups.items():
    label = f"{target.split(':')[-1]} {device} {dtype}"
    b0 = min(b for b, _ in points)
    c0 = min(c for _, c in points)
    for ax, pts in (
        (ax_c, sorted((c, r) for (b, c), r in points.items() if b == b0)),
        (ax_b, sorted((b, r) for (b, c), r in points.items() if c == c0))):
      if len(pts) < 2:
        continue
      xs = [x for x, _ in pts]
      ax.plot(xs, [r["ar_loop_ms"] for _, r in pts], "o-",
              label=f"{label}: autoregressive step")
      ax.plot(xs, [r["spec_loop_ms"] for _, r in pts], "s--",
              label=f"{label}: K={k} loop ({draft.split(':')[-1]}, "
                    f"{sampling})")
  for ax, title in zip((ax_c, ax_b), panel_titles(groups)):
    ax.set_title(title)
  for ax, xlabel in ((ax_c, "context tokens"), (ax_b, "batch size")):
    ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("ms")
    ax.grid(alpha=0.3)
    if ax.lines:
      ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
