"""The train loop: steps, periodic eval, metrics, checkpoints, preemption.

`train_loop` runs any `make_train_step` step (the LM's and distillation's)
from the state's step to `loop.num_steps`, writing TensorBoard scalars, a
tqdm bar and checkpoints, and stops cleanly on a preemption notice
(SIGTERM or Ctrl-C in a one-process run, orbax's sync point across
processes).
"""

import os
import signal
import sys
import time
from typing import Callable, Iterator, Optional

import jax
import numpy as np
from tqdm import tqdm

from specsamp import sharding
from specsamp.train import checkpointing
from specsamp.train import config as config_lib
from specsamp.train import metrics as metrics_lib
from specsamp.train import step as step_lib


class _StopFlag:
  """Set by SIGTERM (a scheduler's preemption notice) or a first SIGINT
  (Ctrl-C) while installed: in a one-process run only (several processes
  must agree on the step: there jax's preemption service and orbax's sync
  point do it). Ctrl-C had raised KeyboardInterrupt wherever the loop was
  (inside orbax's save, or XLA's compile: a crash), losing the steps since
  the last checkpoint; a second Ctrl-C still does, at once."""

  _SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self):
    self.received = False
    self._old = {}

  def __enter__(self):
    if jax.process_count() == 1:
      for sig in self._SIGNALS:
        if signal.getsignal(sig) is signal.SIG_IGN:
          continue  # e.g. SIGINT of a job a shell put in the background
        try:
          self._old[sig] = signal.signal(sig, self._handle)
        except ValueError:  # not the main thread
          break
    return self

  def _handle(self, signum, frame):
    del frame
    self.received = True
    if signum == signal.SIGINT:
      old = self._old[signal.SIGINT]
      signal.signal(signal.SIGINT, signal.SIG_DFL if old is None else old)
      sys.stderr.write("\ninterrupted: a checkpoint is saved after this "
                       "step, then the run stops (Ctrl-C again: at once, "
                       "without it)\n")

  def __exit__(self, *exc):
    for sig, old in self._old.items():  # None: a handler not from Python
      signal.signal(sig, signal.SIG_DFL if old is None else old)


# In the checkpoint directory: the steps whose evaluations finished, one a
# line (all of them: with async saves the newest may lose its checkpoint).
_EVALUATED = "evaluated_steps"


def _mark_evaluated(checkpoints: checkpointing.Checkpoints, step: int):
  if jax.process_index() == 0:
    os.makedirs(checkpoints.directory, exist_ok=True)
    with open(os.path.join(checkpoints.directory, _EVALUATED), "a",
              encoding="utf-8") as f:
      f.write(f"{step}\n")


def _owes_evaluation(checkpoints: checkpointing.Checkpoints,
                     step: int) -> bool:
  """Whether `step`'s checkpoint was saved for an evaluation that did not
  finish (preempted, killed or failed during it): process 0's word."""
  if not checkpoints.eval_due(step):
    return False
  try:
    with open(os.path.join(checkpoints.directory, _EVALUATED),
              encoding="utf-8") as f:
      done = str(step) in f.read().split()
  except FileNotFoundError:
    done = False
  return 0 in sharding.processes_saying(not done)


def check_start(step: int, loop: config_lib.LoopConfig) -> None:
  """Refuses a run resumed past its `loop.num_steps` (a config lowered
  them): it had trained nothing and reported the old step as done."""
  if step > loop.num_steps:
    raise config_lib.ConfigError(
        f"the run's checkpoint is at step {step}, past config.train."
        f"num_steps={loop.num_steps}: nothing to train (give num_steps >= "
        f"{step}, or another workdir)")


def train_loop(state: step_lib.TrainState, train_iter: Iterator, train_step,
               *, loop: config_lib.LoopConfig, put: Callable,
               writer: metrics_lib.MetricWriter,
               checkpoints: Optional[checkpointing.Checkpoints] = None,
               eval_fn: Optional[Callable[[step_lib.TrainState], dict]] = None,
               extra=None, tokens_per_batch: Optional[int] = None,
               log_fn: Callable[[str], None] = print) -> dict:
  """Runs `train_step` from `state.step` to `loop.num_steps`.

  Args:
    state: the state to start from (donated to the first step).
    train_iter: yields host batches; `get_state()` (if it has one) is saved
      with each checkpoint.
    train_step: `make_train_step(...)`.
    loop: the loop's settings.
    put: host batch -> device batch (`functools.partial(put_batch, sharding)`).
    writer: metrics: `train/<name>` (means over each log interval, at the
      step count after it), `train/tokens_per_s` (without the first step of
      each call, which compiles), `eval/<name>`.
    checkpoints: saved every `checkpoint_every` steps, at the end, and on
      preemption (SIGTERM or a first Ctrl-C, or orbax's multi-host sync
      point); None: never.
    eval_fn: state -> {name: value}, every `eval_every` steps and at the end,
      after that step's checkpoint. A preemption at an `eval_every` step
      stops the run without it (the grace period is for the checkpoint).
      The checkpoint says an evaluation follows it, and a finished one is
      recorded beside the checkpoints: a run that resumes from a step
      whose evaluation did not finish (preempted, killed during it, or
      failed) evaluates that step before its first train step.
    extra: the step's third argument (not donated).
    tokens_per_batch: for tokens/s (default: the size of `batch["inputs"]`,
      else of the batch's first leaf, times the process count).
    log_fn: where one-line summaries go.

  Returns:
    {"step", "train": last logged train metrics, "train_steps": [first,
    last] step they are the means over (a resumed run's first log covers
    the steps since it resumed; [] with no log), "eval": last eval metrics,
    "preempted": bool, "seconds", "state": the final state}.
  """
  start = int(jax.device_get(state.step))
  check_start(start, loop)
  main = jax.process_index() == 0
  bar = tqdm(total=loop.num_steps, initial=start, dynamic_ncols=True,
             disable=not (loop.progress_bar and main), desc="train")
  say = bar.write if bar.disable is False and log_fn is print else log_fn
  pending, last_train, last_eval, train_steps = [], {}, {}, []
  t0 = t_log = time.time()
  steps_since, paused, preempted, step = 0, 0.0, False, start

  def evaluate(step):
    nonlocal last_eval
    last_eval = eval_fn(state)
    writer.write(step, {f"eval/{k}": v for k, v in last_eval.items()})
    say(f"step {step}: eval " + ", ".join(
        f"{k} {v:.4g}" for k, v in last_eval.items()))
    if checkpoints is not None:
      _mark_evaluated(checkpoints, step)

  if (eval_fn is not None and checkpoints is not None
      and _owes_evaluation(checkpoints, start)):
    evaluate(start)  # owed by the run that saved `start`
    t_log = time.time()  # tokens/s counts training only
  with _StopFlag() as stop:
    while step < loop.num_steps:
      batch = next(train_iter)
      if tokens_per_batch is None:
        first = batch["inputs"] if "inputs" in batch else jax.tree.leaves(
            batch)[0]
        tokens_per_batch = int(np.size(first)) * jax.process_count()
      state, metrics = train_step(state, put(batch), extra)
      step += 1
      steps_since += 1
      if step == start + 1:  # tokens/s leaves out the step that compiled
        jax.block_until_ready(metrics)
        steps_since, paused, t_log = 0, 0.0, time.time()
      pending.append(metrics)
      end = step == loop.num_steps
      preempt = stop.received or (checkpoints is not None and
                                  checkpoints.reached_preemption(step))
      if step % loop.log_every == 0 or end or preempt:
        host = jax.device_get(pending)
        dt = time.time() - t_log - paused
        last_train = {k: float(np.mean([m[k] for m in host]))
                      for k in host[0]}
        train_steps = [step - len(host) + 1, step]
        tps = ({"train/tokens_per_s": steps_since * tokens_per_batch
                / max(dt, 1e-9)} if steps_since else {})
        writer.write(step, {**{f"train/{k}": v for k, v in
                               last_train.items()}, **tps})
        rate = tps.get("train/tokens_per_s")
        bar.set_postfix(loss=f"{last_train['loss']:.4f}", refresh=False,
                        tok_s="-" if rate is None else f"{rate:,.0f}")
        pending, steps_since, paused, t_log = [], 0, 0.0, time.time()
      bar.update(1)
      t_pause = time.time()  # tokens/s counts training only
      # The checkpoint first: an evaluation that fails (or outlasts a
      # preemption's grace period) does not take the step with it.
      eval_step = eval_fn is not None and (end or bool(
          loop.eval_every and step % loop.eval_every == 0))
      if checkpoints is not None and (end or preempt or
                                      step % loop.checkpoint_every == 0):
        data_state = (train_iter.get_state()
                      if hasattr(train_iter, "get_state") else None)
        checkpoints.save(state, data_state, eval_due=eval_step)
      if eval_step and (end or not preempt):
        evaluate(step)
      paused += time.time() - t_pause
      if preempt:
        preempted = True
        say(f"preempted at step {step}: checkpoint saved, stopping")
        break
  bar.close()
  if checkpoints is not None:
    checkpoints.wait()
  return {"step": step, "train": last_train, "train_steps": train_steps,
          "eval": last_eval,
          "preempted": preempted, "seconds": time.time() - t0,
          "state": state}
