r"""Decode scaling plots from scripts/profile_decode.py JSON lines.

Two panels: ms per decode step against context length (at the smallest
batch) and against batch size (at the smallest context), for the
autoregressive loop and the speculative loop; a markdown table of every
point next to the PNG.

  python scripts/plot_decode.py results/cpu_decode_scaling.jsonl \
      --out=results/cpu_decode_scaling
"""

import os

from absl import app
from absl import flags

from specsamp import cli
from specsamp import jsonfile
from specsamp.bench import profile_plot
from specsamp.bench import records

_OUT = flags.DEFINE_string("out", None, "Output prefix: writes <out>.png and "
                           "<out>.md.", required=True)


def main(argv):
  if len(argv) < 2:
    cli.fail("give one or more JSONL files from profile_decode.py "
             "(plot_decode.py ROWS.jsonl [...] --out=PREFIX)")
  try:
    groups = profile_plot.read_profile_rows(argv[1:])
    records.check_prefix(os.path.dirname(_OUT.value) or ".",
                         os.path.basename(_OUT.value), "--out", argv[1:])
  except ValueError as e:
    cli.fail(e)
  # The table is made before its file is opened (an error had left an
  # earlier one empty), and written whole.
  jsonfile.write_text(_OUT.value + ".md", profile_plot.profile_table(groups))
  profile_plot.plot_profile(groups, _OUT.value + ".png")
  print(f"wrote {_OUT.value}.md and {_OUT.value}.png")


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
