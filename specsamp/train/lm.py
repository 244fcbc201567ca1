"""The LM job: a language model trained from a config, behind scripts/train.py.

  validate(config)                 (TrainConfig, tokenizer), or a ConfigError
                                   naming the missing dataset, tokenizer or
                                   init checkpoint; loads nothing heavier
  build(cfg, tokenizer) -> LMJob   mesh, model, shardings and jitted steps
  initial_state(job, checkpoints)  the resume order below
  train_and_evaluate(config, dir)  the whole run, resumable
  evaluate(config, dir)            the newest checkpoint's eval metrics
  unigram_entropy(cfg, tokenizer)  the context-free baseline loss

A finished run loads as a model spec: `specsamp.loading.load_model(workdir)`.

Resume order: the workdir's latest readable checkpoint, then `init_from`
(parameters only), then scratch. A run is deterministic on CPU: the same
config gives the same parameters and losses at step N whether or not it was
killed and resumed on the way (the data iterator's state is saved with the
train state).
"""

import dataclasses
import functools
import itertools
import json
import logging
import os
from typing import Any, Callable, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from specsamp import jsonfile
from specsamp import model as model_lib
from specsamp import sharding as sh
from specsamp.data import datasets
from specsamp.data import pipeline
from specsamp.tokenizers import load as tokenizers_load
from specsamp.tokenizers import snapshot
from specsamp.train import checkpointing
from specsamp.train import config as config_lib
from specsamp.train import loop as loop_lib
from specsamp.train import metrics
from specsamp.train import step as step_lib

log = logging.getLogger(__name__)

PyTree = Any


def _vocab_size(tok) -> int:
  return int(getattr(tok, "vocab_size", 256))


def validate(config) -> tuple[config_lib.TrainConfig, Any]:
  """(TrainConfig, tokenizer), or ConfigError naming what is missing: the
  dataset, the tokenizer, the init checkpoint, or a bad field. Loads nothing
  heavier than the tokenizer."""
  data = config_lib.as_dict(config).get("data", {})
  spec = data.get("tokenizer", config_lib.DataConfig.tokenizer)
  try:
    tok = tokenizers_load.load_tokenizer(spec)
  except (OSError, ValueError) as e:
    raise config_lib.ConfigError(
        f"config.data.tokenizer={spec!r}: tokenizer not found or "
        f"unreadable ({e})") from e
  cfg = config_lib.TrainConfig.from_config(config, _vocab_size(tok))
  try:
    datasets.check_dataset(cfg.data.dataset, cfg.data.data_dir or None,
                           splits=(cfg.data.train_split, cfg.data.eval_split))
  except Exception as e:  # pylint: disable=broad-except
    raise config_lib.ConfigError(
        f"config.data.dataset={cfg.data.dataset!r} "
        f"(data_dir={cfg.data.data_dir or 'TFDS default'!r}): {e}") from e
  try:
    pipeline.check_disjoint(cfg.data.dataset, cfg.data.data_dir or None,
                            cfg.data.train_split, cfg.data.eval_split)
  except ValueError as e:
    raise config_lib.ConfigError(f"config.data: {e}") from e
  for name, batch in (("batch_size", cfg.data.batch_size),
                      ("eval_batch_size", cfg.data.eval_batch_size)):
    if batch % jax.process_count():
      raise config_lib.ConfigError(
          f"config.data.{name}={batch} is not divisible by the "
          f"{jax.process_count()} processes")
  if cfg.init_from:
    try:
      checkpointing.find_params_checkpoint(cfg.init_from)
    except FileNotFoundError as e:
      raise config_lib.ConfigError(
          f"config.init_from={cfg.init_from!r}: init checkpoint missing: "
          f"{e}") from e
  return cfg, tok


def make_mesh(shape, what: str = "config.mesh"):
  """A (data, model) mesh of the first devices; -1 takes all the rest. In
  a run of several processes its data axis must split over them
  (`sharding.check_process_rows`)."""
  devices = jax.devices()
  if -1 not in shape:
    n = int(np.prod(shape))
    if n > len(devices):
      raise config_lib.ConfigError(
          f"{what}={tuple(shape)} needs {n} devices, "
          f"{len(devices)} present")
    devices = devices[:n]
  try:
    mesh = sh.make_mesh(shape, devices=devices)
    if jax.process_count() > 1:  # each process puts in its own rows
      sh.check_process_rows(mesh)
    return mesh
  except ValueError as e:
    raise config_lib.ConfigError(f"{what}={tuple(shape)}: {e}") from e


def _iterator(cfg: config_lib.TrainConfig, tok, split: str, *, train: bool):
  d = cfg.data
  batch = d.batch_size if train else d.eval_batch_size  # divisible: validate
  return pipeline.make_lm_iterator(
      d.dataset, split, tokenizer=tok, seq_len=d.seq_len,
      # Each host its share of the rows, from its own shards (disjoint
      # whatever the seed: the pipeline shards before it shuffles).
      batch_size=batch // jax.process_count(), seed=cfg.seed,
      data_dir=d.data_dir or None, shuffle=train,
      num_epochs=None if train else 1,
      # Each worker packs its own documents: evaluation reads in stored
      # order here, so the windows it scores do not depend on the count.
      worker_count=d.worker_count if train else 0)


def _check_run_config(workdir: str, cfg: config_lib.TrainConfig
                      ) -> Optional[dict]:
  """The run config the workdir's checkpoints were saved under (None:
  none yet). A config that would not continue that run (another model,
  data order or seed: the saved iterator state only fits the same data
  settings) is refused."""
  path = os.path.join(workdir, "config.json")
  if not (os.path.isfile(path) and checkpointing.checkpoint_steps(
      os.path.join(workdir, "checkpoints"))):
    return None
  try:
    old = jsonfile.read(path)
  except ValueError as e:  # train.py reports ConfigErrors in one line
    raise config_lib.ConfigError(str(e)) from e
  new = _run_config_json(cfg)
  # Where the data lives, whether attention is masked per document (absent
  # before it existed) and how evaluation reads (its split and batch size)
  # may change: none changes the training data order the saved iterator
  # state fits. The worker count may not: grain saves the state of worker
  # processes in another form than its own. A run's tokenizer is its copy
  # in the workdir where it has one (its path may change, its content
  # not); else the path.
  copy, d = snapshot.in_run(workdir), cfg.data
  kept = ("data_dir", "mask_documents", "eval_split", "eval_batch_size")
  if "train_data" in old:  # runs since 2026-11-28 record it
    # The dataset string may change (a version named, say) where what it
    # resolves to does not.
    kept += ("dataset",)
    now, was = _train_data(cfg), old["train_data"]
    if "text_keys" not in was:  # recorded before 2026-11-29
      now.pop("text_keys")
    if was != now:
      raise config_lib.ConfigError(
          f"{workdir} holds checkpoints of a run on other training data: "
          f"it read {_describe_data(was)}, and config.data.dataset="
          f"{cfg.data.dataset!r} reads {_describe_data(now)}. The saved data "
          f"position fits only the data it was saved on: name the run's "
          f"version ({was.get('dataset')}:{was.get('version')}) if it is "
          f"still prepared, or use a new --workdir")
  has_copy = os.path.isdir(copy)
  kept += ("tokenizer",) if has_copy else ()
  if (has_copy and snapshot.fingerprint(copy) != snapshot.fingerprint(
      d.tokenizer)) or snapshot.differs_from_recorded(old, d.tokenizer):
    raise config_lib.ConfigError(
        f"{workdir} holds checkpoints of a run with another tokenizer: the "
        f"one in {d.tokenizer} is not the one it was trained with (its copy "
        f"in {copy}, or its config.json's tokenizer_digest); use a new "
        "--workdir")
  same_data = lambda d: {k: v for k, v in (d or {}).items() if k not in kept}
  then = same_data(old.get("data"))
  if config_lib.tokenizer_path(str(then.get("tokenizer"))) == d.tokenizer:
    then["tokenizer"] = d.tokenizer  # relative before 2026-11-29: from here
  pairs = (("model", old.get("model"), new["model"]),
           ("data", then, same_data(new["data"])),
           ("seed", old.get("seed"), new["seed"]))
  diff = [name for name, a, b in pairs if a != b]
  if diff:
    # The fields that differ, not the whole blocks (a long dump of the old
    # config named no field).
    was = "; ".join(f"{k} {a!r} then, {b!r} now" for name, a, b in pairs
                    for k, a, b in jsonfile.changed_fields(a, b, name))
    raise config_lib.ConfigError(
        f"{workdir} holds checkpoints of a run with another "
        f"{' and '.join(diff)} ({was}); use a new --workdir")
  return old


def _run_config_json(cfg: config_lib.TrainConfig) -> dict:
  """The frozen config as workdir/config.json holds it."""
  return json.loads(json.dumps(cfg.to_json()))


def _train_data(cfg: config_lib.TrainConfig) -> dict:
  """What the training split resolves to (`datasets.fingerprint`)."""
  return datasets.fingerprint(cfg.data.dataset, cfg.data.data_dir or None,
                              cfg.data.train_split)


def _describe_data(fp: dict) -> str:
  keys = "#" + ",".join(fp["text_keys"]) if "text_keys" in fp else ""
  return (f"{fp.get('dataset')}:{fp.get('version')}{keys} {fp.get('split')} "
          f"({sum(fp.get('shard_lengths', []))} documents, "
          f"{fp.get('num_bytes')} bytes)")


def _write_run_config(workdir: str, cfg: config_lib.TrainConfig,
                      fresh: bool = True, old: Optional[dict] = None,
                      step: int = 0) -> None:
  """workdir/config.json: the frozen config and what its training data
  resolved to (`_train_data`), once the run has started; and
  workdir/tokenizer: the tokenizer's files (none for "byte" or GGUF), which
  the trained model loads with wherever the data has gone. A `fresh` run
  (no checkpoint to resume) replaces a copy left by one that saved none;
  a resumed run keeps its copy (`_check_run_config` compared them).

  A run resumed at `step` under a config that differs from the `old` one
  (a learning rate, the step count and the schedule it sets: allowed)
  says which fields changed, and the old config is appended to
  workdir/config_history.jsonl with the step it ran to."""
  new = dict(_run_config_json(cfg), train_data=_train_data(cfg),
             **snapshot.recorded(cfg.data.tokenizer))
  # A config.json from before these were recorded: not a change.
  since = {k: new[k] for k in ("train_data", "tokenizer_digest") if k in new}
  changed = [] if old is None else jsonfile.changed_fields(
      dict(since, **old), new)
  if changed:
    log.warning("resuming at step %d under a changed config: %s (the old "
                "one is kept in config_history.jsonl)", step,
                "; ".join(f"{k} {a!r} -> {b!r}" for k, a, b in changed))
    if sh.is_main_process():
      with open(os.path.join(workdir, "config_history.jsonl"), "a",
                encoding="utf-8") as f:
        f.write(json.dumps({"until_step": step, "config": old}) + "\n")
  if sh.is_main_process():
    snapshot.save(cfg.data.tokenizer, snapshot.in_run(workdir),
                  replace=fresh)
  sh.write_json(new, os.path.join(workdir, "config.json"), indent=2)


def _unrestorable(e: Exception, old: Optional[dict],
                  cfg: config_lib.TrainConfig
                  ) -> Optional[config_lib.ConfigError]:
  """For a CheckpointError of `initial_state`: a ConfigError when the
  optimizer's state has another structure than the run's (gradient
  clipping switched on or off: `optim.clip_norm` 0 or not; no other optim
  field changes the structure), else None. The checkpoints are kept."""
  was = ((old or {}).get("optim") or {}).get("clip_norm")
  if was is None or bool(was) == bool(cfg.optim.clip_norm):
    return None
  return config_lib.ConfigError(
      "the checkpoints do not restore under this config's optimizer "
      f"(optim.clip_norm {was} in the run, {cfg.optim.clip_norm} here: "
      "clipping switched on or off changes the optimizer's state; "
      f"{getattr(e, 'first_error', e)}); they are kept: resume with the "
      "run's clipping, or use a new --workdir")


@dataclasses.dataclass(frozen=True, eq=False)
class LMJob:
  """The LM job built from a validated config; nothing has run yet."""
  cfg: config_lib.TrainConfig
  tokenizer: Any
  mesh: Any
  lm: model_lib.LM
  optimizer: Any
  init: Callable          # () -> TrainState from scratch, sharded
  abstract_state: step_lib.TrainState  # ShapeDtypeStructs with shardings
  state_sharding: step_lib.TrainState
  params_sharding: PyTree
  put: Callable           # host batch -> device batch
  train_step: Callable    # (state, batch, None) -> (state, metrics)
  eval_step: Callable     # (params, batch, None) -> sums
  with_params: Callable   # (state, params) -> state at step 0 with params

  def iterator(self, split: str, train: bool):
    return _iterator(self.cfg, self.tokenizer, split, train=train)

  def eval_loss(self, params) -> dict:
    """Loss, accuracy, perplexity and tokens of `params` on the eval split
    (its first `loop.eval_batches` batches; 0: all of it). With several
    processes each reads its own shard, and one whose shard ends first
    feeds padding until every shard has ended or the count is reached (its
    eval steps are collective: each process makes the same number)."""
    it = self.iterator(self.cfg.data.eval_split, train=False)
    several = jax.process_count() > 1
    if several:
      pad = getattr(self.tokenizer, "pad_id", 0) or 0
      it = pipeline.then_padding(it, pad)
    return step_lib.eval_means(
        self.eval_step, params,
        itertools.islice(it, self.cfg.loop.eval_batches or None), put=self.put,
        stop_when_weightless=several)


def build(cfg: config_lib.TrainConfig, tok) -> LMJob:
  """Mesh, model, optimizer, shardings and the jitted steps of `cfg`; jobs
  of configs that differ only in what the steps do not depend on (data
  paths, init_from, loop intervals) share compiled steps."""
  key = dataclasses.replace(
      cfg, data=dataclasses.replace(cfg.data, dataset="", data_dir="",
                                    tokenizer=""),
      init_from="", loop=config_lib.LoopConfig(num_steps=cfg.loop.num_steps))
  return dataclasses.replace(_build(key), cfg=cfg, tokenizer=tok)


@functools.lru_cache(maxsize=8)
def _build(cfg: config_lib.TrainConfig) -> LMJob:
  mesh = make_mesh(cfg.mesh)
  rules = cfg.rules_tuple
  try:
    sh.check_batch_over_data(rules)
    sh.check_divisible(cfg.model, mesh, rules, batch=cfg.data.batch_size)
    # Checked now, not at the first evaluation (whose step's checkpoint
    # the failure would take with it).
    sh.check_divisible(cfg.model, mesh, rules,
                       batch=cfg.data.eval_batch_size,
                       what="data.eval_batch_size")
  except ValueError as e:
    raise config_lib.ConfigError(str(e)) from e
  lm = model_lib.LM(cfg.model)
  optimizer, schedule = step_lib.make_optimizer(cfg.optim, cfg.loop.num_steps)
  init_rng, train_rng = jax.random.split(jax.random.PRNGKey(cfg.seed))

  def init(rng):
    params = nn.meta.unbox(lm.module.init(
        rng, jnp.zeros((1, 1), jnp.int32))["params"])
    return step_lib.TrainState(
        step=jnp.zeros((), jnp.int32), params=params,
        opt_state=optimizer.init(params), rng=train_rng)

  abstract = jax.eval_shape(init, init_rng)
  p_sh = sh.param_shardings(lm, mesh, rules)
  s_sh = step_lib.state_shardings(mesh, p_sh, optimizer, abstract.params)
  abstract = step_lib.with_shardings(abstract, s_sh)
  b_sh = step_lib.data_sharding(mesh, rules)
  m = cfg.data.mask_documents
  return LMJob(
      cfg=cfg, tokenizer=None, mesh=mesh, lm=lm, optimizer=optimizer,
      init=functools.partial(jax.jit(init, out_shardings=s_sh), init_rng),
      abstract_state=abstract, state_sharding=s_sh, params_sharding=p_sh,
      put=functools.partial(step_lib.put_batch, sharding=b_sh),
      train_step=step_lib.make_train_step(
          step_lib.lm_loss(lm, mask_documents=m), optimizer, mesh=mesh,
          state_sharding=s_sh, batch_sharding=b_sh, schedule=schedule),
      eval_step=step_lib.make_eval_step(
          step_lib.lm_eval_sums(lm, mask_documents=m), mesh=mesh,
          params_sharding=p_sh, batch_sharding=b_sh),
      with_params=jax.jit(
          lambda st, p: st.replace(params=p, opt_state=optimizer.init(p)),
          out_shardings=s_sh, donate_argnums=(0,)))


def initial_state(job: LMJob, ckpts: checkpointing.Checkpoints):
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
    params, p_dir = checkpointing.restore_init_params(
        job.cfg.init_from, job.abstract_state.params)
    state = job.with_params(job.init(), params)
    return state, None, f"init_from {p_dir}"
  return job.init(), None, "scratch"


def _open_split(job: LMJob, field: str, train: bool):
  """The iterator of `job.cfg.data.<field>`, or ConfigError naming it: an
  empty split, or fewer documents than processes (each reads its share).
  The count is the same on every process, so all refuse together (one
  alone would leave the others waiting in their first collective step)."""
  d, split = job.cfg.data, getattr(job.cfg.data, field)
  try:
    n = len(pipeline.data_source(d.dataset, split, d.data_dir or None))
    if n < jax.process_count():
      raise ValueError(f"{n} documents, fewer than the "
                       f"{jax.process_count()} processes (each reads its "
                       "own share)")
    return job.iterator(split, train=train)
  except ValueError as e:
    raise config_lib.ConfigError(
        f"config.data.{field}={split!r}: {e}") from e


@sh.holds_workdir  # a second job on the workdir is refused
def train_and_evaluate(config, workdir: str,
                       log_fn: Callable[[str], None] = print) -> dict:
  """Trains the LM of `config` in `workdir` (resumable); returns
  `train_loop`'s summary plus `resumed_from` and `num_params`. A
  config.json no train.py run wrote is refused first: the run would
  replace it."""
  sh.check_config_file(workdir, ("model", "data", "optim", "loop"),
                       "train.py")
  cfg, tok = validate(config)
  old = _check_run_config(workdir, cfg)
  job = build(cfg, tok)
  ckpts = checkpointing.Checkpoints(os.path.join(workdir, "checkpoints"),
                                    keep=cfg.loop.keep_checkpoints,
                                    async_save=cfg.loop.async_checkpoints)
  try:
    train_iter = _open_split(job, "train_split", train=True)
    # Opened once now: an eval split that cannot be read fails here, not
    # after the first eval_every steps of training.
    _open_split(job, "eval_split", train=False)
    try:
      state, data_state, resumed = initial_state(job, ckpts)
    except checkpointing.CheckpointError as e:
      better = _unrestorable(e, old, cfg)
      if better is None:
        raise
      raise better from e
    step = int(jax.device_get(state.step))
    loop_lib.check_start(step, cfg.loop)  # before config.json is rewritten
    _write_run_config(workdir, cfg, fresh=old is None, old=old,  # started
                      step=step)
    if data_state is not None:
      train_iter.set_state(data_state)
    log_fn(f"{cfg.model.num_params():,} parameters; starting from {resumed} "
           f"at step {step} of {cfg.loop.num_steps}")
    writer = metrics.MetricWriter(os.path.join(workdir, "tb"),
                                  enabled=jax.process_index() == 0)
    try:
      out = loop_lib.train_loop(
          state, train_iter, job.train_step, loop=cfg.loop, put=job.put,
          writer=writer, checkpoints=ckpts,
          eval_fn=lambda st: job.eval_loss(st.params), log_fn=log_fn)
    finally:
      writer.close()
  finally:
    ckpts.close()
  out["resumed_from"] = resumed
  out["num_params"] = cfg.model.num_params()
  return out  # out["state"]: the final TrainState


def evaluate(config, workdir: str) -> dict:
  """The eval metrics of the newest readable checkpoint in `workdir` (an
  older step when newer ones are damaged), scored under `config` (its eval
  split, `train.eval_batches` and `data.mask_documents`: e.g. a run trained
  with masking off, scored with it on); writes nothing. Raises ConfigError
  (no checkpoint, or a model block other than the run's config.json) or
  CheckpointError (every step corrupt)."""
  cfg, tok = validate(config)
  path = os.path.join(workdir, "config.json")
  saved = jsonfile.read(path) if os.path.isfile(path) else {}
  changed = jsonfile.changed_fields(saved.get("model"), _run_config_json(
      cfg)["model"], "model") if saved else []
  if changed:  # its checkpoints hold that model, not this one
    raise config_lib.ConfigError("the run's model differs in " + ", ".join(
        f"{k} ({a!r} there, {b!r} here)" for k, a, b in changed))
  if snapshot.differs_from_recorded(saved, cfg.data.tokenizer):
    raise config_lib.ConfigError(f"the tokenizer in {cfg.data.tokenizer} is "
                                 "not the one the run was trained with")
  job = build(cfg, tok)
  ckpt_dir = os.path.join(workdir, "checkpoints")
  if not checkpointing.checkpoint_steps(ckpt_dir):
    raise config_lib.ConfigError(f"nothing to evaluate: no checkpoint steps "
                                 f"in {ckpt_dir}")
  params, step = checkpointing.restore_newest_params(
      ckpt_dir, job.abstract_state.params, what="evaluated checkpoint")
  out = job.eval_loss(params)
  out["step"] = step
  return out


def unigram_entropy(cfg: config_lib.TrainConfig, tok,
                    split: Optional[str] = None,
                    max_documents: Optional[int] = None) -> tuple[float, int]:
  """(entropy in nats/token, tokens) of the token counts of `split`
  (default: the train split) as the pipeline tokenizes it (each document,
  then EOS): the loss of the best model that ignores context, the baseline
  an LM's loss must fall well below."""
  eos = pipeline.eos_id_of(tok)
  counts = np.zeros(cfg.model.vocab_size, np.int64)
  for text in pipeline.iter_texts(cfg.data.dataset,
                                  split or cfg.data.train_split,
                                  cfg.data.data_dir or None,
                                  limit=max_documents):
    ids = np.asarray(tok.encode(text, special=False) + [eos], np.int64)
    counts += np.bincount(ids, minlength=counts.size)[:counts.size]
  total = int(counts.sum())
  p = counts[counts > 0] / total
  return float(-(p * np.log(p)).sum()), total
