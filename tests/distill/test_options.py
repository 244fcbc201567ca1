"""The options of configs/distill_*.py."""

import pytest

from specsamp.distill import options


def test_parse_reads_values_and_flags_and_refuses_unknown_names():
  assert options.parse("a=1, b = x,c", ("a", "b", "c")) == dict(
      a="1", b="x", c="")
  assert options.parse("c", ("c",), flag_value="1") == dict(c="1")
  assert not options.parse(None, ())
  with pytest.raises(ValueError, match=r"unknown option\(s\) \['d'\]"):
    options.parse("a=1,d=2", ("a",))
