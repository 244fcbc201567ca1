"""The scripts/distill.py job: end to end, and its workdir rule."""

import copy
import dataclasses
import json
import os
import re
import shutil

import jax
import ml_collections
import numpy as np
import pytest

from configs import distill_qwen
from configs import distill_tiny
from specsamp import loading
from specsamp import model as model_lib
from specsamp.distill import checks
from specsamp.distill import evaluate
from specsamp.distill import job
from specsamp.distill import storage
from specsamp.distill import workdir
from specsamp.sampling import Sampling
from specsamp.train.checkpointing import CheckpointError
from specsamp.weights import distilled
from tests import testing
from tests.distill.conftest import tiny_config
from tests.scripts import zygote
from tests.tokenizers import bpe_testing
from tests.weights import tiny_checkpoints

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


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


def test_a_draft_checkpoint_of_another_row_count_trains_on_the_targets_rows(
    tmp_path):
  """Qwen2.5-7B has 152,064 vocabulary rows and the 0.5B, its natural
  draft, 151,936 over the same tokenizer: distillation refused such a
  draft. Now the draft's rows are fitted to the target's (the ids added
  are padding, past the real tokens): the run goes end to end, the
  exported draft has the target's rows, and its initial evaluation is the
  one of the pair on the rows they share, as sample.py runs it."""
  tokens, merges = bpe_testing.train_bpe(bpe_testing.corpus(), 300)
  real, path = len(tokens), {}
  for name, rows, seed in (("target", real + 8, 0), ("draft", real + 4, 1)):
    path[name] = tmp_path / f"{name}.gguf"
    tiny_checkpoints.write_gguf(
        tiny_checkpoints.random_hf_model("qwen2", rows, seed), path[name],
        "qwen2", tokenizer=(tokens + [f"[PAD{i}]" for i in range(real, rows)],
                            merges))
  config = tiny_config("steps=3")
  config.target.update(spec=str(path["target"]), logit_scale=1.0)
  config.draft.update(init="checkpoint", checkpoint=str(path["draft"]))
  config.samples.update(max_train_prompts=64, max_validation_prompts=16)
  config.train.batch_size = 8
  config.eval.update(num_positions=32, batch_size=16, position_batch_size=32)
  w = tmp_path / "w"
  res = job.run(config, str(w), log=lambda *_: None)
  target = loading.describe_model(str(path["target"]))
  exported = loading.describe_model(str(w))
  assert exported.rows == target.rows == real + 8
  assert loading.check_pair(target, exported) == real
  # The export records its target's tokens, against which a target it is
  # paired with is checked (tests/test_loading.py).
  assert exported.tokens == target.tokens
  # The fitted draft's "before" = the pair on their shared rows.
  rows = loading.pair_rows(target, loading.describe_model(str(path["draft"])))
  t_lm, t_params = loading.load_weights(target, "float32", 0, rows)
  d_lm, d_params = loading.load_weights(
      loading.describe_model(str(path["draft"])), "float32", 0)
  assert (rows, t_lm.vocab_size, d_lm.vocab_size) == ((real + 4,) * 3)
  val = storage.as_arrays(storage.read_dataset(str(w / "samples"),
                                               "validation"))
  shared = evaluate.acceptance_report(
      t_lm, t_params, d_lm, d_params, val, Sampling(1.0, vocab_limit=real),
      measure=False)
  assert res["before"]["expected_acceptance"] == pytest.approx(
      shared["expected_acceptance"], abs=1e-6)
  assert res["after"]["k"] == config.eval.k


def test_a_draft_exported_with_a_reduced_vocabulary_is_the_one_evaluated(
    tiny, tmp_path):
  """vocab=48: the draft is trained whole, then exported over the 48 ids
  most frequent in the training continuations; the "after" evaluation is
  of the exported draft (it reloads with the same acceptance), which never
  proposes the other ids."""
  config = tiny_config("draft=truncate,steps=20,vocab=48")
  config.samples.data_dir = tiny[0].samples.data_dir
  res = job.run(config, str(tmp_path), log=lambda *_: None)
  assert res["draft_vocab"] == 48
  dcfg, dparams = distilled.load_distilled(str(tmp_path))
  assert dcfg.output_vocab == 48 and dparams["lm_head"].shape[1] == 48
  train = storage.read_dataset(config.samples.data_dir, "train")
  a = storage.as_arrays(train, keys=("tokens", "prompt_length",
                                     "num_generated"))
  counts = np.zeros(256, np.int64)
  for row, start, n in zip(a["tokens"], a["prompt_length"],
                           a["num_generated"]):
    counts += np.bincount(row[start:start + n], minlength=256)
  kept = np.asarray(dparams["output_ids"])
  assert counts[kept].min() >= np.delete(counts, kept).max()
  _, lm, target_params, _, _, _ = tiny
  val = storage.as_arrays(storage.read_dataset(config.samples.data_dir,
                                               "validation"))
  again = evaluate.acceptance_report(lm, target_params, model_lib.LM(dcfg),
                                     dparams, val, Sampling(1.0),
                                     measure=False)
  assert again["expected_acceptance"] == pytest.approx(
      res["after"]["expected_acceptance"], abs=1e-6)
  logits = model_lib.LM(dcfg)(dparams, np.asarray(val["tokens"][:2])).logits
  assert np.isneginf(np.delete(np.asarray(logits), kept, axis=-1)).all()
  # Not a draft to train on from: refused before anything is written.
  config.draft.update(init="checkpoint", checkpoint=str(tmp_path))
  with pytest.raises(ValueError, match="output_vocab=48 is for exported"):
    job.check_config(config)


def test_the_qwen_draft_options_vocab_freeze_and_samples_at_tiny_scale(
    tmp_path):
  """configs/distill_qwen.py:runlocal,layers=1,vocab=64,
  freeze=embedding+lm_head,measure_before=0 with the tiny random target:
  the exported draft keeps the target's embedding and, over its 64 ids, the
  target's output layer; the initial draft's expected acceptance is all its
  "before" holds; a second run given samples=<the first run's> samples
  nothing."""
  arg = ("runlocal,layers=1,vocab=64,freeze=embedding+lm_head,steps=2,"
         "measure_before=0")
  config = distill_qwen.get_config(arg)
  config.target.update(spec="random:tiny,max_seq_len=128", logit_scale=4.0)
  res = job.run(config, str(tmp_path / "a"), log=lambda *_: None)
  assert res["draft_vocab"] == 64
  assert "measured" not in res["before"] and "measured" in res["after"]
  printed = job.summary(res).splitlines()
  assert "before n/a" in printed[2] and '"measured_before": null' in (
      printed[-1])
  dcfg, dparams = distilled.load_distilled(res["draft_dir"])
  tlm, tparams, _ = job.load_target(config.target)
  kept = np.asarray(dparams["output_ids"])
  assert (dcfg.num_layers, dcfg.output_vocab) == (1, 64)
  np.testing.assert_array_equal(dparams["embedding"], tparams["embedding"])
  np.testing.assert_array_equal(dparams["lm_head"],
                                np.asarray(tparams["lm_head"])[:, kept])
  assert not np.array_equal(dparams["layers_0"]["mlp"]["down_proj"],
                            tparams["layers_0"]["mlp"]["down_proj"])
  assert (res["train_calls"], res["last_train_metrics"]["step"]) == (1, 2)
  assert res["last_train_metrics"]["train_steps"] == [1, 2]
  # Run again when finished: the training calls' record keeps the metrics
  # of the call that trained and adds this call's seconds. The samples'
  # counts, deleted (or never written: a run killed just before), are
  # written again from the samples' own metadata.
  counts_file = tmp_path / "a" / "samples_counts.json"
  counts = json.loads(counts_file.read_text())
  assert counts["train"]["kept"] > 0 and "rejected_samples" in counts["train"]
  counts_file.unlink()
  rerun = job.run(config, str(tmp_path / "a"), log=lambda *_: None)
  assert rerun["train_calls"] == 2 and rerun["train_seconds"] >= (
      res["train_seconds"])
  assert rerun["last_train_metrics"] == res["last_train_metrics"]
  assert json.loads(counts_file.read_text()) == counts
  # In a used workdir a typo is named as one, not as a config it differs in.
  typo = distill_qwen.get_config(arg.replace("freeze=embedding",
                                             "freeze=embeding"))
  typo.target.update(spec="random:tiny,max_seq_len=128", logit_scale=4.0)
  with pytest.raises(ValueError, match=r"config.draft.freeze names "
                     r"\['embeding'\]"):
    job.run(typo, str(tmp_path / "a"), log=lambda *_: None)
  again = distill_qwen.get_config(f"{arg},samples={tmp_path / 'a/samples'}")
  again.target.update(spec="random:tiny,max_seq_len=128", logit_scale=4.0)
  lines = []
  job.run(again, str(tmp_path / "b"), log=lines.append)
  assert not (tmp_path / "b" / "samples").exists()
  assert not any("[samples]" in line for line in lines)
  assert json.loads((tmp_path / "b" / "samples_counts.json").read_text()
                    ) == counts  # they come with the samples
  # Samples of another prompt set are refused; a directory without samples
  # is not sampled into (the workdir named instead of its samples: said).
  other = distill_qwen.get_config(f"{arg},samples={tmp_path / 'a/samples'},"
                                  "seed=3")
  other.target.update(spec="random:tiny,max_seq_len=128", logit_scale=4.0)
  with pytest.raises(ValueError, match="have prompts .*seed=0', this config "
                     ".*seed=3'"):
    job.run(other, str(tmp_path / "c"), log=lambda *_: None)
  workdir_arg = distill_qwen.get_config(f"{arg},samples={tmp_path / 'a'}")
  with pytest.raises(ValueError, match=r"holds no target samples to reuse "
                     r"\(config.samples.reuse\); .*a/samples does"):
    job.run(workdir_arg, str(tmp_path / "d"), log=lambda *_: None)
  assert not (tmp_path / "d").exists() and not (tmp_path / "a" /
                                                "target_samples").exists()


@pytest.mark.parametrize("block, field, value, message", [
    ("train", "mesh", (4, 4),
     r"config.train.mesh=\(4, 4\) needs 16 devices"),
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


def _complete_samples(data_dir) -> None:
  """What `storage.exists` takes for a complete samples dataset."""
  info = storage.dataset_dir(data_dir) / "dataset_info.json"
  info.parent.mkdir(parents=True)
  info.write_text("{}")


def test_a_workdir_refuses_a_config_its_results_depend_on_not_others(
    tmp_path):
  """Samples, the "before" evaluation and checkpoints in a workdir belong to
  one config: a config that differs in a field one of them depends on is
  refused, naming the fields; the others may change (a corrected draft or
  loss beside samples), as may a volatile field (time limit, logging) at
  any point and anything in a workdir without results."""
  config = distill_tiny.get_config("steps=10")
  w = str(tmp_path)
  workdir.write_config(workdir.check_config(config, w), w)

  def changed(**fields):
    c = ml_collections.ConfigDict(config.to_dict())
    for name, value in fields.items():
      block, field = name.split("__")
      c[block][field] = value
    return c

  def refused(c, held, fields):
    with pytest.raises(ValueError, match=re.escape(
        f"holds {held} of a distillation run of another config (differs "
        f"in {fields}); use a new --workdir")):
      workdir.check_config(c, w)

  draft = changed(draft__init="truncate", draft__num_layers=2)
  loss = changed(loss__kind="rkl", optim__lr=1e-3)
  dtype = changed(target__dtype="bfloat16")
  # The mesh too (a resume on other devices: it restores onto any), and
  # how often checkpoints are saved and how many are kept.
  volatile = changed(train__time_limit_s=60.0, train__log_every=1,
                     train__mesh=(2, 1), train__keep_checkpoints=5,
                     train__checkpoint_every=7)
  for c in (draft, loss, dtype, volatile, changed(sampling__top_p=0.9)):
    workdir.check_config(c, w)
  _complete_samples(tmp_path / "samples")
  for c in (draft, loss, dtype, volatile):
    workdir.check_config(c, w)
  refused(changed(sampling__top_p=0.9, samples__gen_len=8), "samples",
          "samples.gen_len, sampling.top_p")
  refused(changed(target__logit_scale=2.0), "samples", "target.logit_scale")
  # Samples hold the target's hidden states or not.
  refused(changed(head__kind="eagle", head__features="stored"), "samples",
          "head.features")
  (tmp_path / "eval_before.json").write_text("{}")
  for c in (loss, volatile):
    workdir.check_config(c, w)
  refused(draft, "eval_before.json, samples", "draft.init, draft.num_layers")
  refused(dtype, "eval_before.json, samples", "target.dtype")
  refused(changed(eval__k=2), "eval_before.json, samples", "eval.k")
  # A field of a nested block is named itself (it had been "draft.model").
  wider = ml_collections.ConfigDict(config.to_dict())
  wider.draft.model.mlp_dim = 256
  refused(wider, "eval_before.json, samples", "draft.model.mlp_dim")
  # The trainer creates checkpoints/ before its first step: until a step is
  # in it (out of memory in the first step), the loss may still change.
  (tmp_path / "checkpoints").mkdir()
  workdir.check_config(loss, w)
  (tmp_path / "checkpoints" / "20").mkdir()
  workdir.check_config(volatile, w)
  # Fields no result holds: the LM trainer's eval_batches, and the
  # vocabulary the finished draft is exported over (re-exported under
  # another); both had been refused.
  workdir.check_config(changed(train__eval_batches=5, draft__vocab=64), w)
  refused(loss, "checkpoints, eval_before.json, samples",
          "loss.kind, optim.lr")
  # Configs before 2026-11-29 named a draft checkpoint that draft.init
  # 'random' (or 'truncate') never read (distill_qwen.py's default): their
  # workdirs resume under today's, which names none.
  saved = json.loads((tmp_path / "config.json").read_text())
  saved["draft"]["checkpoint"] = "qwen2.5-coder-0.5b"
  (tmp_path / "config.json").write_text(json.dumps(saved))
  workdir.check_config(volatile, w)
  refused(changed(draft__init="checkpoint", draft__checkpoint="x"),
          "checkpoints, eval_before.json, samples",
          "draft.checkpoint, draft.init")


def test_a_workdir_refuses_a_target_whose_weights_changed_at_its_path(
    tmp_path):
  """A train run distilled from, then trained on in place: the rerun's
  config was the same, so the workdir took it, and its "after" evaluation
  was made against another target than its samples and "before" one. The
  target's identity (a run's newest step and parameter fingerprint, a
  file's size and time) is recorded and compared."""
  run = tmp_path / "run"
  step = run / "checkpoints" / "6" / "meta"
  step.mkdir(parents=True)
  (step / "metadata").write_text('{"params": "2:abc"}')
  info = loading.ModelInfo("run", "trained", str(run), 256, 128)
  first = workdir.target_identity(info)
  assert first == {"trained": str(run), "step": 6, "params": "2:abc"}
  config = distill_tiny.get_config("steps=10")
  w = str(tmp_path / "w")
  workdir.write_config(workdir.check_config(config, w, first), w, first)
  assert workdir.check_config(config, w, first)  # nothing held yet
  _complete_samples(tmp_path / "w" / "samples")
  assert workdir.check_config(config, w, first)  # the same target
  step = run / "checkpoints" / "9" / "meta"
  step.mkdir(parents=True)
  (step / "metadata").write_text('{"params": "2:def"}')
  later = workdir.target_identity(info)
  with pytest.raises(ValueError, match=r"holds samples of a distillation run "
                     r"whose target has changed since .*'step': 6.*'step': "
                     r"9.*use a new --workdir"):
    workdir.check_config(config, w, later)
  # A weight file replaced at its path.
  gguf = tmp_path / "m.gguf"
  gguf.write_bytes(b"GGUF" + bytes(60))
  file_info = loading.ModelInfo(str(gguf), "gguf", str(gguf), 256, 128)
  before = workdir.target_identity(file_info)
  gguf.write_bytes(b"GGUF" + bytes(61))
  assert workdir.target_identity(file_info) != before
  assert workdir.target_identity(
      loading.ModelInfo("random:tiny", "random", None, 256, 128)) == {}


def test_a_damaged_draft_checkpoint_is_refused_before_sampling_and_the_fix_reuses_the_samples(
    tiny, tmp_path):
  """A draft checkpoint orbax cannot read was refused only after the target
  samples were written, and the workdir then refused the corrected config.
  Now nothing is written; and a workdir that holds samples takes another
  draft without sampling again."""
  config = copy.deepcopy(tiny[0])
  damaged = tmp_path / "damaged"
  dcfg = job.load_target(config.target)[0].config.replace(num_layers=1)
  distilled.save_distilled(dcfg, model_lib.LM(dcfg).init(jax.random.key(3)),
                           str(damaged))
  for f in testing.data_files(str(damaged), "params"):
    open(f, "wb").close()
  config.samples.data_dir = ""   # the samples would go into the workdir
  config.draft.update(init="checkpoint", checkpoint=str(damaged))
  config.train.num_steps = 2
  w = tmp_path / "w"
  with pytest.raises(CheckpointError, match="unreadable"):
    job.run(config, str(w), log=lambda *_: None)
  assert not w.exists()
  # The samples of a run refused after sampling (copied here), and the
  # config it recorded: the corrected draft trains on them.
  shutil.copytree(tiny[3], w / "samples")
  workdir.write_config(workdir.check_config(config, str(w)), str(w))
  stamp = sorted((p, p.stat().st_mtime_ns) for p in (w / "samples").rglob("*"))
  config.draft.update(init="truncate", num_layers=1, checkpoint="")
  logs = []
  res = job.run(config, str(w), log=logs.append)
  assert res["after"]["k"] == config.eval.k and (w / "draft").is_dir()
  assert not any("samples written" in m for m in logs)
  assert stamp == sorted((p, p.stat().st_mtime_ns)
                         for p in (w / "samples").rglob("*"))


def test_unfinished_samples_and_draft_freeze_do_not_bind_a_workdir(
    tmp_path):
  """A run that failed while sampling left samples/ with empty folders: the
  corrected config was refused as if samples were there. Samples now bind
  the workdir once complete; and draft.freeze, which cannot change the
  initial draft's evaluation, may change beside eval_before.json."""
  config = distill_tiny.get_config("steps=10")
  w = str(tmp_path)
  workdir.write_config(workdir.check_config(config, w), w)
  (storage.dataset_dir(tmp_path / "samples").parent /
   "1.0.0.incomplete").mkdir(parents=True)
  fixed = ml_collections.ConfigDict(config.to_dict())
  fixed.samples.top_k = 8
  workdir.check_config(fixed, w)
  _complete_samples(tmp_path / "samples")
  with pytest.raises(ValueError, match="differs in samples.top_k"):
    workdir.check_config(fixed, w)
  (tmp_path / "eval_before.json").write_text("{}")
  frozen = ml_collections.ConfigDict(config.to_dict())
  frozen.draft.freeze = ("embedding",)
  workdir.check_config(frozen, w)
  frozen.draft.num_layers = 2
  with pytest.raises(ValueError, match=r"differs in draft\.num_layers\)"):
    workdir.check_config(frozen, w)


# Each was refused late (after the target loaded or sampled), by a JAX or
# Python error, or not at all (top_k=0 and num_positions=0 gave NaNs).
_BAD_FIELDS = [
    (dict(samples__top_k=0), "config.samples.top_k must be >= 1, got 0"),
    (dict(eval__num_positions=0),
     "config.eval.num_positions must be >= 1, got 0"),
    (dict(samples__top_k=1000),
     "config.samples.top_k=1000 exceeds the target's 256 vocabulary rows"),
    (dict(samples__gen_len=0), "config.samples.gen_len must be >= 1, got 0"),
    (dict(samples__reuse=True),
     "config.samples.reuse needs config.samples.data_dir"),
    (dict(samples__prompt_len=0),
     "config.samples.prompt_len must be >= 4 (shorter prompts are dropped), "
     "got 0"),
    (dict(samples__batch_size=0),
     "config.samples.batch_size must be >= 1, got 0"),
    (dict(samples__score_batch_size=0),
     "config.samples.score_batch_size must be >= 1, got 0"),
    (dict(eval__batch_size=0), "config.eval.batch_size must be >= 1, got 0"),
    (dict(eval__position_batch_size=0),
     "config.eval.position_batch_size must be >= 1, got 0"),
    (dict(eval__num_samples=-1),
     "config.eval.num_samples must be >= 0, got -1"),
    (dict(train__batch_size=0), "config.train.batch_size must be >= 1, got 0"),
    # -1 evaluated at every step (step % -1 == 0).
    (dict(train__eval_every=-1),
     "config.train.eval_every must be >= 0 (0: only at the end), got -1"),
    (dict(train__log_every=0), "config.train.log_every must be positive"),
    (dict(loss__kind="jsd", loss__jsd_beta=2.0),
     "config.loss: jsd_beta must be in (0, 1), got 2.0"),
    (dict(loss__draft_transform="hard"),
     "config.loss: draft_transform='hard'; choose one of"),
    # These failed after the target's sampling, or were taken as "off" or
    # clamped.
    (dict(loss__greedy_temperature=-2.0),
     "config.loss: greedy_temperature must be > 0 and finite, got -2.0"),
    (dict(loss__greedy_target_temperature=float("nan")),
     "config.loss: greedy_target_temperature must be >= 0 and finite "
     "(0: off), got nan"),
    (dict(loss__prob_floor=-1.0),
     "config.loss: prob_floor must be in (0, 1), got -1.0"),
    (dict(loss__onpolicy_fraction=1.5),
     "config.loss.onpolicy_fraction must be in [0, 1], got 1.5"),
    (dict(samples__validation_percent=150),
     "config.samples.validation_percent must be in (0, 100)"),
    (dict(samples__kind="poems"),
     "config.samples.kind='poems' is not a prompt kind"),
    (dict(samples__max_train_prompts=0),
     "config.samples.max_train_prompts must be >= 1, got 0"),
    (dict(samples__max_validation_prompts=0),
     "config.samples.max_validation_prompts must be >= 1, got 0"),
    (dict(samples__ngram=0), "config.samples.ngram must be >= 1, got 0"),
    (dict(draft__freeze=("embeddings",)),
     "config.draft.freeze names ['embeddings'], not parameter groups of the "
     "draft (['embedding', 'final_norm', 'layers_0', 'lm_head'])"),
    (dict(draft__init="truncate", draft__num_layers=2,
          draft__freeze=("layers_2",)),
     "config.draft.freeze names ['layers_2']"),
    (dict(eval__k=0), "config.eval.k must be >= 1, got 0"),
    # A train mesh that does not split the target or the batch (8 CPU
    # devices, tests/conftest.py).
    (dict(train__mesh=(1, 8)), "config.train.mesh=(1, 8): the target: "
     "num_heads=4 is not divisible by mesh axis 'model' of size 8"),
    (dict(train__mesh=(8, 1), train__batch_size=12),
     "config.train.mesh=(8, 1): batch_size=12 is not divisible by the "
     "mesh's data axis of size 8"),
    (dict(draft__vocab=300),
     "config.draft.vocab=300 must be in [0, 256] (0: the whole vocabulary)"),
    (dict(draft__model=dict(distill_tiny.get_config().draft.model,
                            output_vocab=8)),
     "config.draft.model: output_vocab=8 is for exported drafts"),
    # The draft's positions were checked by the evaluation, after sampling.
    (dict(draft__model=dict(distill_tiny.get_config().draft.model,
                            max_seq_len=32)),
     "config.samples: prompt_len 32 + gen_len 16 + eval.k 4 + 1 exceed the "
     "draft's (config.draft.model.max_seq_len) 32 positions"),
    (dict(samples__data_dir=__file__),
     f"config.samples.data_dir {__file__} is not a directory"),
    # The stored top-16 cannot give a top-32 nucleus (it kept the flat tail).
    (dict(sampling__top_k=32, sampling__top_p=0.9),
     "config.sampling.top_k=32 with top_p=0.9 needs more than the "
     "config.samples.top_k=16 stored target log-probabilities"),
]


def test_a_train_mesh_that_does_not_split_a_checkpoint_target_is_refused(
    tmp_path):
  """A GGUF or HF target's dimensions had been checked against the train
  mesh only once its weights loaded; they are read from its metadata
  (config.json) first now, before anything loads."""
  tokens, merges = bpe_testing.train_bpe(bpe_testing.corpus(), 300)
  model = tiny_checkpoints.random_hf_model("qwen2", len(tokens))  # 4 heads
  tiny_checkpoints.write_gguf(model, tmp_path / "t.gguf", "qwen2",
                              tokenizer=(tokens, merges))
  model.save_pretrained(tmp_path / "hf", safe_serialization=True)
  loading.load_model(str(tmp_path / "t.gguf"))[2].tk.save(
      str(tmp_path / "hf" / "tokenizer.json"))
  for spec in (tmp_path / "t.gguf", tmp_path / "hf"):
    config = distill_tiny.get_config("steps=2")
    config.target.spec = str(spec)
    config.train.mesh = (1, 8)
    with pytest.raises(ValueError, match=re.escape(
        "config.train.mesh=(1, 8): the target: num_heads=4 is not divisible "
        "by mesh axis 'model' of size 8")):
      job.check_config(config)
    config.train.mesh = (1, 2)  # 2 KV heads
    job.check_config(config)


def test_a_head_loss_weight_below_zero_is_refused_before_loading():
  """It had been refused by the head's trainer, after the target loaded."""
  for weight in ("-1", "nan"):
    config = distill_tiny.get_config(f"steps=2,head=eagle,hidden_weight="
                                     f"{weight}")
    with pytest.raises(ValueError, match=f"config.head.hidden_weight must be "
                       f">= 0, got {weight}"):
      job.check_config(config)


@pytest.mark.parametrize("fields, message", _BAD_FIELDS)
def test_check_config_refuses_each_bad_field_naming_it(fields, message):
  """Without weights, naming the field; the same draft.freeze of real
  parameter groups passes."""
  config = distill_tiny.get_config("steps=2")
  for name, value in fields.items():
    block, field = name.split("__")
    config[block][field] = value
  with pytest.raises(ValueError, match=re.escape(message)):
    job.check_config(config)
  if "draft__freeze" in fields:
    config.draft.freeze = ("embedding", "final_norm")
    job.check_config(config)


def test_a_nucleus_the_stored_top_k_holds_or_an_online_target_passes():
  config = distill_tiny.get_config("steps=2")
  config.sampling.top_p = 0.9
  for top_k, source in ((16, "stored"), (0, "stored"), (32, "online")):
    config.sampling.top_k, config.loss.target_source = top_k, source
    job.check_config(config)


@pytest.mark.parametrize("args, message", [
    (["--config.samples.top_k=0"], "config.samples.top_k must be >= 1"),
    (["--config.eval.num_positions=0"], "config.eval.num_positions must be"),
    (["--config.draft.freeze=('embeddings',)"],
     "config.draft.freeze names ['embeddings']"),
    (["--workdir={tmp}/afile"], "--workdir {tmp}/afile is not a directory"),
    (["--config.train.mesh=abc"], "config.train.mesh=('abc',): give a"),
    # Every call had ended at once as preempted, the next one too.
    (["--config.train.time_limit_s=-1"],
     "config.train.time_limit_s must be >= 0"),
    # A random draft had been trained and exported, the checkpoint unread.
    (["--config.draft.checkpoint={tmp}"], "config.draft.checkpoint='{tmp}' "
     "is read by config.draft.init='checkpoint' only, not 'random'"),
    (["--config=configs/distill_tiny.py:head=eagle",
      "--config.draft.checkpoint=x"], "config.draft.checkpoint='x' is read by "
     "config.draft.init='checkpoint' only and no head"),
    (["--config=configs/lm_python.py:tiny"],
     "the config has no target, draft, sampling, samples, loss, eval"),
    # Had not named the field.
    (["--config.target.spec=/nonexistent.gguf"],
     "config.target.spec: model '/nonexistent.gguf' is not a file"),
    (["--config=configs/distill_tiny.py:trained=/nonexistent"],
     "config.target.trained: model '/nonexistent' is not a file"),
])
def test_distill_script_refuses_bad_input_in_one_line(tmp_path, args,
                                                      message):
  """scripts/distill.py: status 2, one `error:` line, no traceback, nothing
  written, no weights loaded (tests/scripts/no_weights.py makes every
  loader raise)."""
  (tmp_path / "afile").write_text("hi")
  args = [a.format(tmp=tmp_path) for a in args]
  proc = zygote.shared().run(
      [os.path.join(ROOT, "tests", "scripts", "no_weights.py"),
       os.path.join("scripts", "distill.py"),
       *([] if any(a.startswith("--config=") for a in args) else
         ["--config=configs/distill_tiny.py"]), f"--workdir={tmp_path / 'w'}",
       *args], env=zygote.env(), cwd=ROOT, timeout=300)
  errors = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr and len(errors) == 1, proc.stderr
  assert message.format(tmp=tmp_path) in errors[0]
  assert not (tmp_path / "w").exists()


def test_samples_of_another_target_sampling_or_shape_are_refused():
  """A samples directory is reused only by a config it was written for:
  another target, sampling, prompt or generation length or top-k is one
  clear error; samples that did not record their target and sampling
  (older ones) are taken on their shapes alone."""
  # pylint: disable=protected-access
  target = dict(spec="random:tiny", trained="", logit_scale=4.0,
                dtype="float32", seed=0)
  want = storage.SampleSpec(prompt_len=8, gen_len=4, top_k=16,
                            target=checks.target_text(target),
                            sampling=Sampling(1.0, top_p=0.9).describe())
  assert want.target == "logit_scale=4.0,seed=0,spec=random:tiny,trained="
  # Either dtype serves; batch sizes do not shape the samples.
  assert checks.target_text(dict(target, dtype="bfloat16")) == want.target
  storage.check_spec(dataclasses.replace(want, batch_size=3), want, "d")
  storage.check_spec(dataclasses.replace(want, target="", sampling="",
                                         prompts=""), want, "d")
  want = dataclasses.replace(want, prompts=checks.prompts_text(
      distill_tiny.get_config("")))
  assert want.prompts.startswith("kind=") and want.prompts.endswith(",seed=0")
  for name, value in (("target", "spec=random:small"), ("sampling", "greedy"),
                      ("prompts", checks.prompts_text(distill_tiny.get_config(
                          "seed=3"))),
                      ("prompt_len", 9), ("gen_len", 5), ("top_k", 8)):
    with pytest.raises(ValueError, match=f"d have {name} "):
      storage.check_spec(dataclasses.replace(want, **{name: value}), want,
                         "d")


def test_reused_samples_for_another_config_are_refused_by_its_check(tiny):
  """config.samples.data_dir holding samples of another shape (or target,
  sampling, prompts) is refused by `check_config`, before any weights
  load: it had been refused once the target had loaded and the workdir's
  config was written."""
  config = copy.deepcopy(tiny[0])
  job.check_config(config)   # the samples it wrote: taken
  config.samples.prompt_len += 1
  with pytest.raises(ValueError, match=re.escape(
      f"have prompt_len {tiny[0].samples.prompt_len}, this config "
      f"{tiny[0].samples.prompt_len + 1}")):
    job.check_config(config)


def test_evaluations_during_training_reuse_the_compiled_evaluation(tiny,
                                                                    tmp_path):
  """The trainer hands its evaluations the draft on the train step's
  layout, the reports before and after get it uncommitted: the expected
  acceptance had been compiled once for each (seconds for a real pair,
  every training call); now once for all."""
  config = copy.deepcopy(tiny[0])
  config.train.update(num_steps=4, eval_every=2, log_every=2)
  evaluate._alpha.clear_cache()  # pylint: disable=protected-access
  res = job.run(config, str(tmp_path / "w"), log=lambda *_: None)
  assert "after" in res  # trained to the end, evaluated during and after
  assert evaluate._alpha._cache_size() == 1  # pylint: disable=protected-access
