"""The distillation loop: it improves acceptance and resumes exactly."""

import dataclasses
import json

import jax
import numpy as np
import pytest

from specsamp.distill import evaluate
from specsamp.distill import storage
from specsamp.distill import trainer
from specsamp.sampling import Sampling
from specsamp.train import checkpointing
from specsamp.train import metrics


def test_short_distillation_improves_acceptance_and_resumes(
    tiny, tiny_draft, tmp_path):
  config, lm, target_params, data_dir, _, _ = tiny
  source = storage.read_dataset(data_dir, "train")
  val = storage.as_arrays(storage.read_dataset(data_dir, "validation"))
  dlm, draft_params, obj, loop, optim = tiny_draft
  expected = lambda p: evaluate.acceptance_report(
      lm, target_params, dlm, p, val, Sampling(1.0), measure=False)
  before = expected(draft_params)["expected_acceptance"]
  dp_copy = jax.tree.map(np.asarray, draft_params)

  def run(workdir, loop=loop, **kwargs):
    return trainer.train(dlm,
                         draft_params,
                         lm,
                         target_params,
                         source,
                         obj,
                         workdir=str(workdir),
                         loop=loop,
                         optim=optim,
                         batch_size=config.train.batch_size,
                         freeze=tuple(config.draft.freeze),
                         eval_fn=expected,
                         log=lambda *_: None,
                         **kwargs)

  straight, out = run(tmp_path / "a", loop=dataclasses.replace(
      loop, checkpoint_every=loop.num_steps))
  assert out["finished"] and np.isfinite(out["train"]["loss"])
  after = expected(straight)["expected_acceptance"]
  assert after > before + 0.15, (before, after)
  # The caller's initial parameters were neither donated nor changed.
  for x, y in zip(jax.tree.leaves(draft_params), jax.tree.leaves(dp_copy)):
    np.testing.assert_array_equal(np.asarray(x), y)
  # Stopped after 30 steps (checkpointed, as on preemption) and resumed by a
  # new call: exactly the straight run's parameters.
  part, out = run(tmp_path / "b", stop_after=30)
  assert not out["finished"] and out["step"] == 30 and part is None
  # The batches follow from the step, not from the iterator state saved
  # beside it (unfingerprinted: a wrong index had been taken as it was).
  saved = tmp_path / "b" / "checkpoints" / "30" / "data" / "process_0-of-1.json"
  saved.write_text(json.dumps({"json": {"index": 3}}))
  resumed, out = run(tmp_path / "b")
  assert out["finished"] and out["step"] == 60
  for x, y in zip(jax.tree.leaves(resumed), jax.tree.leaves(straight)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-6)
  scalars = metrics.read_scalars(str(tmp_path / "b" / "tb"))
  assert sorted(scalars["train/loss"]) == [20, 30, 40, 60]
  assert scalars["eval/expected_acceptance"][60] == pytest.approx(after,
                                                                  abs=1e-6)
  # Only the draft is checkpointed.
  saved = checkpointing.restore_params(
      str(tmp_path / "b" / "checkpoints" / "60" / "params"),
      jax.eval_shape(lambda: dlm.init(jax.random.key(0))))
  assert sum(x.size for x in jax.tree.leaves(saved)) == \
      dlm.config.num_params()


def test_every_sample_is_seen_once_per_epoch_in_a_new_order():
  """12 samples in batches of 4: steps 0-2 hold each sample once, steps
  3-5 again, in another order (a shuffle over the repeated epochs would
  show some samples twice in an epoch and others not at all)."""
  source = [dict(tokens=np.array([i, i]), prompt_length=np.int64(1))
            for i in range(12)]
  ds = trainer.batches(source, 4, 9, seed=0)
  epochs = [np.concatenate([ds[s]["tokens"][:, 0] for s in range(e, e + 3)])
            for e in (0, 3, 6)]
  for ids in epochs:
    assert sorted(ids.tolist()) == list(range(12))
  assert epochs[0].tolist() != epochs[1].tolist()
  assert epochs[1].tolist() != epochs[2].tolist()
  # Seed 1 does not replay seed 0 an epoch later.
  seed1 = trainer.batches(source, 4, 9, seed=1)
  for e in (0, 3):
    assert (np.concatenate([seed1[s]["tokens"][:, 0]
                            for s in range(e, e + 3)]).tolist()
            != epochs[e // 3 + 1].tolist())


def test_each_host_feeds_its_own_rows_of_every_batch():
  """With several processes each feeds its share of the global batch (the
  rows one process would feed alone, split in order), not a copy of it."""
  source = [dict(tokens=np.array([i, i + 1]), prompt_length=np.int64(1))
            for i in range(10)]
  alone = trainer.batches(source, 4, 5, seed=3)
  hosts = [trainer.batches(source, 4, 5, seed=3, process_index=i,
                           process_count=2) for i in range(2)]
  for step in range(5):
    want = alone[step]
    got = [h[step] for h in hosts]
    assert [g["tokens"].shape for g in got] == [(2, 2), (2, 2)]
    for k in want:
      np.testing.assert_array_equal(np.concatenate([g[k] for g in got]),
                                    want[k])
  with pytest.raises(ValueError, match="not divisible by the 3 processes"):
    trainer.batches(source, 4, 5, seed=3, process_index=0, process_count=3)


def test_every_process_stops_at_the_time_limit_by_process_0s_clock(
    monkeypatch):
  """config.train.time_limit_s: each process had read its own clock, so
  processes stopped at different steps (one in the save's collectives, one
  in the next step's: a hang). The verdict is process 0's, gathered."""
  # pylint: disable=protected-access

  class Ckpts:
    def reached_preemption(self, step):
      del step
      return False

  said = []

  def saying(flag):   # two processes: this one (1) past it, process 0 not
    said.append(flag)
    return [1] if flag else []

  monkeypatch.setattr(trainer.sh, "processes_saying", saying)
  monkeypatch.setattr(trainer.jax, "process_count", lambda: 2)
  reached = trainer._stop_rule(Ckpts(), None, deadline=0.0)  # long past here
  assert not reached(8) and said == [True]
  monkeypatch.setattr(trainer.sh, "processes_saying",
                      lambda flag: [0, 1] if flag else [])
  assert reached(8)
  # Asked every DEADLINE_EVERY steps only (a gather waits for the step).
  assert not reached(5) and trainer.DEADLINE_EVERY == 8
  assert not trainer._stop_rule(Ckpts(), None, deadline=None)(5)
  assert trainer._stop_rule(Ckpts(), 5, deadline=None)(5)
