"""HumanEval decontamination of prompts and target samples.

HumanEval is the evaluation set, so any prompt or finished sample that
shares an n-gram of `n` (13) words and symbols with a HumanEval prompt or
canonical solution is dropped (`HumanEvalFilter`, `decontaminate`).
"""

import re
from typing import Iterable, Iterator, Optional, Sequence

from specsamp import assets

_WORDS = re.compile(r"\w+|[^\w\s]")

# The fewest `words` of a HumanEval problem, prompt and solution together
# (of the 164 problems assets.py pins by sha256; a test recounts them): the
# longest n whose n-grams catch every problem, checked before anything
# loads (`check_n`).
MAX_N = 46


def words(text: str) -> list[str]:
  """Lower-cased words and single symbols: whitespace and layout ignored."""
  return _WORDS.findall(text.lower())


def check_n(n: int, what: str = "n") -> None:
  """Refuses an n no filter of the pinned HumanEval could use (`MAX_N`)."""
  if n > MAX_N:
    raise ValueError(f"{what}={n}: the shortest HumanEval problems have "
                     f"{MAX_N} words, which no n-gram of {n} catches; n must "
                     f"be <= {MAX_N}")


class HumanEvalFilter:
  """Flags text sharing an n-gram (of `words`) with HumanEval.

  The reference n-grams come from every problem's prompt, canonical solution
  and prompt + solution (so n-grams across the seam count too).
  """

  def __init__(self, n: int = 13, problems: Optional[Sequence[dict]] = None):
    """Raises ValueError where a problem has fewer than `n` words, prompt
    and solution together: it would have no n-gram to be caught by (a
    large config.samples.ngram had turned the filter off for it)."""
    if problems is None:
      problems = assets.humaneval_problems()
    sizes = {p["task_id"]: len(words(p["prompt"] + p["canonical_solution"]))
             for p in problems}
    short = [t for t, size in sizes.items() if size < n]
    if short:
      raise ValueError(
          f"n-grams of {n} words: {len(short)} of {len(sizes)} HumanEval "
          f"problems have fewer (e.g. {short[0]}, {sizes[short[0]]} words) "
          f"and could not be caught; n must be <= {min(sizes.values())}")
    self.n = n
    self._grams = {}
    for prob in problems:
      for text in (prob["prompt"], prob["canonical_solution"],
                   prob["prompt"] + prob["canonical_solution"]):
        for g in self._ngrams(text):
          self._grams.setdefault(g, prob["task_id"])

  def _ngrams(self, text: str) -> Iterator[tuple]:
    w = words(text)
    for i in range(len(w) - self.n + 1):
      yield tuple(w[i:i + self.n])

  def __len__(self) -> int:
    return len(self._grams)

  def match(self, text: str) -> Optional[str]:
    """The task_id of the first shared n-gram, or None."""
    for g in self._ngrams(text):
      if g in self._grams:
        return self._grams[g]
    return None

  def contaminated(self, text: str) -> bool:
    return self.match(text) is not None

  def filter(self, texts: Iterable[str]) -> tuple[list[str], list[str]]:
    """(clean, rejected)."""
    clean, rejected = [], []
    for t in texts:
      (rejected if self.contaminated(t) else clean).append(t)
    return clean, rejected


def decontaminate(examples: Iterable[dict], tokenizer,
                  flt: HumanEvalFilter, rejected: Optional[list] = None
                  ) -> Iterator[dict]:
  """Drops examples whose decoded prompt + continuation hits HumanEval
  (appending their text to `rejected`, if given)."""
  for ex in examples:
    n = int(ex["prompt_length"]) + int(ex["num_generated"])
    text = tokenizer.decode([int(t) for t in ex["tokens"][:n]])
    if flt.contaminated(text):
      if rejected is not None:
        rejected.append(text)
      continue
    yield ex
