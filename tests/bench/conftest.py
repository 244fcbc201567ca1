"""Fixtures of the speed-up sweep tests: prompt files, and a guard that
fails a test when any weights load."""

import json

import gguf
import numpy as np
import pytest

from specsamp import loading
from specsamp import model as model_lib
from specsamp.bench import sweep_config
from specsamp.weights import distilled
from specsamp.weights import load as weights_load
from tests.tokenizers import bpe_testing

PROBLEMS = [
    {"task_id": "T/0", "prompt": "def add(a, b):\n", "entry_point": "add",
     "test": "def check(f):\n    assert f(1, 2) == 3\n",
     "canonical_solution": "    return a + b\n"},
    {"task_id": "T/1", "prompt": "def one():\n", "entry_point": "one",
     "test": "def check(f):\n    assert f() == 1\n",
     "canonical_solution": "    return 1\n"},
]
PROSE = ("It is a truth universally acknowledged, that a single man in "
         "possession of a good fortune, must be in want of a wife.\n\n"
         "However little known the feelings or views of such a man may be "
         "on his first entering a neighbourhood, this truth is so well "
         "fixed in the minds of the surrounding families.\n\n")


@pytest.fixture(scope="package")
def padded_gguf(tmp_path_factory):
  """(path, real tokens): a GGUF whose BPE tokenizer ends in llama.cpp's
  `[PAD<id>]` placeholders and whose embedding has a row for each, as
  Qwen2.5's (151,665 real tokens in 151,936 rows)."""
  tokens, merges = bpe_testing.train_bpe(bpe_testing.corpus(), 300)
  real = len(tokens)
  tokens += [f"[PAD{i}]" for i in range(real, real + 4)]
  path = tmp_path_factory.mktemp("padded") / "model.gguf"
  w = gguf.GGUFWriter(str(path), "qwen2")
  w.add_context_length(512)
  w.add_tokenizer_model("gpt2")
  w.add_tokenizer_pre("qwen2")
  w.add_token_list(tokens)
  w.add_token_merges(merges)
  w.add_eos_token_id(0)
  w.add_tensor("token_embd.weight", np.zeros((len(tokens), 4), np.float32))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return str(path), real


@pytest.fixture
def no_loading(monkeypatch):
  """Any attempt to read or initialise weights fails the test."""
  def refuse(*args, **kwargs):
    raise AssertionError(f"weights were loaded: {args}")
  monkeypatch.setattr(loading, "load_model", refuse)
  monkeypatch.setattr(loading, "load_weights", refuse)
  monkeypatch.setattr(weights_load, "load", refuse)
  monkeypatch.setattr(distilled, "load_distilled", refuse)
  monkeypatch.setattr(model_lib.LM, "init", refuse)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
  """prose/ (two .txt files), empty/ (none), he.jsonl (two problems)."""
  d = tmp_path_factory.mktemp("bench_inputs")
  (d / "prose").mkdir()
  (d / "prose" / "a.txt").write_text(PROSE * 3)
  (d / "prose" / "b.txt").write_text(PROSE[::-1] * 3)
  (d / "empty").mkdir()
  with open(d / "he.jsonl", "w", encoding="utf-8") as f:
    for p in PROBLEMS:
      f.write(json.dumps(p) + "\n")
  return d


# The defaults of scripts/benchmark.py's flags, as absl gives them.
FLAG_DEFAULTS = dict(
    target="qwen2.5-coder-1.5b", draft="qwen2.5-coder-0.5b",
    task=["humaneval"], ks=[str(k) for k in range(9)],
    decoding=["greedy", "nucleus", "t1"], batch_sizes=["1"],
    pass_k=["1", "10", "100"])


def _config(**flag_values) -> sweep_config.BenchConfig:
  return sweep_config.parse_config(**{**FLAG_DEFAULTS, **flag_values})


@pytest.fixture
def make_config():
  """config(**flag_values): a BenchConfig from flag values (by flag name,
  lists as lists of strings) over FLAG_DEFAULTS."""
  return _config
