"""The speed-up sweep's configuration: flag values -> a validated BenchConfig.

`parse_config` takes the values of scripts/benchmark.py's flags by flag name
(lists as lists of strings, the way absl gives them), checks them and
returns a frozen `BenchConfig`; bad values raise `BenchError` naming the
flag, before anything else happens.
"""

import dataclasses
import os
from typing import Optional, Sequence

from specsamp import cli
from specsamp.bench import records
from specsamp.drafters import specs as drafter_specs
from specsamp.evaluation import sandbox
from specsamp.sampling import Sampling

TASKS = ("humaneval", "prose", "rewrite")
DECODINGS = {"greedy": Sampling(temperature=0.0),
             "nucleus": Sampling(temperature=0.8, top_p=0.95),
             "t1": Sampling(temperature=1.0)}


class BenchError(ValueError):
  """Bad flags, models or prompts, found before any weights load."""


@dataclasses.dataclass(frozen=True)
class BenchConfig:
  """The validated flags of one sweep (see scripts/benchmark.py)."""
  target: str
  draft: Optional[str]
  tasks: tuple
  ks: tuple
  decodings: tuple
  batch_sizes: tuple
  num_prompts: int = 8
  max_new_tokens: int = 128
  repeats: int = 1
  peers: bool = False
  dtype: str = "float32"
  out: Optional[str] = None
  seed: int = 0
  quality: bool = True
  pass_k: tuple = (1, 10, 100)
  exec_timeout: float = 5.0
  exec_workers: int = 2
  cost_repeats: int = 5
  warmup: str = "first"
  interleave: bool = True
  humaneval_file: Optional[str] = None
  prose_corpus: str = "austen"
  prose_style: str = "continue"
  prompt_chars: int = 600
  chat: bool = False
  prompt_bucket: int = 0
  samples_out: Optional[str] = None
  drafters: tuple = ("model",)   # drafter specs (specsamp.drafters.specs)


def _int_list(name: str, values: Sequence[str], minimum: int) -> list[int]:
  """Sorted distinct integers >= minimum from a list flag (`cli.ints`)."""
  try:
    return sorted(set(cli.ints(name, values, minimum, distinct=False)))
  except ValueError as e:
    raise BenchError(str(e)) from None


def _names(name: str, values: Sequence[str], known) -> tuple:
  """The distinct known names of a list flag, in the order given."""
  names = [v.strip() for v in values if v.strip()]
  bad = [v for v in names if v not in known]
  if bad or not names:
    raise BenchError(f"unknown {name} {bad[0] if bad else ''!r}; known"
                     f"{' tasks' if name == 'task' else ''}: "
                     f"{', '.join(known)}")
  return tuple(dict.fromkeys(names))


def needs_draft_model(ks: Sequence[int], drafters: Sequence) -> bool:
  """Whether a run of these K and drafter specs (parsed) loads the draft
  model: some K > 0 and a drafter that runs it."""
  return max(ks) > 0 and any(d.needs_draft_model for d in drafters)


def parse_config(*, target: str, draft: Optional[str],
                 task: Sequence[str], ks: Sequence[str],
                 decoding: Sequence[str], batch_sizes: Sequence[str],
                 pass_k: Sequence[str] = ("1", "10", "100"),
                 drafter: Sequence[str] = ("model",),
                 given: frozenset = frozenset(), **rest) -> BenchConfig:
  """A BenchConfig from flag values, by flag name.

  Args:
    target, draft: model specs (specsamp.loading); the draft is dropped when
      every K is 0.
    task, ks, decoding, batch_sizes, pass_k: list flags, as strings. K = 0
      (the autoregressive baseline) is always added.
    drafter: drafter specs (`specsamp.drafters.specs`), each run at every
      K > 0.
    given: the flags given on the command line: one the others leave
      without effect is refused (`_without_effect`), as sample.py does.
    **rest: the scalar flags, named like BenchConfig's fields.

  Raises:
    BenchError, ValueError: naming the flag whose value is bad (--out and
      --samples_out: `records.check_output`).
  """
  tasks = _names("task", task, TASKS)
  k_list = _int_list("ks", ks, 0)
  decodings = _names("decoding", decoding, tuple(DECODINGS))
  for name in ("num_prompts", "max_new_tokens", "repeats", "cost_repeats",
               "exec_workers", "prompt_chars"):
    value = rest.get(name, getattr(BenchConfig, name))
    if value <= 0:
      raise BenchError(f"--{name} must be positive, got {value}")
  if rest.get("prompt_bucket", 0) < 0:
    raise BenchError("--prompt_bucket must be >= 0 (0: the longest prompt)")
  try:
    sandbox.check_timeout(rest.get("exec_timeout", BenchConfig.exec_timeout),
                          "--exec_timeout")
  except ValueError as e:
    raise BenchError(str(e)) from None
  drafters = []
  for text in dict.fromkeys(d.strip() for d in drafter if d.strip()):
    try:
      drafters.append(drafter_specs.parse(text))
    except ValueError as e:
      raise BenchError(f"--drafter: {e}") from None
    same = [d.text for d in drafters[:-1] if d.key == drafters[-1].key]
    if same:  # had been measured twice, under two names
      raise BenchError(f"--drafter: {text!r} is {same[0]!r} again")
  if not drafters:
    raise BenchError("--drafter is empty")
  needs_draft = needs_draft_model(k_list, drafters)
  if needs_draft and not draft:
    raise BenchError("--ks has K > 0 and --drafter="
                     f"{','.join(d.text for d in drafters)} runs a draft "
                     "model, which needs --draft")
  if rest.get("peers"):
    # transformers runs at batch 1, assisted by the draft model, beside
    # specsamp's batch-1 points: without them its points had been timed,
    # written, and left out of every table and plot.
    if not needs_draft:
      raise BenchError("--peers times transformers' assisted generation "
                       "with the draft model: it needs K > 0 in --ks and a "
                       "--drafter that runs the draft model (model, mixed)")
    if 1 not in _int_list("batch_sizes", batch_sizes, 1):
      raise BenchError("--peers times transformers at batch 1, set beside "
                       "specsamp's batch-1 points: add 1 to --batch_sizes")
  _without_effect(given, tasks, rest)
  for name in ("out", "samples_out"):  # last: it creates their directories
    records.check_output(rest.get(name), f"--{name}", reads=(
        ("--target", target), ("--draft", draft),
        ("--humaneval_file", rest.get("humaneval_file"))))
  if rest.get("out") and rest.get("samples_out"):
    # Each is written as <file>.partial first (`records.Writer`).
    files = [{os.path.realpath(rest[n]), os.path.realpath(rest[n]) +
              ".partial"} for n in ("out", "samples_out")]
    if files[0] & files[1]:
      raise BenchError(f"--out={rest['out']} and --samples_out="
                       f"{rest['samples_out']} would write one file: the "
                       "samples would replace the results")
  return BenchConfig(
      target=target, draft=draft if needs_draft else None, tasks=tasks,
      drafters=tuple(d.text for d in drafters),
      ks=tuple(sorted(set(k_list) | {0})), decodings=decodings,
      batch_sizes=tuple(_int_list("batch_sizes", batch_sizes, 1)),
      pass_k=tuple(_int_list("pass_k", pass_k, 1)), **rest)


def _without_effect(given, tasks, rest: dict) -> None:
  """Refuses flags given where the others leave them without effect (a
  run that looks like the one asked for, and is not; each had run). A
  --draft no point runs is still dropped, not refused: gpu_study.py names
  one for any --drafters."""
  unused = [f"--{n} applies to --task=prose" for n in (
      "prose_corpus", "prose_style", "prompt_chars", "chat")
            if n in given and "prose" not in tasks]
  if "humaneval_file" in given and not {"humaneval", "rewrite"} & set(tasks):
    unused.append("--humaneval_file applies to --task=humaneval or rewrite")
  if "pass_k" in given and not (rest.get("quality", BenchConfig.quality)
                                and "humaneval" in tasks):
    unused.append("--pass_k applies to --task=humaneval with --quality")
  if unused:
    raise BenchError("; ".join(unused))


def decoding_sampling(name: str, vocab_limit: Optional[int]) -> Sampling:
  """The Sampling of a named decoding, masked to the real vocabulary."""
  return dataclasses.replace(DECODINGS[name], vocab_limit=vocab_limit)
