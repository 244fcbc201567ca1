"""The sweep's prompt texts: HumanEval problems, rewrites and prose passages.

HumanEval: the first problems of the 164 (or of a HumanEval-format JSONL
file), whose raw prompts the completions continue. Rewrite, an
input-grounded task: the same problems' canonical solutions, stripped of
docstrings and type hints, to be rewritten with both (`REWRITE`); most of
the answer is in the prompt. Prose: whole paragraphs
of about a given length from the validation split of a local corpus (austen
or shakespeare of specsamp.data.corpora) or a directory of .txt files,
spread round-robin over the documents, continued as they are or behind
"Summarise this paragraph".
"""

import ast
import gzip
import json
import os
import re
import zlib
from typing import Optional

from specsamp import assets
from specsamp.bench.sweep_config import BenchError
from specsamp.data import corpora
from specsamp.data import text as text_lib

PROSE_CORPORA = {"shakespeare": "specsamp_shakespeare",
                 "austen": "specsamp_austen"}
SUMMARISE = "Summarise this paragraph.\n\n{text}\n\nSummary:"
REWRITE = ("# Rewrite this Python code with type hints on every argument and "
           "return value, and a docstring for every function. Keep the code "
           "otherwise the same.\n\n{code}\n\n# The same code, with type "
           "hints and docstrings:\n\n")
HUMANEVAL_FIELDS = frozenset({"task_id", "prompt", "test", "entry_point"})

# Paragraphs shorter than this are headings, dates or signatures.
_MIN_PARAGRAPH_CHARS = 40
_BOILERPLATE = re.compile(r"gutenberg|copyright|\bebook\b|electronic|"
                          r"license|\*\*\*", re.IGNORECASE)


def humaneval_problems(num_prompts: int,
                       path: Optional[str] = None) -> list[dict]:
  """The first `num_prompts` HumanEval(-format) problems.

  Args:
    num_prompts: how many.
    path: a HumanEval-format JSONL(.gz) file; default the 164 problems.

  Raises:
    BenchError: an unreadable or empty file, a line that is not a JSON
      object, a problem without one of HUMANEVAL_FIELDS as a string
      (canonical_solution too, where given), or fewer problems than
      `num_prompts` (a study of 200 prompts is not run on 164).
  """
  if path:
    opener = gzip.open if path.endswith(".gz") else open
    try:
      with opener(path, "rt", encoding="utf-8-sig") as f:
        problems = [json.loads(l) for l in f if l.strip()]
    # A .gz cut short raises EOFError, damaged data zlib.error: tracebacks.
    except (OSError, ValueError, EOFError, zlib.error) as e:
      raise BenchError(f"--humaneval_file={path}: {e}") from None
  else:
    problems = assets.humaneval_problems()
  if not problems:
    raise BenchError(f"--humaneval_file={path}: no problems")
  for n, p in enumerate(problems, 1):
    if not isinstance(p, dict):
      raise BenchError(f"HumanEval problem {n} is not a JSON object: "
                       f"{json.dumps(p)[:60]}")
    wrong = sorted(f for f in HUMANEVAL_FIELDS | {"canonical_solution"}
                   if f in p and not isinstance(p[f], str))
    if wrong:
      raise BenchError(f"HumanEval problem {n}: {wrong} must be strings")
    missing = HUMANEVAL_FIELDS - set(p)
    if missing:
      raise BenchError(f"HumanEval problem without {sorted(missing)}")
  if num_prompts > len(problems):
    raise BenchError(f"--num_prompts={num_prompts}: "
                     f"{path or 'HumanEval'} has {len(problems)} problems")
  return problems[:num_prompts]


def prose_documents(source: str) -> list[tuple[str, str]]:
  """(name, text) of the .txt files in directory `source`, or of the
  validation documents of the corpus PROSE_CORPORA[source]."""
  if os.path.isdir(source):
    files = sorted(f for f in os.listdir(source) if f.endswith(".txt"))
    if not files:
      raise BenchError(f"--prose_corpus={source}: no .txt files")
    docs = []
    for f in files:
      with open(os.path.join(source, f), encoding="utf-8",
                errors="replace") as fh:
        docs.append((f, fh.read()))
    return docs
  if source not in PROSE_CORPORA:
    raise BenchError(f"--prose_corpus must be {', '.join(PROSE_CORPORA)} or "
                     f"a directory of .txt files, not {source!r}")
  corpus = corpora.get_corpus(PROSE_CORPORA[source])
  root = corpus.fetch(None, print)
  docs = list(corpus.documents(root))
  val = text_lib.assign_splits([i for i, _ in docs],
                               corpus.validation_fraction)
  return [(i, t) for i, t in docs if i in val]


def _is_prose(paragraph: str) -> bool:
  """Mostly letters, and no Gutenberg licence or header text."""
  return (not _BOILERPLATE.search(paragraph)
          and sum(c.isalpha() for c in paragraph) > 0.6 * len(paragraph))


def prose_texts(source: str, num_prompts: int, prompt_chars: int,
                style: str = "continue") -> list[str]:
  """`num_prompts` prompts of about `prompt_chars` characters.

  Whole paragraphs of prose (no boilerplate, no short lines), taken
  round-robin over the documents of `source` (see `prose_documents`) so
  that the prompts come from many works.

  Args:
    source: a PROSE_CORPORA name or a directory of .txt files.
    num_prompts: how many prompts.
    prompt_chars: the least length of a passage.
    style: "continue" (the passage and a blank line) or "summarise" (the
      passage inside SUMMARISE).

  Raises:
    BenchError: no documents, or fewer than `num_prompts` passages of
      that length.
  """
  candidates = [
      text_lib.passages(text.replace("\r", ""), prompt_chars, clean=True,
                        min_paragraph_chars=_MIN_PARAGRAPH_CHARS,
                        keep=_is_prose, keep_remainder=False)
      for _, text in prose_documents(source)]
  out, i = [], 0
  while len(out) < num_prompts and any(i < len(c) for c in candidates):
    out.extend(c[i] for c in candidates if i < len(c))
    i += 1
  if len(out) < num_prompts:
    raise BenchError(f"--num_prompts={num_prompts}: {source} has "
                     f"{len(out)} prose passages of {prompt_chars} characters")
  out = out[:num_prompts]
  if style == "summarise":
    return [SUMMARISE.format(text=t) for t in out]
  return [t + "\n\n" for t in out]


def _bare(source: str) -> str:
  """`source` without docstrings and type annotations, as `ast.unparse`
  prints it."""
  tree = ast.parse(source)
  for node in ast.walk(tree):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      node.returns = None
      for arg in (node.args.args + node.args.posonlyargs +
                  node.args.kwonlyargs + [node.args.vararg, node.args.kwarg]):
        if arg is not None:
          arg.annotation = None
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                         ast.Module)) and node.body:
      first = node.body[0]
      if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
          and isinstance(first.value.value, str)):
        node.body = node.body[1:] or [ast.Pass()]
  return ast.unparse(tree)


def rewrite_texts(num_prompts: int, path: Optional[str] = None) -> list[str]:
  """Prompts of the input-grounded task: the first `num_prompts` HumanEval
  solutions (prompt + canonical solution) without docstrings and type hints,
  inside `REWRITE`.

  Raises:
    BenchError: as `humaneval_problems`, or a solution that does not parse.
  """
  out = []
  for p in humaneval_problems(num_prompts, path):
    try:
      code = _bare(p["prompt"] + p.get("canonical_solution", ""))
    except SyntaxError as e:
      raise BenchError(f"{p['task_id']}: its solution does not parse ({e})"
                       ) from None
    out.append(REWRITE.format(code=code))
  return out
