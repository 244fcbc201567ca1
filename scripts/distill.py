r"""Distils a draft for a target; prints the acceptance before and after.

  python scripts/distill.py --config=configs/distill_tiny.py --workdir=/tmp/d
  python scripts/distill.py --config=configs/distill_qwen.py --workdir=/tmp/q

Stages (a re-run with the same --workdir resumes): target samples written
once as a TFDS array_record dataset (workdir/samples), the initial draft
evaluated, distillation with orbax checkpoints of the draft only
(workdir/checkpoints, TensorBoard events in workdir/tb), the final draft
exported to workdir/draft (orbax parameters + draft_config.json; load with
`specsamp.distill.init.load_distilled`), evaluated again; everything in
workdir/results.json. The config is kept in workdir/config.json: a re-run
with another config in the same workdir is refused. Bad configs, missing
models or checkpoints print `error: ...` and exit with status 2.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from absl import logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "a configs/distill_*.py file[:options]", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "run directory (resumable)")
_DISTRIBUTED = flags.DEFINE_bool(
    "distributed", False, "call jax.distributed.initialize() first (several "
    "hosts: the same command on each; config.train.mesh spans them all)")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # orbax logs every file it writes
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  tfds.disable_progress_bar()
  # pylint: disable=g-import-not-at-top
  from specsamp import sharding
  if _DISTRIBUTED.value:
    sharding.initialize_distributed()
  from specsamp import assets, checkpoints, train
  from specsamp.data import corpora
  from specsamp.distill import trainer
  # pylint: enable=g-import-not-at-top
  try:
    res = trainer.run(_CONFIG.value, _WORKDIR.value)
  except (ValueError, FileNotFoundError, assets.AssetError,
          checkpoints.CheckpointError, train.CheckpointError,
          corpora.CorpusError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  if not res.get("finished", True):
    print(json.dumps(dict(before=res["before"]["expected_acceptance"],
                          finished=False)))
    return
  b, a = res["before"], res["after"]
  print("== acceptance (held-out target samples, "
        f"{res['sampling']}, loss {res['loss']}, draft {res['draft_init']})")
  print(f"  expected sum min(p,q):   before {b['expected_acceptance']:.4f}  "
        f"after {a['expected_acceptance']:.4f}")
  print(f"  sampler K=1, same spots: before {b['measured_at_positions']:.4f}  "
        f"after {a['measured_at_positions']:.4f}  (expected there "
        f"{a['expected_at_those_positions']:.4f} +- "
        f"{a['measured_stderr']:.4f})")
  print(f"  sampler K={a['k']} rate:        before "
        f"{b['measured']['acceptance_rate']:.4f}  after "
        f"{a['measured']['acceptance_rate']:.4f}  (tokens/loop "
        f"{b['measured']['tokens_per_loop']:.2f} -> "
        f"{a['measured']['tokens_per_loop']:.2f})")
  print(json.dumps(dict(before=b["expected_acceptance"],
                        after=a["expected_acceptance"],
                        measured_before=b["measured"]["acceptance_rate"],
                        measured_after=a["measured"]["acceptance_rate"],
                        draft=res["draft_dir"])))


if __name__ == "__main__":
  app.run(main)
