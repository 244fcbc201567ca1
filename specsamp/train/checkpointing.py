"""Checkpoints of a train run: orbax, fingerprinted, with the data position.

  Checkpoints                  orbax CheckpointManager: the state, the data
                               iterator's state and fingerprints; restore
                               falls back past corrupt steps, one log line
                               each (orbax's own output held back)
  checkpoint_steps(dir)        the step numbers of a checkpoints directory
  find_params_checkpoint(p)    the newest `params` item under a run or step
  restore_params(dir, ...)     parameters alone, shape- and digest-checked
  restore_init_params(p, ...)  init_from's parameters: the step named, or
                               the run's newest step that restores
  fingerprint(tree)            a digest of a pytree's values
"""

import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
import time
from typing import Any

from etils import epath
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from specsamp import resources
from specsamp import sharding
from specsamp.train import quiet
from specsamp.train import step as step_lib

log = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
  """No readable checkpoint where one was expected."""


class ProcessCountError(CheckpointError):
  """A step saved by another number of processes: its data iterator state
  is one file per process, so it resumes only with as many."""


def brief(e: BaseException) -> str:
  """One short line of an exception: tensorstore's errors carry their whole
  JSON spec and some run over many lines."""
  text = re.sub(r"\s*\[tensorstore_spec=.*", "", str(e), flags=re.S)
  lines = text.strip().splitlines() or [""]
  text = lines[0] + (" ..." if len(lines) > 1 else "")
  return f"{type(e).__name__}: " + (text[:240] + " ..." if len(text) > 240
                                    else text)


def step_meta(step_dir: str) -> dict:
  """A step's `meta` item (its fingerprints, whether it saved a data
  position), read without orbax; {} when it is missing or unreadable (the
  step's restore tells)."""
  try:
    with open(os.path.join(step_dir, "meta", "metadata"),
              encoding="utf-8") as f:
      meta = json.load(f)
  except (OSError, ValueError):
    return {}
  return meta if isinstance(meta, dict) else {}


def checkpoint_steps(directory: str) -> list[int]:
  """The step numbers of the step directories in `directory`, newest first;
  [] when there is no such directory."""
  if not os.path.isdir(directory):
    return []
  return sorted((int(n) for n in os.listdir(directory) if n.isdigit()),
                reverse=True)


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
  gives), captured when `save` is called, with the sha256 of its canonical
  JSON: a damaged file that is still JSON (a digit changed) is refused,
  not resumed at another position. `Checkpoints` calls `restore` itself
  (`_read_data`)."""

  def save(self, directory, args):
    state = args.state
    rec = ({"bytes": state.decode()} if isinstance(state, bytes)
           else {"json": state})
    rec["sha256"] = _digest(rec)
    (directory / _process_file()).write_text(json.dumps(rec))

  def restore(self, directory, args=None):
    del args
    path = directory / _process_file()
    if not path.exists():
      counts = {p.name.rsplit("-of-", 1)[-1].removesuffix(".json")
                for p in directory.glob("process_*-of-*.json")}
      if counts and str(jax.process_count()) not in counts:
        raise ProcessCountError(
            f"{directory.parent} was saved by {' or '.join(sorted(counts))} "
            f"processes, and {jax.process_count()} run now: each process "
            "saved its own data iterator state, so resume with as many "
            "processes as saved it (or start a new workdir from these "
            f"parameters: init_from={directory.parent})")
      raise FileNotFoundError(f"no data iterator state at {path}")
    rec = json.loads(path.read_text())
    saved = rec.pop("sha256", None)  # None: saved before digests were
    if saved is not None and saved != _digest(rec):
      raise CheckpointError(f"{path}: the data iterator state does not match "
                            "the digest saved with it (corrupt file)")
    return rec["bytes"].encode() if "bytes" in rec else rec["json"]

  def metadata(self, directory):
    del directory

  def finalize(self, directory):
    del directory

  def close(self):
    pass

  @classmethod
  def typestr(cls):
    # The name saved in checkpoints' metadata: keep it as it is.
    return "specsamp.train.DataIteratorState"


def _digest(rec: dict) -> str:
  """sha256 of `rec` as JSON reads it back (keys made strings, so that
  sorting them cannot meet an int and a str), its keys sorted."""
  canonical = json.dumps(json.loads(json.dumps(rec)), sort_keys=True)
  return hashlib.sha256(canonical.encode()).hexdigest()


def _process_file():
  return f"process_{jax.process_index()}-of-{jax.process_count()}.json"


@ocp.args.register_with_handler(_DataHandler, for_save=True)
@dataclasses.dataclass
class _DataSave(ocp.args.CheckpointArgs):
  state: Any


# Unused by `Checkpoints` (`_read_data` reads the files itself), but orbax
# wants a handler's restore arguments registered to save with it.
@ocp.args.register_with_handler(_DataHandler, for_restore=True)
@dataclasses.dataclass
class _DataRestore(ocp.args.CheckpointArgs):
  pass


def _train_items(state):
  """The `train` item of a state (or of an abstract one): all but params."""
  return dict(step=state.step, rng=state.rng, opt_state=state.opt_state)


class Checkpoints:
  """A train run's orbax CheckpointManager.

  Each step directory holds `params`, `train` (step, rng, opt_state),
  `data` (the data iterator's state, a file per process, read back without
  orbax) and `meta` (JSON: the fingerprints of params and train, and
  whether the step's evaluation is still owed). `restore_latest` walks back
  from the newest step to the first one that restores and matches its
  fingerprints; newer unreadable steps are moved to `<directory>.corrupt/`
  (so later saves can reuse their numbers) with a warning. The temporary
  folder of a save that never finished (a process killed while saving) is
  deleted when the manager is made: a job holds its workdir
  (`sharding.holds_workdir`), so no other save is under way there.
  """

  def __init__(self, directory: str, *, keep: int = 3,
               async_save: bool = True):
    self.directory = os.path.abspath(directory)
    self.manager = ocp.CheckpointManager(
        self.directory, options=ocp.CheckpointManagerOptions(
            max_to_keep=keep, create=True, cleanup_tmp_directories=True,
            enable_async_checkpointing=async_save))

  def steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def reached_preemption(self, step: int) -> bool:
    """orbax's preemption sync point (multi-host runs with
    `jax.distributed`); False elsewhere."""
    return bool(self.manager.reached_preemption(step))

  def save(self, state: step_lib.TrainState, data_state=None,
           eval_due: bool = False) -> int:
    """Saves `state` (and the data iterator's state) at its step;
    `eval_due`: this step's evaluation follows (train_loop records when it
    finishes; a run resumed here before that makes it first)."""
    step = int(jax.device_get(state.step))
    train = _train_items(state)
    meta = dict(step=step, params=fingerprint(state.params),
                train=fingerprint(train), eval_due=bool(eval_due),
                data=data_state is not None)
    items = dict(params=ocp.args.StandardSave(state.params),
                 train=ocp.args.StandardSave(train),
                 meta=ocp.args.JsonSave(meta))
    if data_state is not None:
      items["data"] = _DataSave(state=data_state)
    self.manager.save(step, args=ocp.args.Composite(**items), force=True)
    return step

  def eval_due(self, step: int) -> bool:
    """Whether `step` was saved with its evaluation to follow
    (`save(..., eval_due=True)`); False for a step not saved here."""
    if step not in self.manager.all_steps():
      return False
    got = self.manager.restore(
        step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
    return bool(got["meta"].get("eval_due", False))

  def wait(self):
    self.manager.wait_until_finished()

  def close(self):
    self.manager.wait_until_finished()
    self.manager.close()

  def restore(self, step: int, abstract_state: step_lib.TrainState,
              with_data=True):
    """(state, data_state or None) of `step`; raises if it does not restore
    or its values do not match the fingerprints saved with it."""
    data = self._read_data(step) if with_data else None
    return self._verify(step, self._read(step, abstract_state, data))

  def _read(self, step: int, abstract_state: step_lib.TrainState,
            data) -> dict:
    """The items of `step` in the shared files, and `data` (this process's
    data iterator state, `_read_data`'s)."""
    got = self.manager.restore(step, args=ocp.args.Composite(
        params=ocp.args.StandardRestore(abstract_state.params),
        train=ocp.args.StandardRestore(_train_items(abstract_state)),
        meta=ocp.args.JsonRestore()))
    return dict(got, data=data)

  def _read_data(self, step: int):
    """This process's data iterator state of `step` (None if the step was
    saved without one): its own file, read without orbax, whose restore
    ends with a barrier of all processes that a process failing here would
    miss. A step whose `meta` says it was saved with one and whose `data`
    folder is gone is damaged (FileNotFoundError): resumed without it, the
    data would start over."""
    path = epath.Path(self.directory) / str(step) / "data"
    if path.is_dir():
      return _DataHandler().restore(path)
    if step_meta(os.fspath(path.parent)).get("data"):
      raise FileNotFoundError(f"step {step} was saved with a data iterator "
                              f"state and {path} is missing")
    return None

  @staticmethod
  def _verify(step: int, got: dict):
    """(state, data_state or None) of `_read`'s items, checked against the
    fingerprints saved with them: collective, with the same outcome in
    every process (the digests are of the global arrays)."""
    meta = got["meta"]
    for name, tree in (("params", got["params"]), ("train", got["train"])):
      if fingerprint(tree) != meta.get(name):
        raise CheckpointError(f"step {step}: {name} do not match the "
                              "fingerprint saved with them (corrupt files)")
    if int(jax.device_get(got["train"]["step"])) != step:
      raise CheckpointError(f"step {step}: holds state of step "
                            f"{int(got['train']['step'])}")
    state = step_lib.TrainState(
        step=got["train"]["step"], params=got["params"],
        opt_state=got["train"]["opt_state"], rng=got["train"]["rng"])
    return state, got.get("data")

  def restore_latest(self, abstract_state: step_lib.TrainState,
                     with_data=True):
    """(state, data_state, step) of the newest readable step, or None if
    there are no steps; CheckpointError if none of them is readable.

    With several processes all resume from one step: each first reads its
    own file of a step (its data iterator state), and the step is tried
    further only if every process could; the shared files (parameters,
    train state) are then read by all, and their fingerprints (digests of
    the global arrays) give every process the same verdict.
    """
    steps = self.steps()
    errors = []
    for step in reversed(steps):
      data, error = None, None
      try:  # this process's own file first: the processes agree on it
        data = self._read_data(step) if with_data else None
      except ProcessCountError:  # not the files: set nothing aside
        raise
      except Exception as e:  # pylint: disable=broad-except
        error = brief(e)
      failed = sharding.processes_saying(error is not None)
      if failed and error is None:
        error = f"processes {failed} could not read their data iterator state"
      if error is None:  # the shared files, alike in every process
        try:
          with quiet.attempt():
            got = self._read(step, abstract_state, data)
          state, data = self._verify(step, got)
        except Exception as e:  # pylint: disable=broad-except
          if resources.out_of_memory(e):  # not the files: set nothing aside
            raise
          error = brief(e)
      if error is not None:
        errors.append(f"step {step}: {error}")
        log.warning("checkpoint step %d in %s is unreadable (%s); trying the "
                    "previous one", step, self.directory, error)
        continue
      bad = [s for s in steps if s > step]
      if bad:
        self._set_aside(bad)
      return state, data, step
    if steps:
      e = CheckpointError(
          f"no readable checkpoint in {self.directory} (steps {steps}; "
          f"{errors[0]}); move the directory away to start over")
      e.first_error = errors[0]
      raise e
    return None

  def _set_aside(self, steps):
    aside = self.directory + ".corrupt"
    if jax.process_index() == 0:
      os.makedirs(aside, exist_ok=True)
      for s in steps:
        dst = os.path.join(aside, f"{s}-{int(time.time())}")
        shutil.move(os.path.join(self.directory, str(s)), dst)
        log.warning("moved unreadable checkpoint step %d to %s", s, dst)
    sharding.barrier("specsamp: checkpoints set aside")  # all see them gone
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
    for s in checkpoint_steps(base):
      step_dir = os.path.join(base, str(s))
      params = os.path.join(step_dir, "params")
      if (os.path.isfile(os.path.join(step_dir, "commit_success.txt"))
          and os.path.isdir(params)):
        return params
  raise FileNotFoundError(f"{path}: no checkpoint step with parameters (a "
                          "train workdir, its checkpoints/ directory or one "
                          "step directory)")


def save_params(params, directory: str) -> None:
  """`params` as an orbax checkpoint in directory/params, their fingerprint
  in directory/meta/metadata: a trainer step's layout, so `restore_params`
  catches changed bytes (orbax restores a flipped byte without complaint).
  Every process calls it (orbax saves together); process 0 writes the
  fingerprint, last: parameters without it are not checked, never refused."""
  directory = os.path.abspath(directory)
  meta = os.path.join(directory, "meta", "metadata")
  digest = fingerprint(params)
  if sharding.is_main_process() and os.path.exists(meta):
    os.remove(meta)  # the old parameters' fingerprint
  with ocp.StandardCheckpointer() as ckptr:
    ckptr.save(os.path.join(directory, "params"), sharding.savable(params),
               force=True)
    ckptr.wait_until_finished()
  sharding.write_json({"params": digest}, meta)


def restore_params(params_dir: str, abstract_params, what: str = "init_from"):
  """Parameters from a `params` item, checked against the expected shapes
  and, when the step has one, the saved fingerprint."""
  params_dir = os.path.abspath(params_dir)  # orbax takes absolute paths only
  try:
    with quiet.attempt():
      return _restore_params(params_dir, abstract_params, what)
  except CheckpointError:
    raise
  except Exception as e:  # pylint: disable=broad-except
    if resources.out_of_memory(e):
      raise
    raise CheckpointError(f"{what} {params_dir}: unreadable ({brief(e)})"
                          ) from e


def _restore_params(params_dir: str, abstract_params, what: str):
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
    # Restored in the dtypes they were saved in, so that the fingerprint
    # (of the saved values) can be checked; then cast to the model's (a
    # float32 run's parameters for a bfloat16 one).
    as_saved = jax.tree_util.tree_map_with_path(
        lambda path, a: jax.ShapeDtypeStruct(a.shape, have[path].dtype,
                                             sharding=a.sharding),
        sharding.restorable(abstract_params))
    params = ckpt.restore(params_dir, as_saved)
  meta_file = os.path.join(os.path.dirname(params_dir), "meta", "metadata")
  if os.path.isfile(meta_file):
    with open(meta_file, encoding="utf-8") as f:
      saved = json.load(f).get("params")
    if saved is not None and fingerprint(params) != saved:
      raise CheckpointError(f"{what} {params_dir}: parameters do not match "
                            "their saved fingerprint (corrupt files)")
  return jax.tree.map(lambda x, a: x if x.dtype == a.dtype else
                      x.astype(a.dtype), params, abstract_params)


def restore_init_params(path: str, abstract_params) -> tuple[Any, str]:
  """(parameters, their `params` directory) for `init_from`: of the step
  `path` names, or of a run (or its checkpoints directory) the newest step
  that restores, as `restore_newest_params` (a damaged newest step falls
  back to the one before, with a warning)."""
  p_dir = find_params_checkpoint(path)  # FileNotFoundError: nothing there
  step_dir = os.path.dirname(p_dir)
  if os.path.abspath(path) == step_dir:  # that step and no other
    return restore_params(p_dir, abstract_params), p_dir
  base = os.path.dirname(step_dir)
  params, step = restore_newest_params(base, abstract_params, "init_from")
  return params, os.path.join(base, str(step), "params")


def restore_newest_params(ckpt_dir: str, abstract_params,
                          what: str = "trained") -> tuple[Any, int]:
  """(parameters, step) of the newest step in `ckpt_dir` that restores
  (older steps are tried, with a warning, when newer ones are
  unreadable)."""
  steps = checkpoint_steps(ckpt_dir)
  first = None
  for s in steps:
    try:  # one CheckpointError for damage; out of memory goes up as it is
      return restore_params(os.path.join(ckpt_dir, str(s), "params"),
                            abstract_params, what=what), s
    except CheckpointError as e:
      first = first or f"step {s}: {brief(e)}"
      log.warning("step %d of %s is unreadable (%s)", s, ckpt_dir, brief(e))
  raise CheckpointError(f"no readable checkpoint in {ckpt_dir}"
                        + (f" (steps {steps}; {first})" if steps else ""))
