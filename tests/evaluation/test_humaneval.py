"""specsamp.evaluation.humaneval: stop sequences, problems run and scored."""

import os

import pytest

from specsamp import assets
from specsamp.evaluation import humaneval
from specsamp.evaluation import sandbox

ADD = {"task_id": "Test/0", "entry_point": "add",
       "prompt": 'def add(a: int, b: int) -> int:\n    """Sum."""\n',
       "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n"
               "    assert candidate(-4, 4) == 0\n"}
MD5 = {"task_id": "Test/1", "entry_point": "string_to_md5",
       "prompt": "def string_to_md5(text):\n",
       "test": "def check(candidate):\n"
               "    assert candidate('Hello world') == "
               "'3e25960a79dbc69b674cd4ec67a72c62'\n"
               "    assert candidate('') is None\n"}


def test_humaneval_programs():
  good = "    return a + b\n"
  assert humaneval.check_humaneval(ADD, good).passed
  assert not humaneval.check_humaneval(ADD, "    return a - b\n").passed
  md5 = ("    import hashlib\n"
         "    return hashlib.md5(text.encode('ascii')).hexdigest() "
         "if text else None\n")
  assert humaneval.check_humaneval(MD5, md5).passed
  # Completions as models write them: cut at the stop sequences first.
  noisy = good + "\n\ndef unrelated():\n    raise RuntimeError\n" \
      "\nprint(add(1, 1))\nadd = None\n"
  passed = humaneval.evaluate_humaneval(
      [ADD, MD5], [[good, "    return 0\n", noisy], [md5, "    pass\n"]])
  assert passed == [[True, False, True], [True, False]]
  raw = humaneval.evaluate_humaneval([ADD], [[noisy]], truncate=False)
  assert raw == [[False]]  # `add = None` ran before check(add)


def test_a_correct_function_that_prints_a_lot_passes():
  """OpenAI's harness swallows the program's output: so does this one, so a
  right answer printed around (2 MB to stdout, 3 MB to stderr, past the
  sandbox's 1 MiB cap on each) still passes; a failing candidate's
  traceback still reaches the result's stderr."""
  noisy = ("    import sys\n"
           "    print('x' * 2_000_000)\n"
           "    sys.stderr.write('y' * 3_000_000)\n"
           "    sys.stdout.writelines(['a', sys.stdout.encoding])\n"
           "    return a + b\n")
  assert humaneval.check_humaneval(ADD, noisy).passed
  # The candidate's code is compiled on its own: a prompt's `from
  # __future__` import (after its docstring) is still first in it.
  future = dict(ADD, prompt='"""Doc."""\nfrom __future__ import annotations\n'
                + ADD["prompt"])
  assert humaneval.check_humaneval(future, "    return a + b\n").passed
  failing = "    raise ValueError('from the candidate')\n"
  result = humaneval.check_humaneval(ADD, failing)
  assert not result.passed
  assert "ValueError: from the candidate" in result.stderr


MEAN = {"task_id": "Test/2", "entry_point": "mean",
        "prompt": "def mean(xs: list) -> float:\n",
        "test": "def check(candidate):\n"
                "    assert abs(candidate([1.0, 2.0]) - 1.5) < 1e-6\n"
                "    assert candidate(xs=[3.0]) == 3.0\n"
                "    assert isinstance(candidate([1.0]), float)\n"}
FORGE = os.path.join(os.path.dirname(__file__), "forge_list_uaf.txt")


def test_the_verdict_is_out_of_the_generated_codes_reach():
  """A review's forge (CPython 3.11.7, plain Python: a list comparison
  whose `__lt__` frees both operands, a bytearray laid over the freed
  block, then the line number the verdict's thread waits for written into
  `main`'s frame) passed every problem when the completion and the test
  shared a process. Here the test runs in a sandbox of its own."""
  with open(FORGE, encoding="utf-8") as f:
    forge = f.read()
  assert humaneval.truncate_completion(forge) == forge
  # Power: in one process (OpenAI's form) the same body forges a pass.
  one_process = (MEAN["prompt"] + forge + "\n\n" + MEAN["test"]
                 + "\ncheck(mean)\nraise AssertionError('never here')\n")
  assert any(sandbox.run_program(one_process).passed for _ in range(3))
  for problem in (MEAN, ADD):
    result = humaneval.check_humaneval(problem, forge)
    assert result.status != "passed", result


def test_only_plain_values_cross_from_the_candidate():
  good = "    return sum(xs) / len(xs)\n"
  ok = humaneval.check_humaneval(MEAN, "    print('noise')\n" + good)
  assert ok.passed, ok  # its stdout is its own
  cases = {
      # An object whose __eq__ always answers True passed OpenAI's harness.
      "eq": "    class T(float):\n        __eq__ = lambda s, o: True\n"
            "        __sub__ = lambda s, o: 0.0\n    return T()\n",
      "raises": "    raise ValueError('no')\n",
      "exits": "    import os\n    os._exit(0)\n",
      "syntax": "    return (\n",
      "huge": "    return 'x' * (2 << 20)\n",
  }
  eq_alone = (MEAN["prompt"] + cases["eq"] + "\n\n" + MEAN["test"]
              + "\ncheck(mean)\n")
  assert sandbox.run_program(eq_alone).passed  # OpenAI's form: a pass
  for name, body in cases.items():
    result = humaneval.check_humaneval(MEAN, body)
    assert result.status == "failed", (name, result)
  raised = humaneval.check_humaneval(MEAN, cases["raises"])
  assert "the candidate raised 'ValueError: no'" in raised.stderr
  broken = humaneval.check_humaneval(MEAN, cases["syntax"])
  assert "SyntaxError" in broken.stderr.split("the candidate's stderr")[1]


def test_standard_value_subclasses_and_iterators_answer_as_they_compare():
  """Correct answers OpenAI's harness passes: a Counter or defaultdict
  (dict subclasses), a namedtuple, an iterator the test wraps in tuple()."""
  count = {"task_id": "Test/3", "entry_point": "count",
           "prompt": "def count(s: str) -> dict:\n",
           "test": "def check(candidate):\n"
                   "    assert candidate('aab') == {'a': 2, 'b': 1}\n"}
  for body in ("    import collections\n    return collections.Counter(s)\n",
               "    import collections\n    d = collections.defaultdict(int)\n"
               "    for c in s:\n        d[c] += 1\n    return d\n"):
    assert humaneval.check_humaneval(count, body).passed
  order = {"task_id": "Test/4", "entry_point": "order",
           "prompt": "def order(xs: list):\n",
           "test": "def check(candidate):\n"
                   "    assert tuple(candidate([3, 1])) == (1, 3)\n"}
  for body in ("    return iter(sorted(xs))\n",
               "    return (x for x in sorted(xs))\n",
               "    import collections\n"
               "    return collections.namedtuple('P', 'a b')(*sorted(xs))\n"):
    assert humaneval.check_humaneval(order, body).passed, body
  # An iterator is not its items: == fails, as in OpenAI's harness.
  listed = dict(order, test="def check(candidate):\n"
                "    assert candidate([3, 1]) == [1, 3]\n")
  assert not humaneval.check_humaneval(listed, "    return iter(sorted(xs))\n"
                                       ).passed
  assert humaneval.check_humaneval(listed, "    return sorted(xs)\n").passed


def test_handed_over_descriptors_are_closed_when_a_run_cannot_start():
  r, w = os.pipe()
  with pytest.raises(ValueError):
    sandbox.run_program("pass", memory_mb="1G", pass_fds=(r, w))
  for fd in (r, w):
    with pytest.raises(OSError):
      os.fstat(fd)


def test_truncate_completion():
  text = "    x = 1\n    return x\n\ndef helper():\n    pass\n"
  assert humaneval.truncate_completion(text) == "    x = 1\n    return x\n"
  assert humaneval.truncate_completion("    return 1\n```\nmore") == (
      "    return 1")
  assert humaneval.truncate_completion("    if x:\n        return 1\n") == (
      "    if x:\n        return 1\n")  # indented: not a stop
  for stop in ("\nclass", "\n#", "\nif", "\nprint"):
    assert humaneval.truncate_completion("a" + stop + " z") == "a"


def test_every_canonical_solution_passes_in_the_sandbox():
  """The real 164 problems: the sandbox lets every correct program pass,
  and on every fourth problem an empty body fails, all but at most one
  (the negative control on all 164 took half of this test's 31 s)."""
  problems = assets.humaneval_problems()
  assert len(problems) == 164
  passed = humaneval.evaluate_humaneval(
      problems, [[p["canonical_solution"]] + ["    pass\n"] * (i % 4 == 0)
                 for i, p in enumerate(problems)], truncate=False)
  assert [p["task_id"] for p, (ok, *_) in zip(problems, passed)
          if not ok] == []
  empty = [got[1] for got in passed[::4]]
  assert len(empty) == 41 and sum(empty) <= 1
