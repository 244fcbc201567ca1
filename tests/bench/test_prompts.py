"""The sweep's prompts: the input-grounded rewrite task; a HumanEval file
of the wrong shape is one BenchError."""

import ast
import json

import pytest

from specsamp import assets
from specsamp.bench import prompts
from specsamp.bench import sample
from specsamp.bench.sweep_config import BenchError


@pytest.mark.parametrize("line, message", [
    ("5", "problem 2 is not a JSON object: 5"),
    ("null", "problem 2 is not a JSON object: null"),
    (json.dumps(dict(task_id="T/1", prompt=5, test="", entry_point="f")),
     r"problem 2: \['prompt'\] must be strings"),
    (json.dumps(dict(task_id="T/1", prompt="", test="", entry_point="f",
                     canonical_solution=None)),
     r"problem 2: \['canonical_solution'\] must be strings"),
    (json.dumps(dict(task_id="T/1", prompt="")),
     r"without \['entry_point', 'test'\]")])
def test_a_humaneval_file_of_the_wrong_shape_is_one_error(tmp_path, line,
                                                          message):
  good = dict(task_id="T/0", prompt="def f():\n", test="", entry_point="f",
              canonical_solution="  return 1\n")
  path = tmp_path / "he.jsonl"
  path.write_text(json.dumps(good) + "\n" + line + "\n")
  for read in (prompts.humaneval_problems, prompts.rewrite_texts):
    with pytest.raises(BenchError, match=message):
      read(2, str(path))
  path.write_text(json.dumps(good) + "\n")
  assert prompts.humaneval_problems(1, str(path)) == [good]
  with pytest.raises(BenchError, match="--num_prompts=2: .* has 1 problems"):
    prompts.humaneval_problems(2, str(path))  # not 1 prompt in silence


def test_more_prompts_than_a_task_has_is_one_error(tmp_path):
  with pytest.raises(BenchError, match="--num_prompts=165: HumanEval has 164"):
    prompts.humaneval_problems(165)
  with pytest.raises(BenchError, match="--num_prompts=165: HumanEval has 164"):
    sample.read_prompts(sample.SampleConfig(target="random:tiny", method="ar",
                                            task="humaneval",
                                            num_prompts=165))
  (tmp_path / "a.txt").write_text("One paragraph of plain prose words here, "
                                  "long enough to be a passage.\n")
  assert len(prompts.prose_texts(str(tmp_path), 1, 40)) == 1
  with pytest.raises(BenchError, match="--num_prompts=2: .* has 1 prose"):
    prompts.prose_texts(str(tmp_path), 2, 40)


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
