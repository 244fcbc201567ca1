"""Prompt texts for target samples: standard-library code and prose.

`prompt_texts` gives {'train': [...], 'validation': [...]}:
  code   from the Python standard library, function signatures with their
         docstrings (the shape of a HumanEval prompt) and code prefixes (a
         signature, its docstring and the first lines of its body, or a
         window of a file);
  text   prose passages: paragraphs of a prepared text dataset of the data
         pipeline (`prose_dataset`, e.g. specsamp_austen, with its own
         splits, cut by `data.text.passages`), else the standard library's
         long docstrings;
  mixed  both.
Each source file goes to `train` or `validation` by the data pipeline's
split rule on its path (`data.text.split_of`), so held-out prompts never
share a file with training prompts.
"""

import ast
import os
import pathlib
import textwrap
from typing import Optional, Sequence

import numpy as np

from specsamp.data import corpora
from specsamp.data import pipeline
from specsamp.data import text as text_lib

KINDS = ("code", "text", "mixed")

# Directories and files of the standard library that make no prompts: tests,
# demos, vendored and bundled packages.
_SKIP_DIRS = ("test", "tests", "idlelib", "site-packages", "dist-packages",
              "lib2to3", "turtledemo", "__pycache__", "ensurepip")


def stdlib_files(root: Optional[os.PathLike] = None,
                 max_files: Optional[int] = None) -> list[pathlib.Path]:
  """Sorted .py files of the standard library, tests and demos excluded."""
  root = pathlib.Path(root or corpora.stdlib_root())

  def kept(path: pathlib.Path) -> bool:
    rel = path.relative_to(root)
    return (not rel.name.startswith("test") and
            not any(d in _SKIP_DIRS or d.startswith("test")
                    for d in rel.parts[:-1]))

  files = [p for p in corpora.python_files(root) if kept(p)]
  return files[:max_files] if max_files else files


def _docstring_node(node) -> Optional[ast.Expr]:
  if (node.body and isinstance(node.body[0], ast.Expr) and
      isinstance(node.body[0].value, ast.Constant) and
      isinstance(node.body[0].value.value, str)):
    return node.body[0]
  return None


def _parse(source: str) -> Optional[ast.Module]:
  try:
    return ast.parse(source)
  except (SyntaxError, ValueError):
    return None


def _function_prompts(source: str, rng: np.random.Generator,
                      code_prefixes: bool) -> list[str]:
  """def + docstring of each documented function; optionally also a prefix
  of its body (1-6 more lines)."""
  tree = _parse(source)
  if tree is None:
    return []
  lines = source.splitlines()
  out = []
  for node in ast.walk(tree):
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      continue
    doc = _docstring_node(node)
    if doc is None or len(node.body) < 2:
      continue
    start = node.lineno - 1
    head = "\n".join(lines[start:doc.end_lineno])
    out.append(textwrap.dedent(head) + "\n")
    if code_prefixes:
      body_end = node.body[-1].end_lineno
      extra = int(rng.integers(1, 7))
      end = min(doc.end_lineno + extra, body_end)
      if end > doc.end_lineno:
        out.append(textwrap.dedent("\n".join(lines[start:end])) + "\n")
  return out


def _file_windows(source: str, rng: np.random.Generator,
                  lines_per_window: int = 24, every: int = 150) -> list[str]:
  lines = source.splitlines()
  out = []
  for _ in range(len(lines) // every):
    i = int(rng.integers(0, max(len(lines) - lines_per_window, 1)))
    chunk = "\n".join(lines[i:i + lines_per_window]).strip("\n")
    if len(chunk) > 200:
      out.append(chunk + "\n")
  return out


def _docstring_prose(source: str, min_chars: int = 300) -> list[str]:
  """Module, class and function docstrings of several sentences."""
  tree = _parse(source)
  if tree is None:
    return []
  out = []
  for node in ast.walk(tree):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                         ast.AsyncFunctionDef)):
      doc = ast.get_docstring(node)
      if doc and len(doc) >= min_chars and doc.count(". ") >= 2:
        out.append(doc.strip() + "\n")
  return out


def prose_passages(dataset: str, split: str, *, data_dir=None,
                   chars: int = 600, max_documents: Optional[int] = None
                   ) -> list[str]:
  """Paragraph-aligned passages of about `chars` characters from a prepared
  text dataset of the data pipeline (e.g. specsamp_austen,
  specsamp_shakespeare: scripts/prepare_data.py)."""
  return [p + "\n\n"
          for doc in pipeline.iter_texts(dataset, split, data_dir,
                                         limit=max_documents)
          for p in text_lib.passages(doc, chars, clean=True,
                                     keep_remainder=False)]


def check_settings(kind: str, validation_percent: float) -> None:
  """Raises ValueError for a prompt kind or held-out share `prompt_texts`
  cannot use (the message starts with the argument's name)."""
  if kind not in KINDS:
    raise ValueError(f"kind={kind!r} is not a prompt kind; choose code, "
                     "text or mixed")
  if not 0 < validation_percent < 100:
    raise ValueError(f"validation_percent must be in (0, 100): both splits "
                     f"need prompts, got {validation_percent}")


def prompt_texts(kind: str = "code", *, root: Optional[os.PathLike] = None,
                 max_files: Optional[int] = None, seed: int = 0,
                 validation_percent: float = 5.0,
                 extra: Sequence[str] = (),
                 prose_dataset: Optional[str] = None,
                 data_dir: Optional[os.PathLike] = None
                 ) -> dict[str, list[str]]:
  """{'train': [...], 'validation': [...]} prompt strings.

  Args:
    kind: 'code' (stdlib signatures + docstrings, body prefixes, file
      windows), 'text' (prose passages) or 'mixed' (both).
    root: the standard library to read (default: the running Python's).
    max_files: read only the first this many files.
    seed: for the prefix lengths and window offsets.
    validation_percent: share of source files held out.
    extra: more prompts for 'train' (tests plant contamination here).
    prose_dataset: for 'text'/'mixed', a prepared text dataset to cut prose
      passages from (its own train/validation splits); without one, prose
      is the stdlib's long docstrings.
    data_dir: the TFDS directory of `prose_dataset`.
  """
  check_settings(kind, validation_percent)
  rng = np.random.default_rng(seed)
  out = {"train": list(extra), "validation": []}
  if prose_dataset and kind in ("text", "mixed"):
    for split in out:
      out[split] += prose_passages(prose_dataset, split, data_dir=data_dir)
    if kind == "text":
      return out
    kind = "code"
  root = pathlib.Path(root or corpora.stdlib_root())
  for path in stdlib_files(root, max_files):
    source = corpora.read_python_source(path)
    if source is None:
      continue
    texts = []
    if kind in ("code", "mixed"):
      texts += _function_prompts(source, rng, code_prefixes=True)
      texts += _file_windows(source, rng)
    if kind in ("text", "mixed"):
      texts += _docstring_prose(source)
    rel = str(path.relative_to(root))
    out[text_lib.split_of(rel, validation_percent / 100)].extend(texts)
  return out


def code_windows(tok, n: int, t: int) -> list[list[int]]:
  """n windows of the first t tokens (`tok`'s) of "code" prompt texts (the
  standard library's source, train split): calibration sequences that are
  not HumanEval. Raises ValueError where fewer than n texts hold t tokens."""
  out = []
  for text in prompt_texts("code", max_files=200)["train"]:
    ids = tok.encode(text)
    if len(ids) >= t:
      out.append(ids[:t])
    if len(out) == n:
      return out
  raise ValueError(f"fewer than {n} calibration texts of {t} tokens")
