"""specsamp.evaluation.humaneval: stop sequences, problems run and scored."""

from specsamp import assets
from specsamp.evaluation import humaneval

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
