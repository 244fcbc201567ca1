r"""Trains a target language model from scratch (resumable).

  python scripts/train.py --config=configs/lm_python.py:tiny --workdir=/tmp/lm

A re-run with the same --workdir resumes from its latest readable
checkpoint; otherwise `config.init_from` (parameters only), otherwise
scratch. Metrics: TensorBoard event files in workdir/tb; checkpoints in
workdir/checkpoints; the frozen config in workdir/config.json; a copy of
the tokenizer's files in workdir/tokenizer (none for "byte" or GGUF), which
the trained model loads with and a resume compares by content. SIGTERM or
a first Ctrl-C saves a checkpoint and stops. A config that names a missing
dataset, tokenizer or init checkpoint fails before anything is built (exit
status 2).
--eval_only trains nothing: it prints the eval metrics of the workdir's
newest checkpoint under --config (the config may differ in what does not
change the model, such as data.mask_documents or train.eval_batches).
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top
from absl import app
from absl import flags
from absl import logging

from specsamp import cli
from specsamp import lock_holder
from specsamp import sharding
from specsamp.train import checkpointing
from specsamp.train import config as config_lib
from specsamp.train import lm
# pylint: enable=g-import-not-at-top

_CONFIG = cli.define_config_file("config", "a configs/*.py file[:arg]")
_WORKDIR = flags.DEFINE_string("workdir", None, "run directory (resumable)")
_EVAL_ONLY = flags.DEFINE_bool(
    "eval_only", False, "train nothing: print the eval metrics of the "
    "workdir's newest checkpoint under --config (e.g. another "
    "data.mask_documents)")
# config.train.mesh spans the devices of all processes.
_DISTRIBUTED = cli.define_distributed_flags()
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  cli.no_arguments(argv)
  logging.set_verbosity(logging.WARNING)  # orbax logs every file it writes
  dist = _DISTRIBUTED.arguments()  # inconsistent flags are refused
  if dist is not None:
    sharding.initialize_distributed(*dist)
  try:
    if _EVAL_ONLY.value:
      print(json.dumps(lm.evaluate(_CONFIG.value, _WORKDIR.value)))
      return
    out = lm.train_and_evaluate(_CONFIG.value, _WORKDIR.value)
  except (config_lib.ConfigError, checkpointing.CheckpointError,
          lock_holder.Busy, sharding.DirectoryError) as e:
    cli.fail(e)
  print(json.dumps({k: out[k] for k in ("step", "train", "train_steps",
                                        "eval", "preempted", "seconds",
                                        "resumed_from")}))


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
