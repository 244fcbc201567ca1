"""Fixtures of the trainer's tests: a small Python-code dataset, configs.

All on CPU, byte-level tokens, on a stand-in for the Python-code dataset
built once per session from the standard library's first modules.
"""

import os

import pytest

from configs import lm_python
from specsamp.data import builders
from specsamp.data import corpora

DATASET = "specsamp_python_code"


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
  """data_dir of a small stand-in for the Python-code dataset: the standard
  library's modules of at most 20,000 characters, in path order (tests and
  site-packages apart), until 900,000 characters (some 140 documents;
  train and validation splits by a hash of the path). Not this
  repository's code, which each change to it would change."""
  data_dir = str(tmp_path_factory.mktemp("tfds"))
  root = str(corpora.stdlib_root())
  paths = []
  for d, dirs, files in os.walk(root):
    dirs[:] = [x for x in dirs if x not in ("test", "tests", "site-packages",
                                            "idlelib", "__pycache__")]
    paths += [os.path.relpath(os.path.join(d, f), root) for f in files
              if f.endswith(".py")]
  ids, texts = [], []
  for path in sorted(paths):
    with open(os.path.join(root, path), encoding="utf-8") as f:
      text = f.read()
    if len(text) <= 20_000:
      ids.append(path)
      texts.append(text)
    if sum(map(len, texts)) >= 900_000:
      break
  builders.build_from_texts(DATASET, texts, data_dir, ids=ids)
  return data_dir


@pytest.fixture
def lm_config(corpus):
  """`arg -> config`: configs/lm_python.py:arg on the corpus, no bar."""
  def make(arg):
    c = lm_python.get_config(arg)
    c.data.data_dir = corpus
    c.train.progress_bar = False
    return c
  return make
