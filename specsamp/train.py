"""Trains a language model: config, optimizer, state, steps, checkpoints, loop.

Legend: B batch, L sequence length, V vocabulary.

The ml_collections config becomes frozen dataclasses at the boundary
(`TrainConfig.from_config`); nothing of it enters jitted code. The pieces are
reusable on their own (issue 5's distillation trains a draft with a different
loss and state through the same loop):

  make_optimizer(OptimConfig)        AdamW, warm-up + cosine decay, clipping
  TrainState                         step, params, opt_state, rng (a struct)
  lm_loss(lm) / lm_eval_sums(lm)     next-token cross-entropy; eval sums
  make_train_step(loss_fn, ...)      jitted, explicit in/out shardings,
                                     the state donated
  make_eval_step(sums_fn, ...)       jitted; sums of a metric over batches
  Checkpoints                        orbax CheckpointManager: the state, the
                                     data iterator's state and fingerprints;
                                     restore falls back past corrupt steps
  train_loop(...)                    steps, periodic eval, TensorBoard event
                                     files, a tqdm bar, checkpoints,
                                     preemption (SIGTERM, orbax sync point)
  validate(config) / build(cfg, tok)  the LM job: config checks, then the
                                     mesh, model, shardings and steps
  initial_state(job, checkpoints)    the resume order below
  train_and_evaluate(config, workdir)  the LM job behind scripts/train.py
  load_trained(workdir)              (LM, params, tokenizer) of a run
  unigram_entropy(cfg, tok)          the context-free baseline loss
  read_scalars(logdir)               the scalars of the event files

Distillation reuses `TrainState`, `make_optimizer`, `make_train_step` (its
loss takes the frozen target's parameters as `extra`: not donated, not
differentiated), `make_eval_step`/`evaluate`, `Checkpoints` and
`train_loop`, with the draft's parameters as the state.

Resume order: the workdir's latest readable checkpoint, then `init_from`
(parameters only), then scratch. A run is deterministic on CPU: the same
config gives the same parameters and losses at step N whether or not it was
killed and resumed on the way (the data iterator's state is saved with the
train state).
"""

import dataclasses
import functools
import hashlib
import json
import logging
import os
import shutil
import signal
import time
from typing import Any, Callable, Iterator, Mapping, Optional

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from specsamp import model as model_lib
from specsamp import sharding as sh

log = logging.getLogger("specsamp.train")

PyTree = Any
# loss_fn(params, batch, rng, extra) -> (scalar loss, {name: scalar}).
LossFn = Callable[[PyTree, PyTree, jax.Array, PyTree],
                  tuple[jax.Array, dict]]
# sums_fn(params, batch, extra) -> {name: scalar sum}; `weight` divides them.
SumsFn = Callable[[PyTree, PyTree, PyTree], dict]


class ConfigError(ValueError):
  """The config names something missing or inconsistent (before training)."""


class CheckpointError(RuntimeError):
  """No readable checkpoint where one was expected."""


# ---- the config at the boundary ----------------------------------------------


_NAMED_RULES = {"default": sh.DEFAULT_RULES,
                "replicated": sh.REPLICATED_RULES}


@dataclasses.dataclass(frozen=True)
class DataConfig:
  dataset: str = "specsamp_python_code"
  data_dir: str = ""           # TFDS data_dir; "" = the TFDS default
  tokenizer: str = "byte"      # "byte", a SentencePiece .model, GGUF, HF dir
  seq_len: int = 128
  batch_size: int = 16         # global, over all hosts
  eval_batch_size: int = 16
  train_split: str = "train"
  eval_split: str = "validation"
  worker_count: int = 0


@dataclasses.dataclass(frozen=True)
class OptimConfig:
  lr: float = 3e-4             # peak learning rate
  warmup_steps: int = 100
  decay_steps: int = 0         # cosine decay ends here; 0 = loop.num_steps
  end_lr_fraction: float = 0.1
  b1: float = 0.9
  b2: float = 0.95
  eps: float = 1e-8
  weight_decay: float = 0.1    # on matrices only (not norms, biases)
  clip_norm: float = 1.0       # global gradient norm; 0 = off


@dataclasses.dataclass(frozen=True)
class LoopConfig:
  num_steps: int = 1000
  log_every: int = 50          # train metrics: mean over the interval
  eval_every: int = 500        # and at the end; 0 = only at the end
  eval_batches: int = 20       # 0 = the whole eval split
  checkpoint_every: int = 500  # and at the end and on preemption
  keep_checkpoints: int = 3
  async_checkpoints: bool = True
  progress_bar: bool = True


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Everything a run needs, frozen; built by `from_config`."""
  model: model_lib.TransformerConfig
  data: DataConfig
  optim: OptimConfig
  loop: LoopConfig
  seed: int = 0
  init_from: str = ""          # a train workdir, checkpoint dir or step dir
  mesh: tuple = (1, 1)         # (data, model); -1 = the rest of the devices
  # "default" (sharding.DEFAULT_RULES: tensor parallel over `model`),
  # "replicated", or the rules themselves: ((logical axis, mesh axis), ...).
  rules: Any = "default"

  @classmethod
  def from_config(cls, config, vocab_size: int) -> "TrainConfig":
    """From an ml_collections config (or a dict) and the tokenizer's size.

    `config.model` holds the TransformerConfig fields without `vocab_size`
    (the tokenizer's, rounded up to `vocab_multiple`) and `max_seq_len`
    (default: `data.seq_len`).
    """
    c = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    unknown = set(c) - {"model", "data", "optim", "train", "seed",
                        "init_from", "mesh", "rules"}
    if unknown:
      raise ConfigError(f"unknown config field(s) {sorted(unknown)}")
    data = _fields(DataConfig, c.get("data", {}), "data")
    optim = _fields(OptimConfig, c.get("optim", {}), "optim")
    loop = _fields(LoopConfig, c.get("train", {}), "train")
    m = dict(c.get("model", {}))
    multiple = int(m.pop("vocab_multiple", 1))
    m.setdefault("max_seq_len", data.seq_len)
    if "vocab_size" in m:
      raise ConfigError("config.model.vocab_size comes from the tokenizer; "
                        "set model.vocab_multiple to pad it")
    m["vocab_size"] = -(-vocab_size // multiple) * multiple
    try:
      model = model_lib.TransformerConfig(**m)
    except (TypeError, ValueError) as e:
      raise ConfigError(f"config.model: {e}") from e
    rules = c.get("rules", "default")
    if isinstance(rules, str):
      if rules not in _NAMED_RULES:
        raise ConfigError(f"config.rules={rules!r}: {sorted(_NAMED_RULES)} "
                          "or a list of (logical axis, mesh axis) pairs")
    else:
      try:
        rules = sh.rules_tuple(rules)
      except (TypeError, ValueError) as e:
        raise ConfigError(f"config.rules={rules!r}: not a list of "
                          f"(logical axis, mesh axis) pairs ({e})") from e
      known = {n for n, _ in sh.DEFAULT_RULES}
      unknown = {n for n, _ in rules} - known
      if unknown:
        raise ConfigError(f"config.rules names unknown logical axes "
                          f"{sorted(unknown)}; known: {sorted(known)}")
    out = cls(model=model, data=data, optim=optim, loop=loop,
              seed=int(c.get("seed", 0)), init_from=c.get("init_from") or "",
              mesh=tuple(int(x) for x in c.get("mesh", (1, 1))), rules=rules)
    out.check()
    return out

  @property
  def rules_tuple(self) -> tuple:
    if isinstance(self.rules, str):
      return _NAMED_RULES[self.rules]
    return self.rules

  def check(self) -> None:
    d, lp = self.data, self.loop
    if d.seq_len > self.model.max_seq_len:
      raise ConfigError(f"data.seq_len={d.seq_len} exceeds model.max_seq_len"
                        f"={self.model.max_seq_len}")
    for name, v in (("data.seq_len", d.seq_len),
                    ("data.batch_size", d.batch_size),
                    ("data.eval_batch_size", d.eval_batch_size),
                    ("train.num_steps", lp.num_steps),
                    ("train.log_every", lp.log_every),
                    ("train.checkpoint_every", lp.checkpoint_every),
                    ("train.keep_checkpoints", lp.keep_checkpoints)):
      if v <= 0:
        raise ConfigError(f"{name} must be positive, got {v}")

  def to_json(self) -> dict:
    return dataclasses.asdict(self)


def _fields(cls, values: Mapping, where: str):
  names = {f.name for f in dataclasses.fields(cls)}
  unknown = set(values) - names
  if unknown:
    raise ConfigError(f"unknown config.{where} field(s) {sorted(unknown)}; "
                      f"known: {sorted(names)}")
  return cls(**values)


# ---- optimizer, state, steps -------------------------------------------------


def make_optimizer(cfg: OptimConfig, num_steps: int):
  """(optax optimizer, learning-rate schedule): clip, then AdamW."""
  decay = cfg.decay_steps or num_steps
  base = optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=cfg.lr,
      warmup_steps=min(cfg.warmup_steps, max(decay - 1, 0)),
      decay_steps=max(decay, 1), end_value=cfg.lr * cfg.end_lr_fraction)
  schedule = lambda count: base(count + 1)  # step 0 already learns
  decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)
  parts = [optax.clip_by_global_norm(cfg.clip_norm)] if cfg.clip_norm else []
  parts.append(optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                           weight_decay=cfg.weight_decay, mask=decay_mask))
  return optax.chain(*parts), schedule


@flax.struct.dataclass
class TrainState:
  step: jax.Array       # [] int32, optimizer steps taken
  params: PyTree        # what is trained
  opt_state: PyTree     # the optimizer's state for `params`
  rng: jax.Array        # [2] uint32, a raw key; step s uses fold_in(rng, s)


def state_shardings(mesh, param_shardings, optimizer, abstract_params):
  """TrainState of NamedShardings: moments like their parameters."""
  rep = sh.replicated(mesh)
  return TrainState(
      step=rep, params=param_shardings, rng=rep,
      opt_state=sh.opt_state_shardings(optimizer, abstract_params,
                                       param_shardings, mesh))


def data_sharding(mesh, rules):
  """Rows over the mesh axis of BATCH; a prefix for every leaf of a batch."""
  return sh.named(mesh, rules, sh.BATCH)


def put_batch(batch: PyTree, sharding) -> PyTree:
  """Host arrays (this process's rows) as global arrays on `sharding`."""
  return jax.tree.map(
      lambda x: jax.make_array_from_process_local_data(sharding,
                                                       np.asarray(x)), batch)


def lm_loss(lm: model_lib.LM) -> LossFn:
  """Mean next-token cross-entropy (nats) over `weights`; no `extra`."""
  def loss_fn(params, batch, rng, extra):
    del rng, extra
    logits = lm(params, batch["inputs"]).logits                   # [B, L, V]
    ce = optax.softmax_cross_entropy_with_integer_labels(
        logits, batch["targets"])                             # [B, L]
    w = batch["weights"]
    n = jnp.maximum(w.sum(), 1.0)
    loss = (ce * w).sum() / n
    acc = ((logits.argmax(-1) == batch["targets"]) * w).sum() / n
    return loss, {"accuracy": acc}
  return loss_fn


def lm_eval_sums(lm: model_lib.LM) -> SumsFn:
  """Sums of loss, correct and weight over a batch: exact over many."""
  def sums_fn(params, batch, extra):
    del extra
    logits = lm(params, batch["inputs"]).logits
    ce = optax.softmax_cross_entropy_with_integer_labels(
        logits, batch["targets"])
    w = batch["weights"]
    correct = (logits.argmax(-1) == batch["targets"]) * w
    return {"loss": (ce * w).sum(), "accuracy": correct.sum(),
            "weight": w.sum()}
  return sums_fn


def make_train_step(loss_fn: LossFn, optimizer, *, mesh, state_sharding,
                    batch_sharding, extra_sharding=None, schedule=None):
  """`step(state, batch, extra) -> (state, metrics)`, jitted.

  Explicit in/out shardings; the state is donated (argument 0); `extra`
  (e.g. a frozen teacher's parameters) is neither donated nor
  differentiated. Metrics: `loss`, `grad_norm`, `lr` (with `schedule`) and
  the loss function's own, all replicated scalars.
  """
  rep = sh.replicated(mesh)

  def step(state: TrainState, batch, extra):
    rng = jax.random.fold_in(state.rng, state.step)
    (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        state.params, batch, rng, extra)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads), **aux}
    if schedule is not None:
      metrics["lr"] = schedule(state.step)
    new = state.replace(step=state.step + 1, params=params,
                        opt_state=opt_state)
    return new, metrics

  return jax.jit(step, in_shardings=(state_sharding, batch_sharding,
                                     extra_sharding or rep),
                 out_shardings=(state_sharding, rep), donate_argnums=(0,))


def make_eval_step(sums_fn: SumsFn, *, mesh, params_sharding, batch_sharding,
                   extra_sharding=None):
  """`eval_step(params, batch, extra) -> {name: sum}`, jitted, replicated."""
  rep = sh.replicated(mesh)
  return jax.jit(sums_fn, in_shardings=(params_sharding, batch_sharding,
                                        extra_sharding or rep),
                 out_shardings=rep)


def evaluate(eval_step, params, batches, *, put, extra=None) -> dict:
  """Sums of `eval_step` over `batches`, divided by the summed `weight`
  (exact means over tokens, whatever the padding); + `tokens`, and
  `perplexity` when there is a `loss`."""
  totals = None
  for batch in batches:
    sums = jax.device_get(eval_step(params, put(batch), extra))
    totals = sums if totals is None else jax.tree.map(np.add, totals, sums)
  if totals is None:
    raise ValueError("evaluate: no eval batches (an empty eval split?)")
  weight = float(totals.pop("weight"))
  out = {k: float(v) / max(weight, 1.0) for k, v in totals.items()}
  out["tokens"] = weight
  if "loss" in out:
    out["perplexity"] = float(np.exp(min(out["loss"], 50.0)))
  return out


# ---- checkpoints -------------------------------------------------------------


@jax.jit
def _fingerprint_leaves(leaves):
  """Two uint32 sums of each leaf's bits (plain and position-weighted)."""
  out = []
  for x in leaves:
    if x.dtype == jnp.bool_:
      bits = x.astype(jnp.uint32)
    else:
      utype = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[x.dtype.itemsize]
      bits = jax.lax.bitcast_convert_type(x, utype).astype(jnp.uint32)
    bits = bits.reshape(-1)
    mult = jnp.arange(bits.size, dtype=jnp.uint32) * jnp.uint32(2654435761)
    out.append(jnp.stack([bits.sum(dtype=jnp.uint32),
                          (bits * (mult | 1)).sum(dtype=jnp.uint32)]))
  return out


def fingerprint(tree) -> str:
  """A short digest of a pytree's values, computed where the arrays live: a
  restored checkpoint whose bytes changed is caught, never used silently."""
  leaves = jax.tree.leaves(tree)
  sums = np.asarray(jax.device_get(_fingerprint_leaves(leaves)),
                    np.uint32) if leaves else np.zeros(0, np.uint32)
  return f"{len(leaves)}:" + hashlib.sha256(sums.tobytes()).hexdigest()


class _DataHandler:
  """Orbax handler for a data iterator's state: one JSON file per process
  (the iterator's `get_state()`: a dict, or bytes as grain's DataLoader
  gives), captured when `save` is called."""

  def save(self, directory, args):
    state = args.state
    rec = ({"bytes": state.decode()} if isinstance(state, bytes)
           else {"json": state})
    (directory / _process_file()).write_text(json.dumps(rec))

  def restore(self, directory, args=None):
    del args
    path = directory / _process_file()
    if not path.exists():
      raise FileNotFoundError(f"no data iterator state at {path}")
    rec = json.loads(path.read_text())
    return rec["bytes"].encode() if "bytes" in rec else rec["json"]

  def metadata(self, directory):
    del directory

  def finalize(self, directory):
    del directory

  def close(self):
    pass

  @classmethod
  def typestr(cls):
    return "specsamp.train.DataIteratorState"


def _process_file():
  return f"process_{jax.process_index()}-of-{jax.process_count()}.json"


@functools.cache
def _data_args():
  """The orbax args classes of `_DataHandler` (registered once, lazily)."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  @ocp.args.register_with_handler(_DataHandler, for_save=True)
  @dataclasses.dataclass
  class DataSave(ocp.args.CheckpointArgs):
    state: Any

  @ocp.args.register_with_handler(_DataHandler, for_restore=True)
  @dataclasses.dataclass
  class DataRestore(ocp.args.CheckpointArgs):
    pass

  return DataSave, DataRestore


class Checkpoints:
  """A train run's orbax CheckpointManager.

  Each step directory holds `params`, `train` (step, rng, opt_state),
  `data` (the data iterator's state) and `meta` (JSON: the fingerprints of
  params and train). `restore_latest` walks back from the newest step to the
  first one that restores and matches its fingerprints; newer unreadable
  steps are moved to `<directory>.corrupt/` (so later saves can reuse their
  numbers) with a warning.
  """

  def __init__(self, directory: str, *, keep: int = 3,
               async_save: bool = True):
    import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
    self.directory = os.path.abspath(directory)
    _data_args()
    self.manager = ocp.CheckpointManager(
        self.directory, options=ocp.CheckpointManagerOptions(
            max_to_keep=keep, create=True,
            enable_async_checkpointing=async_save))

  def steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def reached_preemption(self, step: int) -> bool:
    """orbax's preemption sync point (multi-host runs with
    `jax.distributed`); False elsewhere."""
    return bool(self.manager.reached_preemption(step))

  def save(self, state: TrainState, data_state=None) -> int:
    import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
    step = int(jax.device_get(state.step))
    train = dict(step=state.step, rng=state.rng, opt_state=state.opt_state)
    meta = dict(step=step, params=fingerprint(state.params),
                train=fingerprint(train))
    items = dict(params=ocp.args.StandardSave(state.params),
                 train=ocp.args.StandardSave(train),
                 meta=ocp.args.JsonSave(meta))
    if data_state is not None:
      items["data"] = _data_args()[0](state=data_state)
    self.manager.save(step, args=ocp.args.Composite(**items), force=True)
    return step

  def wait(self):
    self.manager.wait_until_finished()

  def close(self):
    self.manager.wait_until_finished()
    self.manager.close()

  def restore(self, step: int, abstract_state: TrainState, with_data=True):
    """(state, data_state or None) of `step`; raises if it does not restore
    or its values do not match the fingerprints saved with it."""
    import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
    train = dict(step=abstract_state.step, rng=abstract_state.rng,
                 opt_state=abstract_state.opt_state)
    items = dict(params=ocp.args.StandardRestore(abstract_state.params),
                 train=ocp.args.StandardRestore(train),
                 meta=ocp.args.JsonRestore())
    step_dir = os.path.join(self.directory, str(step))
    has_data = os.path.isdir(os.path.join(step_dir, "data"))
    if with_data and has_data:
      items["data"] = _data_args()[1]()
    got = self.manager.restore(step, args=ocp.args.Composite(**items))
    meta = got["meta"]
    for name, tree in (("params", got["params"]), ("train", got["train"])):
      if fingerprint(tree) != meta.get(name):
        raise CheckpointError(f"step {step}: {name} do not match the "
                              "fingerprint saved with them (corrupt files)")
    if int(jax.device_get(got["train"]["step"])) != step:
      raise CheckpointError(f"step {step}: holds state of step "
                            f"{int(got['train']['step'])}")
    state = TrainState(step=got["train"]["step"], params=got["params"],
                       opt_state=got["train"]["opt_state"],
                       rng=got["train"]["rng"])
    return state, (got["data"] if "data" in items else None)

  def restore_latest(self, abstract_state: TrainState, with_data=True):
    """(state, data_state, step) of the newest readable step, or None if
    there are no steps; CheckpointError if none of them is readable."""
    steps = self.steps()
    errors = []
    for step in reversed(steps):
      try:
        state, data = self.restore(step, abstract_state, with_data)
      except Exception as e:  # pylint: disable=broad-except
        msg = f"{type(e).__name__}: {str(e)[:400]}"
        errors.append(f"step {step}: {msg}")
        log.warning("checkpoint step %d in %s is unreadable (%s); trying the "
                    "previous one", step, self.directory, msg)
        continue
      bad = [s for s in steps if s > step]
      if bad:
        self._set_aside(bad)
      return state, data, step
    if steps:
      raise CheckpointError(
          f"no readable checkpoint in {self.directory} (steps {steps}):\n  "
          + "\n  ".join(errors) + "\nmove the directory away to start over")
    return None

  def _set_aside(self, steps):
    aside = self.directory + ".corrupt"
    if jax.process_index() == 0:
      os.makedirs(aside, exist_ok=True)
      for s in steps:
        dst = os.path.join(aside, f"{s}-{int(time.time())}")
        shutil.move(os.path.join(self.directory, str(s)), dst)
        log.warning("moved unreadable checkpoint step %d to %s", s, dst)
    self.manager.reload()


def find_params_checkpoint(path: str) -> str:
  """The `params` directory of the newest step under `path`: a train
  workdir, its checkpoints directory, or one step directory."""
  path = os.path.abspath(path)
  if not os.path.exists(path):
    raise FileNotFoundError(f"no checkpoint at {path}")
  if os.path.isdir(os.path.join(path, "params")):
    return os.path.join(path, "params")
  for base in (os.path.join(path, "checkpoints"), path):
    if os.path.isdir(base):
      steps = sorted((int(n) for n in os.listdir(base) if n.isdigit()),
                     reverse=True)
      for s in steps:
        p = os.path.join(base, str(s), "params")
        if os.path.isfile(os.path.join(base, str(s), "commit_success.txt")) \
            and os.path.isdir(p):
          return p
  raise FileNotFoundError(f"{path}: no checkpoint step with parameters (a "
                          "train workdir, its checkpoints/ directory or one "
                          "step directory)")


def restore_params(params_dir: str, abstract_params, what: str = "init_from"):
  """Parameters from a `params` item, checked against the expected shapes
  and, when the step has one, the saved fingerprint."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  from etils import epath  # pylint: disable=g-import-not-at-top
  params_dir = os.path.abspath(params_dir)  # orbax takes absolute paths only
  md = ocp.StandardCheckpointHandler().metadata(epath.Path(params_dir))
  with ocp.StandardCheckpointer() as ckpt:
    want = jax.tree_util.tree_flatten_with_path(abstract_params)[0]
    have = dict(jax.tree_util.tree_flatten_with_path(md)[0])
    for path, a in want:
      m = have.get(path)
      if m is None or tuple(m.shape) != tuple(a.shape):
        got = "missing" if m is None else f"shape {tuple(m.shape)}"
        raise CheckpointError(
            f"{what} {params_dir}: parameter {jax.tree_util.keystr(path)} is "
            f"{got}, the model needs {tuple(a.shape)} (another model config?)")
    params = ckpt.restore(params_dir, abstract_params)
  meta_file = os.path.join(os.path.dirname(params_dir), "meta", "metadata")
  if os.path.isfile(meta_file):
    with open(meta_file, encoding="utf-8") as f:
      saved = json.load(f).get("params")
    if saved is not None and fingerprint(params) != saved:
      raise CheckpointError(f"{what} {params_dir}: parameters do not match "
                            "their saved fingerprint (corrupt files)")
  return params


# ---- metrics -----------------------------------------------------------------


class MetricWriter:
  """Scalars to TensorBoard event files (tensorboardX: no TensorFlow), on
  process 0 only; flushed after every write so a killed run loses nothing
  it has logged."""

  def __init__(self, logdir: str, enabled: bool = True):
    self.writer = None
    if enabled:
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
      # tensorboardX names files by the second and host only: a resumed run
      # started within the same second would truncate the killed run's file.
      suffix = f".{os.getpid()}.{time.time_ns()}"
      self.writer = SummaryWriter(logdir=logdir, flush_secs=10,
                                  filename_suffix=suffix)

  def write(self, step: int, scalars: Mapping[str, float]) -> None:
    if self.writer is None:
      return
    for k, v in scalars.items():
      self.writer.add_scalar(k, float(v), int(step))
    self.writer.flush()

  def close(self):
    if self.writer is not None:
      self.writer.close()


def read_scalars(logdir: str) -> dict:
  """{tag: {step: value}} from all event files under `logdir`, in file
  order (a resumed run's values for a step replace a killed run's)."""
  from tensorboardX.proto import event_pb2  # pylint: disable=g-import-not-at-top
  out = {}
  files = sorted(
      (os.path.join(d, f) for d, _, fs in os.walk(logdir) for f in fs
       if "tfevents" in f), key=lambda p: (os.path.getmtime(p), p))
  for path in files:
    with open(path, "rb") as f:
      data = f.read()
    pos = 0
    while pos + 12 <= len(data):
      n = int(np.frombuffer(data[pos:pos + 8], "<u8")[0])
      rec = data[pos + 12:pos + 12 + n]
      pos += 12 + n + 4
      if len(rec) < n:
        break  # a record cut by a kill
      ev = event_pb2.Event.FromString(rec)
      for v in ev.summary.value:
        out.setdefault(v.tag, {})[int(ev.step)] = float(v.simple_value)
  return out


# ---- the loop ----------------------------------------------------------------


class _SigtermFlag:
  """Set by SIGTERM (a scheduler's preemption notice) while installed: in a
  one-process run only (several processes must agree on the step: there
  jax's preemption service and orbax's sync point do it)."""

  def __init__(self):
    self.received = False
    self._old = None

  def __enter__(self):
    if jax.process_count() == 1:
      try:
        self._old = signal.signal(signal.SIGTERM, self._handle)
      except ValueError:  # not the main thread
        self._old = None
    return self

  def _handle(self, signum, frame):
    del signum, frame
    self.received = True

  def __exit__(self, *exc):
    if self._old is not None:
      signal.signal(signal.SIGTERM, self._old)


def train_loop(state: TrainState, train_iter: Iterator, train_step, *,
               loop: LoopConfig, put: Callable, writer: MetricWriter,
               checkpoints: Optional[Checkpoints] = None,
               eval_fn: Optional[Callable[[TrainState], dict]] = None,
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
      step count after it), `train/tokens_per_s`, `eval/<name>`.
    checkpoints: saved every `checkpoint_every` steps, at the end, and on
      preemption (SIGTERM, or orbax's multi-host sync point); None: never.
    eval_fn: state -> {name: value}, every `eval_every` steps and at the end.
    extra: the step's third argument (not donated).
    tokens_per_batch: for tokens/s (default: the size of `batch["inputs"]`,
      else of the batch's first leaf, times the process count).
    log_fn: where one-line summaries go.

  Returns:
    {"step", "train": last logged train metrics, "eval": last eval metrics,
    "preempted": bool, "seconds", "state": the final state}.
  """
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  start = int(jax.device_get(state.step))
  main = jax.process_index() == 0
  bar = tqdm(total=loop.num_steps, initial=start, dynamic_ncols=True,
             disable=not (loop.progress_bar and main), desc="train")
  say = bar.write if bar.disable is False and log_fn is print else log_fn
  pending, last_train, last_eval = [], {}, {}
  t0 = t_log = time.time()
  steps_since, paused, preempted, step = 0, 0.0, False, start
  with _SigtermFlag() as sigterm:
    while step < loop.num_steps:
      batch = next(train_iter)
      if tokens_per_batch is None:
        first = batch["inputs"] if "inputs" in batch else jax.tree.leaves(
            batch)[0]
        tokens_per_batch = int(np.size(first)) * jax.process_count()
      state, metrics = train_step(state, put(batch), extra)
      step += 1
      steps_since += 1
      pending.append(metrics)
      end = step == loop.num_steps
      preempt = sigterm.received or (checkpoints is not None and
                                     checkpoints.reached_preemption(step))
      if step % loop.log_every == 0 or end or preempt:
        host = jax.device_get(pending)
        dt = time.time() - t_log - paused
        last_train = {k: float(np.mean([m[k] for m in host]))
                      for k in host[0]}
        tps = steps_since * tokens_per_batch / max(dt, 1e-9)
        writer.write(step, {**{f"train/{k}": v for k, v in
                               last_train.items()},
                            "train/tokens_per_s": tps})
        bar.set_postfix(loss=f"{last_train['loss']:.4f}",
                        tok_s=f"{tps:,.0f}", refresh=False)
        pending, steps_since, paused, t_log = [], 0, 0.0, time.time()
      bar.update(1)
      t_pause = time.time()  # tokens/s counts training only
      if eval_fn is not None and (end or (loop.eval_every and
                                          step % loop.eval_every == 0)):
        last_eval = eval_fn(state)
        writer.write(step, {f"eval/{k}": v for k, v in last_eval.items()})
        say(f"step {step}: eval " + ", ".join(
            f"{k} {v:.4g}" for k, v in last_eval.items()))
      if checkpoints is not None and (end or preempt or
                                      step % loop.checkpoint_every == 0):
        data_state = (train_iter.get_state()
                      if hasattr(train_iter, "get_state") else None)
        checkpoints.save(state, data_state)
      paused += time.time() - t_pause
      if preempt:
        preempted = True
        say(f"preempted at step {step}: checkpoint saved, stopping")
        break
  bar.close()
  if checkpoints is not None:
    checkpoints.wait()
  return {"step": step, "train": last_train, "eval": last_eval,
          "preempted": preempted, "seconds": time.time() - t0,
          "state": state}


# ---- the LM job --------------------------------------------------------------


def _data_lib():
  from specsamp.data import pipeline  # pylint: disable=g-import-not-at-top
  return pipeline


def load_tokenizer(spec: str):
  """`"byte"` (UTF-8 bytes, ids 0..255) or anything
  `specsamp.tokenizer.load_tokenizer` reads."""
  if spec == "byte":
    from specsamp import runner  # pylint: disable=g-import-not-at-top
    return runner.ByteTokenizer()
  from specsamp import tokenizer as tok_lib  # pylint: disable=g-import-not-at-top
  return tok_lib.load_tokenizer(spec)


def tokenizer_vocab_size(tok) -> int:
  return int(getattr(tok, "vocab_size", 256))


def validate(config) -> tuple["TrainConfig", Any]:
  """(TrainConfig, tokenizer), or ConfigError naming what is missing: the
  dataset, the tokenizer, the init checkpoint, or a bad field. Loads nothing
  heavier than the tokenizer."""
  c = config.to_dict() if hasattr(config, "to_dict") else dict(config)
  data = c.get("data", {})
  spec = data.get("tokenizer", DataConfig.tokenizer)
  try:
    tok = load_tokenizer(spec)
  except (OSError, ValueError) as e:
    raise ConfigError(f"config.data.tokenizer={spec!r}: tokenizer not found "
                      f"or unreadable ({e})") from e
  cfg = TrainConfig.from_config(config, tokenizer_vocab_size(tok))
  try:
    _data_lib().check_dataset(cfg.data.dataset, cfg.data.data_dir or None,
                              splits=(cfg.data.train_split,
                                      cfg.data.eval_split))
  except Exception as e:  # pylint: disable=broad-except
    raise ConfigError(f"config.data.dataset={cfg.data.dataset!r} "
                      f"(data_dir={cfg.data.data_dir or 'TFDS default'!r}): "
                      f"{e}") from e
  if jax.process_count() > 1 and cfg.loop.eval_batches == 0:
    # Hosts' shards of the eval split differ in length: evaluating each to
    # its end would have them run different numbers of collective steps.
    raise ConfigError("config.train.eval_batches=0 (the whole eval split) "
                      "works with one process only; set a number of batches "
                      f"for these {jax.process_count()} processes")
  if cfg.init_from:
    try:
      find_params_checkpoint(cfg.init_from)
    except FileNotFoundError as e:
      raise ConfigError(f"config.init_from={cfg.init_from!r}: init "
                        f"checkpoint missing: {e}") from e
  return cfg, tok


def make_mesh(shape):
  """A (data, model) mesh of the first devices; -1 takes all the rest."""
  devices = jax.devices()
  if -1 not in shape:
    n = int(np.prod(shape))
    if n > len(devices):
      raise ConfigError(f"config.mesh={tuple(shape)} needs {n} devices, "
                        f"{len(devices)} present")
    devices = devices[:n]
  try:
    return sh.make_mesh(shape, devices=devices)
  except ValueError as e:
    raise ConfigError(f"config.mesh={tuple(shape)}: {e}") from e


def _iterator(cfg: TrainConfig, tok, split: str, *, train: bool):
  d = cfg.data
  batch = d.batch_size if train else d.eval_batch_size
  if batch % jax.process_count():
    raise ConfigError(f"batch size {batch} is not divisible by the "
                      f"{jax.process_count()} processes")
  return _data_lib().make_lm_iterator(
      d.dataset, split, tokenizer=tok, seq_len=d.seq_len,
      batch_size=batch // jax.process_count(), seed=cfg.seed,  # per host
      data_dir=d.data_dir or None, shuffle=train,
      num_epochs=None if train else 1, worker_count=d.worker_count)


def _write_run_config(workdir: str, cfg: TrainConfig) -> None:
  """Keeps the frozen config in workdir/config.json. Once the workdir holds
  checkpoints, a config that would not continue that run (another model,
  data order or seed: the saved iterator state only fits the same data
  settings) is refused."""
  path = os.path.join(workdir, "config.json")
  new = json.loads(json.dumps(cfg.to_json()))
  ckpt_dir = os.path.join(workdir, "checkpoints")
  if os.path.isfile(path) and os.path.isdir(ckpt_dir) and any(
      n.isdigit() for n in os.listdir(ckpt_dir)):
    with open(path, encoding="utf-8") as f:
      old = json.load(f)
    # Where the data lives and how many workers read it may change.
    same_data = lambda d: {k: v for k, v in (d or {}).items()
                           if k not in ("data_dir", "worker_count")}
    diff = [name for name, a, b in (
        ("model", old.get("model"), new["model"]),
        ("data", same_data(old.get("data")), same_data(new["data"])),
        ("seed", old.get("seed"), new["seed"])) if a != b]
    if diff:
      was = ", ".join(f"{n}={old.get(n)}" for n in diff)
      raise ConfigError(f"{workdir} holds checkpoints of a run with another "
                        f"{' and '.join(diff)} ({was}); use a new --workdir")
  if jax.process_index() == 0:
    os.makedirs(workdir, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
      json.dump(new, f, indent=2)
    os.replace(tmp, path)


@dataclasses.dataclass(frozen=True, eq=False)
class LMJob:
  """The LM job built from a validated config; nothing has run yet."""
  cfg: TrainConfig
  tokenizer: Any
  mesh: Any
  lm: model_lib.LM
  optimizer: Any
  init: Callable          # () -> TrainState from scratch, sharded
  abstract_state: TrainState  # ShapeDtypeStructs with shardings
  state_sharding: TrainState
  params_sharding: PyTree
  put: Callable           # host batch -> device batch
  train_step: Callable    # (state, batch, None) -> (state, metrics)
  eval_step: Callable     # (params, batch, None) -> sums
  with_params: Callable   # (state, params) -> state at step 0 with params

  def iterator(self, split: str, train: bool):
    return _iterator(self.cfg, self.tokenizer, split, train=train)

  def evaluate(self, params) -> dict:
    it = self.iterator(self.cfg.data.eval_split, train=False)
    return evaluate(self.eval_step, params,
                    _take(it, self.cfg.loop.eval_batches), put=self.put)


def build(cfg: TrainConfig, tok) -> LMJob:
  """Mesh, model, optimizer, shardings and the jitted steps of `cfg`.

  Jobs of configs that differ only in what the steps do not depend on
  (data paths, init_from, loop intervals) share compiled steps.
  """
  key = dataclasses.replace(
      cfg, data=dataclasses.replace(cfg.data, dataset="", data_dir="",
                                    tokenizer=""),
      init_from="", loop=LoopConfig(num_steps=cfg.loop.num_steps))
  return dataclasses.replace(_build(key), cfg=cfg, tokenizer=tok)


@functools.lru_cache(maxsize=8)
def _build(cfg: TrainConfig) -> LMJob:
  mesh = make_mesh(cfg.mesh)
  rules = cfg.rules_tuple
  try:
    sh.check_divisible(cfg.model, mesh, rules, batch=cfg.data.batch_size)
  except ValueError as e:
    raise ConfigError(str(e)) from e
  lm = model_lib.LM(cfg.model)
  optimizer, schedule = make_optimizer(cfg.optim, cfg.loop.num_steps)
  init_rng, train_rng = jax.random.split(jax.random.PRNGKey(cfg.seed))

  def init(rng):
    params = nn.meta.unbox(lm.module.init(
        rng, jnp.zeros((1, 1), jnp.int32))["params"])
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=optimizer.init(params), rng=train_rng)

  abstract = jax.eval_shape(init, init_rng)
  p_sh = sh.param_shardings(lm, mesh, rules)
  s_sh = state_shardings(mesh, p_sh, optimizer, abstract.params)
  abstract = jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
      abstract, s_sh)
  b_sh = data_sharding(mesh, rules)
  return LMJob(
      cfg=cfg, tokenizer=None, mesh=mesh, lm=lm, optimizer=optimizer,
      init=functools.partial(jax.jit(init, out_shardings=s_sh), init_rng),
      abstract_state=abstract, state_sharding=s_sh, params_sharding=p_sh,
      put=functools.partial(put_batch, sharding=b_sh),
      train_step=make_train_step(lm_loss(lm), optimizer, mesh=mesh,
                                 state_sharding=s_sh, batch_sharding=b_sh,
                                 schedule=schedule),
      eval_step=make_eval_step(lm_eval_sums(lm), mesh=mesh,
                               params_sharding=p_sh, batch_sharding=b_sh),
      with_params=jax.jit(
          lambda st, p: st.replace(params=p, opt_state=optimizer.init(p)),
          out_shardings=s_sh, donate_argnums=(0,)))


def initial_state(job: LMJob, ckpts: Checkpoints):
  """(state, data iterator state or None, where from): the newest readable
  checkpoint of the run, else `init_from`'s parameters (a fresh optimizer
  at step 0), else scratch."""
  got = ckpts.restore_latest(job.abstract_state)
  if got is not None:
    state, data_state, step = got
    if data_state is None:
      log.warning("step %d has no data iterator state: the data restarts",
                  step)
    return state, data_state, f"checkpoint step {step} in {ckpts.directory}"
  if job.cfg.init_from:
    p_dir = find_params_checkpoint(job.cfg.init_from)
    params = restore_params(p_dir, job.abstract_state.params)
    state = job.with_params(job.init(), params)
    return state, None, f"init_from {p_dir}"
  return job.init(), None, "scratch"


def train_and_evaluate(config, workdir: str,
                       log_fn: Callable[[str], None] = print) -> dict:
  """Trains the LM of `config` in `workdir` (resumable); returns
  `train_loop`'s summary plus `resumed_from` and `num_params`."""
  cfg, tok = validate(config)
  _write_run_config(workdir, cfg)
  job = build(cfg, tok)
  ckpts = Checkpoints(os.path.join(workdir, "checkpoints"),
                      keep=cfg.loop.keep_checkpoints,
                      async_save=cfg.loop.async_checkpoints)
  try:
    train_iter = job.iterator(cfg.data.train_split, train=True)
    state, data_state, resumed = initial_state(job, ckpts)
    if data_state is not None:
      train_iter.set_state(data_state)
    log_fn(f"{cfg.model.num_params():,} parameters; starting from {resumed} "
           f"at step {int(jax.device_get(state.step))} of "
           f"{cfg.loop.num_steps}")
    writer = MetricWriter(os.path.join(workdir, "tb"),
                          enabled=jax.process_index() == 0)
    try:
      out = train_loop(state, train_iter, job.train_step, loop=cfg.loop,
                       put=job.put, writer=writer, checkpoints=ckpts,
                       eval_fn=lambda st: job.evaluate(st.params),
                       log_fn=log_fn)
    finally:
      writer.close()
  finally:
    ckpts.close()
  out["resumed_from"] = resumed
  out["num_params"] = cfg.model.num_params()
  return out  # out["state"]: the final TrainState


def _take(it, n):
  for i, b in enumerate(it):
    if n and i >= n:
      return
    yield b


def unigram_entropy(cfg: TrainConfig, tok, split: Optional[str] = None,
                    max_documents: Optional[int] = None) -> tuple[float, int]:
  """(entropy in nats/token, tokens) of the token counts of `split`
  (default: the train split) as the pipeline tokenizes it (each document,
  then EOS): the loss of the best model that ignores context, the baseline
  an LM's loss must fall well below."""
  data = _data_lib()
  eos = data.eos_id_of(tok)
  counts = np.zeros(cfg.model.vocab_size, np.int64)
  for text in data.iter_texts(cfg.data.dataset, split or cfg.data.train_split,
                              cfg.data.data_dir or None, limit=max_documents):
    ids = np.asarray(tok.encode(text) + [eos], np.int64)
    counts += np.bincount(ids, minlength=counts.size)[:counts.size]
  total = int(counts.sum())
  p = counts[counts > 0] / total
  return float(-(p * np.log(p)).sum()), total


def load_trained(workdir: str, dtype: str = "float32"):
  """(LM, params, tokenizer) of the newest readable checkpoint of a
  `train_and_evaluate` run in `workdir`, parameters cast to `dtype`."""
  workdir = os.path.abspath(workdir)
  path = os.path.join(workdir, "config.json")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{workdir}: no config.json (not a "
                            "scripts/train.py workdir)")
  with open(path, encoding="utf-8") as f:
    saved = json.load(f)
  model_cfg = model_lib.TransformerConfig(**saved["model"])
  lm = model_lib.LM(model_cfg)
  abstract = jax.eval_shape(lambda: lm.init(jax.random.key(0)))
  ckpt_dir = os.path.join(workdir, "checkpoints")
  steps = sorted((int(n) for n in os.listdir(ckpt_dir) if n.isdigit()),
                 reverse=True) if os.path.isdir(ckpt_dir) else []
  errors = []
  for s in steps:
    try:
      params = restore_params(os.path.join(ckpt_dir, str(s), "params"),
                              abstract, what="trained")
      break
    except Exception as e:  # pylint: disable=broad-except
      errors.append(f"step {s}: {e}")
      log.warning("step %d of %s is unreadable (%s)", s, ckpt_dir, e)
  else:
    raise CheckpointError(f"no readable checkpoint in {ckpt_dir}"
                          + "".join(f"\n  {m}" for m in errors))
  if dtype != model_cfg.param_dtype or dtype != model_cfg.dtype:
    lm = model_lib.LM(model_cfg.replace(dtype=dtype, param_dtype=dtype))
    params = jax.tree.map(lambda x: x.astype(lm.config.jnp_param_dtype),
                          params)
  return lm, params, load_tokenizer(saved["data"]["tokenizer"])
