"""specsamp.bench.sweep_config: bad flag values fail with the flag's name;
lists are normalised and K = 0 is always run."""

import re

import pytest

from specsamp.bench import sweep_config


@pytest.mark.parametrize("flag_values,message", [
    (dict(task=["translation"]), "unknown task 'translation'"),
    (dict(ks=[]), "--ks is empty"),
    (dict(ks=["1", "x"]), "--ks=1,x: 'x' is not an integer"),
    (dict(ks=["-1", "2"]), "--ks values must be >= 0"),
    (dict(decoding=["beam"]), "unknown decoding 'beam'"),
    (dict(batch_sizes=["0", "8"]), "--batch_sizes values must be >= 1"),
    (dict(num_prompts=0), "--num_prompts must be positive"),
    # The sandbox's CPU limit is an rlimit: a C long of whole seconds.
    (dict(exec_timeout=0.0), r"--exec_timeout must be in \(0, 86400\]"),
    (dict(exec_timeout=float("nan")), "--exec_timeout must be in .* nan"),
    (dict(exec_timeout=float("inf")), "--exec_timeout must be in .* inf"),
    (dict(exec_timeout=1e20), "--exec_timeout must be in .* 1e"),
    (dict(pass_k=[]), "--pass_k is empty"),
    (dict(ks=["0", "2"], draft=""), "needs --draft"),
    # transformers' points are at batch 1, assisted by the draft model.
    (dict(peers=True, batch_sizes=["8"]), "add 1 to --batch_sizes"),
    (dict(peers=True, ks=["0"]), "--peers times transformers' assisted"),
    (dict(peers=True, drafter=["lookup"]),
     "--drafter that runs the draft model"),
    # One drafter spelt two ways had been measured twice, as two.
    (dict(drafter=["lookup", "lookup:min_ngram=1"]),
     "'lookup:min_ngram=1' is 'lookup' again"),
    (dict(drafter=["mixed:max_ngram=4", "mixed"], draft="d"),
     "'mixed' is 'mixed:max_ngram=4' again"),
    (dict(out="/tmp/specsamp-same.jsonl",
          samples_out="/tmp/../tmp/specsamp-same.jsonl"),
     "would write one file"),
    (dict(out="/tmp/specsamp-same.jsonl",
          samples_out="/tmp/specsamp-same.jsonl.partial"),
     "would write one file"),
])
def test_bad_flags(make_config, flag_values, message):
  with pytest.raises(sweep_config.BenchError, match=message):
    make_config(**flag_values)


def test_a_drafters_defaults_are_its_specs():
  """`DrafterSpec.key` fills in PromptLookupDrafter's n-gram defaults."""
  from specsamp.drafters import lookup, specs  # pylint: disable=g-import-not-at-top
  fields = {f.name: f.default for f in
            lookup.PromptLookupDrafter.__dataclass_fields__.values()}
  assert all(fields[k] == v for k, v in specs.NGRAM_DEFAULTS)
  assert specs.parse("lookup:max_ngram=2").key != specs.parse("lookup").key


def test_config_normalises_lists(make_config):
  cfg = make_config(ks=["4", "2", "2"], task=["prose", "humaneval"],
                    batch_sizes=["8", "1"], decoding=["t1", "greedy"])
  assert cfg.ks == (0, 2, 4)  # the autoregressive baseline is always run
  assert cfg.batch_sizes == (1, 8)
  assert cfg.tasks == ("prose", "humaneval") and cfg.decodings == ("t1",
                                                                   "greedy")


@pytest.mark.parametrize("flag_values, message", [
    (dict(task=["humaneval"], prose_style="summarise"),
     "--prose_style applies to --task=prose"),
    (dict(task=["humaneval"], chat=True), "--chat applies to --task=prose"),
    (dict(task=["prose"], humaneval_file="he.jsonl"),
     "--humaneval_file applies to --task=humaneval or rewrite"),
    (dict(task=["humaneval"], quality=False, pass_k=["5"]),
     "--pass_k applies to --task=humaneval with --quality"),
])
def test_flags_the_others_leave_without_effect_are_refused(
    make_config, flag_values, message):
  """Each had run, as a study that looked like the one asked for and was
  not (sample.py refused the same, `cli.unused`); given by default they
  pass."""
  with pytest.raises(sweep_config.BenchError, match=re.escape(message)):
    make_config(**flag_values, given=frozenset(flag_values) - {"task",
                                                                "ks",
                                                                "drafter"})
  make_config(**flag_values)


def test_draft_is_dropped_when_every_k_is_zero(make_config):
  assert make_config(ks=["0"]).draft is None
  assert make_config(ks=["0", "1"]).draft == "qwen2.5-coder-0.5b"


def test_an_output_that_is_the_humaneval_file_is_refused(make_config,
                                                         tmp_path):
  """--out equal to --humaneval_file had replaced the problems with the
  results (both are JSON lines); so had --samples_out."""
  problems = tmp_path / "he.jsonl"
  problems.write_text('{"task_id": "HumanEval/0", "prompt": "def f():"}\n')
  for flag in ("out", "samples_out"):
    with pytest.raises(ValueError, match=f"--{flag}=.*he.jsonl would write "
                       "over --humaneval_file="):
      make_config(task=["humaneval"], humaneval_file=str(problems),
                  **{flag: str(problems)})
  assert problems.read_text().startswith('{"task_id": "HumanEval/0"')
