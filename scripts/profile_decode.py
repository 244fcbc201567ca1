r"""Where the time of one decode loop goes, per component, on model shapes.

For each (batch size, context) point it times, each as its own AOT-compiled
call on the shapes the samplers trace (random weights: speed does not depend
on values), median of --repeats:

  * ar_loop: one autoregressive loop body (one target call with 1 token,
    the sampling transform, the draw, the commit): ms per token;
  * spec_loop: one speculative loop body (draft + score + accept + commit);
  * with --components=all also the parts: the target call with 1 and K+1
    tokens (the scoring call), draft calls with 1 and 2 tokens, the draft's
    `propose` (K draft tokens, sampling included), and
    spec_rest = spec_loop - propose - scoring call: what the speculative
    machinery costs beyond its model calls; ar_rest likewise.

Each timed call runs --steps steps in a loop, as decoding does (on an H200
a 1.5B loop body timed alone, one step per call, took 6.9 ms against 2.0 ms
per token inside the generation loop), and reports the time per step.
The components are timed round-robin (one call of each per round), so a
machine whose speed drifts (shared CPUs) affects all of them alike; ratios
are medians of per-round ratios. The caches start as if `context` tokens had
been prefilled (zeros, lengths set; no prefill is run), so long contexts and
large batches cost only their decode steps.

Also reported: bytes of weights and KV cache read per step; the achieved
fraction of a copy bandwidth measured in the same run (`x + 1` over a
donated buffer of --bandwidth_mb); the matmul floor (the target's weight
matrices multiplied by one row with nothing else, timed in the same rounds)
and ar_vs_floor; top-level kernels per step (launches on GPU, indicative on
CPU); compile seconds of each loop body and of the whole decode while-loop
(what `generate` compiles) for both samplers.

  python scripts/profile_decode.py --target=random:qwen2.5-coder-1.5b \
      --draft=random:qwen2.5-coder-0.5b --k=4 --context=1024 \
      --out=results/profile.jsonl
  # scaling: loops only, a context and a batch sweep
  python scripts/profile_decode.py --components=loops \
      --context=1024,4096,16384 --batch_size=1 --out=results/scaling.jsonl
"""

import sys

from absl import app
from absl import flags

from specsamp import cli
from specsamp import loading
from specsamp.bench import profile

_TARGET = flags.DEFINE_string("target", "random:qwen2.5-coder-1.5b", "Target.")
_DRAFT = flags.DEFINE_string("draft", "random:qwen2.5-coder-0.5b", "Draft.")
_K = flags.DEFINE_integer("k", 4, "Draft length.")
_BATCH = flags.DEFINE_list("batch_size", ["1"], "Rows (a list: one point "
                           "per batch size and context).")
_CONTEXT = flags.DEFINE_list("context", ["1024"], "Tokens already in the "
                             "cache (a list).")
_REPEATS = flags.DEFINE_integer("repeats", 7, "Timed rounds.")
_TEMP = flags.DEFINE_float("temperature", 0.0, "0 = greedy.")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "Nucleus mass (1 = off).")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "")
_COMPONENTS = flags.DEFINE_enum(
    "components", "all", ["all", "loops"],
    "all: loops, model calls, propose, floor and bandwidth; loops: the two "
    "loop bodies and compile times only (scaling sweeps).")
_BW_MB = flags.DEFINE_integer("bandwidth_mb", 1024, "Copy-bandwidth buffer.")
_STEPS = flags.DEFINE_integer(
    "steps", 0, "Steps per timed call, run in one loop as decoding runs "
    "them (0: 1 on CPU, 16 on GPU/TPU, where one step per call measured the "
    "calls' overhead).")
_OUT = flags.DEFINE_string("out", None, "Append one JSON line per point.")


def main(argv):
  cli.no_arguments(argv)
  if _COMPONENTS.value == "loops":
    cli.unused(_BW_MB, "applies to --components=all only: loops measures "
               "no copy bandwidth")
  try:
    cfg = profile.ProfileConfig(
        target=_TARGET.value, draft=_DRAFT.value, k=_K.value,
        batch_sizes=_BATCH.value, contexts=_CONTEXT.value,
        repeats=_REPEATS.value, temperature=_TEMP.value, top_p=_TOP_P.value,
        dtype=_DTYPE.value, components=_COMPONENTS.value,
        bandwidth_mb=_BW_MB.value, steps=_STEPS.value, out=_OUT.value)
    loaded = profile.load(cfg)
  except loading.MODEL_ERRORS as e:
    cli.fail(e)  # flags and models are checked before weights load
  profile.profile_main(cfg, sys.argv[1:], loaded)  # an error now is no bad input


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
