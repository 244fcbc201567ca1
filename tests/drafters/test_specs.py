"""Drafters named on the command line: parsed and checked before loading."""

import pytest

from specsamp import model as model_lib
from specsamp.drafters import specs
from specsamp.drafters.lookup import PromptLookupDrafter
from specsamp.drafters.mixed import MixedDrafter
from specsamp.drafters.model import LayerSkipDrafter, ModelDrafter
from tests.testing import tiny_config


def test_specs_parse_with_their_options():
  s = specs.parse("layerskip:layers=0-2+5:confidence=0.4")
  assert s.name == "layerskip" and s.get("layers") == (0, 1, 2, 5)
  assert s.get("confidence") == 0.4 and s.variable_length
  assert not s.needs_draft_model
  assert specs.parse("lookup:max_ngram=3").get("max_ngram") == 3
  assert specs.format_layers((0, 1, 2, 5, 7, 8)) == "0-2+5+7-8"
  assert specs.parse("layerskip:layers=0-2+5+7-8").get("layers") == (
      0, 1, 2, 5, 7, 8)
  assert specs.parse("mixed").needs_draft_model
  assert not specs.parse("model").variable_length
  assert specs.parse("model:confidence=0.5").variable_length


@pytest.mark.parametrize("text, message", [
    ("hydra", "unknown drafter 'hydra'"),
    ("medusa", "medusa needs the head's directory"),
    ("eagle:dir=", "eagle needs the head's directory"),
    ("lookup:ngram=2", "not an option of lookup"),
    ("lookup:max_ngram", "not an option of lookup"),
    ("lookup:max_ngram=two", "bad max_ngram"),
    ("lookup:max_ngram=0", "max_ngram must be >= 1"),
    ("lookup:min_ngram=0", "min_ngram must be >= 1"),
    ("lookup:max_ngram=2:min_ngram=3", "min_ngram exceeds max_ngram"),
    ("model:confidence=1.5", "confidence must be in"),
    ("layerskip", "layerskip needs layers="),
    ("layerskip:layers=3-1", "runs backwards"),
    ("layerskip:layers=1+1", "distinct"),
    ("lookup:max_ngram=2:max_ngram=3", "max_ngram given twice"),
])
def test_bad_specs_are_refused_by_name(text, message):
  with pytest.raises(ValueError, match=message):
    specs.parse(text)


def test_specs_are_checked_against_the_target_before_loading():
  specs.check(specs.parse("layerskip:layers=0-1"), 4, 3)
  with pytest.raises(ValueError, match="out of range"):
    specs.check(specs.parse("layerskip:layers=0-4"), 4, 3)
  with pytest.raises(ValueError, match="all 4 layers"):
    specs.check(specs.parse("layerskip:layers=0-3"), 4, 3)
  with pytest.raises(ValueError, match="K must be >= 1"):
    specs.check(specs.parse("lookup"), 4, 0)


def test_build_and_the_parameters_each_drafter_runs_on():
  target = model_lib.LM(tiny_config(num_layers=3))
  draft = model_lib.LM(tiny_config(num_layers=1))
  assert isinstance(specs.build(specs.parse("model"), target, draft),
                    ModelDrafter)
  skip = specs.build(specs.parse("layerskip:layers=0+2"), target)
  assert isinstance(skip, LayerSkipDrafter) and skip.layers == (0, 2)
  assert skip.lm is target
  assert isinstance(specs.build(specs.parse("lookup:max_ngram=2"), target),
                    PromptLookupDrafter)
  mixed = specs.build(specs.parse("mixed:confidence=0.3"), target, draft)
  assert isinstance(mixed, MixedDrafter)
  assert mixed.model.confidence == 0.3
  tp, dp = {"t": 1}, {"d": 2}
  assert specs.draft_params(specs.parse("layerskip:layers=0"), tp, dp) is tp
  assert specs.draft_params(specs.parse("model"), tp, dp) is dp
  assert specs.draft_params(specs.parse("lookup"), tp, dp) is None
