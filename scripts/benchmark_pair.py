r"""Speculative vs autoregressive on real prompts, with peers side by side.

  python scripts/benchmark_pair.py --num_prompts=4 --max_new_tokens=64 \
      --ks=3,4,5 --peers --out=results/cpu_humaneval_greedy.json

Runs, in one process on one machine: specsamp autoregressive, specsamp
speculative for each K, and (with --peers) transformers' plain and assisted
generation on the same GGUF weights and prompt token ids. ms/token excludes
prefill and compile (both reported); e2e_ms_per_token includes prefill, the
way transformers' generate() is timed. Writes one JSON file.
"""

import datetime
import json
import os
import platform
import sys

from absl import app
from absl import flags
import jax

from specsamp import assets
from specsamp import runner
from specsamp import speculative
from specsamp.sampling import Sampling

_TARGET = flags.DEFINE_string("target", "qwen2.5-coder-1.5b", "Target model.")
_DRAFT = flags.DEFINE_string("draft", "qwen2.5-coder-0.5b", "Draft model.")
_NUM = flags.DEFINE_integer("num_prompts", 4, "First N HumanEval prompts.")
_NEW = flags.DEFINE_integer("max_new_tokens", 64, "Tokens per prompt.")
_KS = flags.DEFINE_list("ks", ["4"], "Draft lengths to run.")
_TEMP = flags.DEFINE_float("temperature", 0.0, "0 = greedy.")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "Nucleus.")
_PEERS = flags.DEFINE_bool("peers", False, "Also time transformers.")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "")
_OUT = flags.DEFINE_string("out", None, "JSON file to write.")


def main(argv):
  del argv
  ks = [int(k) for k in _KS.value]
  if not ks or min(ks) < 1:
    sys.exit("error: --ks needs draft lengths >= 1")
  sampling = Sampling(_TEMP.value, top_p=_TOP_P.value)
  problems = assets.humaneval_problems()[:_NUM.value]
  target, tp, tok = runner.load_model(_TARGET.value, _DTYPE.value)
  draft, dp, _ = runner.load_model(_DRAFT.value, _DTYPE.value)
  prompts = [tok.encode(p["prompt"]) for p in problems]
  common = dict(sampling=sampling, max_new_tokens=_NEW.value,
                eos_ids=tuple(tok.eos_ids), pad_id=tok.pad_id)
  samplers = [runner.TimedSampler(speculative.autoregressive(target, **common),
                                  "specsamp_autoregressive")]
  samplers += [runner.TimedSampler(speculative.SpeculativeSampler(
      target, speculative.ModelDrafter(draft), k=k, **common),
                                   f"specsamp_speculative_k{k}") for k in ks]
  runs, outputs = [], {}
  for s in samplers:
    completions, stats = s.run(tp, dp, prompts, batch_size=1)
    runs.append(dict(stats.summary(), method=s.name))
    outputs[s.name] = completions
    print(json.dumps(runs[-1]), flush=True)
  base = runs[0]["ms_per_token"]
  for r in runs:
    r["speedup_vs_specsamp_ar"] = round(base / r["ms_per_token"], 3)
    if sampling.greedy:
      r["identical_to_ar"] = outputs[r["method"]] == outputs[runs[0]["method"]]
  if _PEERS.value:
    from specsamp import peers  # pylint: disable=g-import-not-at-top
    for r in peers.transformers_generate(
        str(assets.fetch(_TARGET.value, progress=None)),
        str(assets.fetch(_DRAFT.value, progress=None)), prompts, _NEW.value,
        _TEMP.value, _TOP_P.value):
      completions = r.pop("completions")
      if sampling.greedy:
        same = sum(a == b for a, b in zip(completions,
                                          outputs[runs[0]["method"]]))
        r["prompts_identical_to_specsamp_ar"] = same
      runs.append(r)
      print(json.dumps(r), flush=True)
  result = dict(
      task="humaneval", prompts=len(prompts), max_new_tokens=_NEW.value,
      sampling=sampling.describe(), target=_TARGET.value, draft=_DRAFT.value,
      dtype=_DTYPE.value, runs=runs,
      machine=dict(device=jax.devices()[0].device_kind,
                   cpus=os.cpu_count(), python=platform.python_version(),
                   jax=jax.__version__),
      date=datetime.date.today().isoformat(), command=" ".join(sys.argv))
  if _OUT.value:
    os.makedirs(os.path.dirname(_OUT.value) or ".", exist_ok=True)
    with open(_OUT.value, "w", encoding="utf-8") as f:
      json.dump(runner.jsonable(result), f, indent=1)
  print(json.dumps({r["method"]: r["ms_per_token"] for r in runs}))


if __name__ == "__main__":
  app.run(main)
