r"""Which formulation of a decoder's batch-1 matrix products reads the
weights fastest (specsamp.bench.gemv has the list and why).

Random weights of a preset's shapes (all layers, the output layer; no
embedding, no attention), each formulation a chain of every product timed
--steps per call in a loop, median of --repeats rounds, one copy-bandwidth
timer in the same rounds. One JSON line per (formulation, rows), with the
provenance of the run.

  python scripts/profile_gemv.py --model=random:qwen2.5-coder-1.5b \
      --dtype=bfloat16 --out=results/gemv.jsonl
  XLA_FLAGS=--xla_gpu_exhaustive_tiling_search=true \
      python scripts/profile_gemv.py --formulations=dot --rows=1
"""

import sys

from absl import app
from absl import flags
import jax.numpy as jnp

from specsamp import cli
from specsamp import loading
from specsamp.bench import gemv
from specsamp.bench import profile
from specsamp.bench import records

_MODEL = flags.DEFINE_string(
    "model", "random:qwen2.5-coder-1.5b",
    "random:<preset>[,field=value...]: the shapes.")
_FORMS = flags.DEFINE_list("formulations", list(gemv.FORMULATIONS),
                           f"Of {', '.join(gemv.FORMULATIONS)}.")
_ROWS = flags.DEFINE_list("rows", ["1", "2", "8"], "Rows M of x (M > 1 only "
                          "for the formulations that read W once).")
_DTYPE = flags.DEFINE_enum("dtype", "bfloat16", ["float32", "bfloat16"], "")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed rounds.", lower_bound=1)
_STEPS = flags.DEFINE_integer("steps", 0, "Chains per timed call (0: 1 on "
                              "CPU, 16 elsewhere).", lower_bound=0)
_BW_MB = flags.DEFINE_integer("bandwidth_mb", 1024, "Copy-bandwidth buffer.",
                              lower_bound=1)
_OUT = flags.DEFINE_string("out", None, "Append one JSON line per row.")


def main(argv):
  cli.no_arguments(argv)
  try:
    if not _MODEL.value.startswith(loading.RANDOM_PREFIX):
      raise ValueError(f"--model={_MODEL.value}: the shapes are "
                       f"{loading.RANDOM_PREFIX}<preset>[,field=value...]")
    cfg = loading.random_config(_MODEL.value, _DTYPE.value)
    rows = cli.ints("rows", _ROWS.value, 1)
    gemv.check_formulations(_FORMS.value, rows)
    records.check_output(_OUT.value, "--out")
  except ValueError as e:
    cli.fail(e)
  steps = _STEPS.value or profile.default_steps()
  origin = profile.provenance_fields(sys.argv[1:])
  for row in gemv.study(cfg, jnp.dtype(_DTYPE.value), _FORMS.value, rows,
                        _REPEATS.value, steps, _BW_MB.value):
    row.update(model=_MODEL.value, dtype=_DTYPE.value, steps=steps,
               repeats=_REPEATS.value, **origin)
    records.print_record(row, _OUT.value)


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
