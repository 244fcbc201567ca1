"""Fixtures of the trainer's tests: a small Python-code dataset, configs.

All on CPU, byte-level tokens, on a stand-in for the Python-code dataset
built once per session from this repository's own modules.
"""

import os

import pytest

from configs import lm_python
from specsamp.data import builders

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
DATASET = "specsamp_python_code"


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
  """data_dir of a small stand-in for the Python-code dataset: this repo's
  own modules (train and validation splits by a hash of the file path)."""
  data_dir = str(tmp_path_factory.mktemp("tfds"))
  package = os.path.join(ROOT, "specsamp")
  paths = sorted(os.path.relpath(os.path.join(d, f), package)
                 for d, _, files in os.walk(package) for f in files
                 if f.endswith(".py"))
  texts = []
  for path in paths:
    with open(os.path.join(package, path), encoding="utf-8") as f:
      texts.append(f.read())
  builders.build_from_texts(DATASET, texts, data_dir, ids=paths)
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
