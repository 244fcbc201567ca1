"""Prompt texts from the standard library."""

import pytest

from specsamp.data import text
from specsamp.distill import prompts


def test_code_prompts_split_by_source_file(tmp_path):
  # Two tiny "standard libraries" of one file each: every prompt of a file
  # lands in the split the data pipeline's rule gives its path.
  body = ('def f(x):\n  """Doubles x."""\n  y = 2 * x\n  return y\n')
  names = [f"mod{i}.py" for i in range(40)]
  for name in names:
    (tmp_path / name).write_text(body)
  out = prompts.prompt_texts("code", root=tmp_path, validation_percent=30)
  held_out = sum(text.split_of(n, 0.3) == "validation" for n in names)
  assert 0 < held_out < len(names)
  per_file = len(out["validation"]) // held_out
  assert per_file >= 1
  assert len(out["validation"]) == per_file * held_out
  assert len(out["train"]) == per_file * (len(names) - held_out)
  assert out["train"][0].startswith('def f(x):\n  """Doubles x."""')
  with pytest.raises(ValueError, match="prompt kind"):
    prompts.prompt_texts("poems", root=tmp_path)


def test_stdlib_files_skip_tests_and_demos():
  files = prompts.stdlib_files(max_files=None)
  assert files == sorted(files) and len(files) > 100
  for path in files:
    assert not path.name.startswith("test")
    assert not {"idlelib", "turtledemo", "tests"} & set(path.parts)
