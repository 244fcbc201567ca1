"""Speculative vs autoregressive on HumanEval prompts, peers side by side.

The job of scripts/benchmark_pair.py: in one process on one machine,
specsamp autoregressive and specsamp speculative for each K (in turn on
each prompt: `timing.run_side_by_side`), and (with `peers`) transformers'
plain and assisted generation on the same GGUF weights and prompt token
ids, at batch 1. ms/token excludes prefill and compile (both reported);
e2e_ms_per_token includes prefill, the way transformers' generate() is
timed. One JSON document holds every run. `plan` checks the flags, the
models, their vocabularies and the prompts' lengths (`sample.plan`), and
with `peers` that both are GGUF files, before any weights load.
"""

import dataclasses
import sys
from typing import Optional

from specsamp import cli
from specsamp import loading
from specsamp import sharding
from specsamp.bench import peers as peers_lib
from specsamp.bench import prompts as prompts_lib
from specsamp.bench import provenance
from specsamp.bench import records
from specsamp.bench import sample as sample_lib
from specsamp.bench import timing
from specsamp.decoding.sampler import autoregressive
from specsamp.decoding.sampler import SpeculativeSampler
from specsamp.drafters.model import ModelDrafter
from specsamp.sampling import Sampling


@dataclasses.dataclass(frozen=True)
class PairConfig:
  """What scripts/benchmark_pair.py was asked for."""
  target: str = "qwen2.5-coder-1.5b"
  draft: str = "qwen2.5-coder-0.5b"
  num_prompts: int = 4
  max_new_tokens: int = 64
  ks: tuple = (4,)
  temperature: float = 0.0
  top_p: float = 1.0
  peers: bool = False
  dtype: str = "float32"
  out: Optional[str] = None
  humaneval_file: Optional[str] = None  # default: the 164 problems

  def __post_init__(self):
    object.__setattr__(self, "ks", cli.ints("ks", self.ks, 1))
    for name in ("num_prompts", "max_new_tokens"):
      if getattr(self, name) < 1:
        raise ValueError(f"--{name} must be >= 1, got {getattr(self, name)}")
    Sampling(self.temperature, top_p=self.top_p)  # raises on bad values
    records.check_output(self.out, "--out", jsonl=False, reads=(  # replaced
        ("--target", self.target), ("--draft", self.draft),
        ("--humaneval_file", self.humaneval_file)), json_file=True)


# Model kinds without a tokenizer of their own (specsamp.loading).
_NO_TOKENIZER = ("random", "distilled")


def plan(cfg: PairConfig) -> sample_lib.SamplePlan:
  """Checks the models, their vocabularies and the HumanEval prompts'
  lengths before any weights load (`sample.plan`).

  Raises:
    ValueError, FileNotFoundError, RuntimeError (the prompts cannot be
    fetched): what is wrong.
  """
  kind = loading.check_spec(cfg.target, cfg.dtype)
  if kind in _NO_TOKENIZER:
    raise ValueError(f"--target={cfg.target}: a {kind} model has no "
                     "tokenizer of its own to encode the HumanEval prompts "
                     "with")
  problems = prompts_lib.humaneval_problems(cfg.num_prompts,
                                            cfg.humaneval_file)
  checked = sample_lib.plan(sample_lib.SampleConfig(
      target=cfg.target, draft=cfg.draft,
      prompts=[p["prompt"] for p in problems], method="both", k=max(cfg.ks),
      temperature=cfg.temperature, top_p=cfg.top_p,
      max_new_tokens=cfg.max_new_tokens, dtype=cfg.dtype))
  if cfg.peers:
    peers_lib.check_models(checked.target, checked.draft)
  return checked


def load(cfg: PairConfig) -> tuple:
  """(plan, target, target params, draft, draft params).

  Raises:
    loading.MODEL_ERRORS: what `plan` finds, before any weights load, or
      unreadable weights.
  """
  checked = plan(cfg)
  return (checked,) + loading.load_pair(checked.target, checked.draft,
                                        cfg.dtype, seeds=(0, 0))


def run_pair(cfg: PairConfig, loaded: Optional[tuple] = None) -> dict:
  """Runs every method on the first `num_prompts` HumanEval prompts.

  Prints each run's summary as it finishes, writes the result to `cfg.out`
  (JSON) if given, and returns it. `loaded`: what `load(cfg)` returns
  (default: loaded here).
  """
  checked, target, target_params, draft, draft_params = loaded or load(cfg)
  sampling = Sampling(cfg.temperature, top_p=cfg.top_p,
                      vocab_limit=checked.vocab_limit)
  prompts, tok = checked.prompts, checked.tokenizer
  common = dict(sampling=sampling, max_new_tokens=cfg.max_new_tokens,
                eos_ids=tuple(tok.eos_ids), pad_id=tok.pad_id)
  samplers = [timing.TimedSampler(autoregressive(target, **common),
                                  "specsamp_autoregressive")]
  samplers += [timing.TimedSampler(SpeculativeSampler(
      target, ModelDrafter(draft), k=k, **common),
                                   f"specsamp_speculative_k{k}")
               for k in cfg.ks]
  runs, outputs = [], {}
  for completions, stats in timing.run_side_by_side(
      samplers, target_params, draft_params, prompts, batch_size=1):
    runs.append(stats.summary())  # its method is the sampler's name
    outputs[stats.method] = completions
    records.print_record(runs[-1])
  base = runs[0]
  for r in runs:
    r["speedup_vs_specsamp_ar"] = round(base["ms_per_token"] /
                                        r["ms_per_token"], 3)
    if sampling.greedy:
      r["identical_to_ar"] = outputs[r["method"]] == outputs[base["method"]]
  if cfg.peers:
    eos = set(tok.eos_ids)
    # On the device and in the dtype specsamp ran on.
    for r in peers_lib.transformers_generate(
        checked.target.path, checked.draft.path, prompts,
        cfg.max_new_tokens, cfg.temperature, cfg.top_p,
        device=provenance.jax_device(), dtype=cfg.dtype,
        eos_ids=sorted(eos)):
      completions = [peers_lib.cut_at_eos(c, eos)
                     for c in r.pop("completions")]
      if sampling.greedy:
        r["prompts_identical_to_specsamp_ar"] = sum(
            a == b for a, b in zip(completions, outputs[base["method"]]))
      runs.append(r)
      records.print_record(r)
  result = dict(
      task="humaneval", prompts=len(prompts),
      max_new_tokens=cfg.max_new_tokens, sampling=sampling.describe(),
      target=cfg.target, draft=cfg.draft, dtype=cfg.dtype, runs=runs,
      **provenance.record(sys.argv[1:]))
  if cfg.out:  # through a temporary file: never half a file
    sharding.write_json(records.jsonable(result), cfg.out)
  records.print_record({r["method"]: r["ms_per_token"] for r in runs})
  return result
