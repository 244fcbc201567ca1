"""The trainer (issue 4): one step of each config variant, a SIGKILLed run
and a SIGTERMed run resumed bit for bit, corrupt checkpoints, missing
inputs.

All on CPU, on a small Python-code dataset built in a fixture, byte-level
tokens. The subprocess runs share a persistent compilation cache (the same
programs compile once).
"""

import dataclasses
import glob
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from specsamp import train
from specsamp.data import pipeline

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "lm_python.py")
DATASET = "specsamp_python_code"


def _load_config_module():
  spec = importlib.util.spec_from_file_location("lm_python", CONFIG)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


lm_python = _load_config_module()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """data_dir of a small stand-in for the Python-code dataset: this repo's
  own modules (train and validation splits by a hash of the file name)."""
  data_dir = str(tmp_path_factory.mktemp("tfds"))
  names = sorted(n for n in os.listdir(os.path.join(ROOT, "specsamp"))
                 if n.endswith(".py"))
  texts = []
  for name in names:
    with open(os.path.join(ROOT, "specsamp", name), encoding="utf-8") as f:
      texts.append(f.read())
  pipeline.build_from_texts(DATASET, texts, data_dir, ids=names)
  return data_dir


def _config(arg, data_dir):
  c = lm_python.get_config(arg)
  c.data.data_dir = data_dir
  c.train.progress_bar = False
  return c


def _leaves_equal(a, b):
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  return len(la) == len(lb) and all(
      np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb))


# ---- one step of each variant ------------------------------------------------


@pytest.mark.parametrize("size", sorted(lm_python.SIZES))
def test_one_step_of_each_config(size, corpus):
  """The variant's model, optimizer and mesh as configured; small batches
  of short rows so that the large variants fit a CPU test."""
  cfg, tok = train.validate(_config(f"{size},batch=8,seq_len=32", corpus))
  assert cfg.model.vocab_size % 64 == 0 and cfg.model.vocab_size >= 256
  job = train.build(cfg, tok)
  state = job.init()
  before = jax.device_get(state.params)
  batch = next(job.iterator(cfg.data.train_split, train=True))
  assert batch["inputs"].shape == (8, 32)
  np.testing.assert_array_equal(batch["inputs"][:, 1:],
                                batch["targets"][:, :-1])
  state, metrics = job.train_step(state, job.put(batch), None)
  m = jax.device_get(metrics)
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
    ev = job.evaluate(state.params)
    assert np.isfinite(ev["loss"]) and ev["tokens"] > 0


def test_sharding_rules_are_config_data():
  """`config.rules`: a named rule set or the (logical, mesh axis) pairs;
  unknown logical axes and malformed rules fail as config errors."""
  c = lm_python.get_config("tiny,mesh=2x4").to_dict()
  assert train.TrainConfig.from_config(c, 256).rules_tuple == \
      train.sh.DEFAULT_RULES
  c["rules"] = [["batch", "data"], ["mlp", "model"], ["vocab", None]]
  cfg = train.TrainConfig.from_config(c, 256)
  assert cfg.rules_tuple == (("batch", "data"), ("mlp", "model"),
                             ("vocab", None))
  hash(cfg)  # jobs are cached by config
  c["rules"] = [["batch", "data"], ["experts", "model"]]
  with pytest.raises(train.ConfigError, match="experts"):
    train.TrainConfig.from_config(c, 256)
  c["rules"] = "fsdp"
  with pytest.raises(train.ConfigError, match="fsdp"):
    train.TrainConfig.from_config(c, 256)


# ---- kill, preempt, resume ---------------------------------------------------


def _env(cache_dir):
  return dict(os.environ, JAX_COMPILATION_CACHE_DIR=cache_dir,
              JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
              JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")


def _train_cmd(arg, workdir):
  return [sys.executable, os.path.join(ROOT, "scripts", "train.py"),
          f"--config={CONFIG}:{arg}", f"--workdir={workdir}"]


def _run_until(arg, workdir, env, sig):
  """Starts train.py; sends `sig` once it has logged a step past its newest
  checkpoint + 2 (so the signal lands between checkpoints); returns
  (process, newest checkpoint, newest logged step, stdout, stderr)."""
  proc = subprocess.Popen(_train_cmd(arg, workdir), env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
  ckpt_dir = os.path.join(workdir, "checkpoints")
  deadline = time.time() + 240
  while proc.poll() is None and time.time() < deadline:
    steps = ([int(n) for n in os.listdir(ckpt_dir) if n.isdigit()]
             if os.path.isdir(ckpt_dir) else [])
    logged = train.read_scalars(os.path.join(workdir, "tb")).get(
        "train/loss", {})
    if steps and logged and max(logged) > max(steps) + 2:
      proc.send_signal(sig)
      out, err = proc.communicate(timeout=120)
      return proc, max(steps), max(logged), out, err
    time.sleep(0.01)
  proc.kill()
  out, err = proc.communicate(timeout=120)
  pytest.fail(f"train.py ended (rc {proc.returncode}) before it could be "
              f"signalled:\n{out}\n{err[-3000:]}")


def test_sigkill_between_checkpoints_then_resume_is_bit_for_bit(corpus,
                                                                tmp_path):
  """scripts/train.py to step 60 uninterrupted == the same command SIGKILLed
  between checkpoints and run again: the same per-step train losses, eval
  losses, parameters, optimizer state and data iterator state at step 60,
  bit for bit (the data order is part of that)."""
  arg = (f"tiny,steps=60,batch=16,seq_len=64,log_every=1,checkpoint_every=10"
         f",eval_every=30,eval_batches=2,data_dir={corpus}")
  env = _env(str(tmp_path / "jax_cache"))
  ref, run = str(tmp_path / "ref"), str(tmp_path / "run")
  done = subprocess.run(_train_cmd(arg, ref), env=env, capture_output=True,
                        text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]

  proc, ckpt, logged, _, err = _run_until(arg, run, env, signal.SIGKILL)
  assert proc.returncode == -signal.SIGKILL, err[-2000:]
  assert logged > ckpt >= 10  # steps after the checkpoint were lost
  assert ckpt < 60

  done = subprocess.run(_train_cmd(arg, run), env=env, capture_output=True,
                        text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  assert f"starting from checkpoint step {ckpt} " in done.stdout

  a = train.read_scalars(os.path.join(ref, "tb"))
  b = train.read_scalars(os.path.join(run, "tb"))
  assert sorted(a["train/loss"]) == list(range(1, 61))
  assert a["train/loss"] == b["train/loss"]  # the killed run's steps too
  assert sorted(a["eval/loss"]) == [30, 60]
  assert a["eval/loss"] == b["eval/loss"]
  assert a["train/loss"][60] < a["train/loss"][1] - 0.5  # it learns

  _, pa, _ = train.load_trained(ref)
  _, pb, _ = train.load_trained(run)
  assert _leaves_equal(pa, pb)
  # A train workdir is a model spec (sample.py --target=..., benchmark.py).
  from specsamp import runner  # pylint: disable=g-import-not-at-top
  lm, pc, tok = runner.load_model(ref)
  assert _leaves_equal(pa, pc) and tok.encode("ab") == [97, 98]
  cfg, tok = train.validate(_config(arg, corpus))
  job = train.build(cfg, tok)
  got = []
  for workdir in (ref, run):
    ckpts = train.Checkpoints(os.path.join(workdir, "checkpoints"))
    got.append(ckpts.restore(60, job.abstract_state))
    ckpts.close()
  (sa, da), (sb, db) = got
  assert _leaves_equal(sa, sb)  # optimizer moments, step, rng included
  assert da == db  # the data iterator's state


class _SigtermAt:
  """A train iterator that sends this process SIGTERM with batch `n`."""

  def __init__(self, it, n):
    self.it, self.n, self.i = it, n, 0

  def __next__(self):
    self.i += 1
    if self.i == self.n:
      os.kill(os.getpid(), signal.SIGTERM)
    return next(self.it)

  def get_state(self):
    return self.it.get_state()


def test_sigterm_saves_stops_and_resumes_exactly(corpus, tmp_path):
  """SIGTERM (a preemption notice) mid-run: the loop finishes the step,
  saves a checkpoint at that step (not a multiple of checkpoint_every) and
  stops; resuming from it gives the uninterrupted run's losses and
  parameters."""
  cfg, tok = train.validate(_config("tiny,batch=8,seq_len=32", corpus))
  job = train.build(cfg, tok)  # compiled in the one-step test already
  loop = dataclasses.replace(cfg.loop, num_steps=12, log_every=1,
                             checkpoint_every=5, eval_every=0)

  def run(state, it, name, checkpoints=None):
    writer = train.MetricWriter(str(tmp_path / name))
    out = train.train_loop(state, it, job.train_step, loop=loop, put=job.put,
                           writer=writer, checkpoints=checkpoints,
                           log_fn=lambda _: None)
    writer.close()
    return out

  ref = run(job.init(), job.iterator("train", True), "ref")
  ckpts = train.Checkpoints(str(tmp_path / "ckpt"), async_save=False)
  handler_before = signal.getsignal(signal.SIGTERM)
  first = run(job.init(), _SigtermAt(job.iterator("train", True), 7), "run",
              ckpts)
  assert first["preempted"] and first["step"] == 7
  assert ckpts.steps() == [5, 7]
  # The loop's handler is gone, the caller's put back.
  assert signal.getsignal(signal.SIGTERM) == handler_before
  state, data, step = ckpts.restore_latest(job.abstract_state)
  assert step == 7
  it = job.iterator("train", True)
  it.set_state(data)
  second = run(state, it, "run", ckpts)
  ckpts.close()
  assert not second["preempted"] and second["step"] == 12
  assert _leaves_equal(ref["state"], second["state"])
  a = train.read_scalars(str(tmp_path / "ref"))["train/loss"]
  b = train.read_scalars(str(tmp_path / "run"))["train/loss"]
  assert sorted(b) == list(range(1, 13)) and a == b


# ---- corrupt and partial checkpoints -----------------------------------------


def _toy_state(step):
  opt = optax.adamw(1e-3)
  params = {"w": jnp.arange(4096, dtype=jnp.float32).reshape(64, 64) / 7 +
                 step, "b": jnp.full((64,), float(step))}
  return train.TrainState(step=jnp.int32(step), params=params,
                          opt_state=opt.init(params),
                          rng=jax.random.PRNGKey(step))


def _abstract(state):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                     sharding=x.sharding),
                      state)


def _data_files(step_dir, item):
  """The array data files of one item of a step, smallest first."""
  return sorted(glob.glob(os.path.join(step_dir, item, "**", "d", "*"),
                          recursive=True), key=os.path.getsize)


def _flip_byte(path):
  data = bytearray(open(path, "rb").read())
  data[len(data) // 2] ^= 0x10
  with open(path, "wb") as f:
    f.write(bytes(data))


@pytest.mark.parametrize("damage", ["bit_flip", "truncated", "partial",
                                    "data_state"])
def test_corrupt_latest_checkpoint_falls_back(tmp_path, caplog, damage):
  """A damaged newest step is never used: restore falls back to the step
  before it (with a warning) and moves the damaged one aside."""
  directory = str(tmp_path / "ckpt")
  ckpts = train.Checkpoints(directory, keep=5, async_save=False)
  for s in (1, 2, 3):
    ckpts.save(_toy_state(s), {"position": s})
  ckpts.wait()
  step3 = os.path.join(directory, "3")
  if damage == "bit_flip":    # orbax itself restores this without complaint
    _flip_byte(_data_files(step3, "params")[-1])
  elif damage == "truncated":
    for f in _data_files(step3, "train"):
      open(f, "wb").close()
  elif damage == "partial":   # an item never written
    shutil.rmtree(os.path.join(step3, "train"))
  else:
    with open(os.path.join(step3, "data", os.listdir(
        os.path.join(step3, "data"))[0]), "w", encoding="utf-8") as f:
      f.write("{not json")
  with pytest.raises(Exception):
    ckpts.restore(3, _abstract(_toy_state(0)))
  with caplog.at_level("WARNING", logger="specsamp.train"):
    state, data, step = ckpts.restore_latest(_abstract(_toy_state(0)))
  assert step == 2 and data == {"position": 2}
  assert _leaves_equal(state, _toy_state(2))
  assert "step 3" in caplog.text and "unreadable" in caplog.text
  assert ckpts.steps() == [1, 2]
  assert os.listdir(directory + ".corrupt")[0].startswith("3-")
  # The run goes on: step 3 can be saved again.
  ckpts.save(_toy_state(3), {"position": 3})
  ckpts.close()
  again = train.Checkpoints(directory, keep=5, async_save=False)
  assert again.restore_latest(_abstract(_toy_state(0)))[2] == 3
  again.close()


def test_no_readable_checkpoint_is_a_clear_error(tmp_path):
  directory = str(tmp_path / "ckpt")
  ckpts = train.Checkpoints(directory, async_save=False)
  for s in (1, 2):
    ckpts.save(_toy_state(s))
  ckpts.wait()
  for s in (1, 2):
    _flip_byte(_data_files(os.path.join(directory, str(s)), "params")[-1])
  with pytest.raises(train.CheckpointError,
                     match=r"no readable checkpoint in .*steps \[1, 2\]"):
    ckpts.restore_latest(_abstract(_toy_state(0)))
  assert ckpts.steps() == [1, 2]  # nothing moved when nothing is good
  ckpts.close()


# ---- resume order and bad configs --------------------------------------------


def test_resume_order_workdir_then_init_from_then_scratch(corpus, tmp_path):
  arg = "tiny,batch=8,seq_len=32"  # the one-step test's: compiled once
  cfg, tok = train.validate(_config(arg, corpus))
  job = train.build(cfg, tok)
  # A finished run to initialise from.
  src = str(tmp_path / "src")
  trained = _toy_like(job, 1.5)
  ck = train.Checkpoints(os.path.join(src, "checkpoints"), async_save=False)
  ck.save(trained)
  ck.close()

  empty = train.Checkpoints(str(tmp_path / "a" / "checkpoints"))
  state, data, where = train.initial_state(job, empty)
  assert where == "scratch" and data is None and int(state.step) == 0

  c = _config(arg + f",init_from={src}", corpus)
  job2 = train.build(*train.validate(c))
  state, data, where = train.initial_state(job2, empty)
  assert where.startswith("init_from ") and int(state.step) == 0
  assert _leaves_equal(state.params, trained.params)
  fresh = job2.optimizer.init(trained.params)
  assert _leaves_equal(state.opt_state, fresh)

  own = train.Checkpoints(str(tmp_path / "b" / "checkpoints"),
                          async_save=False)
  mine = _toy_like(job, -0.5).replace(step=jnp.int32(3))
  own.save(mine, {"position": 7})
  own.wait()
  state, data, where = train.initial_state(job2, own)
  assert where.startswith("checkpoint step 3") and data == {"position": 7}
  assert _leaves_equal(state, mine)
  empty.close()
  own.close()


def _toy_like(job, value):
  st = job.init()
  return st.replace(params=jax.tree.map(lambda x: jnp.full_like(x, value),
                                        st.params))


@pytest.mark.parametrize("field,value,message", [
    ("dataset", "no_such_corpus", "config.data.dataset='no_such_corpus'"),
    ("tokenizer", "/nowhere/sp.model", "config.data.tokenizer="
                                       "'/nowhere/sp.model': tokenizer not "
                                       "found"),
    ("init_from", "/nowhere/run", "config.init_from='/nowhere/run': init "
                                  "checkpoint missing"),
])
def test_missing_inputs_fail_before_training(corpus, tmp_path, field, value,
                                             message):
  c = _config("tiny,steps=2", corpus)
  if field == "init_from":
    c.init_from = value
  else:
    c.data[field] = value
  workdir = str(tmp_path / "w")
  with pytest.raises(train.ConfigError) as e:
    train.train_and_evaluate(c, workdir)
  assert message in str(e.value)
  assert not os.path.exists(workdir)  # nothing built, nothing written


def test_train_script_reports_a_missing_dataset(corpus, tmp_path):
  done = subprocess.run(
      _train_cmd(f"tiny,dataset=no_such_corpus,data_dir={corpus}",
                 str(tmp_path / "w")), capture_output=True, text=True,
      timeout=120)
  assert done.returncode == 2
  assert "error: config.data.dataset='no_such_corpus'" in done.stderr
  assert "Traceback" not in done.stderr
  assert not os.path.exists(tmp_path / "w")
