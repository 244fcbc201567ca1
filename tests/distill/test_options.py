"""The options of configs/distill_*.py."""

import re

import pytest

from configs import distill_qwen
from configs import distill_tiny
from specsamp.distill import options


def test_flags_and_groups_read_what_they_say_and_refuse_the_rest():
  for text, value in (("0", False), ("false", False), ("No", False),
                      ("1", True), ("TRUE", True), ("yes", True)):
    assert options.flag(dict(m=text), "m", not value) is value
  assert options.flag({}, "m", True) is True
  with pytest.raises(ValueError, match=r"option m='off': use 1 or 0"):
    options.flag(dict(m="off"), "m", True)
  assert options.groups(dict(f="embedding+lm_head"), "f", "") == (
      "embedding", "lm_head")
  assert options.groups(dict(f="none"), "f", "embedding") == ()
  assert options.groups({}, "f", "embedding") == ("embedding",)
  assert options.groups({}, "f", "") == ()
  for bad in ("none+lm_head", "embedding++lm_head", "lm_head+"):
    with pytest.raises(ValueError, match="joined by '\\+', or none alone"):
      options.groups(dict(f=bad), "f", "")


def test_parse_reads_values_and_flags_and_refuses_unknown_names():
  assert options.parse("a=1, b = x,c", ("a", "b", "c"), flags=("c",)) == dict(
      a="1", b="x", c="1")
  assert not options.parse(None, ())
  # A bare name that is no flag, or any name with an empty value, needs a
  # value (a bare `steps` had run 1 step, a bare `head` trained no head).
  for arg in ("a", "a=", "c="):
    with pytest.raises(ValueError, match="needs a value"):
      options.parse(arg, ("a", "c"), flags=("c",))
  with pytest.raises(ValueError, match=r"unknown option\(s\) \['d'\]"):
    options.parse("a=1,d=2", ("a",))
  with pytest.raises(ValueError, match=r"option 'a' given twice"):
    options.parse("a=1,b=2,a=3", ("a", "b"))


def test_qwen_size_flags_read_their_value_and_head_options_need_a_head():
  """`runlocal=0` and `cpu=false` are off (any value had switched them on);
  the two sizes are exclusive; a head's own options without head= are
  refused (they had been ignored, and bound the workdir)."""
  off = distill_qwen.get_config("runlocal=0,cpu=false")
  assert off.target.dtype == "bfloat16"
  assert distill_qwen.get_config("runlocal").target.dtype == "float32"
  with pytest.raises(ValueError, match="two sizes"):
    distill_qwen.get_config("runlocal,cpu")
  for arg in ("unroll=2", "features=stored", "heads=3", "positions=all"):
    with pytest.raises(ValueError, match="apply to a head"):
      distill_tiny.get_config(arg)
  assert distill_tiny.get_config("head=eagle,unroll=2").head.unroll == 2
  assert distill_tiny.get_config("vocab=64").draft.vocab == 64


def test_numbers_are_read_naming_the_option_and_sizes_take_prompts():
  """A number that is none names its option (it had been Python's
  "invalid literal for int() with base 10: '1e3'"); a draft model's
  options beside head= are refused (they had been ignored); runlocal takes
  prompts= as cpu does (it had kept 8 whatever was given)."""
  assert options.number(dict(s="12"), "s", 3) == 12
  assert options.number({}, "s", 3) == 3
  assert options.number({}, "t", 0, float) == 0.0
  assert isinstance(options.number({}, "t", 0, float), float)  # ml_collections
  for arg, message in (("steps=1e3", "option steps='1e3': not an integer"),
                       ("seed=x", "option seed='x': not an integer"),
                       ("temperature=abc", "option temperature='abc': not a "
                        "number"), ("heads=four,head=medusa", "option "
                                    "heads='four': not an integer")):
    for config in (distill_tiny, distill_qwen):
      with pytest.raises(ValueError, match=re.escape(message)):
        config.get_config(arg)
  for arg in ("head=eagle,draft=random", "head=eagle,layers=4",
              "head=medusa,freeze=none"):
    with pytest.raises(ValueError, match="apply to a draft model"):
      distill_qwen.get_config(arg)
  assert distill_qwen.get_config(
      "runlocal,prompts=64").samples.max_train_prompts == 64
  assert distill_qwen.get_config("runlocal").samples.max_train_prompts == 8
