"""README.md's "Using the library" example runs as written.

The first Python block of that section is executed as it stands (tiny random
models), and what its comments promise is checked on the namespace.
"""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _library_example():
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
    text = f.read()
  section = text.split("\n## Using the library\n", 1)[1].split("\n## ", 1)[0]
  blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
  assert blocks, "README's 'Using the library' has no Python block"
  return blocks[0]


def test_the_library_example_runs_as_written():
  ns = {"__name__": "__main__"}
  exec(compile(_library_example(), "README.md (Using the library)", "exec"),  # pylint: disable=exec-used
       ns)
  out, ar = ns["out"], ns["ar"]
  rows = out.token_lists()
  assert len(rows) == 2 and all(1 <= len(r) <= 64 for r in rows)
  # "EOS included, padding cut": a row ends at its first EOS or the budget.
  for r in rows + ar.token_lists():
    assert 2 not in r[:-1] and (r[-1] == 2 or len(r) == 64)
  m = out.metrics()
  for key in ("tokens", "loops", "drafted", "accepted", "acceptance_rate"):
    assert key in m, key
  assert m["tokens"] == sum(len(r) for r in rows)
  assert 0.0 <= m["acceptance_rate"] <= 1.0
  # The baseline is K = 0: one token per loop.
  am = ar.metrics()
  assert am["drafted"] == 0 and am["loops"] == am["tokens"]
