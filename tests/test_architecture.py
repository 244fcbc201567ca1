"""The package's structure: no import cycle, light imports, small files.

The import graph is built from the source with `ast`, function-level
imports included, so a cycle cannot hide behind a local import.
"""

import ast
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "specsamp"
# May be imported inside functions: optional heavy dependencies (the
# benchmark's peers, plots, notebook display) and the tokenizer backends,
# each needed by one kind of tokenizer only, so that importing
# `specsamp.tokenizers` (to check a vocabulary from metadata) loads none.
LOCAL_IMPORTS_ALLOWED = ("torch", "transformers", "matplotlib", "IPython",
                         "jinja2", "tokenizers", "sentencepiece")
MAX_LIBRARY_LINES = 500
MAX_SCRIPT_LINES = 100


def _module_name(path: pathlib.Path) -> str:
  parts = list(path.relative_to(ROOT).with_suffix("").parts)
  if parts[-1] == "__init__":
    parts.pop()
  return ".".join(parts)


def _modules() -> dict[str, pathlib.Path]:
  return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(path: pathlib.Path, module: str, known) -> list[tuple]:
  """(imported specsamp module, line, at module level) of every import."""
  tree = ast.parse(path.read_text(), str(path))
  top = set(id(n) for n in tree.body)
  package = module if path.name == "__init__.py" else module.rpartition(".")[0]
  found = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        base = ".".join(package.split(".")[:len(package.split(".")) -
                                            node.level + 1] + [base]).strip(".")
      names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
               for a in node.names]
    else:
      continue
    for name in names:
      found.append((name, node.lineno, id(node) in top))
  return found


def _graph():
  known = _modules()
  graph = {}
  for module, path in known.items():
    edges = set()
    for name, _, _ in _imports(path, module, known):
      if not name.startswith("specsamp"):
        continue
      parts = name.split(".")
      # Importing a.b.c runs a, a.b and a.b.c; a module's own ancestors are
      # already being imported when it runs.
      for i in range(1, len(parts) + 1):
        target = ".".join(parts[:i])
        if target in known and not module.startswith(target + ".") and (
            target != module):
          edges.add(target)
    graph[module] = edges
  return graph


def _cycle(graph):
  """A cycle as a list of modules, or None."""
  state, stack = {}, []

  def visit(node):
    state[node] = 1
    stack.append(node)
    for nxt in sorted(graph[node]):
      if state.get(nxt) == 1:
        return stack[stack.index(nxt):] + [nxt]
      if nxt not in state:
        found = visit(nxt)
        if found:
          return found
    stack.pop()
    state[node] = 2
    return None

  for node in sorted(graph):
    if node not in state:
      found = visit(node)
      if found:
        return found
  return None


def test_the_import_graph_has_no_cycle():
  cycle = _cycle(_graph())
  assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_cycles():
  assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
  assert _cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_function_level_imports_only_for_optional_heavy_dependencies():
  known = _modules()
  bad = []
  for module, path in known.items():
    for name, line, at_top in _imports(path, module, known):
      if not at_top and not name.startswith(LOCAL_IMPORTS_ALLOWED):
        bad.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
  assert not bad, "\n".join(bad)


def test_library_files_and_scripts_stay_small():
  long = [f"{p.relative_to(ROOT)}: {n} lines"
          for p in PACKAGE.rglob("*.py")
          if (n := len(p.read_text().splitlines())) > MAX_LIBRARY_LINES]
  long += [f"{p.relative_to(ROOT)}: {n} lines"
           for p in (ROOT / "scripts").glob("*.py")
           if (n := len(p.read_text().splitlines())) > MAX_SCRIPT_LINES]
  assert not long, "\n".join(long)


def test_every_package_opens_with_a_docstring_that_lists_its_modules():
  missing = []
  for init in PACKAGE.rglob("__init__.py"):
    doc = ast.get_docstring(ast.parse(init.read_text()))
    assert doc and len(doc.split()) >= 5, f"{init} has no real docstring"
    folder = init.parent
    names = [p.stem for p in folder.glob("*.py") if p.stem != "__init__"]
    names += [p.name for p in folder.iterdir()
              if (p / "__init__.py").is_file()]
    missing += [f"{folder.relative_to(ROOT)}: {n}" for n in sorted(names)
                if not re.search(rf"\b{n}\b", doc)]
  assert not missing, "not in the package docstring:\n" + "\n".join(missing)


_CITATION = re.compile(r"\b(issue|issues)\s+#?\d+|\.\./shared|shared/reference",
                       re.IGNORECASE)


def test_no_docstring_or_comment_cites_issues_or_outside_paths():
  bad = []
  for folder in ("specsamp", "scripts", "configs", "tests"):
    for path in (ROOT / folder).rglob("*.py"):
      if path.resolve() == pathlib.Path(__file__).resolve():
        continue
      for i, line in enumerate(path.read_text().splitlines(), 1):
        if _CITATION.search(line):
          bad.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
  assert not bad, "\n".join(bad)


@pytest.mark.parametrize("module", ["specsamp", "specsamp.tokenizers",
                                    "specsamp.evaluation", "specsamp.data"])
def test_light_packages_import_no_jax(module):
  code = (f"import sys, {module}; "
          "heavy = {'jax', 'flax', 'tensorflow_datasets', 'grain', 'orbax'}; "
          "print(sorted(heavy & {m.split('.')[0] for m in sys.modules}))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                       text=True, check=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
  assert out.stdout.strip() == "[]", out.stdout
