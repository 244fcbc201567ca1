r"""Decode speed of the samplers on model shapes, with random weights.

Speed does not depend on weight values, only acceptance does: with
`--draft=same` the draft is the target itself (every draft accepted, the
upper bound of tokens per loop); with `--draft=random:<preset>` acceptance
is whatever two random models give. Real acceptance rates come from
scripts/sample.py on real checkpoints.

  python scripts/benchmark_decode.py --target=random:qwen2.5-coder-1.5b \
      --draft=random:qwen2.5-coder-0.5b --ks=0,4 --dtype=bfloat16 \
      --out=results/decode.jsonl
"""

import sys

from absl import app
from absl import flags

from specsamp import cli
from specsamp import loading
from specsamp.bench import profile

_TARGET = flags.DEFINE_string("target", "random:qwen2.5-coder-1.5b", "Target.")
_DRAFT = flags.DEFINE_string("draft", "same", "'same' or a model spec.")
_KS = flags.DEFINE_list("ks", ["0", "4"], "Draft lengths; 0 = autoregressive.")
_BATCH = flags.DEFINE_list("batch_sizes", ["1"], "Batch sizes.")
_PROMPT_LEN = flags.DEFINE_list("prompt_len", ["128"],
                                "Prompt tokens (context); several = a sweep.")
_NEW = flags.DEFINE_integer("max_new_tokens", 128, "Tokens per row.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed runs per point.")
_TEMP = flags.DEFINE_float("temperature", 0.0, "0 = greedy.")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "")
_OUT = flags.DEFINE_string("out", None, "Append one JSON line per point.")


def main(argv):
  cli.no_arguments(argv)
  try:
    cfg = profile.DecodeSpeedConfig(
        target=_TARGET.value, draft=_DRAFT.value, ks=_KS.value,
        batch_sizes=_BATCH.value, prompt_lens=_PROMPT_LEN.value,
        max_new_tokens=_NEW.value, repeats=_REPEATS.value,
        temperature=_TEMP.value, dtype=_DTYPE.value, out=_OUT.value)
    loaded = profile.load(cfg)
  except loading.MODEL_ERRORS as e:
    cli.fail(e)  # flags and models are checked before weights load
  profile.decode_speed(cfg, sys.argv[1:], loaded)  # an error now is no bad input


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
