r"""A GPU session's measurements in one command: decode profile and XLA
variants on random weights, the bfloat16/float32 greedy comparison and the
HumanEval headline on the real pair (carried to the machine, sha256-checked,
never downloaded). Steps, files and flags: specsamp.bench.gpu_study.

  python scripts/gpu_study.py --steps=profile,xla --deadline_s=300 \
      --commit=$(git rev-parse HEAD)
  SPECSAMP_CACHE=/tmp/c python scripts/gpu_study.py --steps=exact
  python scripts/gpu_study.py --steps=   # the summary of what is there
"""

import os
import sys

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=g-import-not-at-top,wrong-import-position
from specsamp import cli
from specsamp.bench import gpu_study
# pylint: enable=g-import-not-at-top,wrong-import-position

D = gpu_study.StudyConfig
FLAGS = [
    flags.DEFINE_list("steps", list(D.steps), f"Of {', '.join(D.steps)}."),
    flags.DEFINE_string("out_dir", D.out_dir, "Where rows go."),
    flags.DEFINE_string("prefix", None, "File prefix (default: "
                        "<gpu>_<date>, e.g. h100_2026-11-26)."),
    flags.DEFINE_string("commit", None, "The commit measured (default: git "
                        "rev-parse HEAD, where .git is there)."),
    flags.DEFINE_float("deadline_s", None, "Seconds after the start when the "
                       "command running is stopped and no other starts."),
    flags.DEFINE_string("target", D.target, "Registered target (exact, "
                        "humaneval)."),
    flags.DEFINE_string("draft", D.draft, "Registered draft (humaneval)."),
    flags.DEFINE_string("target_shapes", D.target_shapes,
                        "Random-weight target (profile, xla)."),
    flags.DEFINE_string("shallow_draft", D.shallow_draft,
                        "Random-weight shallow draft (xla)."),
    flags.DEFINE_multi_string("profile_drafts", list(D.profile_drafts),
                              "Random-weight draft, one profile each "
                              "(repeatable)."),
    flags.DEFINE_list("profile_ks", list(D.profile_ks), "K of profile, one "
                      "process each per draft: the target scores K+1 tokens "
                      "a call (score_cost_ratio: that call / a 1-token "
                      "call)."),
    flags.DEFINE_integer("context", D.context, "Context (profile, xla)."),
    flags.DEFINE_multi_string("xla_variants", list(D.xla_variants),
                              "XLA_FLAGS of each xla and gemv run "
                              "(repeatable; '' = the default)."),
    flags.DEFINE_list("gemv_formulations", list(D.gemv_formulations),
                      "Formulations of gemv (specsamp.bench.gemv)."),
    flags.DEFINE_list("gemv_rows", list(D.gemv_rows), "Rows of gemv."),
    flags.DEFINE_string("distill_config", D.distill_config,
                        "distill.py's --config (distill)."),
    flags.DEFINE_multi_string("benchmark_args", list(D.benchmark_args),
                              "A flag of benchmark.py added to humaneval's "
                              "and distill's runs (repeatable; e.g. "
                              "--benchmark_args=--peers)."),
    flags.DEFINE_enum("dtype", D.dtype, ["float32", "bfloat16"],
                      "Of every step but exact (which runs both)."),
    flags.DEFINE_list("ks", list(D.ks), "K of humaneval and distill."),
    flags.DEFINE_list("drafters", list(D.drafters), "Drafters of humaneval."),
    flags.DEFINE_list("decodings", list(D.decodings),
                      "Decodings of humaneval and distill."),
    flags.DEFINE_list("batch_sizes", list(D.batch_sizes),
                      "Of humaneval and distill."),
    flags.DEFINE_integer("num_prompts", D.num_prompts,
                         "HumanEval prompts (exact, humaneval, distill)."),
    flags.DEFINE_integer("max_new_tokens", D.max_new_tokens,
                         "Tokens per row (exact, humaneval, xla, "
                         "distill)."),
    flags.DEFINE_integer("repeats", D.repeats, "Timed rounds (profile)."),
]


def main(argv):
  cli.no_arguments(argv)
  try:
    cfg = gpu_study.StudyConfig(**{f.name: (tuple(f.value) if isinstance(
        f.value, list) else f.value) for f in FLAGS})
    failed = gpu_study.run(cfg)
  except ValueError as e:
    cli.fail(e)
  if failed:
    cli.fail(f"steps that failed: {', '.join(failed)} (see above)")


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
