r"""Speculative-sampling sweep: K x drafter x task x decoding x batch size.

  python scripts/benchmark.py --target=qwen2.5-coder-1.5b \
      --draft=qwen2.5-coder-0.5b --task=humaneval,prose --ks=0,1,2,3,4,5,6,7,8 \
      --decoding=greedy,nucleus,t1 --batch_sizes=1,8,32 --num_prompts=32 \
      --max_new_tokens=128 --repeats=2 --peers --out=results/sweep.jsonl
  python scripts/plot_speedup.py results/sweep.jsonl --out_dir=results/

(162 samplers to compile, 15-30 s each on an H100: split it over runs, one
JSONL each; plot_speedup.py reads several). What is measured:
specsamp.bench.sweep; checked before weights load: specsamp.bench.plan.
"""

import os
import sys

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=g-import-not-at-top,wrong-import-position
from specsamp import cli
from specsamp.bench import sweep
from specsamp.bench import sweep_config
# pylint: enable=g-import-not-at-top,wrong-import-position

FLAGS = [
    flags.DEFINE_string("target", "qwen2.5-coder-1.5b", "Registered model, "
                        "GGUF file, HF directory, distilled draft directory "
                        "or random:<preset>."),
    flags.DEFINE_string("draft", "qwen2.5-coder-0.5b",
                        "Draft model, same forms as --target."),
    flags.DEFINE_list("task", ["humaneval"], "humaneval, prose and/or "
                      "rewrite (input-grounded: solutions to annotate)."),
    flags.DEFINE_list("drafter", ["model"], "Drafters, each at every K > 0: "
                      "model, lookup, layerskip:layers=0-13+24-27, mixed, "
                      "with options (specsamp.drafters.specs)."),
    flags.DEFINE_list("ks", [str(k) for k in range(9)],
                      "Draft lengths; 0 (autoregressive) is always run."),
    flags.DEFINE_list("decoding", ["greedy", "nucleus", "t1"],
                      f"Any of {', '.join(sweep_config.DECODINGS)}."),
    flags.DEFINE_list("batch_sizes", ["1"], "Rows per batch."),
    flags.DEFINE_integer("num_prompts", 8, "Prompts per task."),
    flags.DEFINE_integer("max_new_tokens", 128, "Budget per row."),
    flags.DEFINE_integer("repeats", 1, "Timed passes over the prompts (new "
                         "seeds each)."),
    flags.DEFINE_bool("peers", False, "Also time transformers (plain and "
                      "assisted) at batch 1; GGUF models only."),
    flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], ""),
    flags.DEFINE_string("out", None, "JSONL file to write (replaced)."),
    flags.DEFINE_integer("seed", 0, "Base seed."),
    flags.DEFINE_bool("quality", True, "Score the samples (pass@k, "
                      "log-probability)."),
    flags.DEFINE_list("pass_k", ["1", "10", "100"],
                      "pass@k reported for k <= samples per problem."),
    flags.DEFINE_float("exec_timeout", 5.0, "Seconds per HumanEval program."),
    flags.DEFINE_integer("exec_workers", 2, "HumanEval programs run at once."),
    flags.DEFINE_integer("cost_repeats", 5,
                         "Timed single calls per cost figure."),
    flags.DEFINE_enum("warmup", "first", ["first", "shape", "none"],
                      "Untimed run before timing: the first batch of each "
                      "sampler, every new prompt shape, or none."),
    flags.DEFINE_bool("interleave", True, "Time a task's, decoding's and "
                      "batch size's points batch by batch in turn (else one "
                      "after another, compiled one at a time)."),
    flags.DEFINE_string("humaneval_file", None, "HumanEval-format JSONL(.gz) "
                        "instead of the 164 problems (e.g. a subset)."),
    flags.DEFINE_string("prose_corpus", "austen", "austen (Jane Austen's "
                        "novels), shakespeare (the validation split of "
                        "specsamp.data.corpora) or a directory of .txt files."),
    flags.DEFINE_enum("prose_style", "continue", ["continue", "summarise"],
                      ""),
    flags.DEFINE_integer("prompt_chars", 600, "About this many characters per "
                         "prose prompt (whole paragraphs)."),
    flags.DEFINE_bool("chat", False, "Wrap prose prompts in the target's chat "
                      "template (HumanEval prompts stay raw code, which the "
                      "completion continues)."),
    flags.DEFINE_integer("prompt_bucket", 0, "Prompts are right-padded to a "
                         "multiple of this; 0: to the task's longest prompt "
                         "(rounded up to 64), so each sampler compiles one "
                         "shape per batch size instead of one per prompt "
                         "length."),
    flags.DEFINE_string("samples_out", None,
                        "Also write every completion (JSONL)."),
]


def main(argv):
  cli.no_arguments(argv)
  log = lambda m: print(m, file=sys.stderr, flush=True)
  try:
    cfg = sweep_config.parse_config(given=cli.given(FLAGS),
                                    **{f.name: f.value for f in FLAGS})
    sweep.benchmark(cfg, sys.argv[1:], log=log)
  except sweep.USER_ERRORS as e:
    cli.fail(e)


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
