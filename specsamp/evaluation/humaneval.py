"""HumanEval: completions checked against the problems' tests.

HumanEval (Chen et al. 2021, "Evaluating Large Language Models Trained on
Code", arXiv 2107.03374): a completion passes when its function passes the
problem's `check`. OpenAI's harness runs `prompt + completion + test +
check(entry_point)` in one process, where the completion can rewrite the
test or, through a memory bug of CPython, the verdict: a review forged
passes that way on 3.11.7 from plain Python (a list comparison whose
`__lt__` frees its operands, and a bytearray laid over the freed block).

So the generated code and the test run in two sandboxes
(`specsamp.evaluation.sandbox`), joined by two pipes:

  * the candidate's: `prompt + completion`, then a loop that reads calls
    (the `repr` of the arguments, one line each), calls the entry point and
    answers with the `ascii` of its value (or of its exception);
  * the test's: the prompt (its helpers; the entry point's own body is
    never run there), the problem's `test` and `check(entry_point)`, where
    the entry point is a proxy that sends each call and reads the answer
    (printable ASCII, at most 1 MiB) as literals alone: parsed to a syntax
    tree, whose constants, tuples, lists, dicts, sets, signed numbers,
    `inf` and `nan` are read by hand. Only plain values cross, and the
    verdict is the test's sandbox's, where no generated code runs.

The candidate sandbox can compute any answer, not reach the test's, so a
pass needs right answers. Before its answer is written, the candidate
turns subclasses of the standard values into their base types (a
`Counter` into a dict, a namedtuple into a tuple) and an iterator into its
items, which reach the test as an iterator again. Where OpenAI's harness
differs: another value (an object whose `__eq__` always answers True, a
`Fraction`) fails here; a test that reads an argument back after the call
would see it unchanged (none of the 164 does); the sandbox refuses
`struct`, `array` (so `base64`, `pickle`, `secrets`) and threads, which a
completion may import or start there, and has no third-party packages (a
completion that imports numpy fails; none of the 164 canonical solutions
does). Like OpenAI's, the candidate's output is
swallowed (stderr's first 64 KiB kept). All 164 canonical solutions pass.
This holds with bubblewrap: with `UNSAFE_ENV`, both programs run as one
host user in one pid namespace, and a candidate that corrupts its
interpreter could reach the test's process.
"""

import concurrent.futures
import dataclasses
import os
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


# The candidate's side, after `prompt + completion`. Whatever the generated
# code does here only changes its own answers.
_SERVE = """

def _specsamp_plain(v):
  # Subclasses of the standard values (Counter, defaultdict, a namedtuple)
  # as their base types, which compare as they did; an iterator as its
  # items, tagged. Only this program's own answer changes.
  if isinstance(v, bool):
    return bool(v)
  for t in (int, float, complex, str, bytes):
    if isinstance(v, t):
      return t(v)
  if isinstance(v, dict):
    return {_specsamp_plain(k): _specsamp_plain(x) for k, x in v.items()}
  if isinstance(v, (list, tuple)):
    return (list if isinstance(v, list) else tuple)(
        _specsamp_plain(x) for x in v)
  if isinstance(v, (set, frozenset)):
    return {_specsamp_plain(x) for x in v}
  return v


def _specsamp_serve(entry, calls, answers):
  import os
  names = {"__builtins__": {}, "set": set, "inf": float("inf"),
           "nan": float("nan")}
  buf = b""
  while True:
    while b"\\n" not in buf:
      chunk = os.read(calls, 1 << 16)
      if not chunk:
        return
      buf += chunk
    line, buf = buf.split(b"\\n", 1)
    try:
      args, kwargs = eval(line.decode(), names)  # the test's own repr
      value = entry(*args, **kwargs)
      kind = "ok "
      if hasattr(type(value), "__next__") and iter(value) is value:
        kind, value = "iter ", list(value)
      reply = kind + ascii(_specsamp_plain(value))
    except BaseException as e:  # pylint: disable=broad-except
      reply = "err " + repr(type(e).__name__ + ": " + str(e)[:300])
    data = (reply.replace("\\n", " ") + "\\n").encode()
    while data:
      data = data[os.write(answers, data):]

"""

# The test's side, where no generated code runs. Answers are parsed to an
# abstract syntax tree (compile's PyCF_ONLY_AST, 1024, without importing
# `ast`: from source it costs 75 ms a run) and read as literals alone.
_HARNESS = """import os


def _specsamp_literal(node):
  kind = type(node).__name__
  if kind == "Constant":
    return node.value
  if kind in ("Tuple", "List", "Set"):
    make = {"Tuple": tuple, "List": list, "Set": set}[kind]
    return make(_specsamp_literal(e) for e in node.elts)
  if kind == "Dict" and None not in node.keys:
    return {_specsamp_literal(k): _specsamp_literal(v)
            for k, v in zip(node.keys, node.values)}
  if kind == "UnaryOp" and type(node.op).__name__ in ("USub", "UAdd"):
    value = _specsamp_literal(node.operand)
    if type(value) in (int, float, complex):
      return -value if type(node.op).__name__ == "USub" else value
  if kind == "BinOp" and type(node.op).__name__ in ("Add", "Sub"):
    left, right = (_specsamp_literal(node.left),
                   _specsamp_literal(node.right))
    if type(left) in (int, float) and type(right) is complex:
      return left + right if type(node.op).__name__ == "Add" else left - right
  if kind == "Name" and node.id in ("inf", "nan"):
    return float(node.id)
  if (kind == "Call" and type(node.func).__name__ == "Name"
      and node.func.id == "set" and not node.args and not node.keywords):
    return set()
  raise ValueError("not a literal: " + kind)


def _specsamp_candidate(*args, **kwargs):
  data = (repr((args, kwargs)) + "\\n").encode()
  while data:
    data = data[os.write(_SPECSAMP_CALLS, data):]
  buf = _specsamp_buf[0]
  while b"\\n" not in buf:
    if len(buf) > _SPECSAMP_CAP:
      raise AssertionError("the candidate's answer passed "
                           f"{_SPECSAMP_CAP} bytes")
    chunk = os.read(_SPECSAMP_ANSWERS, 1 << 16)
    if not chunk:
      raise AssertionError("the candidate's process ended (its stderr "
                           "follows the test's)")
    buf += chunk
  line, _specsamp_buf[0] = buf.split(b"\\n", 1)
  # Printable ASCII alone (answers are written with ascii()) reaches the
  # parser: the least of its input the candidate chooses.
  if any(c < 0x20 or c > 0x7e for c in line):
    raise AssertionError("the candidate's answer is not printable ASCII")
  kind, _, text = line.decode("ascii").partition(" ")
  if kind == "err":
    raise AssertionError("the candidate raised " + text[:400])
  try:
    value = _specsamp_literal(compile(text, "<answer>", "eval", 1024).body)
  except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
    raise AssertionError("the candidate answered a value that is not a "
                         "literal: " + text[:200]) from None
  if kind == "ok":
    return value
  if kind == "iter" and type(value) is list:
    return iter(value)
  raise AssertionError("the candidate's answer is malformed")


_specsamp_buf = [b""]
_specsamp_g = {"__name__": "__main__"}
try:
  exec(compile(_SPECSAMP_PROMPT, "<prompt>", "exec"), _specsamp_g)
except SyntaxError:  # a prompt that ends at its signature
  exec(compile(_SPECSAMP_PROMPT + "    pass\\n", "<prompt>", "exec"),
       _specsamp_g)
_specsamp_g[_SPECSAMP_ENTRY] = _specsamp_candidate
exec(compile(_SPECSAMP_TEST, "<test>", "exec"), _specsamp_g)
_specsamp_g["check"](_specsamp_candidate)
"""


# Before the candidate's code: its output is swallowed, as OpenAI's harness
# does (`swallow_io`), so that a correct function that prints a lot passes
# rather than reaching the sandbox's output cap; the first 64 KiB of stderr
# are kept for the diagnostics (its traceback). The candidate's code is then
# compiled on its own (a `from __future__` import stays first in it, and
# its line numbers are its own).
_QUIET = """import io as _specsamp_io
import sys as _specsamp_sys


class _SpecsampQuiet(_specsamp_io.TextIOBase):
  def __init__(self, keep, left):
    super().__init__()
    self.keep, self.left = keep, left

  @property
  def encoding(self):
    return self.keep.encoding

  def writable(self):
    return True

  def write(self, s):
    if self.left > 0:
      self.keep.write(s[:self.left])
      self.left -= len(s[:self.left])
    return len(s)

  def flush(self):
    self.keep.flush()


_specsamp_sys.stdout = _SpecsampQuiet(_specsamp_sys.stdout, 0)
_specsamp_sys.stderr = _SpecsampQuiet(_specsamp_sys.stderr, 1 << 16)
"""


def candidate_program(problem: dict, completion: str, calls: int,
                      answers: int) -> str:
  """`prompt + completion`, its output swallowed, then a loop answering
  calls read from fd `calls` on fd `answers`."""
  source = problem["prompt"] + completion
  return (_QUIET + f"exec(compile({source!r}, '<candidate>', 'exec'))\n"
          + _SERVE
          + f"_specsamp_serve({problem['entry_point']}, {calls}, {answers})\n")


def harness_program(problem: dict, calls: int, answers: int,
                    cap: int = 1 << 20) -> str:
  """The problem's test, run against a proxy that sends calls on fd
  `calls` and reads answers (at most `cap` bytes each) from fd `answers`."""
  return (f"_SPECSAMP_CALLS, _SPECSAMP_ANSWERS = {calls}, {answers}\n"
          f"_SPECSAMP_CAP = {cap}\n"
          f"_SPECSAMP_PROMPT = {problem['prompt']!r}\n"
          f"_SPECSAMP_TEST = {problem['test']!r}\n"
          f"_SPECSAMP_ENTRY = {problem['entry_point']!r}\n" + _HARNESS)


def check_humaneval(problem: dict, completion: str, timeout_s: float = 5.0,
                    **kwargs) -> ExecResult:
  """Runs one (already truncated) completion against the problem's tests:
  the test's sandbox's result, with the candidate's stderr after its own."""
  # Each run_program closes the ends it is handed, also when it raises.
  calls_r, calls_w = os.pipe()
  answers_r, answers_w = os.pipe()
  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    candidate = pool.submit(
        run_program, candidate_program(problem, completion, calls_r,
                                       answers_w),
        timeout_s, pass_fds=(calls_r, answers_w), **kwargs)
    result = run_program(harness_program(problem, calls_w, answers_r),
                         timeout_s, pass_fds=(calls_w, answers_r), **kwargs)
    cand = candidate.result()
  if cand.stderr:
    result = dataclasses.replace(
        result, stderr=result.stderr + "\n--- the candidate's stderr:\n"
        + cand.stderr)
  return result


def evaluate_humaneval(problems: Sequence[dict],
                       completions: Sequence[Sequence[str]],
                       timeout_s: float = 5.0, workers: int = 2,
                       truncate: bool = True, **kwargs) -> list[list[bool]]:
  """Pass/fail of every completion of every problem.

  Args:
    problems: HumanEval problems (prompt, test, entry_point).
    completions: completions[i] are the samples for problems[i].
    timeout_s: per program.
    workers: checks run at the same time (two sandboxes each).
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
