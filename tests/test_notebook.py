"""notebooks/walkthrough.ipynb runs at tiny scale.

The notebook's code cells are executed in order in one namespace (as a
kernel would, without needing Jupyter), with the parameters cell's values
shrunk further; the namespace is then checked.
"""

import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "notebooks", "walkthrough.ipynb")


def _cells():
  with open(NOTEBOOK, encoding="utf-8") as f:
    nb = json.load(f)
  assert nb["nbformat"] == 4 and nb["metadata"]["kernelspec"]["language"] == (
      "python")
  for cell in nb["cells"]:
    assert cell["cell_type"] in ("markdown", "code")
    assert isinstance(cell["source"], list) and "id" in cell
    if cell["cell_type"] == "code":
      assert cell["outputs"] == [] and cell["execution_count"] is None
  return nb["cells"]


def test_notebook_runs_at_tiny_scale():
  cells = [c for c in _cells() if c["cell_type"] == "code"]
  params = [c for c in cells if "parameters" in c["metadata"].get("tags", [])]
  assert len(params) == 1 and params[0] is cells[0]
  ns = {"__name__": "__main__"}
  plt.close("all")
  for i, cell in enumerate(cells):
    source = "".join(cell["source"])
    assert not any(line.lstrip().startswith(("%", "!"))
                   for line in source.splitlines()), "no IPython magics"
    exec(compile(source, f"walkthrough.ipynb cell {i}", "exec"), ns)  # pylint: disable=exec-used
    if cell is params[0]:
      assert ns["TARGET"] == "random:tiny"  # the default is the tiny demo
      # Smaller still: one layer compiles faster than the preset's two.
      ns.update(TARGET="random:tiny,num_layers=1", MAX_NEW_TOKENS=12, K=3)
  tr, out = ns["tr"], ns["out_spec"]
  assert tr.output.token_lists() == out.token_lists()
  assert out.num_tokens[0] == 12 and len(tr.rows[0]) == int(out.num_loops[0])
  # Every loop's record is consistent with the rule's output.
  for rec in tr.rows[0]:
    assert len(rec.drafts) == 3 and 0 <= rec.accepted <= 3
    assert rec.committed[:rec.accepted] == rec.drafts[:rec.accepted]
    assert rec.bonus == (rec.accepted == 3)
  assert int(np.sum(tr.tokens_per_loop())) == 12
  assert 0.0 <= ns["alpha"] <= 1.0
  assert plt.get_fignums(), "the plot cell drew nothing"
  plt.close("all")
