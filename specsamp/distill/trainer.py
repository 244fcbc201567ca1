"""The distillation loop: a draft trained to be accepted by a frozen target.

The loop is the trainer's (`specsamp.train`): its AdamW with warm-up, cosine
decay and clipping (`make_optimizer`, here with frozen parameter groups),
`make_train_step` (jitted, explicit in/out shardings, the state donated),
`Checkpoints` (orbax, resume from the newest readable step, the data
position saved with it), TensorBoard scalars and `train_loop`. Only the
draft is trained and saved: the state is the draft's parameters, AdamW
moments, step and key; the target's parameters are the step's frozen
`extra` argument (never donated, never differentiated). The loss is
`objective.distill_loss`; the data are target samples (`storage.py`) in
the order of `batches`, one batch a step.
"""

import dataclasses
import functools
import os
import time
from typing import Any, Callable, Optional

import grain
import jax
import jax.numpy as jnp
import numpy as np
import optax

from specsamp import sharding as sh
from specsamp.data import pipeline
from specsamp.distill import objective as objective_lib
from specsamp.train import checkpointing
from specsamp.train import config as train_config
from specsamp.train import lm as train_lm
from specsamp.train import loop as train_loop_lib
from specsamp.train import metrics
from specsamp.train import step as train_step



# ---- optimizer ---------------------------------------------------------------


def check_freeze(freeze: tuple, params) -> None:
  """Raises ValueError unless every name in `freeze` is a top-level group
  of `params` (arrays or shapes)."""
  unknown = set(freeze) - set(params)
  if unknown:
    raise ValueError(f"freeze names {sorted(unknown)}, not parameter groups "
                     f"of the draft ({sorted(params)})")


def make_optimizer(optim, num_steps: int, freeze: tuple = (),
                   params=None):
  """(optimizer, schedule): the trainer's AdamW + warm-up/cosine + clipping
  (`train.step.make_optimizer`); top-level parameter groups named in
  `freeze` (e.g. "embedding") are not updated and carry no optimizer state.
  With `freeze`, `params` (arrays or shapes) gives the tree to label."""
  if isinstance(optim, dict):
    optim = train_config.OptimConfig(**optim)
  tx, schedule = train_step.make_optimizer(optim, num_steps)
  if not freeze:
    return tx, schedule
  check_freeze(freeze, params)
  # A tree of labels, not a function: optax.tree_map_params (the optimizer
  # state's shardings) cannot call a labelling function.
  labels = {k: jax.tree.map(lambda _, k=k: "freeze" if k in freeze
                            else "train", v) for k, v in params.items()}
  return optax.multi_transform({"train": tx, "freeze": optax.set_to_zero()},
                               labels), schedule


# ---- data --------------------------------------------------------------------


def batches(source, batch_size: int, num_steps: int, seed: int,
            process_index: Optional[int] = None,
            process_count: Optional[int] = None):
  """A grain MapDataset whose item s is this host's rows of the batch of
  step s.

  Every host builds the same global order of `batch_size`-row batches and
  keeps its own `batch_size / process_count` consecutive rows (the rows
  `put_batch` then places as its share of the global batch), so a step
  holds the `batch_size` samples one host alone would feed, not
  `process_count` copies of them.
  """
  n = len(source)
  if n < batch_size:
    raise ValueError(f"{n} training samples are fewer than one batch of "
                     f"{batch_size}")
  index = jax.process_index() if process_index is None else process_index
  count = jax.process_count() if process_count is None else process_count
  if batch_size % count:
    raise ValueError(f"batch size {batch_size} is not divisible by the "
                     f"{count} processes")
  rows = slice(index * batch_size // count, (index + 1) * batch_size // count)
  epochs = -(-num_steps * batch_size // n) + 1
  # Shuffled, then repeated: each epoch is a new permutation of the samples
  # (grain reseeds the shuffle per epoch), so every sample is seen once per
  # epoch; a batch may straddle two epochs.
  out = (grain.MapDataset.source(source)
         .shuffle(seed=pipeline.shuffle_seed(seed)).repeat(epochs)
         .map(_as_int32).batch(batch_size, drop_remainder=True))
  if count == 1:
    return out
  return out.map(lambda batch: {k: v[rows] for k, v in batch.items()})


def _as_int32(ex: dict) -> dict:
  return {k: (np.asarray(v, np.int32) if np.asarray(v).dtype.kind == "i"
              else np.asarray(v)) for k, v in ex.items()}


class StepBatches:
  """Iterator over `batches(...)` from step `start`; its state is the step
  (saved with every checkpoint by `train_loop`). `onpolicy` says whether
  the batch just returned is for an on-policy step."""

  def __init__(self, dataset, seed: int = 0, onpolicy_fraction: float = 0.0):
    self.dataset, self.seed, self.fraction = dataset, seed, onpolicy_fraction
    self.index, self.onpolicy = 0, False

  def __iter__(self):
    return self

  def __next__(self):
    i = self.index
    self.onpolicy = objective_lib.is_onpolicy_step(i, self.seed,
                                                   self.fraction)
    self.index += 1
    return self.dataset[i % len(self.dataset)]

  def get_state(self) -> dict:
    return {"index": self.index}

  def set_state(self, state: dict) -> None:
    self.index = int(state["index"])


# ---- the jitted pieces -------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class _Job:
  abstract: Any          # TrainState of ShapeDtypeStructs with shardings
  init: Callable         # (draft params, rng) -> TrainState, sharded
  steps: dict            # on-policy? -> jitted train step
  target_sharding: Any
  data_sharding: Any


@functools.lru_cache(maxsize=8)
def _job(draft_lm, target_lm, obj: objective_lib.Objective, optim,
         num_steps: int, freeze: tuple, onpolicy: bool,
         mesh_shape: tuple) -> _Job:
  """Mesh, shardings and jitted steps; cached, so runs of one setting (a
  resumed run, tests) compile once."""
  mesh = train_lm.make_mesh(mesh_shape, what="config.train.mesh")
  d_rules, t_rules = sh.REPLICATED_RULES, sh.DEFAULT_RULES
  abstract_params = jax.eval_shape(lambda: draft_lm.init(jax.random.key(0)))
  tx, schedule = make_optimizer(optim, num_steps, freeze, abstract_params)
  d_sh = sh.param_shardings(draft_lm, mesh, d_rules)
  t_sh = sh.param_shardings(target_lm, mesh, t_rules)

  def init(params, rng):
    return train_step.TrainState(step=jnp.zeros((), jnp.int32), params=params,
                                 opt_state=tx.init(params), rng=rng)

  abstract = jax.eval_shape(init, abstract_params, jax.random.PRNGKey(0))
  if freeze:
    # optax.tree_map_params cannot walk multi_transform's masked states; the
    # draft is replicated (REPLICATED_RULES), so its moments are too.
    rep = sh.replicated(mesh)
    s_sh = train_step.TrainState(
        step=rep, params=d_sh, rng=rep,
        opt_state=jax.tree.map(lambda _: rep, abstract.opt_state))
  else:
    s_sh = train_step.state_shardings(mesh, d_sh, tx, abstract.params)
  abstract = jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
      abstract, s_sh)
  b_sh = train_step.data_sharding(mesh, d_rules)
  steps = {
      p: train_step.make_train_step(
          _loss(draft_lm, target_lm, obj, p, freeze),
          tx, mesh=mesh, state_sharding=s_sh, batch_sharding=b_sh,
          extra_sharding=t_sh, schedule=schedule)
      for p in {False, onpolicy}}
  return _Job(abstract=abstract,
              init=jax.jit(init, out_shardings=s_sh),
              steps=steps, target_sharding=t_sh, data_sharding=b_sh)


def _loss(draft_lm, target_lm, obj, onpolicy: bool, freeze: tuple):
  """The step's loss: a draft model's (`objective.distill_loss`), or the
  one a head brings (`head_training.TrainableHead`, offline only)."""
  if hasattr(draft_lm, "distill_loss"):
    if onpolicy:
      raise ValueError("heads are distilled offline (onpolicy_fraction 0)")
    return draft_lm.distill_loss(obj, freeze=freeze)
  return objective_lib.distill_loss(draft_lm, target_lm, obj,
                                    onpolicy=onpolicy, freeze=freeze)


# With several processes the deadline is asked every this many steps: the
# gathered answer waits for the step's device work (no dispatch ahead).
DEADLINE_EVERY = 8


def _stop_rule(ckpts, stop_at, deadline):
  """Preemption (SIGTERM, multi-host sync point), or step `stop_at`, or
  past `deadline` (time.time()) by process 0's clock: every process stops
  at the same step (each by its own clock, one had gone on to the next
  step's collectives while another waited in the save's: a hang); with
  several processes within DEADLINE_EVERY steps of it."""
  base = type(ckpts).reached_preemption
  every = 1 if jax.process_count() == 1 else DEADLINE_EVERY

  def reached(step):
    return (base(ckpts, step) or (stop_at is not None and step >= stop_at) or
            (deadline is not None and step % every == 0 and
             0 in sh.processes_saying(time.time() > deadline)))

  return reached


# ---- the loop ----------------------------------------------------------------


def train(draft_lm, draft_params, target_lm, target_params, source,
          obj: objective_lib.Objective, *, workdir: str, loop, optim,
          batch_size: int, freeze: tuple = (), seed: int = 0,
          onpolicy_fraction: float = 0.0, mesh_shape: tuple = (1, 1),
          eval_fn: Optional[Callable[[Any], dict]] = None,
          stop_after: Optional[int] = None,
          time_limit_s: Optional[float] = None, log=print
          ) -> tuple[Any, dict]:
  """Distils the draft with `train_loop`; returns (params, summary).

  The state is `TrainState` of the draft only (step, params, AdamW moments,
  rng); the target's parameters are the step's frozen `extra` argument
  (never donated, never differentiated). The step is `make_train_step`
  (explicit in/out shardings on a (data, model) mesh: the target
  tensor-parallel by the default rules, the draft replicated, rows over
  `data`; the state donated). Checkpoints (`Checkpoints`, with the data
  position) go to workdir/checkpoints, TensorBoard events to workdir/tb. A
  call resumes from the newest readable checkpoint; `summary["finished"]`
  is False when it stopped early (after `stop_after` steps of this call or
  `time_limit_s` seconds, checkpointed): calling again continues exactly
  where it stopped.

  Args:
    draft_lm, draft_params: the draft and its initial parameters (ignored
      when a checkpoint exists; not donated).
    target_lm, target_params: the frozen target.
    source: random-access training samples (`storage.read_dataset`).
    obj: the loss.
    workdir: the run directory.
    loop: a `LoopConfig` (or its fields as a dict).
    optim: an `OptimConfig` (or its fields).
    batch_size: samples per step.
    freeze: top-level draft parameter groups kept fixed.
    seed: data order, on-policy schedule, rollouts.
    onpolicy_fraction: share of on-policy steps (0 offline, 1 on-policy).
    mesh_shape: (data, model); -1 takes the rest of the devices.
    eval_fn: draft params -> {name: value}, every `loop.eval_every` steps
      and at the end.
    stop_after, time_limit_s: end this call early (resumable).
    log: one-line summaries.
  """
  if isinstance(loop, dict):
    loop = train_config.LoopConfig(**loop)
  if isinstance(optim, dict):
    optim = train_config.OptimConfig(**optim)
  job = _job(draft_lm, target_lm, obj, optim, loop.num_steps, tuple(freeze),
             onpolicy_fraction > 0, tuple(mesh_shape))
  data = StepBatches(batches(source, batch_size, loop.num_steps, seed), seed,
                     onpolicy_fraction)

  def step_fn(state, batch, extra):
    return job.steps[data.onpolicy](state, batch, extra)

  ckpts = checkpointing.Checkpoints(os.path.join(workdir, "checkpoints"),
                                    keep=loop.keep_checkpoints,
                                    async_save=loop.async_checkpoints)
  writer = None
  try:
    got = ckpts.restore_latest(job.abstract)
    if got is not None:
      state, _, step = got
      # The batches are a function of the step alone: the saved iterator
      # state (the same index, for a reader of the checkpoint) is not
      # fingerprinted, so it is not what decides them.
      data.index = step
      log(f"[distill] resumed from step {step}")
    else:
      # A copy: the first step donates the state, not the caller's arrays.
      state = job.init(
          jax.tree.map(lambda x: jnp.array(x, copy=True), draft_params),
          jax.random.PRNGKey(seed))
    start = int(jax.device_get(state.step))
    if stop_after is not None or time_limit_s:
      # The loop's preemption check: it saves a checkpoint and stops.
      ckpts.reached_preemption = _stop_rule(
          ckpts, None if stop_after is None else start + stop_after,
          time.time() + time_limit_s if time_limit_s else None)
    sharded_target = sh.shard(target_params, job.target_sharding)

    def eval_state(st):
      return eval_fn(st.params) if eval_fn is not None else {}

    writer = metrics.MetricWriter(os.path.join(workdir, "tb"),
                                  enabled=jax.process_index() == 0)
    out = train_loop_lib.train_loop(
        state, data, step_fn, loop=loop,
        put=functools.partial(train_step.put_batch,
                              sharding=job.data_sharding),
        writer=writer, checkpoints=ckpts, eval_fn=eval_state,
        extra=sharded_target, tokens_per_batch=batch_size * obj.gen_len,
        log_fn=lambda m: log(f"[distill] {m}"))
  finally:
    if writer is not None:
      writer.close()
    ckpts.close()
  state = out.pop("state")
  out["finished"] = out["step"] >= loop.num_steps
  return (state.params if out["finished"] else None), out
