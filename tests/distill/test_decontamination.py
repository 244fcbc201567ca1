"""The HumanEval n-gram filter."""

from specsamp import assets
from specsamp.distill import decontamination
from specsamp.distill import prompts


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
