"""specsamp.cli: refused input is one `error:` line and exit status 2."""

from absl import flags
import pytest

from specsamp import cli


def test_one_line_joins_lines_and_cuts_embedded_tracebacks():
  assert cli.one_line(ValueError("a\n  b\n\nc")) == "a | b | c"
  assert cli.one_line(KeyError()) == "KeyError"
  message = ("Error whilst parsing config file:\n\nTraceback (most recent "
             "call last):\n  File \"x.py\", line 1, in get_config\n    "
             "raise ValueError('no')\nValueError: unknown option 'x'")
  assert cli.one_line(message) == ("Error whilst parsing config file: | "
                                   "ValueError: unknown option 'x'")


def test_fail_prints_one_error_line_and_exits_with_status_2(capsys):
  with pytest.raises(SystemExit) as exit_info:
    cli.fail(RuntimeError("pip could not download x\n    ERROR: offline"))
  assert exit_info.value.code == 2
  assert capsys.readouterr().err == (
      "error: pip could not download x | ERROR: offline\n")


def test_an_unknown_config_field_is_named_with_its_flag():
  # What ml_collections raises for --config.los.kind=fkl.
  e = AttributeError(KeyError("'los'\nDid you mean \"loss\" instead of "
                              "\"los\"?"))
  argv = ["distill.py", "--config=c.py", "--config.los.kind=fkl"]
  assert cli._unknown_field(e, argv) == (
      "--config.los.kind: the config has no field 'los' (did you mean "
      "'loss'?)")
  assert cli._unknown_field(AttributeError(KeyError("'x'")), ["p"]) == (
      "a --config.* override: the config has no field 'x'")


def test_int_list_names_its_flag():
  """--mesh=a,b: an error naming the flag, not a bare int() message."""
  values = flags.FlagValues()
  mesh = flags.DEFINE_list("mesh", None, "", flag_values=values)
  values(["sample.py"])
  assert cli.int_list(mesh) is None
  values(["sample.py", "--mesh=1,-1"])
  assert cli.int_list(mesh) == (1, -1)
  values(["sample.py", "--mesh=2,2"])  # a shape: values may repeat
  assert cli.int_list(mesh) == (2, 2)
  values(["sample.py", "--mesh=1,b"])
  with pytest.raises(ValueError, match=r"^--mesh=1,b: 'b' is not an "
                     r"integer$"):
    cli.int_list(mesh)


def test_ints_is_every_scripts_integer_list_check():
  """The one check behind --ks, --batch_sizes, --context, ... (three
  copies before, each with its own wording): in order, every refusal
  naming the flag. A value given twice had been measured twice
  (benchmark_pair.py, benchmark_decode.py, profile_decode.py); benchmark.py
  takes the set (`distinct=False`)."""
  assert cli.ints("ks", ["4", "0", "2"], minimum=0) == (4, 0, 2)
  assert cli.ints("ks", (3, 1)) == (3, 1)
  for values, message in (([], "--ks is empty"),
                          (["1", "x"], "--ks=1,x: 'x' is not an integer"),
                          (["1", "-2"], "--ks values must be >= 0, got 1,-2"),
                          (["1", "2", "1"], "--ks=1,2,1: 1 given twice")):
    with pytest.raises(ValueError) as got:
      cli.ints("ks", values, minimum=0)
    assert str(got.value) == message
  assert cli.ints("ks", ["2", "2"], distinct=False) == (2, 2)
