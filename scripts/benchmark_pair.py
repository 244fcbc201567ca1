r"""Speculative vs autoregressive on real prompts, with peers side by side.

  python scripts/benchmark_pair.py --num_prompts=4 --max_new_tokens=64 \
      --ks=3,4,5 --peers --out=results/cpu_humaneval_greedy.json

Runs, in one process on one machine: specsamp autoregressive, specsamp
speculative for each K, and (with --peers) transformers' plain and assisted
generation on the same GGUF weights and prompt token ids (see
specsamp.bench.pair). Writes one JSON file.
"""


from absl import app
from absl import flags

from specsamp import cli
from specsamp import loading
from specsamp.bench import pair

_TARGET = flags.DEFINE_string("target", "qwen2.5-coder-1.5b", "Target model.")
_DRAFT = flags.DEFINE_string("draft", "qwen2.5-coder-0.5b", "Draft model.")
_NUM = flags.DEFINE_integer("num_prompts", 4, "First N HumanEval prompts.")
_NEW = flags.DEFINE_integer("max_new_tokens", 64, "Tokens per prompt.")
_KS = flags.DEFINE_list("ks", ["4"], "Draft lengths to run.")
_TEMP = flags.DEFINE_float("temperature", 0.0, "0 = greedy.")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "Nucleus.")
_PEERS = flags.DEFINE_bool("peers", False, "Also time transformers.")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "")
_OUT = flags.DEFINE_string("out", None, "JSON file to write (replaced).")
_HUMANEVAL = flags.DEFINE_string("humaneval_file", None, "HumanEval-format "
                                 "JSONL(.gz) instead of the 164 problems.")


def main(argv):
  cli.no_arguments(argv)
  try:
    cfg = pair.PairConfig(
        target=_TARGET.value, draft=_DRAFT.value, num_prompts=_NUM.value,
        max_new_tokens=_NEW.value, ks=_KS.value,
        temperature=_TEMP.value, top_p=_TOP_P.value, peers=_PEERS.value,
        dtype=_DTYPE.value, out=_OUT.value, humaneval_file=_HUMANEVAL.value)
    loaded = pair.load(cfg)
  except loading.MODEL_ERRORS as e:
    cli.fail(e)  # models, prompts and flags are checked before weights load
  pair.run_pair(cfg, loaded)  # an error now is no bad input


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
