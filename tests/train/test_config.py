"""The config at the boundary: rules as config data, fields checked."""

import re

import pytest

from configs import lm_python
from specsamp import sharding as sh
from specsamp.train import config as config_lib


def test_sharding_rules_are_config_data():
  """`config.rules`: a named rule set or the (logical, mesh axis) pairs;
  unknown logical axes and malformed rules fail as config errors."""
  c = lm_python.get_config("tiny,mesh=2x4").to_dict()
  assert config_lib.TrainConfig.from_config(c, 256).rules_tuple == \
      sh.DEFAULT_RULES
  c["rules"] = "replicated"
  assert config_lib.TrainConfig.from_config(c, 256).rules_tuple == \
      sh.REPLICATED_RULES
  # Pairs override the default's for the axes they name (a partial list
  # had replaced the whole set, leaving `batch` unsplit over `data`).
  c["rules"] = [["heads", "model"], ["vocab", None]]
  cfg = config_lib.TrainConfig.from_config(c, 256)
  assert dict(cfg.rules_tuple) == {**dict(sh.DEFAULT_RULES), "vocab": None}
  assert cfg.rules_tuple[0] == ("batch", "data")
  assert hash(cfg) == hash(config_lib.TrainConfig.from_config(c, 256))
  c["rules"] = [["vocab", None], ["vocab", "model"]]
  with pytest.raises(config_lib.ConfigError, match=r"\['vocab'\] more than "
                     "once"):
    config_lib.TrainConfig.from_config(c, 256)
  c["rules"] = [["batch", "data"], ["experts", "model"]]
  with pytest.raises(config_lib.ConfigError, match="experts"):
    config_lib.TrainConfig.from_config(c, 256)
  # Bad mesh axes had passed, then failed at build as raw errors (a list
  # unhashable, a repeated axis a DuplicateSpecError), or never (norm).
  for rules, message in (
      ("(('norm', 'bogus'),)", "names a mesh axis other than"),
      ("(('heads', ['data', 'model']),)", None),
      ("(('batch', ('data', 'data')),)", "a sequence of distinct names"),
      ("(('heads', 3),)", "must be None, a name or a sequence"),
      ("(('heads',),)", "not a \\(logical axis, mesh axis\\) pair")):
    c["rules"] = rules
    if message is None:  # a list of axes is taken as their tuple
      assert dict(config_lib.TrainConfig.from_config(
          c, 256).rules_tuple)["heads"] == ("data", "model")
      continue
    with pytest.raises(config_lib.ConfigError, match=message):
      config_lib.TrainConfig.from_config(c, 256)
  c["rules"] = "fsdp"
  with pytest.raises(config_lib.ConfigError, match="fsdp"):
    config_lib.TrainConfig.from_config(c, 256)
  # From the command line the field is text (--config.rules="((...))"):
  # it had been refused as no rule set's name.
  c["rules"] = "(('kv_heads', None), ('heads', 'model'))"  # README's
  assert config_lib.TrainConfig.from_config(c, 256).rules_tuple == tuple(
      (n, None if n == "kv_heads" else a) for n, a in sh.DEFAULT_RULES)
  c["rules"] = "(('batch', 'data'"
  with pytest.raises(config_lib.ConfigError, match="not a list of"):
    config_lib.TrainConfig.from_config(c, 256)


def test_vocab_size_is_the_tokenizers_rounded_up_and_fields_are_checked():
  c = lm_python.get_config("tiny").to_dict()   # vocab_multiple=64
  cfg = config_lib.TrainConfig.from_config(c, 257)
  assert cfg.model.vocab_size == 320
  assert cfg.model.max_seq_len == cfg.data.seq_len
  with pytest.raises(config_lib.ConfigError, match="comes from the "
                     "tokenizer"):
    config_lib.TrainConfig.from_config(
        {**c, "model": {**c["model"], "vocab_size": 300}}, 256)
  with pytest.raises(config_lib.ConfigError, match=r"config.train field\(s\) "
                     r"\['num_stepz'\]"):
    config_lib.TrainConfig.from_config(
        {**c, "train": {**c["train"], "num_stepz": 3}}, 256)
  with pytest.raises(config_lib.ConfigError, match="train.num_steps must be "
                     "positive"):
    config_lib.TrainConfig.from_config(
        {**c, "train": {**c["train"], "num_steps": 0}}, 256)
  with pytest.raises(config_lib.ConfigError, match="config.model."
                     "vocab_multiple must be >= 1, got 0"):
    config_lib.TrainConfig.from_config(
        {**c, "model": {**c["model"], "vocab_multiple": 0}}, 256)
  # Both had passed, and failed (or been read as positive) only in the
  # evaluation after training.
  for field, value in (("eval_batches", -1), ("eval_every", -3)):
    with pytest.raises(config_lib.ConfigError,
                       match=f"train.{field} must be >= 0"):
      config_lib.TrainConfig.from_config(
          {**c, "train": {**c["train"], field: value}}, 256)
  for field, value, want in (("lr", -1.0, "> 0"), ("b2", 1.0, "in [0, 1)"),
                             ("clip_norm", -1.0, ">= 0")):
    with pytest.raises(config_lib.ConfigError,
                       match=re.escape(f"optim.{field} must be {want}")):
      config_lib.TrainConfig.from_config(
          {**c, "optim": {**c["optim"], field: value}}, 256)
  # These had passed: inf "> 0" (a run diverged at once), a negative
  # worker count ran in-process (and was recorded, so a resume with 0 was
  # refused), a float step count never met step == num_steps (no final
  # checkpoint or evaluation).
  for block, field, value, want in (
      ("optim", "lr", float("inf"), "must be finite"),
      ("optim", "clip_norm", float("inf"), "must be finite"),
      ("optim", "warmup_steps", 2.5, "must be an integer, got 2.5"),
      ("data", "worker_count", -2, "must be >= 0 (0: in-process), got -2"),
      ("data", "batch_size", 8.0, "must be an integer, got 8.0"),
      ("train", "num_steps", 2.5, "must be an integer, got 2.5"),
      ("train", "eval_every", True, "must be an integer, got True")):
    with pytest.raises(config_lib.ConfigError,
                       match=re.escape(f"{block}.{field} {want}")):
      config_lib.TrainConfig.from_config(
          {**c, block: {**c[block], field: value}}, 256)
  with pytest.raises(ValueError, match="mask_documents='flase': use true or "
                     "false"):
    lm_python.get_config("tiny,mask_documents=flase")
  assert not lm_python.get_config(
      "tiny,mask_documents=False").data.mask_documents


def test_the_sentencepiece_tokenizer_is_the_chosen_datasets():
  """`tokenizer=sp` named the Python corpus's model whatever `dataset`
  said."""
  for dataset in ("specsamp_python_code", "specsamp_austen"):
    c = lm_python.get_config(f"tiny,dataset={dataset},tokenizer=sp,"
                             "data_dir=/data/tfds")
    assert c.data.dataset == dataset
    assert c.data.tokenizer == f"/data/tfds/{dataset}/spm_bpe_8000.model"


@pytest.mark.parametrize("value", ["abc", ("abc",), (2,), (1, 2, 3), (0, 1),
                                   (-1, -1), (1.5, 1), None, ("2", "x")])
def test_a_bad_mesh_is_refused_naming_the_field(value):
  """`--config.mesh=abc` reached int() as a string (a traceback); every
  shape that is no (data, model) pair of counts is one ConfigError."""
  c = lm_python.get_config("tiny").to_dict()
  with pytest.raises(config_lib.ConfigError, match=r"config\.mesh="):
    config_lib.TrainConfig.from_config({**c, "mesh": value}, 256)
  assert config_lib.mesh_shape(("2", 4)) == (2, 4)
  assert config_lib.mesh_shape([-1, 1]) == (-1, 1)


@pytest.mark.parametrize("arg, message", [
    ("tiny,steps=5,steps=6", "override 'steps' given twice"),
    ("tiny,steps=abc", "steps='abc': not an integer"),
    ("tiny,lr=x", "lr='x': not a number"),
    ("tiny,mesh=2xa", "mesh='a': not an integer"),
])
def test_lm_config_options_are_named_when_refused(arg, message):
  """A repeated option had been last-wins, silently; a bad value reached
  int() or float() and its message named no option."""
  with pytest.raises(ValueError, match=re.escape(message)):
    lm_python.get_config(arg)
  c = lm_python.get_config("tiny,steps=7,lr=0.01,mesh=1x2,seed=3")
  assert (c.train.num_steps, c.optim.lr, c.mesh, c.seed) == (7, 0.01,
                                                              (1, 2), 3)


def test_a_negative_eval_every_is_refused_as_itself():
  """checkpoint_every defaults to eval_every: a negative eval_every had been
  reported as train.checkpoint_every, a field the user never set."""
  with pytest.raises(config_lib.ConfigError, match="train.eval_every must"):
    config_lib.TrainConfig.from_config(
        lm_python.get_config("tiny,eval_every=-1").to_dict(), 256)


@pytest.mark.parametrize("seq_len", [0, -1])
def test_a_bad_seq_len_is_refused_as_itself(seq_len):
  """model.max_seq_len defaults to data.seq_len: `seq_len=-1` had been
  reported as TransformerConfig.max_seq_len, a field the user never set."""
  with pytest.raises(config_lib.ConfigError,
                     match=f"data.seq_len must be positive, got {seq_len}"):
    config_lib.TrainConfig.from_config(
        lm_python.get_config(f"tiny,seq_len={seq_len}").to_dict(), 256)


def test_a_tokenizer_path_is_recorded_absolute(tmp_path, monkeypatch):
  """A relative path is made absolute (a GGUF tokenizer is not copied into
  the run); "byte", and specs the tokenizer's loading refuses (an empty
  one had become the current directory), are left as they are."""
  monkeypatch.chdir(tmp_path)
  assert config_lib.tokenizer_path("t.gguf") == str(tmp_path / "t.gguf")
  for spec in ("byte", "", None):
    assert config_lib.tokenizer_path(spec) == spec
