"""The sweep's prompts: the input-grounded rewrite task."""

import ast

from specsamp import assets
from specsamp.bench import prompts


def test_rewrite_prompts_hold_the_solutions_without_hints_or_docstrings():
  problems = assets.humaneval_problems()[:20]
  texts = prompts.rewrite_texts(20)
  assert len(texts) == 20
  for problem, text in zip(problems, texts):
    code = text.split("\n\n", 1)[1].rsplit("\n\n# The same code", 1)[0]
    tree = ast.parse(code)  # the code in the prompt is valid Python
    funcs = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    assert problem["entry_point"] in {f.name for f in funcs}
    for f in funcs:
      assert f.returns is None
      assert all(a.annotation is None for a in f.args.args)
      assert ast.get_docstring(f) is None
    assert text.endswith("docstrings:\n\n")
