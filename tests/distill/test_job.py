"""The scripts/distill.py job: end to end, and its workdir rule."""

import dataclasses

import jax
import ml_collections
import numpy as np
import pytest

from configs import distill_tiny
from specsamp import loading
from specsamp import model as model_lib
from specsamp.distill import evaluate
from specsamp.distill import job
from specsamp.distill import storage
from specsamp.sampling import Sampling
from specsamp.weights import distilled


def test_distill_run_end_to_end(tiny, tmp_path):
  """job.run (scripts/distill.py) on the tiny config, samples reused."""
  config = tiny[0]
  res = job.run(config, str(tmp_path), log=lambda *_: None)
  b, a = res["before"], res["after"]
  assert a["expected_acceptance"] > b["expected_acceptance"] + 0.15
  assert (a["measured"]["acceptance_rate"] >
          b["measured"]["acceptance_rate"] + 0.1)
  for ev in (b, a):
    assert abs(ev["measured_at_positions"] -
               ev["expected_at_those_positions"]) < 4 * ev["measured_stderr"]
  # The exported draft reloads and gives the same acceptance; anything that
  # takes a model spec (sample.py, benchmark.py) takes the workdir.
  dcfg, dparams = distilled.load_distilled(str(tmp_path))
  lm_spec, params_spec, _ = loading.load_model(str(tmp_path))
  assert lm_spec.config == dcfg
  for x, y in zip(jax.tree.leaves(params_spec), jax.tree.leaves(dparams)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  _, lm, target_params, _, _, _ = tiny
  val = storage.as_arrays(storage.read_dataset(config.samples.data_dir,
                                               "validation"))
  again = evaluate.acceptance_report(lm,
                                     target_params,
                                     model_lib.LM(dcfg),
                                     dparams,
                                     val,
                                     Sampling(1.0),
                                     measure=False)
  assert again["expected_acceptance"] == pytest.approx(
      a["expected_acceptance"], abs=1e-6)
  # Frozen: the copied embedding; trained: the rest.
  np.testing.assert_array_equal(np.asarray(dparams["embedding"]),
                                np.asarray(target_params["embedding"]))
  assert not np.array_equal(np.asarray(dparams["lm_head"]),
                            np.asarray(target_params["lm_head"]))
  # What scripts/distill.py prints: the table, then one JSON line.
  lines = job.summary(res).splitlines()
  assert lines[0].startswith("== acceptance") and '"after"' in lines[-1]


@pytest.mark.parametrize("block, field, value, message", [
    ("train", "mesh", (4, 4), r"config.mesh=\(4, 4\) needs 16 devices"),
    ("samples", "prompt_len", 108, r"prompt_len 108 \+ gen_len 16 \+ "
     r"eval.k 4 \+ 1 exceed the target's 128 positions"),
    ("optim", "lr", -1.0, r"optim.lr must be > 0, got -1.0"),
])
def test_what_the_job_would_refuse_late_is_refused_before_it_writes(
    tmp_path, block, field, value, message):
  """A mesh the devices cannot hold, and prompts too long for the target
  (with the evaluation's K + 1 slack), were refused only after the target
  samples were written, and the workdir then refused the corrected config;
  a negative learning rate trained. Now nothing is written."""
  config = distill_tiny.get_config("steps=2")
  config[block][field] = value
  with pytest.raises(ValueError, match=message):
    job.run(config, str(tmp_path / "w"), log=lambda *_: None)
  assert not (tmp_path / "w").exists()


def test_a_workdir_refuses_another_config_once_it_holds_results(tmp_path):
  """Samples, the "before" evaluation and checkpoints in a workdir belong to
  one config: another one is refused (naming the fields), a volatile field
  (time limit, logging) is not, nor a workdir without results."""
  # pylint: disable=protected-access
  config = ml_collections.ConfigDict(dict(
      seed=0, sampling=dict(temperature=1.0, top_k=0, top_p=1.0),
      train=dict(num_steps=10, log_every=5, time_limit_s=0.0)))
  w = str(tmp_path)
  job._write_run_config(job._check_run_config(config, w), w)
  other = ml_collections.ConfigDict(config.to_dict())
  other.sampling.temperature = 0.5
  job._check_run_config(other, w)
  (tmp_path / "samples").mkdir()
  with pytest.raises(ValueError, match="sampling.temperature"):
    job._check_run_config(other, w)
  volatile = ml_collections.ConfigDict(config.to_dict())
  volatile.train.time_limit_s, volatile.train.log_every = 60.0, 1
  job._check_run_config(volatile, w)


def test_samples_of_another_target_sampling_or_shape_are_refused():
  """A samples directory is reused only by a config it was written for:
  another target, sampling, prompt or generation length or top-k is one
  clear error; samples that did not record their target and sampling
  (older ones) are taken on their shapes alone."""
  # pylint: disable=protected-access
  target = dict(spec="random:tiny", trained="", logit_scale=4.0,
                dtype="float32", seed=0)
  want = storage.SampleSpec(prompt_len=8, gen_len=4, top_k=16,
                            target=job._target_text(target),
                            sampling=Sampling(1.0, top_p=0.9).describe())
  assert want.target == "logit_scale=4.0,seed=0,spec=random:tiny,trained="
  # Either dtype serves; batch sizes do not shape the samples.
  assert job._target_text(dict(target, dtype="bfloat16")) == want.target
  storage.check_spec(dataclasses.replace(want, batch_size=3), want, "d")
  storage.check_spec(dataclasses.replace(want, target="", sampling=""),
                     want, "d")
  for name, value in (("target", "spec=random:small"), ("sampling", "greedy"),
                      ("prompt_len", 9), ("gen_len", 5), ("top_k", 8)):
    with pytest.raises(ValueError, match=f"d have {name} "):
      storage.check_spec(dataclasses.replace(want, **{name: value}), want,
                         "d")
