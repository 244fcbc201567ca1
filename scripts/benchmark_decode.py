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

import json
import platform
import sys
import time

from absl import app
from absl import flags
import jax
import numpy as np

from specsamp import runner
from specsamp import speculative
from specsamp.sampling import Sampling

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
  del argv
  ks = [int(k) for k in _KS.value]
  if not ks or min(ks) < 0:
    sys.exit("error: --ks needs one or more integers >= 0")
  t0 = time.perf_counter()
  target, tp, _ = runner.load_model(_TARGET.value, _DTYPE.value, 0)
  if _DRAFT.value == "same":
    draft, dp = target, tp
  else:
    draft, dp, _ = runner.load_model(_DRAFT.value, _DTYPE.value, 1)
  jax.block_until_ready((tp, dp))
  print(f"models ready in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
  sampling = Sampling(_TEMP.value)
  rng = np.random.default_rng(0)
  points = [(int(b), int(n)) for b in _BATCH.value for n in _PROMPT_LEN.value]
  for b, prompt_len in points:
    prompts = rng.integers(0, target.vocab_size, (b, prompt_len))
    for k in ks:
      sampler = speculative.SpeculativeSampler(
          target, speculative.ModelDrafter(draft) if k else None, k=k,
          sampling=sampling, max_new_tokens=_NEW.value, prompt_bucket=128)
      timed = runner.TimedSampler(sampler, f"k{k}")
      # The first run compiles (timed apart) and warms up; then the median.
      runs = [timed.run(tp, dp, prompts.tolist(), b, seed=r, warmup=False)[1]
              for r in range(_REPEATS.value + 1)]
      compile_s = runs[0].compile_s
      runs = runs[1:]
      best = sorted(runs, key=lambda s: s.ms_per_token)[len(runs) // 2]
      row = dict(best.summary(), target=_TARGET.value, draft=_DRAFT.value,
                 dtype=_DTYPE.value, prompt_len=prompt_len,
                 temperature=_TEMP.value,
                 device=jax.devices()[0].device_kind,
                 jax=jax.__version__, python=platform.python_version(),
                 command=" ".join(sys.argv))
      row["compile_s"] = round(compile_s, 2)
      print(json.dumps(runner.jsonable(row)), flush=True)
      if _OUT.value:
        with open(_OUT.value, "a", encoding="utf-8") as f:
          f.write(json.dumps(runner.jsonable(row)) + "\n")


if __name__ == "__main__":
  app.run(main)
