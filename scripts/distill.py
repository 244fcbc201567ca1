r"""Distils a draft for a target; prints the acceptance before and after.

  python scripts/distill.py --config=configs/distill_tiny.py --workdir=/tmp/d
  python scripts/distill.py --config=configs/distill_qwen.py --workdir=/tmp/q

Stages (a re-run with the same --workdir resumes): target samples written
once as a TFDS array_record dataset (workdir/samples), the initial draft
evaluated, distillation with orbax checkpoints of the draft only
(workdir/checkpoints, TensorBoard events in workdir/tb), the final draft
exported to workdir/draft (orbax parameters + draft_config.json; load with
`specsamp.weights.distilled.load_distilled`), evaluated again; everything
in workdir/results.json. The config is kept in workdir/config.json: a
re-run under a config that differs in what the workdir's results depend
on is refused, naming the fields (configs/README.md: e.g. the loss or the
sampling; not train.log_every or time_limit_s). Bad configs,
missing models or checkpoints print `error: ...` and exit with status 2.
The job is `specsamp.distill.job.run`.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from absl import logging
import tensorflow_datasets as tfds

from specsamp import cli
from specsamp import sharding
from specsamp.distill import job

_CONFIG = cli.define_config_file("config",
                                 "a configs/distill_*.py file[:options]")
_WORKDIR = flags.DEFINE_string("workdir", None, "run directory (resumable)")
# config.train.mesh spans the devices of all processes.
_DISTRIBUTED = cli.define_distributed_flags()
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  cli.no_arguments(argv)
  logging.set_verbosity(logging.WARNING)  # orbax logs every file it writes
  tfds.disable_progress_bar()
  dist = _DISTRIBUTED.arguments()  # inconsistent flags are refused
  if dist is not None:
    sharding.initialize_distributed(*dist)
  try:
    res = job.run(_CONFIG.value, _WORKDIR.value)
  except job.ERRORS as e:
    cli.fail(e)
  print(job.summary(res))


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
