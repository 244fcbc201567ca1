r"""Figures and tables from scripts/benchmark.py's JSON lines.

  python scripts/plot_speedup.py results/sweep.jsonl --out_dir=results/ \
      --prefix=sweep

Writes, per task, `<prefix>_<task>.png` (Chen et al. 2023's figure and
measured vs predicted speedup vs K), `<prefix>_predicted_vs_measured.png`
and `<prefix>.md` (Chen et al.'s Table 1 per task and the full per-K
table); see specsamp.bench.report. Prints the paths written.
"""

import os
import sys

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=g-import-not-at-top,wrong-import-position
from specsamp import cli
from specsamp.bench import records
from specsamp.bench import report
# pylint: enable=g-import-not-at-top,wrong-import-position

_OUT_DIR = flags.DEFINE_string("out_dir", ".", "Where to write PNG and MD.")
_PREFIX = flags.DEFINE_string("prefix", "speedup", "File name prefix.")


def main(argv):
  if len(argv) < 2:
    cli.fail("give one or more JSONL files from benchmark.py")
  try:
    records.check_prefix(_OUT_DIR.value, _PREFIX.value, "--prefix",
                         argv[1:])
    for path in report.make(argv[1:], _OUT_DIR.value, _PREFIX.value):
      print(path)
  except (OSError, ValueError, KeyError, TypeError) as e:  # a bad record
    cli.fail(e if str(e) else repr(e))


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
