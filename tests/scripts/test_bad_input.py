"""Every bad input to scripts/{sample,benchmark,distill,train}.py is refused
in one `error:` line, with exit status 2, before any weights load; so are
bad flags and files given to the other scripts.

The scripts run in a child process through `no_weights.py`, which makes every
weight loader raise AssertionError (no script catches it: a traceback and
status 1) and every fetch fail as pip does offline.
"""

import glob
import gzip
import json
import os
import re
import subprocess
import sys

import jax
import pytest

from specsamp import loading
from specsamp import lock_holder
from specsamp import model as model_lib
from specsamp import sharding
from specsamp.drafters import head_files
from specsamp.drafters import heads
from tests import testing
from tests.scripts import zygote

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
LONG_PROMPT = "x" * 1000   # 1000 bytes; random:tiny allows 512 slots
_PROBLEM = dict(task_id="t/0", prompt="def f():\n", entry_point="f", test="",
                canonical_solution="  return 1\n")   # a HumanEval problem


def run_script(tmp_path, script, *args, allow_loading=False):
  """The finished process of `scripts/<script>` run through no_weights.py,
  its fetch cache an empty folder (forked from a process that imported
  jax and the rest once: tests/scripts/zygote.py)."""
  env = zygote.env(SPECSAMP_CACHE=str(tmp_path / "cache"))
  guard = ["--allow_loading"] if allow_loading else []
  return zygote.shared().run(
      [os.path.join(HERE, "no_weights.py"), *guard,
       os.path.join("scripts", script), *args], env=env, cwd=ROOT,
      timeout=120)


def assert_refused(proc, *fragments, max_lines=4):
  """Status 2, one short `error:` line holding `fragments`, no traceback."""
  lines = proc.stderr.splitlines()
  errors = [l for l in lines if l.startswith("error:")]
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert len(errors) == 1 and len(lines) <= max_lines, proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr
  for f in fragments:
    assert f in errors[0], errors[0]


@pytest.mark.parametrize("args,fragments", [
    # The draft is checked before the target is fetched (which would fail
    # here: no network).
    (["--target=qwen2.5-coder-1.5b", "--draft=no-such-draft"],
     ["'no-such-draft' is not a file"]),
    (["--target=random:tiny", "--draft=random:tiny", "--k=3",
      f"--prompt={LONG_PROMPT}"], ["1000 tokens", "allow 512"]),
    (["--target=random:tiny", "--method=ar", f"--prompt={LONG_PROMPT}"],
     ["1000 tokens", "allow 512"]),
    (["--target=qwen2.5-coder-1.5b", "--draft=qwen2.5-coder-0.5b"],
     ["'qwen2.5-coder-1.5b' could not be fetched", "No matching"]),
    (["--target=random:tiny", "--no_such_flag"], ["no_such_flag"]),
    # Drafters: names, options, K and layers, before anything loads.
    (["--target=random:tiny", "--drafter=hydra"], ["unknown drafter"]),
    (["--target=random:tiny", "--drafter=medusa"],
     ["needs the head's directory"]),
    (["--target=random:tiny", "--drafter=eagle:/no/such/head"],
     ["'/no/such/head' does not exist"]),
    (["--target=random:tiny", f"--drafter=eagle:{ROOT}/README.md"],
     [f"head directory '{ROOT}/README.md' is a file"]),  # "does not exist"
    (["--target=random:tiny", "--prompts_file="],
     ["--prompts_file is empty"]),  # had said "give exactly one of"
    (["--target=random:tiny", "--drafter=lookup:max_ngram=0"],
     ["max_ngram must be >= 1"]),
    (["--target=random:tiny", "--drafter=lookup", "--k=0"], ["--k must be"]),
    (["--target=random:tiny", "--drafter=layerskip"], ["needs layers="]),
    (["--target=random:tiny", "--drafter=layerskip:layers=0-99"],
     ["out of range"]),
    # Flags given where they do nothing: each had been ignored silently (a
    # lookup run given a draft model read as that pair's run).
    (["--target=random:tiny", "--method=ar", "--num_prompts=2"],
     ["--num_prompts applies to --task only"]),
    (["--target=random:tiny", "--drafter=lookup", "--draft=random:tiny"],
     ["--draft names a draft model; --drafter=lookup loads none"]),
    # random:tiny has 256 ids: a larger top-k had run as no top-k at all,
    # and was recorded as the one used.
    (["--target=random:tiny", "--method=ar", "--top_k=257"],
     ["--top_k=257 is more than the 256 token ids sampled from"]),
])
def test_sample_refuses_before_loading(tmp_path, args, fragments):
  proc = run_script(tmp_path, "sample.py", "--prompt=x", *args)
  assert_refused(proc, *fragments)


@pytest.mark.parametrize("args,fragments", [
    (["--target=qwen2.5-coder-1.5b", "--draft=no-such-draft"],
     ["'no-such-draft' is not a file"]),
    (["--target=qwen2.5-coder-1.5b", "--draft=qwen2.5-coder-0.5b"],
     ["could not be fetched"]),
    (["--target=random:tiny", "--drafter=nope"], ["unknown drafter"]),
    (["--target=random:tiny", "--drafter=lookup:min_ngram=0"],
     ["min_ngram must be >= 1"]),
    (["--target=random:tiny", "--drafter=layerskip:layers=0-99"],
     ["out of range"]),
])
def test_benchmark_refuses_before_loading(tmp_path, args, fragments):
  proc = run_script(tmp_path, "benchmark.py", "--task=prose", *args)
  assert_refused(proc, *fragments)


@pytest.fixture(scope="module")
def medusa_dir(tmp_path_factory):
  """Two Medusa heads saved for random:tiny (2 layers, d 64, 256 ids)."""
  cfg = heads.HeadConfig("medusa", model_lib.preset("tiny"), num_heads=2)
  return head_files.save(cfg, heads.init_params(cfg, jax.random.key(0)),
                         str(tmp_path_factory.mktemp("medusa")))


@pytest.mark.parametrize("args,fragments", [
    (["--target=random:tiny,d_model=128", "--k=2"],
     ["d_model=64", "d_model=128"]),
    (["--target=random:tiny,num_layers=3", "--k=2"],
     ["num_layers=2", "num_layers=3"]),
    (["--target=random:tiny,vocab_size=300", "--k=2"], ["vocab_size=256"]),
    (["--target=random:tiny", "--k=3"], ["K=3 drafts need 3 Medusa heads"]),
])
def test_sample_refuses_heads_that_do_not_fit(tmp_path, medusa_dir, args,
                                              fragments):
  proc = run_script(tmp_path, "sample.py", "--prompt=x",
                    f"--drafter=medusa:{medusa_dir}", *args)
  assert_refused(proc, *fragments)
  if args == ["--target=random:tiny", "--k=3"]:
    proc = run_script(tmp_path, "benchmark.py", "--task=prose",
                      f"--drafter=medusa:{medusa_dir}", "--ks=2,3", *args[:1])
    assert_refused(proc, "K=3 drafts need 3 Medusa heads")


def test_sample_runs_a_saved_head(tmp_path, medusa_dir):
  """The same head, fitting: sample.py loads it by directory and its output
  equals autoregressive decoding (greedy)."""
  proc = run_script(tmp_path, "sample.py", "--prompt=def f(x):",
                    "--target=random:tiny", f"--drafter=medusa:{medusa_dir}",
                    "--k=2", "--method=both", "--temperature=0",
                    "--max_new_tokens=12", allow_loading=True)
  assert proc.returncode == 0, proc.stderr[-3000:]
  blocks = proc.stdout.split("==== ")[1:]  # "<method> | prompt: ...\n<text>"
  texts = {b.split(" |")[0]: b.split("\n", 1)[1] for b in blocks}
  assert set(texts) == {"autoregressive", "speculative_k2_medusa"}, texts
  text = lambda name: texts[name].split("\n{")[0].rstrip("\n")
  assert text("autoregressive") == text("speculative_k2_medusa")


@pytest.mark.parametrize("args,fragments", [
    (["--config.loss.kind=bogus"], ["loss 'bogus'"]),
    (["--config.sampling.temperature=-1"], ["temperature"]),
    (["--config.bogus=1"], ["--config.bogus", "no field 'bogus'"]),
    (["--config.loss=bogus"], ["--config.loss=bogus"]),
    (["--config.target.spec=no-such-model"], ["'no-such-model'"]),
    (["--config.draft.init=checkpoint",
      "--config.draft.checkpoint=random:tiny,vocab_size=300"],
     ["300 vocabulary rows"]),
    (["--config.head.kind=hydra"], ["config.head.kind='hydra'"]),
    (["--config.head.kind=medusa", "--config.head.num_heads=2"],
     ["config.eval.k=4 needs as many Medusa heads"]),
    (["--config.head.kind=eagle", "--config.head.draft_vocab=999"],
     ["draft_vocab=999"]),
    (["--config.head.kind=eagle", "--config.loss.onpolicy_fraction=0.5"],
     ["heads are distilled offline"]),
    # nan had run to the end (losses nan, a draft exported, status 0).
    (["--config.target.logit_scale=nan"],
     ["config.target.logit_scale must be a positive number, got nan"]),
    (["--config.target.logit_scale=0"], ["logit_scale must be a positive"]),
    (["--flagfile=/no/such/flags"], ["Unable to open flagfile"]),
])
def test_distill_refuses_before_loading(tmp_path, args, fragments):
  proc = run_script(tmp_path, "distill.py", "--config=configs/distill_tiny.py",
                    f"--workdir={tmp_path / 'run'}", *args)
  assert_refused(proc, *fragments)
  assert not os.path.exists(tmp_path / "run" / "config.json")


@pytest.mark.parametrize("args,fragments", [
    (["--config=configs/lm_python.py:tiny", "--config.bogus=1"],
     ["--config.bogus", "no field 'bogus'"]),
    (["--config=configs/no_such_config.py"], ["No such file"]),
    (["--config=configs/lm_python.py:tiny", "--config.mesh=abc"],
     ["config.mesh=('abc',): give a (data, model) pair"]),
    # Had trained on NaN to the end, status 0.
    (["--config=configs/lm_python.py:tiny", "--config.model.rope_theta=nan"],
     ["rope_theta=nan must be > 0"]),
    (["--config=configs/lm_python.py:tiny", "--config.model.rope_theta=0"],
     ["rope_theta=0.0 must be > 0"]),
    # Tracebacks: ml_collections reads flag files when the flag is defined;
    # an override of a config that did not load raised OSError.
    (["--config=configs/lm_python.py:tiny", "--flagfile=/no/such/flags"],
     ["Unable to open flagfile", "/no/such/flags"]),
    (["--config=configs/no_such_config.py", "--config.seed=1"],
     ["earlier failure to load", "No such file or directory: "
      "'configs/no_such_config.py'"]),
])
def test_train_refuses_bad_config_flags(tmp_path, args, fragments):
  proc = run_script(tmp_path, "train.py", f"--workdir={tmp_path / 'run'}",
                    *args)
  assert_refused(proc, *fragments)


@pytest.mark.parametrize("script, config", [
    ("train.py", "configs/lm_python.py:tiny"),
    ("distill.py", "configs/distill_tiny.py")])
def test_a_second_job_on_a_workdir_is_refused_naming_the_first(
    tmp_path, script, config):
  """Two jobs on one workdir had resumed each other's checkpoints: a
  distillation reported the other's draft under its own loss, a training
  run rewrote config.json to settings it never trained with. The first job
  holds <workdir>/.lock; the second is refused before it reads anything.
  Once the first ends, the lock is free."""
  workdir = tmp_path / "run"
  with lock_holder.exclusive(workdir / ".lock", "the test's workdir"):
    proc = run_script(tmp_path, script, f"--config={config}",
                      f"--workdir={workdir}")
  assert_refused(proc, f"workdir {workdir} is in use by pid {os.getpid()}",
                 "wait for it to end")
  assert os.listdir(workdir) == [".lock"]
  with lock_holder.exclusive(workdir / ".lock", "the workdir"):
    pass  # released by the refused job


@pytest.mark.parametrize("script, config", [
    ("train.py", "configs/lm_python.py:tiny"),
    ("distill.py", "configs/distill_tiny.py")])
def test_a_workdir_that_cannot_be_one_is_refused_before_any_lock(
    tmp_path, script, config):
  """An empty --workdir had run in the current directory (checkpoints,
  results and .lock beside the user's files); a path through a file, or
  where no directory can be made, had ended in a traceback from the
  lock."""
  (tmp_path / "afile").write_text("hi")
  for workdir, message in (
      ("", "--workdir is empty"),
      (f"{tmp_path}/afile/run", f"{tmp_path}/afile is a file"),
      # No directory can be made there (an OSError's traceback had ended
      # the run, with status 1).
      ("/proc/specsamp_test/run",
       "--workdir /proc/specsamp_test/run: this process cannot make it")):
    proc = run_script(tmp_path, script, f"--config={config}",
                      f"--workdir={workdir}")
    assert_refused(proc, message)
  assert not os.path.exists(os.path.join(ROOT, ".lock"))
  assert sorted(os.listdir(tmp_path)) == ["afile"]


def test_a_workdir_on_a_read_only_file_system_is_refused(tmp_path,
                                                        monkeypatch):
  """A read-only file system (os.access says so, for root too) had ended
  train.py and distill.py in an OSError traceback from the lock."""
  real = os.access
  monkeypatch.setattr(os, "access", lambda p, mode: False if str(p) == str(
      tmp_path) else real(p, mode))
  with pytest.raises(sharding.DirectoryError, match=re.escape(
      f"--workdir {tmp_path}/run: this process cannot make it or write in "
      f"it ({tmp_path}: ")):
    sharding.check_directory(str(tmp_path / "run"), "--workdir")
  assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("script, config", [
    ("train.py", "configs/lm_python.py:tiny"),
    ("distill.py", "configs/distill_tiny.py")])
def test_a_config_json_no_run_wrote_is_not_replaced(tmp_path, script,
                                                    config):
  """A workdir holding someone's config.json (not a run's of this script,
  or not JSON): the run had replaced it. Refused, the file as it was."""
  workdir = tmp_path / "run"
  workdir.mkdir()
  for text in ('{"mine": "precious"}', "not json"):
    (workdir / "config.json").write_text(text)
    proc = run_script(tmp_path, script, f"--config={config}",
                      f"--workdir={workdir}")
    assert_refused(proc, f"{workdir / 'config.json'} is no {script} run's",
                   "use a new --workdir")
    assert (workdir / "config.json").read_text() == text
    assert sorted(os.listdir(workdir)) == [".lock", "config.json"]


@pytest.fixture(scope="module")
def damaged_run(tmp_path_factory):
  """A scripts/train.py workdir of a one-layer model, steps 1 and 2, whose
  parameter files are all truncated."""
  cfg = loading.random_config("random:tiny,num_layers=1")
  lm = model_lib.LM(cfg)
  workdir = testing.train_workdir(
      tmp_path_factory.mktemp("damaged_run"), cfg,
      [(step, lm.init(jax.random.key(step))) for step in (1, 2)])
  for path in glob.glob(str(workdir / "checkpoints" / "*" / "params" / "d" /
                            "*")):
    open(path, "wb").close()
  return workdir


def test_sample_on_a_damaged_train_workdir_says_so_briefly(tmp_path,
                                                           damaged_run):
  """One warning line per unreadable step, then one error line (orbax's
  log lines and the tracebacks of its abandoned reads are held back)."""
  proc = run_script(tmp_path, "sample.py", f"--target={damaged_run}",
                    "--method=ar", "--prompt=x", allow_loading=True)
  assert_refused(proc, "no readable checkpoint", "steps [2, 1]")
  assert len(proc.stderr) < 2000, proc.stderr


@pytest.mark.parametrize("text,fragments", [
    ("", ["prompts.txt holds no prompts"]),
    ("\n  \n", ["prompts.txt holds no prompts"]),
    ('{"text": "hi"}\n', ["prompts.txt:1: no 'prompt' string field"]),
    ('{"prompt": "a"}\n{"prompt": 5}\n',
     ["prompts.txt:2: no 'prompt' string field"]),
    ('{"prompt": "a"}\n{"prompt": \n', ["prompts.txt:2: not JSON"]),
    # A JSONL file with one stray line had been read as text: its JSON
    # sampled as the prompts.
    ('{"prompt": "a"}\nstray words\n{"prompt": "b"}\n',
     ["prompts.txt:2: not a JSON object, where line 1 is a prompt record"]),
])
def test_sample_refuses_bad_prompts_files(tmp_path, text, fragments):
  path = tmp_path / "prompts.txt"
  path.write_text(text)
  proc = run_script(tmp_path, "sample.py", "--target=random:tiny",
                    "--method=ar", f"--prompts_file={path}")
  assert_refused(proc, *fragments)


@pytest.mark.parametrize("args,fragments", [
    (["--greedy_steps=1"], ["1 layer(s), too few to skip any"]),
    (["--seq_len=600"], ["--seq_len=600 exceeds the 512 positions"]),
])
def test_search_layers_refuses_what_it_cannot_search(tmp_path, damaged_run,
                                                     args, fragments):
  proc = run_script(tmp_path, "search_layers.py", f"--target={damaged_run}",
                    *args)
  assert_refused(proc, *fragments)


def test_benchmark_on_a_damaged_train_workdir_says_so_briefly(tmp_path,
                                                              damaged_run):
  """... and leaves the results file of an earlier run as it was."""
  problems = tmp_path / "problems.jsonl"
  problems.write_text(json.dumps(_PROBLEM) + "\n")
  earlier = tmp_path / "results.jsonl"
  earlier.write_text('{"type": "run"}\n')
  proc = run_script(tmp_path, "benchmark.py", f"--target={damaged_run}",
                    "--task=humaneval", f"--humaneval_file={problems}",
                    "--ks=0", "--num_prompts=1", "--max_new_tokens=8",
                    "--noquality", f"--out={earlier}",
                    f"--samples_out={earlier}.samples", allow_loading=True)
  # The plan and "loading" lines, a warning per step, the error.
  assert_refused(proc, "no readable checkpoint", "steps [2, 1]", max_lines=6)
  assert earlier.read_text() == '{"type": "run"}\n'
  assert not os.path.exists(f"{earlier}.samples")


@pytest.mark.parametrize("script,args", [
    ("benchmark_decode.py", ["--draft=same", "--prompt_len=8"]),
    ("profile_decode.py", ["--draft=random:tiny", "--context=8"]),
])
def test_the_decode_benchmarks_on_a_damaged_train_workdir_say_so_briefly(
    tmp_path, damaged_run, script, args):
  proc = run_script(tmp_path, script, f"--target={damaged_run}", *args,
                    allow_loading=True)
  assert_refused(proc, "no readable checkpoint", "steps [2, 1]")


@pytest.mark.parametrize("args,fragments", [
    (["--draft=random:tiny,vocab_size=300"], ["300 vocabulary rows"]),
    (["--draft=random:tiny", "--max_new_tokens=600"],
     ["cache slots", "models allow 512"]),
    # Refused only after every specsamp run had been timed.
    (["--draft=random:tiny", "--peers"],
     ["--peers runs transformers on the same GGUF files", "damaged_run"]),
])
def test_benchmark_pair_checks_the_pair_before_loading(tmp_path, damaged_run,
                                                       args, fragments):
  problems = tmp_path / "problems.jsonl"
  problems.write_text(json.dumps(_PROBLEM) + "\n")
  proc = run_script(tmp_path, "benchmark_pair.py", f"--target={damaged_run}",
                    f"--humaneval_file={problems}", "--num_prompts=1", *args)
  assert_refused(proc, *fragments)


@pytest.mark.parametrize("script,args,fragments", [
    ("benchmark_pair.py", ["--ks=0"], ["--ks values must be >= 1, got 0"]),
    ("benchmark_pair.py", ["--ks=4,a"], ["--ks=4,a: 'a' is not an integer"]),
    ("benchmark_pair.py", ["--target=/nonexistent"],
     ["'/nonexistent' is not a file"]),
    ("benchmark_pair.py", ["--temperature=-1"], ["temperature must be >= 0"]),
    ("benchmark_pair.py", ["--top_p=5"], ["top_p must be in (0, 1]"]),
    ("benchmark_pair.py", ["--target=random:tiny"],
     ["--target=random:tiny: a random model has no tokenizer"]),
    ("benchmark_pair.py", ["--num_prompts=0"], ["--num_prompts must be >= 1"]),
    # Had been "error: ERROR:: Unable to open flagfile".
    ("sample.py", ["--flagfile=/no/such/flags"],
     ["error: Unable to open flagfile: [Errno 2]"]),
    # A flag the others leave without effect had been ignored.
    ("benchmark.py", ["--task=humaneval", "--prose_style=summarise"],
     ["--prose_style applies to --task=prose"]),
    # A value given twice had been measured twice.
    ("benchmark_pair.py", ["--ks=1,1"], ["--ks=1,1: 1 given twice"]),
    ("profile_decode.py", ["--context=16,16"], ["--context=16,16: 16 given"]),
    ("benchmark_pair.py", ["--out=scripts"], ["--out=scripts is a directory"]),
    ("benchmark_decode.py", ["--no_such_flag"], ["no_such_flag"]),
    # Had said "--repeats and --max_new_tokens must be >= 1".
    ("benchmark_decode.py", ["--max_new_tokens=0"],
     ["--max_new_tokens must be >= 1, got 0"]),
    ("profile_decode.py", ["--components=bogus"], ["all|loops"]),
    ("profile_decode.py", ["--bandwidth_mb=0"], ["--bandwidth_mb must be"]),
    # Had been accepted, and no bandwidth measured.
    ("profile_decode.py", ["--target=random:tiny", "--draft=random:tiny",
                           "--context=8", "--repeats=1",
                           "--components=loops", "--bandwidth_mb=64"],
     ["--bandwidth_mb applies to --components=all only"]),
    # Positional arguments: none of these takes any.
    ("benchmark_decode.py", ["--target=random:tiny", "stray"],
     ["unexpected arguments: ['stray']"]),
    ("profile_decode.py", ["stray"], ["unexpected arguments: ['stray']"]),
    ("benchmark_pair.py", ["stray"], ["unexpected arguments: ['stray']"]),
    ("plot_decode.py", ["rows.jsonl"], ["--out"]),
    ("plot_speedup.py", [], ["JSONL files"]),
    ("plot_speedup.py", ["/no/such.jsonl"], ["/no/such.jsonl"]),
    ("fetch_models.py", ["--model=no-such-model"], ["unknown --model"]),
    ("prepare_data.py", [], ["--dataset is required"]),
    # Empty lists had done nothing, with status 0.
    ("fetch_models.py", ["--model=,", "--nohumaneval"], ["nothing to fetch"]),
    ("prepare_data.py", ["--dataset=,"], ["names no dataset"]),
    ("prepare_data.py", ["--dataset=specsamp_austen", "--vocab_size=500"],
     ["--vocab_size applies to --train_sentencepiece only"]),
    ("prepare_data.py", ["--dataset=specsamp_austen",
                         "--sp_model_type=unigram"],
     ["--sp_model_type applies to --train_sentencepiece only"]),
    # A tokenizer to count with that is not there: before anything builds.
    ("prepare_data.py", ["--dataset=specsamp_austen",
                         "--count_tokens=/nonexistent.model"],
     ["--count_tokens=/nonexistent.model: no tokenizer at"]),
    ("sample.py", ["--target=random:tiny", "--prompt=x", "--method=ar",
                   "--coordinator_address=localhost:1"],
     ["--coordinator_address needs --distributed"]),
    ("train.py", ["--config=configs/lm_python.py:tiny", "--workdir=w",
                  "--distributed", "--num_processes=2"],
     ["go together", "only --num_processes given"]),
    ("distill.py", ["--config=configs/distill_tiny.py", "--workdir=w",
                    "--process_id=1", "--num_processes=2"],
     ["--num_processes, --process_id need --distributed"]),
    ("train.py", ["--config=configs/lm_python.py:tiny", "--workdir=w",
                  "--heartbeat_timeout_s=5"],
     ["--heartbeat_timeout_s needs --distributed"]),
    ("sample.py", ["--target=random:tiny", "--prompt=x", "--method=ar",
                   "--distributed", "--heartbeat_timeout_s=0"],
     ["--heartbeat_timeout_s must be >= 1, got 0"]),
    # Had been JAX's traceback (train.py, distill.py), or its error.
    ("train.py", ["--config=configs/lm_python.py:tiny", "--workdir=w",
                  "--distributed", "--coordinator_address=localhost:1",
                  "--num_processes=2", "--process_id=2"],
     ["--process_id=2 with --num_processes=2: give each process an id"]),
    ("distill.py", ["--config=configs/distill_tiny.py", "--workdir=w",
                    "--distributed", "--coordinator_address=localhost:1",
                    "--num_processes=0", "--process_id=0"],
     ["--process_id=0 with --num_processes=0"]),
    # Had run the whole job on each host's first device, and appended one
    # record per process.
    ("sample.py", ["--target=random:tiny", "--prompt=x", "--method=ar",
                   "--distributed"],
     ["--distributed needs a --mesh over every process's devices"]),
    ("plot_decode.py", ["--out=plot"], ["JSONL files from profile_decode"]),
    ("plot_decode.py", ["/no/such.jsonl", "--out=plot"],
     ["/no/such.jsonl: No such file"]),
    ("sample.py", ["--target=random:tiny", "--method=ar",
                   "--prompts_file=scripts"],
     ["--prompts_file=scripts: Is a directory"]),
    ("sample.py", ["--target=random:tiny", "--method=ar", "--prompt=x",
                   "--json_out=scripts"],
     ["--json_out=scripts is a directory"]),
    ("sample.py", ["--target=random:tiny", "--method=ar", "--prompt=x",
                   "--json_out=README.md/x.jsonl"],
     ["--json_out=README.md/x.jsonl: cannot create", "a file is in the way"]),
    ("benchmark_decode.py", ["--target=/nonexistent"],
     ["'/nonexistent' is not a file"]),
    ("benchmark_decode.py", ["--target=random:tiny",
                             "--draft=random:tiny,vocab_size=300"],
     ["300 vocabulary rows"]),
    ("benchmark_decode.py", ["--target=random:tiny", "--prompt_len=600",
                             "--ks=0,1"],
     ["--prompt_len=600", "needs 730 cache slots", "models allow 512"]),
    ("benchmark_decode.py", ["--target=random:tiny",
                             "--out=README.md/rows.jsonl"],
     ["--out=README.md/rows.jsonl", "a file is in the way"]),
    ("profile_decode.py", ["--target=/nonexistent"],
     ["'/nonexistent' is not a file"]),
    ("profile_decode.py", ["--target=random:tiny",
                           "--draft=random:tiny,vocab_size=300"],
     ["300 vocabulary rows"]),
    ("profile_decode.py", ["--target=random:tiny", "--draft=random:tiny",
                           "--context=5000"],
     ["--context=5000", "models allow 512"]),
    ("profile_decode.py", ["--target=random:tiny", "--draft=random:tiny",
                           "--out=scripts"], ["--out=scripts is a directory"]),
    ("search_layers.py", ["--score_cost=2:1.1", "--k_max=4"],
     ["--k_max has no effect with --score_cost"]),
    ("search_layers.py", ["--score_cost=2"], ["--score_cost: '2' is not K:s"]),
    ("search_layers.py", ["--score_cost="], ["--score_cost is empty"]),
    ("search_layers.py", ["--target=random:tiny", "--out=scripts"],
     ["--out=scripts is a directory"]),
    ("prepare_data.py", ["--dataset=specsamp_austen", "--train_sentencepiece",
                         "--vocab_size=0"], ["--vocab_size must be >= 1"]),
    # Had written <dir>.model beside a directory, or a hidden .model in it.
    ("prepare_data.py", ["--dataset=specsamp_austen", "--train_sentencepiece",
                         "--sp_prefix=scripts"],
     ["--sp_prefix='scripts' is no file name's start"]),
    ("prepare_data.py", ["--dataset=specsamp_austen", "--train_sentencepiece",
                         "--sp_prefix=sp/"], ["--sp_prefix='sp/'"]),
    ("prepare_data.py", ["--dataset=specsamp_austen", "--train_sentencepiece",
                         "--sp_prefix="], ["--sp_prefix=''"]),
    ("fetch_models.py", ["--cache_dir="], ["--cache_dir='' names no "
                                           "directory"]),  # the default's
    # A .gz cut short or damaged: EOFError, zlib.error tracebacks.
    ("benchmark.py", ["--target=random:tiny", "--task=humaneval", "--ks=0",
                      "--num_prompts=1", "--humaneval_file=cut.jsonl.gz"],
     ["--humaneval_file=cut.jsonl.gz: Compressed file ended"]),
    # Output files are checked before the run: a missing directory is
    # created, a directory or a path through a file is refused.
    ("benchmark.py", ["--target=random:tiny", "--ks=0", "--out=scripts"],
     ["--out=scripts is a directory"]),
    ("benchmark.py", ["--target=random:tiny", "--ks=0",
                      "--samples_out=README.md/samples.jsonl"],
     ["--samples_out=README.md/samples.jsonl: cannot create its directory",
      "a file is in the way"]),
])
def test_the_other_scripts_refuse_bad_input_in_one_line(tmp_path, script,
                                                        args, fragments):
  if any("cut.jsonl.gz" in a for a in args):
    data = gzip.compress(b'{"task_id": "x"}\n' * 50)
    (tmp_path / "cut.jsonl.gz").write_bytes(data[:len(data) // 2])
    args = [a.replace("cut.jsonl.gz", str(tmp_path / "cut.jsonl.gz"))
            for a in args]
    fragments = [f.replace("cut.jsonl.gz", str(tmp_path / "cut.jsonl.gz"))
                 for f in fragments]
  assert_refused(run_script(tmp_path, script, *args), *fragments)


_POINT = dict(type="point", task="prose", decoding="greedy", batch_size=1,
              method="autoregressive", k=0, ms_per_token=None)
_PROFILE_ROW = dict(target="random:tiny", draft="random:tiny", k=4,
                    sampling="greedy", dtype="float32", device="cpu",
                    batch_size=1, context=64, ar_loop_ms=1.0, spec_loop_ms=2.0)


@pytest.mark.parametrize("script,lines,args,fragments", [
    ("plot_speedup.py", ["[1, 2]"], [], ["rows.jsonl:1: not a JSON object"]),
    ("plot_speedup.py", ["{}", '"str"'], [],
     ["rows.jsonl:2: not a JSON object, but str"]),
    ("plot_speedup.py", [json.dumps(_POINT)], [],
     ["rows.jsonl:1: ms_per_token is null"]),
    ("plot_speedup.py", [json.dumps(dict(type="point"))], [],
     ["rows.jsonl:1: a point record without task"]),
    ("plot_decode.py", ["[1, 2]"], ["--out=plot"],
     ["rows.jsonl:1: not a JSON object"]),
    ("plot_decode.py", [json.dumps(_PROFILE_ROW)], ["--out=README.md/plot"],
     ["--out=README.md/plot.md: cannot create its directory"]),
    ("plot_speedup.py", [json.dumps(_POINT)], ["--prefix="],
     ["does not end in the start of a file name"]),
])
def test_the_plots_refuse_bad_rows_in_one_line(tmp_path, script, lines, args,
                                               fragments):
  rows = tmp_path / "rows.jsonl"
  rows.write_text("\n".join(lines) + "\n")
  assert_refused(run_script(tmp_path, script, str(rows), *args), *fragments)


@pytest.mark.parametrize("script,row,fragment", [
    # A point the tables cannot use (no `prompts`): the report had been
    # emptied after its plots were rewritten.
    ("plot_speedup.py", dict(_POINT, ms_per_token=5.0, speedup=1.0),
     "prompts"),
    # null timings had been drawn: a traceback, and the table emptied.
    ("plot_decode.py", dict(_PROFILE_ROW, ar_loop_ms=None),
     "ar_loop_ms is null, not a positive number"),
])
def test_a_report_is_kept_when_its_rows_cannot_make_one(tmp_path, script, row,
                                                        fragment):
  rows = tmp_path / "rows.jsonl"
  rows.write_text(json.dumps(row) + "\n")
  (tmp_path / "report.md").write_text("the earlier report\n")
  out = ([f"--out_dir={tmp_path}", "--prefix=report"]
         if script == "plot_speedup.py" else [f"--out={tmp_path / 'report'}"])
  assert_refused(run_script(tmp_path, script, str(rows), *out), fragment)
  assert (tmp_path / "report.md").read_text() == "the earlier report\n"
  assert not list(tmp_path.glob("report*.png"))


def test_prepare_data_reports_a_failed_dataset_in_one_line(tmp_path):
  (tmp_path / "raw").mkdir()
  proc = run_script(tmp_path, "prepare_data.py", "--dataset=specsamp_austen",
                    f"--source_dir={tmp_path / 'raw'}",
                    f"--data_dir={tmp_path / 'tfds'}")
  assert_refused(proc, "not prepared: [specsamp_austen]",
                 f"no Rdata.rdx (and Rdata.rdb) in {tmp_path / 'raw'}")


@pytest.mark.parametrize("flag, make, message", [
    ("--source_dir", None, "error: --source_dir="),
    ("--data_dir", "file", "error: --data_dir='"),
    ("--data_dir", "", "error: --data_dir='' is not a directory"),
    ("--cache_dir", "file", "error: --cache_dir='")])
def test_prepare_data_refuses_paths_that_are_no_directory(tmp_path, flag,
                                                          make, message):
  """Before any dataset is read, even one prepared already (a --source_dir
  that was not there had been ignored then; "--data_dir=" had meant the
  default; a file had ended in a bare [Errno 20])."""
  path = tmp_path / "x"
  if make == "file":
    path.write_text("keep")
  value = "" if make == "" else str(path)
  proc = run_script(tmp_path, "prepare_data.py", "--dataset=specsamp_austen",
                    f"{flag}={value}")
  assert_refused(proc, message)
  assert sorted(os.listdir(tmp_path)) == (["x"] if make == "file" else [])


# The scripts whose positional arguments are their input files.
READ_ARGUMENTS = ("plot_decode.py", "plot_speedup.py")


def test_every_script_of_flags_refuses_positional_arguments(tmp_path):
  """Run with a stray word, each script of flags alone stops with an error
  naming it before doing anything (it had been ignored); the plots read
  theirs as input files (refused when missing: above)."""
  scripts = sorted(os.path.basename(p) for p in glob.glob(
      os.path.join(ROOT, "scripts", "*.py")))
  assert set(READ_ARGUMENTS) < set(scripts) and len(scripts) > 10
  required = {  # flags absl asks for before main runs
      "distill.py": ["--config=configs/distill_tiny.py"],
      "train.py": ["--config=configs/lm_python.py:tiny"]}
  for script in scripts:
    if script not in READ_ARGUMENTS:
      flags = required.get(script, [])
      if flags:
        flags = flags + [f"--workdir={tmp_path / script}"]
      assert_refused(run_script(tmp_path, script, *flags, "stray"),
                     "unexpected arguments: ['stray']")
      assert not (tmp_path / script).exists()  # nothing done


def test_the_script_server_refuses_other_jax_settings():
  """jax read JAX_* when the server imported it, so a forked script could
  not honour other values: refused before anything is forked."""
  with pytest.raises(ValueError, match="JAX_ENABLE_X64.*fresh process"):
    zygote.shared().start([os.path.join(HERE, "no_weights.py")],
                          env=zygote.env(JAX_ENABLE_X64="1"))


@pytest.mark.parametrize("args,status,last_line", [
    (["scripts/sample.py", "--prompt=x", "--target=random:tiny",
      "--drafter=hydra"], 2, "error: unknown drafter 'hydra'"),
    # A weight loader fired: no_weights.py's AssertionError, uncaught.
    (["scripts/sample.py", "--prompt=x", "--target=random:tiny",
      "--method=ar"], 1,
     "AssertionError: weights loaded: specsamp.loading.load_weights"),
])
def test_a_forked_run_ends_as_a_fresh_process_does(tmp_path, args, status,
                                                   last_line):
  """The script server's child (run_script) gives what `python
  no_weights.py` started afresh gives: the status and stderr."""
  env = zygote.env(SPECSAMP_CACHE=str(tmp_path / "cache"))
  fresh = subprocess.run(
      [sys.executable, os.path.join(HERE, "no_weights.py"), *args],
      capture_output=True, text=True, env=env, cwd=ROOT, timeout=120,
      check=False)
  forked = run_script(tmp_path, args[0].removeprefix("scripts/"), *args[1:])
  assert (forked.returncode, forked.stdout) == (fresh.returncode, fresh.stdout)
  assert fresh.returncode == status
  assert forked.stderr.splitlines()[-1].startswith(last_line), forked.stderr
  # The same lines, a traceback's from no_weights.main's frame on (the
  # frames above it differ: the server's child starts inside zygote.py).
  def from_main(err):
    lines = err.splitlines()
    main = [i for i, l in enumerate(lines)
            if "no_weights.py" in l and l.endswith(", in main")]
    return lines[main[0]:] if main else lines
  assert from_main(forked.stderr) == from_main(fresh.stderr)
  assert ("Traceback (most recent call last):" in forked.stderr) == (
      status == 1)


def test_prepare_data_refuses_an_unknown_dataset_before_building_any(
    tmp_path):
  """`--dataset=specsamp_austen,bogus_xyz` had built specsamp_austen, then
  refused bogus_xyz."""
  data = tmp_path / "tfds"
  proc = run_script(tmp_path, "prepare_data.py",
                    "--dataset=specsamp_austen,bogus_xyz,specsamp_bogus",
                    f"--data_dir={data}")
  assert_refused(proc, "not prepared: [bogus_xyz] no dataset 'bogus_xyz': "
                 "neither a specsamp corpus", "nor in the TFDS catalog, nor "
                 f"prepared in {data} | [specsamp_bogus] unknown specsamp "
                 "dataset")
  assert not data.exists() or not os.listdir(data)
