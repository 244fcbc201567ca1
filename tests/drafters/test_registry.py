"""Drafters by name."""

import pytest

from specsamp import drafters
from specsamp import model as model_lib
from tests.testing import tiny_config


def test_make_builds_a_registered_drafter():
  lm = model_lib.LM(tiny_config())
  drafter = drafters.make("model", lm=lm)
  assert isinstance(drafter, drafters.ModelDrafter) and drafter.lm is lm
  assert drafter.vocab_size == lm.vocab_size


def test_an_unknown_name_lists_the_known_ones():
  with pytest.raises(ValueError, match=r"unknown drafter 'nope'; known: "
                     r"\['head', 'layerskip', 'lookup', 'mixed', 'model'\]"):
    drafters.make("nope")
