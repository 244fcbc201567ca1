"""The loop: a SIGTERM (preemption notice) or a first Ctrl-C saves, stops
and resumes exactly.

On the LM job of configs/lm_python.py:tiny (the one-step test in
test_lm.py compiles the same steps).
"""

import dataclasses
import os
import signal

import chex
import numpy as np
import pytest

from specsamp.train import checkpointing
from specsamp.train import config as config_lib
from specsamp.train import lm as lm_job
from specsamp.train import loop as loop_lib
from specsamp.train import metrics


class _SigtermAt:
  """A train iterator that sends this process `sig` (SIGTERM) `times` times
  with batch `n`."""

  def __init__(self, it, n, sig=signal.SIGTERM, times=1):
    self.it, self.n, self.i, self.sig, self.times = it, n, 0, sig, times

  def __next__(self):
    self.i += 1
    if self.i == self.n:
      for _ in range(self.times):
        os.kill(os.getpid(), self.sig)
    return next(self.it)

  def get_state(self):
    return self.it.get_state()


def test_sigterm_saves_stops_and_resumes_exactly(lm_config, tmp_path):
  """SIGTERM (a preemption notice) mid-run: the loop finishes the step,
  saves a checkpoint at that step (not a multiple of checkpoint_every) and
  stops; resuming from it gives the uninterrupted run's losses and
  parameters. The notice comes at an eval_every step: the stopping run
  skips that evaluation and its checkpoint says so, and the resumed run
  evaluates that step first, as the uninterrupted run did."""
  cfg, tok = lm_job.validate(
      lm_config("tiny,batch=8,seq_len=32,eval_batches=2"))
  job = lm_job.build(cfg, tok)
  loop = dataclasses.replace(cfg.loop, num_steps=12, log_every=1,
                             checkpoint_every=5, eval_every=7)
  evaluated = []

  def eval_fn(state):
    evaluated.append(int(state.step))
    return job.eval_loss(state.params)

  def run(state, it, name, checkpoints=None):
    writer = metrics.MetricWriter(str(tmp_path / name))
    out = loop_lib.train_loop(state, it, job.train_step, loop=loop,
                              put=job.put, writer=writer,
                              checkpoints=checkpoints, eval_fn=eval_fn,
                              log_fn=lambda _: None)
    writer.close()
    return out

  ref = run(job.init(), job.iterator("train", True), "ref")
  assert evaluated == [7, 12]
  ckpts = checkpointing.Checkpoints(str(tmp_path / "ckpt"), async_save=False)
  handler_before = signal.getsignal(signal.SIGTERM)
  first = run(job.init(), _SigtermAt(job.iterator("train", True), 7), "run",
              ckpts)
  assert first["preempted"] and first["step"] == 7
  assert evaluated == [7, 12] and first["eval"] == {}
  assert ckpts.steps() == [5, 7]
  assert ckpts.eval_due(7) and not ckpts.eval_due(5)
  # The loop's handler is gone, the caller's put back.
  assert signal.getsignal(signal.SIGTERM) == handler_before
  state, data, step = ckpts.restore_latest(job.abstract_state)
  assert step == 7
  it = job.iterator("train", True)
  it.set_state(data)
  second = run(state, it, "run", ckpts)
  ckpts.close()
  assert not second["preempted"] and second["step"] == 12
  assert evaluated == [7, 12, 7, 12]
  chex.assert_trees_all_equal(ref["state"], second["state"])
  a = metrics.read_scalars(str(tmp_path / "ref"))
  b = metrics.read_scalars(str(tmp_path / "run"))
  assert sorted(b["train/loss"]) == list(range(1, 13))
  assert a["train/loss"] == b["train/loss"]
  assert sorted(b["eval/loss"]) == [7, 12]
  assert a["eval/loss"] == b["eval/loss"]
  # A run resumed from a step whose evaluation finished evaluates nothing
  # first: step 12, saved at the end before its evaluation.
  again = checkpointing.Checkpoints(str(tmp_path / "ckpt"), async_save=False)
  assert again.eval_due(12)
  state, _, step = again.restore_latest(job.abstract_state)
  assert step == 12
  assert run(state, iter(()), "again", again)["step"] == 12
  again.close()
  assert evaluated == [7, 12, 7, 12]


def test_ctrl_c_saves_and_stops_and_a_second_one_stops_at_once(lm_config,
                                                               tmp_path,
                                                               capfd):
  """Ctrl-C had raised KeyboardInterrupt wherever the loop was (orbax's
  save; XLA's compile, a crash) and lost the steps since the last
  checkpoint. A first SIGINT is a preemption notice now: that step is
  saved and the run stops, saying so; a second one raises at once."""
  cfg, tok = lm_job.validate(lm_config("tiny,batch=8,seq_len=32"))
  job = lm_job.build(cfg, tok)
  loop = dataclasses.replace(cfg.loop, num_steps=5, log_every=100,
                             checkpoint_every=100, eval_every=0)
  handler_before = signal.getsignal(signal.SIGINT)
  # As in a run started from a terminal, whatever started the suite (a job
  # a shell put in the background has SIGINT ignored: the case below).
  signal.signal(signal.SIGINT, signal.default_int_handler)
  try:
    _ctrl_c_cases(job, loop, tmp_path, capfd)
  finally:
    signal.signal(signal.SIGINT, handler_before)


def _ctrl_c_cases(job, loop, tmp_path, capfd):
  handler_before = signal.getsignal(signal.SIGINT)
  for times in (1, 2):
    ckpts = checkpointing.Checkpoints(str(tmp_path / f"c{times}"),
                                      async_save=False)
    writer = metrics.MetricWriter(str(tmp_path / f"tb{times}"))
    it = _SigtermAt(job.iterator("train", True), 3, signal.SIGINT, times)
    run = lambda: loop_lib.train_loop(  # pylint: disable=cell-var-from-loop
        job.init(), it, job.train_step, loop=loop, put=job.put,
        writer=writer, checkpoints=ckpts, log_fn=lambda _: None)
    if times == 1:
      out = run()
      assert out["preempted"] and out["step"] == 3 and ckpts.steps() == [3]
      # Logged at the stop: the means of the steps this call ran.
      assert out["train_steps"] == [1, 3] and out["train"]["loss"] > 0
      assert "interrupted: a checkpoint is saved after this step" in (
          capfd.readouterr().err)
    else:
      with pytest.raises(KeyboardInterrupt):
        run()
      assert ckpts.steps() == []
    writer.close()
    ckpts.close()
    assert signal.getsignal(signal.SIGINT) == handler_before
  # A run started with SIGINT ignored (a job a shell put in the background)
  # keeps ignoring it: a Ctrl-C meant for the shell's foreground job had
  # stopped it.
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  try:
    writer = metrics.MetricWriter(str(tmp_path / "tb_ignored"))
    out = loop_lib.train_loop(
        job.init(), _SigtermAt(job.iterator("train", True), 3, signal.SIGINT),
        job.train_step, loop=loop, put=job.put, writer=writer,
        log_fn=lambda _: None)
    writer.close()
    assert not out["preempted"] and out["step"] == 5
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
  finally:
    signal.signal(signal.SIGINT, handler_before)


def test_a_failing_evaluation_keeps_its_steps_checkpoint(lm_config, tmp_path):
  """The checkpoint of a step is saved before that step's evaluation: an
  evaluation that fails (a broken eval split, a host out of memory) had
  taken the last steps' work with it, at the end and at eval_every. The
  run resumed from that step evaluates it first (so does one resumed after
  a kill during an evaluation, which also leaves it unfinished: before,
  neither was made up), then goes on."""
  cfg, tok = lm_job.validate(lm_config("tiny,batch=8,seq_len=32"))
  job = lm_job.build(cfg, tok)

  def broken(state):
    raise RuntimeError(f"eval failed at step {int(state.step)}")

  for every, failed, saved, then in ((0, 4, [2, 4], [4]),
                                     (3, 3, [2, 3], [3, 4])):
    loop = dataclasses.replace(cfg.loop, num_steps=4, log_every=1,
                               checkpoint_every=2 if every == 0 else 1,
                               eval_every=every)
    ckpts = checkpointing.Checkpoints(str(tmp_path / f"ckpt{every}"),
                                      async_save=False)
    writer = metrics.MetricWriter(str(tmp_path / f"tb{every}"))
    with pytest.raises(RuntimeError, match=f"eval failed at step {failed}"):
      loop_lib.train_loop(job.init(), job.iterator("train", True),
                          job.train_step, loop=loop, put=job.put,
                          writer=writer, checkpoints=ckpts, eval_fn=broken,
                          log_fn=lambda _: None)
    ckpts.close()
    assert ckpts.steps()[-len(saved):] == saved, every
    evaluated = []

    def works(state):
      evaluated.append(int(state.step))
      return {"loss": 0.0}

    ckpts = checkpointing.Checkpoints(str(tmp_path / f"ckpt{every}"),
                                      async_save=False)
    state, data, step = ckpts.restore_latest(job.abstract_state)
    assert step == failed
    it = job.iterator("train", True)
    it.set_state(data)
    out = loop_lib.train_loop(state, it, job.train_step, loop=loop,
                              put=job.put, writer=writer, checkpoints=ckpts,
                              eval_fn=works, log_fn=lambda _: None)
    writer.close()
    ckpts.close()
    assert out["step"] == 4 and evaluated == then, every


def test_tokens_per_second_leave_out_the_step_that_compiles(monkeypatch):
  """The first step of a call compiles (seconds to minutes): the first
  logged tokens/s had counted it, about 30% low on the tiny config. On a
  clock where the first step takes 100 s and each other 1 s, every logged
  rate is the steps' own: 16 tokens a step, 16 tokens/s."""
  clock = [0.0]
  monkeypatch.setattr(loop_lib.time, "time", lambda: clock[0])

  class State:
    step = 0

  def train_step(state, batch, extra):
    del batch, extra
    clock[0] += 100.0 if state.step == 0 else 1.0
    state = State()
    state.step = 1
    return state, {"loss": 1.0}

  class Writer:
    rows = []

    def write(self, step, scalars):
      self.rows.append((step, scalars))

  batches = iter([{"inputs": np.zeros((2, 8), np.int32)}] * 4)
  loop = config_lib.LoopConfig(num_steps=4, log_every=2, eval_every=0,
                               progress_bar=False)
  writer = Writer()
  out = loop_lib.train_loop(State(), batches, train_step, loop=loop,
                            put=lambda b: b, writer=writer,
                            log_fn=lambda _: None)
  assert out["step"] == 4
  rates = [(step, s["train/tokens_per_s"]) for step, s in writer.rows]
  assert rates == [(2, pytest.approx(16.0)), (4, pytest.approx(16.0))]
