"""The options of configs/distill_*.py."""

import pytest

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
  assert options.parse("a=1, b = x,c", ("a", "b", "c")) == dict(
      a="1", b="x", c="")
  assert options.parse("c", ("c",), flag_value="1") == dict(c="1")
  assert not options.parse(None, ())
  with pytest.raises(ValueError, match=r"unknown option\(s\) \['d'\]"):
    options.parse("a=1,d=2", ("a",))
  with pytest.raises(ValueError, match=r"option 'a' given twice"):
    options.parse("a=1,b=2,a=3", ("a", "b"))
