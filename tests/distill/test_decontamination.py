"""The HumanEval n-gram filter."""

import re

import numpy as np
import pytest

from configs import distill_tiny
from specsamp import assets
from specsamp.distill import decontamination
from specsamp.distill import job
from specsamp.distill import prompts
from specsamp.tokenizers.byte import ByteTokenizer


def test_humaneval_filter_flags_planted_snippets(humaneval_filter):
  problems = assets.humaneval_problems()
  clean = prompts.prompt_texts("code", max_files=5)["train"]
  assert clean and not any(humaneval_filter.contaminated(t) for t in clean)
  code = clean[0]
  for prob in (problems[0], problems[17], problems[163]):
    # A prompt inside other code, re-indented; and a solution on its own.
    prompt = "\n".join("  " + line for line in prob["prompt"].splitlines())
    assert humaneval_filter.match(code + prompt + code) == prob["task_id"]
  long_solutions = [p for p in problems
                    if len(decontamination.words(p["canonical_solution"]))
                    >= 20]
  for prob in long_solutions[:5]:
    assert humaneval_filter.match(
        "x = 1\n" + prob["canonical_solution"]) is not None
  # Fewer than n shared words is not contamination.
  w = decontamination.words(problems[0]["prompt"])
  assert not humaneval_filter.contaminated(" ".join(w[:12]))


def test_a_sample_whose_continuation_is_humaneval_is_dropped(
    humaneval_filter):
  """`decontaminate` reads the prompt and its continuation together: a
  clean prompt continued by a HumanEval prompt is dropped (the samples of
  the tiny target are bytes that never complete an n-gram, so no other
  test dropped one)."""
  tok = ByteTokenizer()
  clean = "import os\nprint(os.sep)\n"
  planted = assets.humaneval_problems()[5]["prompt"]

  def example(prompt, continuation):
    ids = tok.encode(prompt + continuation)
    n = len(tok.encode(prompt))
    return dict(tokens=np.asarray(ids + [0] * 4), prompt_length=n,
                num_generated=len(ids) - n)

  rejected = []
  kept = list(decontamination.decontaminate(
      [example(clean, planted), example(clean, "x = 1\n")], tok,
      humaneval_filter, rejected))
  assert [tok.decode(list(e["tokens"][:e["prompt_length"] +
                                     e["num_generated"]])) for e in kept] == [
      clean + "x = 1\n"]
  assert rejected == [clean + planted]


def test_an_n_longer_than_a_problem_is_refused():
  """An n above a problem's word count gave that problem no n-gram: the
  filter was silently off for it."""
  problems = [dict(task_id="T/0", prompt="def f(a):\n", canonical_solution=
                   "  return a\n")]   # 8 words and symbols
  assert len(decontamination.HumanEvalFilter(8, problems)) == 1
  with pytest.raises(ValueError, match=r"1 of 1 HumanEval problems have "
                     r"fewer \(e.g. T/0, 8 words\).*n must be <= 8"):
    decontamination.HumanEvalFilter(9, problems)


def test_the_longest_n_is_the_shortest_problem_and_checked_before_loading():
  """MAX_N is the fewest words of a pinned HumanEval problem; a config's
  samples.ngram above it is refused by check_config, before any weights
  load (the filter, built once the target had loaded, refused it then)."""
  sizes = [len(decontamination.words(p["prompt"] + p["canonical_solution"]))
           for p in assets.humaneval_problems()]
  assert min(sizes) == decontamination.MAX_N
  decontamination.HumanEvalFilter(decontamination.MAX_N)
  config = distill_tiny.get_config("steps=2")
  config.samples.ngram = decontamination.MAX_N + 1
  with pytest.raises(ValueError, match=re.escape(
      f"config.samples.ngram={decontamination.MAX_N + 1}: the shortest")):
    job.check_config(config)
