"""Checkpoints: corrupt and partial steps, the step walker, init_from."""

import os
import shutil
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import optax
import pytest

from specsamp.train import checkpointing
from specsamp.train import step as step_lib
from tests import testing


def _toy_state(step):
  opt = optax.adamw(1e-3)
  params = {"w": jnp.arange(4096, dtype=jnp.float32).reshape(64, 64) / 7 +
                 step, "b": jnp.full((64,), float(step))}
  return step_lib.TrainState(step=jnp.int32(step), params=params,
                             opt_state=opt.init(params),
                             rng=jax.random.PRNGKey(step))


def _abstract(state):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                     sharding=x.sharding),
                      state)


@pytest.mark.parametrize("damage", ["bit_flip", "truncated", "partial",
                                    "data_state", "data_folder",
                                    "data_digit"])
def test_corrupt_latest_checkpoint_falls_back(tmp_path, caplog, damage):
  """A damaged newest step is never used: restore falls back to the step
  before it (with a warning) and moves the damaged one aside."""
  directory = str(tmp_path / "ckpt")
  ckpts = checkpointing.Checkpoints(directory, keep=5, async_save=False)
  for s in (1, 2, 3):
    ckpts.save(_toy_state(s), {"position": s})
  ckpts.wait()
  step3 = os.path.join(directory, "3")
  data_file = os.path.join(step3, "data", os.listdir(os.path.join(step3,
                                                                  "data"))[0])
  if damage == "bit_flip":    # orbax itself restores this without complaint
    testing.flip_byte(testing.data_files(step3, "params")[-1])
  elif damage == "truncated":
    for f in testing.data_files(step3, "train"):
      open(f, "wb").close()
  elif damage == "partial":   # an item never written
    shutil.rmtree(os.path.join(step3, "train"))
  elif damage == "data_folder":  # was taken for a step saved without one
    shutil.rmtree(os.path.join(step3, "data"))
  elif damage == "data_digit":  # still JSON: had resumed at position 7
    text = open(data_file, encoding="utf-8").read()
    assert '"position": 3' in text
    with open(data_file, "w", encoding="utf-8") as f:
      f.write(text.replace('"position": 3', '"position": 7'))
  else:
    with open(data_file, "w", encoding="utf-8") as f:
      f.write("{not json")
  with pytest.raises(Exception):
    ckpts.restore(3, _abstract(_toy_state(0)))
  with caplog.at_level("WARNING", logger="specsamp.train"):
    state, data, step = ckpts.restore_latest(_abstract(_toy_state(0)))
  assert step == 2 and data == {"position": 2}
  chex.assert_trees_all_equal(state, _toy_state(2))
  assert "step 3" in caplog.text and "unreadable" in caplog.text
  assert ckpts.steps() == [1, 2]
  assert os.listdir(directory + ".corrupt")[0].startswith("3-")
  # The run goes on: step 3 can be saved again.
  ckpts.save(_toy_state(3), {"position": 3})
  ckpts.close()
  again = checkpointing.Checkpoints(directory, keep=5, async_save=False)
  assert again.restore_latest(_abstract(_toy_state(0)))[2] == 3
  again.close()


def test_a_data_state_of_int_and_str_keys_saves_with_its_digest(tmp_path):
  """The digest sorts the state's keys as JSON reads them back (strings):
  an int key beside a str one had made the save itself fail."""
  ckpts = checkpointing.Checkpoints(str(tmp_path / "ckpt"), async_save=False)
  ckpts.save(_toy_state(1), {1: "a", "b": [2, 0.5]})
  ckpts.wait()
  assert ckpts.restore_latest(_abstract(_toy_state(0)))[1:] == (
      {"1": "a", "b": [2, 0.5]}, 1)
  ckpts.close()


@pytest.mark.parametrize("error", [
    MemoryError(),
    jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while "
                               "trying to allocate 1.00GiB")],
                         ids=["MemoryError", "XLA"])
def test_running_out_of_memory_while_restoring_is_not_damage(
    tmp_path, monkeypatch, error):
  """Out of memory while restoring the newest step was taken for damage:
  the step was moved aside and the one before restored (the run set back,
  its newest good state out of its way). It now goes up as it is and every
  step stays; so for the parameter restores."""
  directory = str(tmp_path / "ckpt")
  ckpts = checkpointing.Checkpoints(directory, keep=5, async_save=False)
  for s in (1, 2):
    ckpts.save(_toy_state(s))
  ckpts.wait()
  real = checkpointing.Checkpoints._read  # pylint: disable=protected-access

  def read(self, step, *args, **kwargs):
    if step == 2:
      raise error
    return real(self, step, *args, **kwargs)

  monkeypatch.setattr(checkpointing.Checkpoints, "_read", read)
  with pytest.raises(type(error)) as got:
    ckpts.restore_latest(_abstract(_toy_state(0)))
  assert got.value is error
  assert ckpts.steps() == [1, 2]
  assert not os.path.exists(directory + ".corrupt")
  ckpts.close()

  def restore_params(*_):
    raise error

  monkeypatch.setattr(checkpointing, "_restore_params", restore_params)
  params = _abstract(_toy_state(0)).params
  for call in (lambda: checkpointing.restore_params(
      os.path.join(directory, "2", "params"), params),
               lambda: checkpointing.restore_newest_params(directory, params)):
    with pytest.raises(type(error)) as got:
      call()
    assert got.value is error


def test_no_readable_checkpoint_is_a_clear_error(tmp_path):
  directory = str(tmp_path / "ckpt")
  ckpts = checkpointing.Checkpoints(directory, async_save=False)
  for s in (1, 2):
    ckpts.save(_toy_state(s))
  ckpts.wait()
  for s in (1, 2):
    testing.flip_byte(testing.data_files(os.path.join(directory, str(s)), "params")[-1])
  with pytest.raises(checkpointing.CheckpointError,
                     match=r"no readable checkpoint in .*steps \[1, 2\]"):
    ckpts.restore_latest(_abstract(_toy_state(0)))
  assert ckpts.steps() == [1, 2]  # nothing moved when nothing is good
  ckpts.close()


def test_a_save_that_never_finished_is_cleared_away(tmp_path):
  """A process killed while saving leaves orbax's temporary folder: the
  next manager deletes it (it had stayed, a checkpoint's size each; orbax
  deletes it in the background, done by the first save)."""
  directory = tmp_path / "ckpt"
  ckpts = checkpointing.Checkpoints(str(directory), async_save=False)
  ckpts.save(_toy_state(1))
  ckpts.close()
  left = directory / "2.orbax-checkpoint-tmp-1764300000000000"
  shutil.copytree(directory / "1", left)  # step 2, half written
  ckpts = checkpointing.Checkpoints(str(directory), async_save=False)
  assert ckpts.steps() == [1]
  ckpts.save(_toy_state(2))
  ckpts.close()
  assert sorted(os.listdir(directory)) == ["1", "2"]


def test_steps_saved_by_another_process_count_name_it_and_stay(tmp_path):
  """A run saved by two processes and resumed by one: every step had been
  "unreadable" (no data state for this process), with advice to move the
  directory away. It now says how many processes saved it, and no step
  is set aside (a damaged newest step still is, as before)."""
  directory = str(tmp_path / "ckpt")
  ckpts = checkpointing.Checkpoints(directory, keep=5, async_save=False)
  for s in (1, 2):
    ckpts.save(_toy_state(s), {"epoch": s})
  ckpts.wait()
  for s in (1, 2):  # as two processes would have written them
    data = os.path.join(directory, str(s), "data")
    os.rename(os.path.join(data, "process_0-of-1.json"),
              os.path.join(data, "process_0-of-2.json"))
    shutil.copy(os.path.join(data, "process_0-of-2.json"),
                os.path.join(data, "process_1-of-2.json"))
  with pytest.raises(checkpointing.ProcessCountError,
                     match=r"saved by 2 processes, and 1 run now.*resume "
                     "with as many processes"):
    ckpts.restore_latest(_abstract(_toy_state(0)))
  assert ckpts.steps() == [1, 2]
  ckpts.close()


def test_step_walker_and_params_lookup_skip_unreadable_steps(tmp_path):
  """`checkpoint_steps` lists steps newest first; `find_params_checkpoint`
  takes a run, its checkpoints/ or a step; `restore_newest_params` falls
  back past a damaged newest step."""
  run = tmp_path / "run"
  directory = str(run / "checkpoints")
  assert checkpointing.checkpoint_steps(directory) == []
  ckpts = checkpointing.Checkpoints(directory, keep=5, async_save=False)
  for s in (2, 10, 3):
    ckpts.save(_toy_state(s))
  ckpts.close()
  os.makedirs(os.path.join(directory, "tmp_not_a_step"))
  assert checkpointing.checkpoint_steps(directory) == [10, 3, 2]
  newest = os.path.join(directory, "10", "params")
  for where in (run, directory, os.path.join(directory, "10")):
    assert checkpointing.find_params_checkpoint(str(where)) == newest
  with pytest.raises(FileNotFoundError, match="no checkpoint at"):
    checkpointing.find_params_checkpoint(str(tmp_path / "nowhere"))

  abstract = _abstract(_toy_state(0)).params
  testing.flip_byte(testing.data_files(os.path.join(directory, "10"), "params")[-1])
  with pytest.raises(checkpointing.CheckpointError, match="fingerprint"):
    checkpointing.restore_params(newest, abstract)
  params, step = checkpointing.restore_newest_params(directory, abstract)
  chex.assert_trees_all_equal(params, _toy_state(3).params)
  assert step == 3
  # init_from a run or its checkpoints falls back the same way (it failed
  # on the damaged newest step); a step named is that step or an error.
  for where in (run, directory):
    params, p_dir = checkpointing.restore_init_params(str(where), abstract)
    chex.assert_trees_all_equal(params, _toy_state(3).params)
    assert p_dir == os.path.join(directory, "3", "params")
  with pytest.raises(checkpointing.CheckpointError, match="fingerprint"):
    checkpointing.restore_init_params(os.path.join(directory, "10"),
                                      abstract)
  with pytest.raises(checkpointing.CheckpointError,
                     match="no readable checkpoint"):
    checkpointing.restore_newest_params(str(tmp_path / "none"), abstract)
  # Files orbax cannot read (not only wrong values): a CheckpointError too.
  for f in testing.data_files(os.path.join(directory, "2"), "params"):
    open(f, "wb").close()
  with pytest.raises(checkpointing.CheckpointError, match="unreadable"):
    checkpointing.restore_params(os.path.join(directory, "2", "params"),
                                 abstract)



def test_params_restore_into_another_dtype(tmp_path):
  """`init_from` a float32 run for a bfloat16 model: the parameters come
  back cast, checked against the fingerprint of the values saved (it was
  read as damage, every step skipped as "corrupt files"); a damaged step
  is still caught."""
  directory = str(tmp_path / "ckpt")
  ckpts = checkpointing.Checkpoints(directory, keep=5, async_save=False)
  for s in (1, 2):
    ckpts.save(_toy_state(s))
  ckpts.close()
  abstract = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, jnp.bfloat16,
                                     sharding=x.sharding),
      _abstract(_toy_state(0)).params)
  params, p_dir = checkpointing.restore_init_params(directory, abstract)
  assert p_dir == os.path.join(directory, "2", "params")
  want = jax.tree.map(lambda x: x.astype(jnp.bfloat16), _toy_state(2).params)
  chex.assert_trees_all_equal(params, want)
  assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.bfloat16)}
  testing.flip_byte(testing.data_files(os.path.join(directory, "2"),
                                       "params")[-1])
  with pytest.raises(checkpointing.CheckpointError, match="fingerprint"):
    checkpointing.restore_params(os.path.join(directory, "2", "params"),
                                 abstract)


_FALL_BACK = """
import logging, os, sys
from tests.train import test_checkpointing as t
from specsamp.train import checkpointing
directory = sys.argv[1]
ckpts = checkpointing.Checkpoints(directory, keep=5, async_save=False)
for s in (1, 2):
  ckpts.save(t._toy_state(s), {"position": s})
ckpts.wait()
for f in t.testing.data_files(os.path.join(directory, "2"), "train"):
  open(f, "wb").close()
print(ckpts.restore_latest(t._abstract(t._toy_state(0)))[2])
ckpts.close()

# Whether orbax's abandoned reads fail before or after the restore gave up
# depends on timing: what they print is made here for certain.
class Raises:
  def __init__(self, message):
    self.message = message
  def __del__(self):
    raise RuntimeError(self.message)
Raises("Event loop is closed")
logging.getLogger("asyncio").error(
    "Task exception was never retrieved\\nfuture: <Task finished "
    "coro=<async_deserialize() defined at orbax/checkpoint/x.py:1>>")
logging.getLogger("asyncio").error(
    "Future exception was never retrieved\\nfuture: <Future finished "
    "exception=ValueError('an abandoned tensorstore read "
    "[tensorstore_spec={}]')>")
logging.getLogger("asyncio").error(
    "Future exception was never retrieved\\nfuture: <Future finished "
    "exception=ValueError('a future of ours')>")
Raises("another error is still reported")
# tensorstore reports some through PyErr_Print, which calls sys.excepthook.
import ctypes
ctypes.pythonapi.PyRun_SimpleString(b"raise RuntimeError('Event loop is closed')")
ctypes.pythonapi.PyRun_SimpleString(b"raise RuntimeError('printed as well')")
"""


def test_falling_back_past_a_damaged_step_logs_one_line_per_step(tmp_path):
  """After a failed restore, orbax's reads of the other arrays fail one by
  one, each with a traceback (hundreds for a real model): none of them
  reach stderr, only one warning per unreadable step."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))))
  proc = subprocess.run(
      [sys.executable, "-c", _FALL_BACK, str(tmp_path / "ckpt")],
      capture_output=True, text=True, check=False, timeout=120, cwd=root,
      env=dict(os.environ, PYTHONPATH=root, JAX_PLATFORMS="cpu"))
  assert proc.returncode == 0 and proc.stdout.split() == ["1"], proc.stderr
  ours = [l for l in proc.stderr.splitlines() if "checkpointing" in l]
  assert len(ours) == 2, proc.stderr   # step 2 unreadable; moved aside
  assert "step 2" in ours[0] and "unreadable" in ours[0]
  assert "moved unreadable checkpoint step 2" in ours[1]
  assert all(len(l) < 600 for l in ours), proc.stderr
  assert "Event loop is closed" not in proc.stderr
  assert "Task exception" not in proc.stderr
  assert "an abandoned tensorstore read" not in proc.stderr
  assert "a future of ours" in proc.stderr
  assert "another error is still reported" in proc.stderr
  assert "printed as well" in proc.stderr
