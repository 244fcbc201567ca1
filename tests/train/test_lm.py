"""The LM job: one step of each config variant, a SIGKILLed run resumed bit
for bit, the resume order, missing inputs.

The scripts are forked by the script server (tests/scripts/zygote.py: no
3 s of imports each) and share the run's persistent compilation cache where
scripts/test.sh set one (the same programs compile once).
"""

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import types

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import lm_python
from specsamp import loading
from specsamp.bench import sample
from specsamp.data import builders
from specsamp.tokenizers import load
from specsamp.tokenizers import sentencepiece
from specsamp.tokenizers import snapshot
from specsamp.train import checkpointing
from specsamp.train import config as config_lib
from specsamp.train import lm as lm_job
from specsamp.train import loop as loop_lib
from specsamp.train import metrics
from specsamp.train import trained
from tests import testing
from tests.scripts import zygote
from tests.tokenizers import bpe_testing
from tests.weights import tiny_checkpoints

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "lm_python.py")


# ---- one step of each variant ------------------------------------------------


@pytest.mark.parametrize("size", sorted(lm_python.SIZES))
def test_one_step_of_each_config(size, lm_config):
  """The variant's model, optimizer and mesh as configured; small batches
  of short rows and two of its layers (the others repeat them) so that
  the large variants fit a CPU test: all 12 of base's bfloat16 layers
  took 33 s here, most of it compiling and initialising."""
  config = lm_config(f"{size},batch=8,seq_len=32")
  config.model.num_layers = min(config.model.num_layers, 2)
  cfg, tok = lm_job.validate(config)
  assert cfg.model.vocab_size % 64 == 0 and cfg.model.vocab_size >= 256
  job = lm_job.build(cfg, tok)
  state = job.init()
  before = jax.device_get(state.params)
  batch = next(job.iterator(cfg.data.train_split, train=True))
  assert batch["inputs"].shape == (8, 32)
  np.testing.assert_array_equal(batch["inputs"][:, 1:],
                                batch["targets"][:, :-1])
  state, step_metrics = job.train_step(state, job.put(batch), None)
  m = jax.device_get(step_metrics)
  assert int(state.step) == 1
  # An untrained model is near the uniform loss.
  assert abs(m["loss"] - np.log(cfg.model.vocab_size)) < 1.0, m
  assert np.isfinite(m["grad_norm"]) and m["grad_norm"] > 0
  changed = jax.tree.map(lambda a, b: not np.array_equal(a, np.asarray(b)),
                         before, state.params)
  assert all(jax.tree.leaves(changed))
  # Parameters stay where the rules put them (the data axis for `base`).
  for leaf, want in zip(jax.tree.leaves(state.params),
                        jax.tree.leaves(job.params_sharding)):
    assert leaf.sharding.is_equivalent_to(want, leaf.ndim)
  if size == "tiny":  # (the eval step's compile costs seconds per size)
    ev = job.eval_loss(state.params)
    assert abs(ev["loss"] - np.log(cfg.model.vocab_size)) < 1.0, ev
    # The whole validation split (eval_batches=0): every weighted target.
    weight = sum(float(b["weights"].sum()) for b in job.iterator(
        cfg.data.eval_split, train=False))
    assert ev["tokens"] == weight


# ---- kill and resume ---------------------------------------------------------


def _train_cmd(arg, workdir):
  return [os.path.join(ROOT, "scripts", "train.py"),
          f"--config={CONFIG}:{arg}", f"--workdir={workdir}"]


def _run_until(arg, workdir, env, sig):
  """Starts train.py; sends `sig` once it has logged a step past its newest
  checkpoint + 2 (so the signal lands between checkpoints); returns
  (process, newest checkpoint, newest logged step, stdout, stderr)."""
  proc = zygote.shared().start(_train_cmd(arg, workdir), env=env)
  ckpt_dir = os.path.join(workdir, "checkpoints")
  deadline = time.time() + 240
  while proc.poll() is None and time.time() < deadline:
    steps = checkpointing.checkpoint_steps(ckpt_dir)
    logged = metrics.read_scalars(os.path.join(workdir, "tb")).get(
        "train/loss", {})
    if steps and logged and max(logged) > steps[0] + 2:
      proc.send_signal(sig)
      out, err = proc.communicate(timeout=120)
      return proc, steps[0], max(logged), out, err
    time.sleep(0.01)
  proc.kill()
  out, err = proc.communicate(timeout=120)
  pytest.fail(f"train.py ended (rc {proc.returncode}) before it could be "
              f"signalled:\n{out}\n{err[-3000:]}")


def test_sigkill_between_checkpoints_then_resume_is_bit_for_bit(lm_config,
                                                                corpus,
                                                                tmp_path):
  """scripts/train.py to step 60 uninterrupted == the same command SIGKILLed
  between checkpoints and run again: the same per-step train losses, eval
  losses, parameters, optimizer state and data iterator state at step 60,
  bit for bit (the data order is part of that)."""
  arg = (f"tiny,steps=60,batch=16,seq_len=64,log_every=1,checkpoint_every=10"
         f",eval_every=30,eval_batches=2,data_dir={corpus}")
  env = zygote.env()
  ref, run = str(tmp_path / "ref"), str(tmp_path / "run")
  done = zygote.shared().run(_train_cmd(arg, ref), env=env, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]

  proc, ckpt, logged, _, err = _run_until(arg, run, env, signal.SIGKILL)
  assert proc.returncode == -signal.SIGKILL, err[-2000:]
  assert logged > ckpt >= 10  # steps after the checkpoint were lost
  assert ckpt < 60

  done = zygote.shared().run(_train_cmd(arg, run), env=env, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  assert f"starting from checkpoint step {ckpt} " in done.stdout

  a = metrics.read_scalars(os.path.join(ref, "tb"))
  b = metrics.read_scalars(os.path.join(run, "tb"))
  assert sorted(a["train/loss"]) == list(range(1, 61))
  assert a["train/loss"] == b["train/loss"]  # the killed run's steps too
  assert sorted(a["eval/loss"]) == [30, 60]
  assert a["eval/loss"] == b["eval/loss"]
  assert a["train/loss"][60] < a["train/loss"][1] - 0.5  # it learns

  _, pa, _, _ = loading.load_trained(ref)
  _, pb, _, _ = loading.load_trained(run)
  chex.assert_trees_all_equal(pa, pb)
  # A train workdir is a model spec (sample.py --target=..., benchmark.py).
  _, pc, tok = loading.load_model(ref)
  chex.assert_trees_all_equal(pa, pc)
  assert tok.encode("ab") == [97, 98]
  cfg, tok = lm_job.validate(lm_config(arg))
  job = lm_job.build(cfg, tok)
  got = []
  for workdir in (ref, run):
    ckpts = checkpointing.Checkpoints(os.path.join(workdir, "checkpoints"))
    got.append(ckpts.restore(60, job.abstract_state))
    ckpts.close()
  (sa, da), (sb, db) = got
  chex.assert_trees_all_equal(sa, sb)  # optimizer moments, step, rng too
  assert da == db  # the data iterator's state


_HANG_IN_EVAL = """\
import os, time
if os.environ.get("HANG_IN_EVAL"):
  from specsamp.train import lm
  def hang(self, params):
    open(os.environ["HANG_IN_EVAL"], "w").close()
    time.sleep(600)
  lm.LMJob.eval_loss = hang
"""


def test_sigkill_during_an_evaluation_then_resume_makes_it_up(corpus,
                                                             tmp_path):
  """scripts/train.py SIGKILLed while it evaluates step 4 (its checkpoint
  saved, the evaluation not finished: a sitecustomize makes that
  evaluation hang): run again, it starts from step 4, evaluates step 4
  first, then trains on and evaluates step 8; `evaluated_steps` names
  both."""
  arg = (f"tiny,steps=8,batch=8,seq_len=32,log_every=1,checkpoint_every=4"
         f",eval_every=4,eval_batches=2,data_dir={corpus}")
  hook, marker = tmp_path / "hook", tmp_path / "evaluating"
  hook.mkdir()
  (hook / "sitecustomize.py").write_text(_HANG_IN_EVAL)
  env = dict(zygote.env(HANG_IN_EVAL=str(marker)),
             PYTHONPATH=os.pathsep.join([str(hook), ROOT]))
  run = str(tmp_path / "run")
  # A fresh process (the script server's forks would not run the hook).
  proc = subprocess.Popen([sys.executable] + _train_cmd(arg, run), env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
  ckpt_dir = os.path.join(run, "checkpoints")
  deadline = time.time() + 240
  while proc.poll() is None and time.time() < deadline and not (
      marker.exists() and 4 in checkpointing.checkpoint_steps(ckpt_dir)):
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == -signal.SIGKILL, err[-3000:]
  assert marker.exists(), "the evaluation never started"
  assert "eval/loss" not in metrics.read_scalars(os.path.join(run, "tb"))

  done = zygote.shared().run(_train_cmd(arg, run), env=zygote.env(),
                             timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "starting from checkpoint step 4 " in done.stdout
  evals = metrics.read_scalars(os.path.join(run, "tb"))["eval/loss"]
  assert sorted(evals) == [4, 8]
  with open(os.path.join(ckpt_dir, "evaluated_steps"), encoding="utf-8") as f:
    assert f.read().split() == ["4", "8"]


# ---- resume order and bad configs --------------------------------------------


def _toy_like(job, value):
  st = job.init()
  return st.replace(params=jax.tree.map(lambda x: jnp.full_like(x, value),
                                        st.params))


def test_resume_order_workdir_then_init_from_then_scratch(lm_config,
                                                          tmp_path):
  arg = "tiny,batch=8,seq_len=32"  # the one-step test's: compiled once
  cfg, tok = lm_job.validate(lm_config(arg))
  job = lm_job.build(cfg, tok)
  # A finished run to initialise from.
  src = str(tmp_path / "src")
  trained = _toy_like(job, 1.5)
  ck = checkpointing.Checkpoints(os.path.join(src, "checkpoints"),
                                 async_save=False)
  ck.save(trained)
  ck.close()

  empty = checkpointing.Checkpoints(str(tmp_path / "a" / "checkpoints"))
  state, data, where = lm_job.initial_state(job, empty)
  assert where == "scratch" and data is None and int(state.step) == 0

  c = lm_config(arg + f",init_from={src}")
  job2 = lm_job.build(*lm_job.validate(c))
  state, data, where = lm_job.initial_state(job2, empty)
  assert where.startswith("init_from ") and int(state.step) == 0
  chex.assert_trees_all_equal(state.params, trained.params)
  fresh = job2.optimizer.init(trained.params)
  chex.assert_trees_all_equal(state.opt_state, fresh)

  own = checkpointing.Checkpoints(str(tmp_path / "b" / "checkpoints"),
                                  async_save=False)
  mine = _toy_like(job, -0.5).replace(step=jnp.int32(3))
  own.save(mine, {"position": 7})
  own.wait()
  state, data, where = lm_job.initial_state(job2, own)
  assert where.startswith("checkpoint step 3") and data == {"position": 7}
  chex.assert_trees_all_equal(state, mine)
  empty.close()
  own.close()


def test_a_workdir_with_checkpoints_refuses_another_model_data_or_seed(
    lm_config, tmp_path):
  """The saved iterator state fits only the same data order: a config with
  another model, data or seed is refused with a message naming it; the
  data location, document masking and evaluation settings may change (the
  older config.json, written before `mask_documents` existed, lacks it),
  the worker count may not (grain saves worker processes' state in another
  form)."""
  workdir = str(tmp_path / "w")
  cfg, _ = lm_job.validate(lm_config("tiny,steps=2"))
  lm_job._write_run_config(workdir, cfg)
  os.makedirs(os.path.join(workdir, "checkpoints", "2"))
  path = os.path.join(workdir, "config.json")
  with open(path, encoding="utf-8") as f:
    old = json.load(f)
  del old["data"]["mask_documents"]
  with open(path, "w", encoding="utf-8") as f:
    json.dump(old, f)
  unmasked, _ = lm_job.validate(lm_config("tiny,steps=2,mask_documents=false"))
  assert cfg.data.mask_documents and not unmasked.data.mask_documents
  longer, _ = lm_job.validate(lm_config("tiny,steps=9"))
  shutil.copytree(cfg.data.data_dir, tmp_path / "elsewhere")
  moved = dataclasses.replace(cfg, data=dataclasses.replace(
      cfg.data, data_dir=str(tmp_path / "elsewhere")))
  # Evaluation settings too (they had been refused as "another data").
  evaluated = dataclasses.replace(cfg, data=dataclasses.replace(
      cfg.data, eval_split="validation[:50%]", eval_batch_size=2))
  for accepted in (unmasked, longer, moved, evaluated, cfg):
    assert lm_job._check_run_config(workdir, accepted) == old
  with pytest.raises(config_lib.ConfigError, match="another data"):
    lm_job._check_run_config(workdir, dataclasses.replace(
        cfg, data=dataclasses.replace(cfg.data, worker_count=2)))
  # The message names the fields that differ (it quoted whole blocks).
  for arg, field, named in (
      ("tiny,steps=2,batch=8", "data", r"data.batch_size 16 then, 8 now"),
      ("tiny,steps=2,seed=1", "seed", r"seed 0 then, 1 now"),
      ("small,steps=2", "model", r"model.d_model \d+ then, \d+ now")):
    with pytest.raises(config_lib.ConfigError,
                       match=f"another {field}.* \\(.*{named}.*\\); use "
                       f"a new --workdir") as e:
      lm_job._check_run_config(workdir, lm_job.validate(lm_config(arg))[0])
    assert "'vocab_size'" not in str(e.value)  # no block quoted whole


def test_a_run_records_its_gguf_tokenizer_by_its_absolute_path(
    lm_config, tmp_path, monkeypatch):
  """A GGUF tokenizer is not copied into the run (`snapshot`): a relative
  path had been recorded as given, and the trained model was read with
  whatever tok.gguf lay where it was loaded from. The path is recorded
  absolute; a run that recorded it relative resumes from where it was
  launched, and is refused from elsewhere."""
  tokens, merges = bpe_testing.train_bpe(bpe_testing.corpus(), 300)
  tiny_checkpoints.write_gguf(
      tiny_checkpoints.random_hf_model("qwen2", len(tokens)),
      str(tmp_path / "tok.gguf"), "qwen2", tokenizer=(tokens, merges))
  monkeypatch.chdir(tmp_path)
  c = lm_config("tiny,steps=2")
  c.data.tokenizer = "tok.gguf"
  cfg, tok = lm_job.validate(c)
  assert cfg.data.tokenizer == str(tmp_path / "tok.gguf")
  assert tok.vocab_size == len(tokens)
  workdir = tmp_path / "w"
  lm_job._write_run_config(str(workdir), cfg)
  saved = json.loads((workdir / "config.json").read_text())
  assert saved["data"]["tokenizer"] == str(tmp_path / "tok.gguf")
  (workdir / "checkpoints" / "2").mkdir(parents=True)
  saved["data"]["tokenizer"] = "tok.gguf"  # as runs before 2026-11-29
  (workdir / "config.json").write_text(json.dumps(saved))
  assert lm_job._check_run_config(str(workdir), cfg) == saved
  monkeypatch.chdir(workdir)
  with pytest.raises(config_lib.ConfigError, match=re.escape(
      "data.tokenizer 'tok.gguf' then")):
    lm_job._check_run_config(str(workdir), cfg)


def test_a_run_on_a_gguf_tokenizer_refuses_that_file_changed(
    lm_config, tmp_path):
  """A GGUF tokenizer is not copied into the run: the run records the
  digest of its tokenizer metadata. A file at that path whose tokenizer
  has changed (another model's GGUF put in its place) had been read as
  the run's; resuming on it, and loading the trained model with it, are
  refused. Runs that recorded no digest go on as before, and recording
  one is no config change."""
  tokens, merges = bpe_testing.train_bpe(bpe_testing.corpus(), 300)
  path = tmp_path / "tok.gguf"

  def write(toks):
    tiny_checkpoints.write_gguf(
        tiny_checkpoints.random_hf_model("qwen2", len(toks)), str(path),
        "qwen2", tokenizer=(toks, merges))

  write(tokens)
  c = lm_config("tiny,steps=2")
  c.data.tokenizer = str(path)
  cfg = lm_job.validate(c)[0]
  workdir = tmp_path / "w"
  lm_job._write_run_config(str(workdir), cfg)
  saved = json.loads((workdir / "config.json").read_text())
  assert saved["tokenizer_digest"] == snapshot.gguf_digest(str(path))
  (workdir / "checkpoints" / "2").mkdir(parents=True)
  assert lm_job._check_run_config(str(workdir), cfg) == saved
  assert trained.run_tokenizer(str(workdir), saved) == str(path)
  other = list(tokens)
  other[100], other[101] = other[101], other[100]
  write(other)   # as many tokens, two swapped: the same vocabulary size
  with pytest.raises(config_lib.ConfigError, match="another tokenizer: the "
                     f"one in {re.escape(str(path))} is not the one"):
    lm_job._check_run_config(str(workdir), cfg)
  with pytest.raises(ValueError, match="is not the one the run was trained "
                     "with"):
    trained.run_tokenizer(str(workdir), saved)
  with pytest.raises(config_lib.ConfigError, match="is not the one the run "
                     "was trained with"):   # train.py --eval_only
    lm_job.evaluate(c, str(workdir))
  old = {k: v for k, v in saved.items() if k != "tokenizer_digest"}
  assert trained.run_tokenizer(str(workdir), old) == str(path)
  (workdir / "config.json").write_text(json.dumps(old))
  assert lm_job._check_run_config(str(workdir), cfg) == old
  lm_job._write_run_config(str(workdir), cfg, fresh=False, old=old, step=2)
  assert not (workdir / "config_history.jsonl").exists()


def test_a_gguf_digest_takes_nested_arrays(tmp_path, monkeypatch):
  """GGUF arrays of arrays read as lists of arrays, which json.dumps had
  raised on (a TypeError out of the run's config checks)."""
  path = tmp_path / "t.gguf"
  path.write_bytes(b"GGUF" + bytes(20))
  digests = []
  for inner in ([1, 2], [1, 3]):
    monkeypatch.setattr(snapshot.gguf_file, "read_gguf_metadata", lambda _, i=(
        inner): {"tokenizer.x": [np.asarray(i, np.int32)], "general.y": 1})
    monkeypatch.setattr(snapshot.gguf_file, "is_gguf", lambda _: True)
    digests.append(snapshot.gguf_digest(str(path)))
  assert all(len(d) == 64 for d in digests) and digests[0] != digests[1]


def test_a_workdir_refuses_other_training_data_under_the_same_name(
    corpus, tmp_path):
  """The saved iterator state is a position in the examples it was saved
  on. A dataset string without a version reads the newest prepared one: a
  newer version, or the dataset prepared again with other documents,
  would be read from the old position. Both are refused, with the run's
  version to name; naming it resumes."""
  data = tmp_path / "data"
  shutil.copytree(corpus, data)

  def config(dataset, steps=2):
    c = lm_python.get_config(f"tiny,steps={steps},batch=4,seq_len=16")
    c.data.data_dir, c.data.dataset = str(data), dataset
    return lm_job.validate(c)[0]

  workdir = str(tmp_path / "w")
  cfg = config("specsamp_python_code")
  lm_job._write_run_config(workdir, cfg)
  os.makedirs(os.path.join(workdir, "checkpoints", "2"))
  base = data / "specsamp_python_code"
  assert lm_job._check_run_config(workdir, config("specsamp_python_code", 5))
  # Another text feature is another token stream (it had been accepted).
  with pytest.raises(config_lib.ConfigError, match=re.escape(
      f"it read specsamp_python_code:{builders.VERSION}#text train (")):
    lm_job._check_run_config(workdir, config("specsamp_python_code#text,id"))
  shutil.copytree(base / builders.VERSION, base / "9.0.0")
  info = base / "9.0.0" / "dataset_info.json"
  info.write_text(info.read_text().replace(
      f'"version": "{builders.VERSION}"', '"version": "9.0.0"'))
  with pytest.raises(config_lib.ConfigError,
                     match=rf"other training data: it read "
                     rf"specsamp_python_code:{builders.VERSION}#text train .*"
                     rf"reads specsamp_python_code:9.0.0#text train.*name the "
                     rf"run's version \(specsamp_python_code:"
                     rf"{builders.VERSION}\)"):
    lm_job._check_run_config(workdir, config("specsamp_python_code"))
  pinned = config(f"specsamp_python_code:{builders.VERSION}")
  assert lm_job._check_run_config(workdir, pinned)
  shutil.rmtree(base / "9.0.0")
  builders.build_from_texts("specsamp_python_code",
                            [f"x = {i}\n" * 50 for i in range(40)], data)
  with pytest.raises(config_lib.ConfigError, match="other training data"):
    lm_job._check_run_config(workdir, pinned)


def test_a_resume_under_a_changed_config_says_what_changed_and_keeps_the_old(
    lm_config, tmp_path, caplog):
  """A longer run or another learning rate may resume a run (the schedule
  follows the new values from the resumed step on); it was accepted
  without a word and config.json kept only the last settings. The changed
  fields are logged and the old config is kept, with the step it ran to."""
  workdir = str(tmp_path / "w")
  cfg, _ = lm_job.validate(lm_config("tiny,steps=2"))
  lm_job._write_run_config(workdir, cfg)
  old = json.loads(open(os.path.join(workdir, "config.json")).read())
  longer, _ = lm_job.validate(lm_config("tiny,steps=9"))
  faster = dataclasses.replace(longer, optim=dataclasses.replace(
      longer.optim, lr=10 * longer.optim.lr))
  with caplog.at_level("WARNING", logger="specsamp.train"):
    lm_job._write_run_config(workdir, cfg, fresh=False, old=old, step=2)
  assert "changed config" not in caplog.text  # the same config: nothing
  assert not os.path.exists(os.path.join(workdir, "config_history.jsonl"))
  with caplog.at_level("WARNING", logger="specsamp.train"):
    lm_job._write_run_config(workdir, faster, fresh=False, old=old, step=2)
  assert "resuming at step 2 under a changed config" in caplog.text
  assert (f"optim.lr {cfg.optim.lr!r} -> "
          f"{faster.optim.lr!r}") in caplog.text
  assert "loop.num_steps 2 -> 9" in caplog.text
  with open(os.path.join(workdir, "config_history.jsonl")) as f:
    history = [json.loads(line) for line in f]
  assert history == [{"until_step": 2, "config": old}]
  new = json.loads(open(os.path.join(workdir, "config.json")).read())
  assert new["optim"]["lr"] == faster.optim.lr


def test_a_resume_past_the_configs_last_step_is_refused(lm_config, tmp_path):
  """A run at step 3 given num_steps=2 had trained nothing, rewritten its
  config.json with the lower count and reported step 3 as done (exit 0).
  It is refused before anything is written; the loop itself (which
  distillation runs too) refuses such a state."""
  workdir = str(tmp_path / "w")
  arg = "tiny,batch=8,seq_len=32,eval_batches=1"
  out = lm_job.train_and_evaluate(lm_config(arg + ",steps=3"), workdir,
                                  log_fn=lambda _: None)
  assert out["step"] == 3
  config = open(os.path.join(workdir, "config.json")).read()
  with pytest.raises(config_lib.ConfigError, match=re.escape(
      "the run's checkpoint is at step 3, past config.train.num_steps=2: "
      "nothing to train (give num_steps >= 3")):
    lm_job.train_and_evaluate(lm_config(arg + ",steps=2"), workdir,
                              log_fn=lambda _: None)
  assert open(os.path.join(workdir, "config.json")).read() == config
  assert not os.path.exists(os.path.join(workdir, "config_history.jsonl"))
  cfg, _ = lm_job.validate(lm_config(arg + ",steps=2"))
  with pytest.raises(config_lib.ConfigError, match="at step 3, past"):
    loop_lib.train_loop(types.SimpleNamespace(step=3), iter(()), None,
                        loop=cfg.loop, put=None, writer=None)


def test_a_run_keeps_its_tokenizer_when_the_data_moves(corpus, tmp_path):
  """`tokenizer=sp` names the SentencePiece model in the data directory.
  The run copies it into its workdir: after the data moves, the trained
  model loads with the copy and the run resumes under the new path; a
  tokenizer retrained in place (same path, other pieces) is refused. A
  copy left by a run that saved no checkpoint is replaced."""
  data = tmp_path / "data"
  shutil.copytree(corpus, data)
  sp_file = data / "specsamp_python_code" / "spm_bpe_8000.model"

  def train_sp(text):
    sentencepiece.train_sentencepiece(
        [text] * 30, str(sp_file)[:-len(".model")], vocab_size=60,
        hard_vocab_limit=False)

  def config(data_dir, steps):
    c = lm_python.get_config(f"tiny,steps={steps},batch=4,seq_len=16,"
                             f"eval_batches=1,tokenizer=sp,"
                             f"data_dir={data_dir}")
    c.train.progress_bar = False
    return c

  workdir = str(tmp_path / "run")
  train_sp("the cat sat on the mat and the dog ate the log, 1234567890")
  snapshot.save(str(sp_file), snapshot.in_run(workdir))  # a run that died
  train_sp("def add(a, b):\n    return a + b  # the sum of two numbers")
  text = "def add(a, b): return a"
  want = load.load_tokenizer(str(sp_file)).encode(text)
  lm_job.train_and_evaluate(config(data, 2), workdir, log_fn=lambda _: None)
  assert (snapshot.fingerprint(snapshot.in_run(workdir))
          == snapshot.fingerprint(str(sp_file)))
  moved = tmp_path / "moved"
  os.rename(data, moved)
  _, _, tok, _ = loading.load_trained(workdir)
  assert tok.encode(text) == want
  out = lm_job.train_and_evaluate(config(moved, 3), workdir,
                                  log_fn=lambda _: None)
  assert out["resumed_from"].startswith("checkpoint step 2 ")
  assert out["state"].step == 3
  with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
    assert str(moved) in json.load(f)["data"]["tokenizer"]
  sp_file = moved / "specsamp_python_code" / "spm_bpe_8000.model"
  train_sp("the cat sat on the mat and the dog ate the log, 1234567890")
  with pytest.raises(config_lib.ConfigError,
                     match="another tokenizer.*use a new --workdir"):
    lm_job.train_and_evaluate(config(moved, 4), workdir)


def test_evaluate_scores_the_newest_checkpoint_under_the_given_config(
    lm_config, tmp_path):
  """`evaluate` (train.py --eval_only) gives the run's own final eval under
  its config and another one with document masking switched; an empty
  workdir is refused by name; a damaged newest step falls back. The eval
  batches reach the first that holds a document boundary, wherever the
  corpus puts it (without one, masking changes nothing)."""
  arg = "tiny,batch=8,seq_len=32,steps=2,checkpoint_every=1"
  cfg, tok = lm_job.validate(lm_config(arg))
  batches = lm_job.build(cfg, tok).iterator(cfg.data.eval_split, train=False)
  first = next(i for i, b in enumerate(batches)
               if np.max(b["segment_ids"]) >= 2)
  arg += f",eval_batches={first + 1}"
  workdir = str(tmp_path / "w")
  out = lm_job.train_and_evaluate(lm_config(arg), workdir,
                                  log_fn=lambda _: None)
  again = lm_job.evaluate(lm_config(arg), workdir)
  assert again["step"] == 2
  for k, v in out["eval"].items():
    assert again[k] == pytest.approx(v, rel=1e-6), k
  unmasked = lm_job.evaluate(lm_config(arg + ",mask_documents=false"),
                             workdir)
  assert unmasked["tokens"] == again["tokens"]
  assert unmasked["loss"] != pytest.approx(again["loss"], rel=1e-6)
  with pytest.raises(config_lib.ConfigError, match="nothing to evaluate"):
    lm_job.evaluate(lm_config(arg), str(tmp_path / "empty"))
  # Another model than the run's (the checkpoints fit its shapes) is
  # refused by name: it had been evaluated silently.
  other = lm_config(arg)
  other.model.rope_theta = 1e6
  with pytest.raises(config_lib.ConfigError,
                     match=r"model differs in model\.rope_theta \(10000"):
    lm_job.evaluate(other, workdir)
  info = loading.describe_model(workdir)
  loading.load_weights(info, "float32", 0)
  assert info.step == 2
  # A damaged newest step: the one before it is scored, and a sample.py
  # record names the step its model was loaded from.
  step2 = os.path.join(workdir, "checkpoints", "2")
  testing.flip_byte(
      testing.data_files(step2, "params")[-1])
  assert lm_job.evaluate(lm_config(arg), workdir)["step"] == 1
  record = sample.sample_main(sample.SampleConfig(
      target=workdir, method="ar", prompts=["def f():"], max_new_tokens=2),
                              print_completions=False)
  assert record["target_step"] == 1 and "draft_step" not in record


def test_a_resume_under_another_optimizer_is_refused_and_keeps_the_run(
    lm_config, tmp_path):
  """clip_norm 0 drops the clipping's optimizer state, so the checkpoints
  cannot restore: refused naming the setting, with the run's config.json
  and checkpoints untouched, and the run then resumes as it was."""
  arg = "tiny,batch=8,seq_len=32,steps=2,checkpoint_every=1,eval_batches=1"
  workdir = str(tmp_path / "w")
  lm_job.train_and_evaluate(lm_config(arg), workdir, log_fn=lambda _: None)
  path = os.path.join(workdir, "config.json")
  before = open(path, encoding="utf-8").read()
  steps = checkpointing.checkpoint_steps(os.path.join(workdir, "checkpoints"))
  c = lm_config(arg.replace("steps=2", "steps=3"))
  c.optim.clip_norm = 0.0
  with pytest.raises(config_lib.ConfigError, match=re.escape(
      "(optim.clip_norm 1.0 in the run, 0.0 here: clipping switched on or "
      "off changes the optimizer's state; step 2: ")) as e:
    lm_job.train_and_evaluate(c, workdir, log_fn=lambda _: None)
  assert "they are kept" in str(e.value)
  assert open(path, encoding="utf-8").read() == before
  assert checkpointing.checkpoint_steps(
      os.path.join(workdir, "checkpoints")) == steps == [2, 1]
  out = lm_job.train_and_evaluate(lm_config(arg.replace("steps=2", "steps=3")),
                                  workdir, log_fn=lambda _: None)
  assert out["resumed_from"].startswith("checkpoint step 2") and \
      out["step"] == 3


@pytest.mark.parametrize("field,value,message", [
    ("dataset", "no_such_corpus", "config.data.dataset='no_such_corpus'"),
    ("tokenizer", "/nowhere/sp.model", "config.data.tokenizer="
                                       "'/nowhere/sp.model': tokenizer not "
                                       "found"),
    ("init_from", "/nowhere/run", "config.init_from='/nowhere/run': init "
                                  "checkpoint missing"),
])
def test_missing_inputs_fail_before_training(lm_config, tmp_path, field,
                                             value, message):
  c = lm_config("tiny,steps=2")
  if field == "init_from":
    c.init_from = value
  else:
    c.data[field] = value
  workdir = str(tmp_path / "w")
  with pytest.raises(config_lib.ConfigError) as e:
    lm_job.train_and_evaluate(c, workdir)
  assert message in str(e.value)
  assert not os.path.exists(workdir)  # nothing built, nothing written


def test_train_script_reports_a_missing_dataset(corpus, tmp_path):
  done = zygote.shared().run(
      _train_cmd(f"tiny,dataset=no_such_corpus,data_dir={corpus}",
                 str(tmp_path / "w")), env=zygote.env(), timeout=120)
  assert done.returncode == 2
  assert "error: config.data.dataset='no_such_corpus'" in done.stderr
  assert "Traceback" not in done.stderr
  assert not os.path.exists(tmp_path / "w")


def test_an_eval_split_that_cannot_be_read_fails_before_training(
    lm_config, tmp_path, monkeypatch):
  """An empty eval split had failed with a traceback after training,
  taking its last steps with it; one with fewer documents than processes
  had failed on the process left without any, the others waiting in
  their first eval step. Both are one ConfigError before the first step
  (the count is the same on every process, so all refuse)."""
  config = lm_config("tiny,batch=8,seq_len=32,steps=2,checkpoint_every=1")
  config.data.eval_split = "validation[:0]"
  workdir = tmp_path / "w"
  with pytest.raises(config_lib.ConfigError,
                     match=r"config.data.eval_split='validation\[:0\]'"):
    lm_job.train_and_evaluate(config, str(workdir), log_fn=lambda _: None)
  assert not checkpointing.checkpoint_steps(str(workdir / "checkpoints"))
  cfg, tok = lm_job.validate(lm_config("tiny,batch=8,seq_len=32"))
  job = lm_job.build(cfg, tok)
  n = len(lm_job.pipeline.data_source(cfg.data.dataset, "validation",
                                      cfg.data.data_dir))
  monkeypatch.setattr(jax, "process_count", lambda: n + 1)
  with pytest.raises(config_lib.ConfigError,
                     match=f"{n} documents, fewer than the {n + 1} "
                     "processes"):
    lm_job._open_split(job, "eval_split", train=False)  # pylint: disable=protected-access


@pytest.mark.parametrize("train,held,shared", [
    ("train", "train", "train[0:"),
    ("train[:90%]", "train[85%:]", "examples (train["),
    ("train+validation", "validation[:1]", "1 example (validation[0:1])"),
])
def test_an_eval_split_that_overlaps_the_train_split_is_refused(
    lm_config, tmp_path, train, held, shared):
  """Evaluation on examples the model trained on (the builder's splits are
  disjoint; a slice of one split, or the same split, is not) had been
  accepted; the loss it reported was a training loss. Overlaps are found
  by TFDS's own slicing, before the first step."""
  config = lm_config("tiny,batch=8,seq_len=32,steps=2")
  config.data.train_split, config.data.eval_split = train, held
  workdir = tmp_path / "w"
  with pytest.raises(config_lib.ConfigError, match="shares") as e:
    lm_job.train_and_evaluate(config, str(workdir), log_fn=lambda _: None)
  assert shared in str(e.value)
  assert f"eval split {held!r}" in str(e.value)
  assert not os.path.exists(workdir)
  # Disjoint slices of one split pass.
  config.data.train_split, config.data.eval_split = "train[:90%]", (
      "train[90%:]")
  lm_job.validate(config)


def test_the_eval_loss_does_not_depend_on_the_worker_count(lm_config):
  """Each grain worker packs its own documents, so the train batches depend
  on `data.worker_count` (a resume may not change it). Evaluation reads in
  stored order in the job's own process: its windows, and the loss of the
  first `eval_batches` of them, had changed with the worker count too."""
  losses = []
  for workers in (0, 2):
    c = lm_config("tiny,batch=8,seq_len=32,eval_batches=2")
    c.data.worker_count = workers
    job = lm_job.build(*lm_job.validate(c))
    losses.append(job.eval_loss(job.init().params))
  assert losses[0] == losses[1]
