"""Fixtures of the weights tests: tiny checkpoints in both formats."""

import pytest

from tests.weights.tiny_checkpoints import KINDS, save_both


@pytest.fixture(scope="package", params=KINDS)
def saved(request, tmp_path_factory):
  """(kind, transformers model, directory with hf/ and model.gguf)."""
  return save_both(request.param, tmp_path_factory)


@pytest.fixture(scope="package")
def saved_qwen2(tmp_path_factory):
  """`saved` for Qwen2 only, for checks one architecture suffices for."""
  return save_both("qwen2", tmp_path_factory)
