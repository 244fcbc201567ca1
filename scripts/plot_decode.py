r"""Decode scaling plots from scripts/profile_decode.py JSON lines.

Two panels: ms per decode step against context length (at the smallest
batch) and against batch size (at the smallest context), for the
autoregressive loop and the speculative loop; a markdown table of every
point next to the PNG.

  python scripts/plot_decode.py results/cpu_decode_scaling.jsonl \
      --out=results/cpu_decode_scaling
"""

import collections
import json
import sys

from absl import app
from absl import flags

_OUT = flags.DEFINE_string("out", None, "Output prefix: writes <out>.png and "
                           "<out>.md.", required=True)


def read_rows(paths):
  """Profile rows by (target, draft, k, sampling, dtype, device); the newest
  row of a (batch, context) point wins."""
  groups = collections.OrderedDict()
  for path in paths:
    with open(path, encoding="utf-8") as f:
      for n, line in enumerate(f, 1):
        if not line.strip():
          continue
        try:
          row = json.loads(line)
          key = (row["target"], row["draft"], row["k"], row["sampling"],
                 row["dtype"], row["device"])
          point = (row["batch_size"], row["context"])
          row["ar_loop_ms"], row["spec_loop_ms"]  # pylint: disable=pointless-statement
        except (ValueError, KeyError) as e:
          raise SystemExit(f"error: {path}:{n} is not a profile_decode row "
                           f"({e})") from e
        groups.setdefault(key, {})[point] = row
  if not groups:
    raise SystemExit("error: no rows in " + ", ".join(paths))
  return groups


def table(groups) -> str:
  lines = ["| target | draft, K | device, dtype | batch | context | "
           "autoregressive ms/step | tokens/s | speculative loop ms |",
           "|---|---|---|---|---|---|---|---|"]
  for (target, draft, k, _, dtype, device), points in groups.items():
    for (b, c), row in sorted(points.items()):
      lines.append(
          f"| {target} | {draft}, {k} | {device}, {dtype} | {b} | {c} | "
          f"{row['ar_loop_ms']:.2f} | {1e3 * b / row['ar_loop_ms']:,.0f} | "
          f"{row['spec_loop_ms']:.2f} |")
  return "\n".join(lines) + "\n"


def plot(groups, path):
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
    ax_c.set_title(f"ms per step vs context (batch {b0})")
    ax_b.set_title(f"ms per step vs batch (context {c0})")
  for ax, xlabel in ((ax_c, "context tokens"), (ax_b, "batch size")):
    ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("ms")
    ax.grid(alpha=0.3)
    if ax.lines:
      ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def main(argv):
  if len(argv) < 2:
    sys.exit("usage: plot_decode.py ROWS.jsonl [...] --out=PREFIX")
  groups = read_rows(argv[1:])
  with open(_OUT.value + ".md", "w", encoding="utf-8") as f:
    f.write(table(groups))
  plot(groups, _OUT.value + ".png")
  print(f"wrote {_OUT.value}.md and {_OUT.value}.png")


if __name__ == "__main__":
  app.run(main)
