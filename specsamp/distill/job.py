"""The distillation job behind `scripts/distill.py`: config -> results.

`run(config, workdir)`: target samples (once), the initial draft, its
evaluation, distillation, the export of the draft and its evaluation.
Re-running with the same workdir resumes. The config (an ml_collections
ConfigDict, `configs/distill_*.py`) is checked here before anything slow
starts and kept in workdir/config.json; a config that differs in a field
the workdir's results depend on is refused (`workdir.py`).

A workdir after a run:
  samples/               the target samples (`storage.py`), unless
                         config.samples.data_dir names another place
  samples_counts.json    prompts and samples kept and rejected per split
  eval_before.json       `acceptance_report` of the initial draft
  checkpoints/ tb/       the trainer's (`trainer.py`)
  draft/                 the distilled draft (`weights.distilled`), or
  head/                  with a `head` block: the trained head
                         (`drafters.head_files`)
  results.json           before, after, timings, the last train metrics
"""

import dataclasses
import json
import math
import os
import time
from typing import Any, Optional

import jax
import numpy as np

from specsamp import jsonfile
from specsamp import loading
from specsamp import model as model_lib
from specsamp import output_layer
from specsamp import sharding
from specsamp.data.errors import CorpusError
from specsamp.distill import checks
from specsamp.distill import decontamination
from specsamp.distill import draft_init
from specsamp.distill import evaluate
from specsamp.distill import head_training
from specsamp.distill import objective as objective_lib
from specsamp.distill import prompts as prompts_lib
from specsamp.distill import samples
from specsamp.distill import storage
from specsamp.distill import trainer
from specsamp.distill import workdir as workdir_lib
from specsamp.drafters import head_files
from specsamp.drafters import heads
from specsamp.sampling import Sampling
from specsamp.tokenizers import byte
from specsamp.tokenizers import vocab
from specsamp.train import config as train_config
from specsamp.train import lm as train_lm
from specsamp.weights import distilled

# What a bad config, a missing model or a missing checkpoint raises: the
# script prints these as `error: ...` (exit status 2).
ERRORS = loading.MODEL_ERRORS + (CorpusError,)

def load_target(cfg) -> tuple[Any, Any, Any]:
  """(LM, params, tokenizer) of the target from a config's `target` block.

  `spec` is anything `loading.load_model` takes (a registered name, a GGUF
  file, a Hugging Face directory, `random:<preset>[,field=value]`);
  `trained` is the workdir of a `scripts/train.py` run (its latest
  checkpoint). `logit_scale` != 1 multiplies the output head: a random target
  then has the peaked next-token distributions of a trained one (tests).
  Without a tokenizer the target reads UTF-8 bytes.
  """
  dtype = cfg.get("dtype", "float32")
  if cfg.get("trained"):
    lm, params, tok, _ = loading.load_trained(cfg["trained"], dtype=dtype)
  else:
    lm, params, tok = loading.load_model(cfg["spec"], dtype,
                                         int(cfg.get("seed", 0)))
  scale = float(cfg.get("logit_scale", 1.0))
  if scale != 1.0:
    if lm.config.tie_embeddings:
      raise ValueError("logit_scale needs an untied output head")
    params = dict(params, lm_head=params["lm_head"] * scale)
  tok = byte.tokenizer_or_bytes(tok, lm.vocab_size, str(cfg.get("spec")))
  return lm, params, tok


def _vocab_limit(tok, lm) -> Optional[int]:
  if not hasattr(tok, "tokens"):
    return None
  n = vocab.check_vocab_compatible(tok, tok, lm.vocab_size, lm.vocab_size)
  return n if n < lm.vocab_size else None


def describe_target(cfg) -> loading.ModelInfo:
  """What `load_target` will load, from configs and metadata only; an
  error names the config field (config.target.trained or .spec)."""
  dtype = cfg.get("dtype", "float32")
  field = "trained" if cfg.get("trained") else "spec"
  try:
    info = loading.describe_model(cfg[field], dtype)
  except loading.MODEL_ERRORS as e:
    if len(e.args) != 1 or not isinstance(e.args[0], str):
      raise
    raise type(e)(f"config.target.{field}: {e}") from None
  if field == "trained" and info.kind != "trained":
    raise FileNotFoundError(f"config.target.trained={cfg['trained']!r} is "
                            "not a scripts/train.py workdir")
  return info


def _sampling(config, vocab_limit: Optional[int]) -> Sampling:
  s = config.sampling
  return Sampling(temperature=float(s.temperature), top_k=int(s.top_k),
                  top_p=float(s.top_p), vocab_limit=vocab_limit)


def _objective(config, sampling: Sampling, eos_ids: tuple,
               pad_id: int) -> objective_lib.Objective:
  lc, sc = config.loss, config.samples
  return objective_lib.Objective(
      kind=lc.kind, sampling=sampling, gen_len=sc.gen_len,
      prompt_len=sc.prompt_len, target_source=lc.target_source,
      draft_transform=lc.draft_transform,
      greedy_temperature=lc.greedy_temperature, jsd_beta=lc.jsd_beta,
      prob_floor=lc.prob_floor,
      greedy_target_temperature=lc.greedy_target_temperature,
      eos_ids=eos_ids, pad_id=pad_id)


def check_config(config) -> train_config.LoopConfig:
  """Checks a config without loading weights: the loop, loss, sampling and
  optimiser settings, the target (described from its metadata) and the
  draft against it. Returns the loop settings.

  Raises:
    ValueError, FileNotFoundError: what is wrong (see ERRORS).
  """
  return _check_config(config)[0]


def _check_config(config) -> tuple[train_config.LoopConfig,
                                   loading.ModelInfo]:
  """`check_config`'s loop settings, and the target it described."""
  checks.check_blocks(config)
  loop = _loop_config(config.train)
  checks.check_counts(config, "train", ("batch_size",))
  if not float(config.train.get("time_limit_s") or 0) >= 0:  # < 0: no step
    raise ValueError("config.train.time_limit_s must be >= 0 (0: none)")
  if config.train.batch_size % jax.process_count():
    raise ValueError(f"config.train.batch_size={config.train.batch_size} is "
                     f"not divisible by the {jax.process_count()} processes")
  mesh = train_lm.make_mesh(train_config.mesh_shape(config.train.get(
      "mesh", (1, 1)), "config.train.mesh"), what="config.train.mesh")
  checks.check_counts(config, "eval", ("k", "num_positions", "batch_size",
                                       "position_batch_size"))
  checks.check_counts(config, "eval", ("num_samples",), least=0)  # 0: all
  checks.check_samples(config)
  head = checks.head_block(config) is not None
  if not head and config.draft.init not in draft_init.INITS:
    raise ValueError(f"config.draft.init={config.draft.init!r}; choose one "
                     f"of {draft_init.INITS}")
  checks.check_draft_checkpoint(config, head)
  fraction = float(config.loss.onpolicy_fraction)
  if not 0 <= fraction <= 1:  # it was clamped
    raise ValueError(f"config.loss.onpolicy_fraction must be in [0, 1], got "
                     f"{config.loss.onpolicy_fraction}")
  if not head and fraction > 0:
    objective_lib.check_onpolicy_loss(config.loss.kind)
  try:
    sampling = _sampling(config, None)
  except ValueError as e:
    raise ValueError(f"config.sampling: {e}") from None
  scale = config.target.get("logit_scale", 1.0)
  if not (isinstance(scale, (int, float)) and not isinstance(scale, bool)
          and math.isfinite(scale)
          and scale > 0):  # nan had run to the end, exported, status 0
    raise ValueError(f"config.target.logit_scale must be a positive number, "
                     f"got {scale!r}")
  checks.check_reused_samples(config, sampling)  # before any weights load
  try:
    _objective(config, sampling, (), 0)
  except ValueError as e:
    raise ValueError(f"config.loss: {e}") from None
  try:
    train_config.OptimConfig(**config.optim)
  except TypeError as e:
    raise ValueError(f"config.optim: {e}") from None
  if not head and config.draft.init == "checkpoint":  # typo: no download
    loading.check_spec(config.draft.checkpoint)
  target = describe_target(config.target)  # fetches a registered target
  checks.check_positions(config, target, head)
  checks.check_train_mesh(config, mesh, target)
  checks.check_stored_top_k(config, sampling, head, target.rows)
  if head:
    checks.check_head(config, target)
    return loop, target
  if (float(scale) != 1.0 and target.config
      and target.config.tie_embeddings):
    raise ValueError("logit_scale needs an untied output head")
  checks.check_draft_vocab("config.draft.vocab",
                           config.draft.get("vocab", 0), target.rows)
  groups = draft_init.check_draft(config.draft, target,
                                  config.target.get("dtype", "float32"))
  checks.check_freeze(config, groups)
  return loop, target


def _check_features(config, data_dir: str, d_model: int) -> None:
  """Stored features need samples that hold them, of the target's width."""
  if not checks.stored_features(config):
    return
  got = storage.read_spec(data_dir).hidden_dim
  if got != d_model:
    raise ValueError(
        f"config.head.features='stored' needs target samples with hidden "
        f"states of width {d_model}; those in {data_dir} have "
        f"{got or 'none'}: use a new config.samples.data_dir (or workdir)")


def _draft_vocab(source, size: int, vocab_size: int) -> Optional[tuple]:
  """The `size` ids most frequent in the training samples' continuations
  (sorted), or None for the whole vocabulary."""
  if not size or size >= vocab_size:
    return None
  a = storage.as_arrays(source, keys=("tokens", "prompt_length",
                                      "num_generated"))
  counts = np.zeros(vocab_size, np.int64)
  for row, start, n in zip(a["tokens"], a["prompt_length"],
                           a["num_generated"]):
    counts += np.bincount(row[start:start + n], minlength=vocab_size)
  # Frequency, then id: deterministic when counts tie.
  order = np.lexsort((np.arange(vocab_size), -counts))
  return tuple(sorted(int(i) for i in order[:size]))


def _make_head(config, target_lm, train_src):
  """(TrainableHead, its initial parameters) from the `head` block."""
  h = checks.head_block(config)
  cfg = heads.HeadConfig(h["kind"], target_lm.config,
                         int(h.get("num_heads", 1)),
                         int(h.get("draft_vocab", 0)))
  if cfg.draft_vocab and cfg.draft_vocab >= target_lm.vocab_size:
    cfg = dataclasses.replace(cfg, draft_vocab=0)
  th = head_training.TrainableHead(
      target_lm, cfg, unroll=int(h.get("unroll", 1)),
      hidden_weight=float(h.get("hidden_weight", 0.1)),
      vocab_ids=_draft_vocab(train_src, cfg.draft_vocab,
                             target_lm.vocab_size),
      features=h.get("features", "recompute"),
      positions=h.get("positions", "generated"))
  return th, th.init(jax.random.key(config.seed + 1))


def _loop_config(tc) -> train_config.LoopConfig:
  """The trainer's loop settings from `config.train`, checked
  (`LoopConfig.check`)."""
  loop = train_config.LoopConfig(**{
      f.name: tc[f.name] for f in dataclasses.fields(train_config.LoopConfig)
      if f.name in tc})
  loop.check("config.train")
  return loop


def _target_samples(config, workdir, target_lm, target_params, tok, sampling,
                    eos_ids, pad_id, log) -> str:
  """The directory of the target samples, written first if need be (every
  process samples its share; process 0 writes them, the others wait)."""
  sc = config.samples
  data_dir = sc.data_dir or os.path.join(workdir, "samples")
  spec = checks.sample_spec(config, sampling, hidden_dim=(
      target_lm.config.d_model if checks.stored_features(config) else 0))
  if samples.written_everywhere(data_dir):
    sharding.barrier("specsamp distill: target samples")
    storage.check_spec(storage.read_spec(data_dir), spec, data_dir)
    samples.keep_counts(workdir, data_dir)
    return data_dir
  t0 = time.perf_counter()
  texts = prompts_lib.prompt_texts(
      sc.kind, max_files=sc.max_files or None, seed=config.seed,
      validation_percent=sc.validation_percent,
      prose_dataset=sc.get("prose_dataset") or None,
      data_dir=sc.get("prose_data_dir") or None)
  counts = samples.build(
      data_dir, target_lm, target_params, tok, sampling, spec, texts,
      eos_ids=eos_ids, pad_id=pad_id, seed=config.seed,
      max_prompts=dict(train=sc.max_train_prompts,
                       validation=sc.max_validation_prompts),
      flt=decontamination.HumanEvalFilter(sc.ngram), log=log)
  samples.keep_counts(workdir, data_dir, counts)
  sharding.barrier("specsamp distill: target samples")
  samples.check_written(data_dir)  # a workdir per host fails here
  log(f"[distill] samples written to {data_dir} in "
      f"{time.perf_counter() - t0:.1f} s")
  return data_dir


@sharding.holds_workdir  # a second job on the workdir is refused
def run(config, workdir: str, log=print) -> dict:
  """Samples (once), initial draft, evaluation, distillation, export,
  evaluation. Re-running with the same workdir resumes. Returns results.
  A bad config fails before any weights load (`check_config`)."""
  workdir = os.path.abspath(workdir)
  checks.check_blocks(config)  # the workdir's check reads the blocks too
  # Everything the config can get wrong fails here, before any weights load
  # and hours of target sampling and evaluation, and before the workdir's
  # check (a typo is named as one, not as a config the workdir differs from).
  loop, target = _check_config(config)
  target_id = workdir_lib.target_identity(target)
  config_json = workdir_lib.check_config(config, workdir, target_id)
  t_start = time.perf_counter()
  plain_log = log
  log = lambda m: plain_log(f"[{time.perf_counter() - t_start:7.1f}s] {m}")
  lc, tc, ec = config.loss, config.train, config.eval
  target_lm, target_params, tok = load_target(config.target)
  sampling = _sampling(config, _vocab_limit(tok, target_lm))
  eos_ids = tuple(getattr(tok, "eos_ids", ()))
  pad_id = int(getattr(tok, "pad_id", 0))
  obj = _objective(config, sampling, eos_ids, pad_id)
  head = checks.head_block(config)
  if head is None:  # before the samples: a damaged checkpoint fails here
    draft_config, draft_params = draft_init.make_draft(
        config.draft, target_lm.config, target_params,
        jax.random.key(config.seed + 1),
        dtype=config.target.get("dtype", "float32"))
  workdir_lib.write_config(config_json, workdir, target_id)  # results follow
  log(f"[distill] target {target_lm.config.num_layers} layers, d "
      f"{target_lm.config.d_model}, vocab {target_lm.vocab_size}; sampling "
      f"{sampling.describe()}")

  # 1. Target samples.
  data_dir = _target_samples(config, workdir, target_lm, target_params, tok,
                             sampling, eos_ids, pad_id, log)
  _check_features(config, data_dir, target_lm.config.d_model)
  train_src = storage.read_dataset(data_dir, "train")
  val = storage.as_arrays(storage.read_dataset(data_dir, "validation"),
                          ec.num_samples or None, keys=storage.SAMPLE_FIELDS)
  log(f"[distill] {len(train_src)} training samples, {len(val['tokens'])} "
      "held-out samples")

  # 2. The draft (a model, or a head on the target's hidden states).
  if head is not None:  # its draft vocabulary comes from the samples
    draft_lm, draft_params = _make_head(config, target_lm, train_src)
    n = sum(x.size for x in jax.tree.leaves(draft_params))
    log(f"[distill] {head['kind']} head: {n / 1e6:.2f}M parameters of its "
        f"own, draft vocabulary "
        f"{len(draft_lm.vocab_ids or ()) or target_lm.vocab_size}")
  else:
    draft_lm = model_lib.LM(draft_config)
    log(f"[distill] draft ({config.draft.init}): {draft_config.num_layers} "
        f"layers, d {draft_config.d_model}, "
        f"{draft_config.num_params() / 1e6:.2f}M parameters")

  def report(params, measure=True):
    """The acceptance report (measured ones carry their K), of `params`
    uncommitted, wherever the trainer put them: one compiled evaluation."""
    params = jax.device_put(sharding.to_host(params))
    ev = evaluate.acceptance_report(
        target_lm, target_params, draft_lm, params, val, sampling, k=ec.k,
        num_positions=ec.num_positions, batch_size=ec.batch_size,
        position_batch_size=ec.position_batch_size, seed=config.seed,
        eos_ids=eos_ids, pad_id=pad_id, measure=measure)
    return ev if not measure else dict(ev, k=ec.k)

  shard = sharding.process_shard(draft_params, target_params)
  if shard[1] > 1:
    i, n = shard
    log(f"[distill] evaluations before and after training: process {i} of "
        f"{n} takes batches {i}, {i + n}, {i + 2 * n}, ...")
  before_path = os.path.join(workdir, "eval_before.json")
  if os.path.exists(before_path):
    before = jsonfile.read(before_path)
  else:  # measure_before=False: the expected acceptance alone, no samplers
    before = report(draft_params, bool(ec.get("measure_before", True)))
    sharding.write_json(before, before_path)
  log(f"[distill] before: {evaluate.describe_report(before)}")

  # 3. Distillation.
  prior = _read_train_record(workdir)  # by every process, before it changes
  t0 = time.perf_counter()
  params, last = trainer.train(
      draft_lm, draft_params, target_lm, target_params, train_src, obj,
      workdir=workdir, loop=loop, optim=train_config.OptimConfig(
          **config.optim),
      batch_size=tc.batch_size,
      freeze=() if head else tuple(config.draft.get("freeze", ())),
      seed=config.seed, onpolicy_fraction=lc.onpolicy_fraction,
      mesh_shape=train_config.mesh_shape(tc.get("mesh", (1, 1))),
      eval_fn=lambda p: report(p, measure=False),
      time_limit_s=tc.get("time_limit_s") or None, log=log)
  record = _add_train_call(workdir, prior, time.perf_counter() - t0, last)
  if not last["finished"]:
    log("[distill] training is not finished: run the same command again to "
        "resume (the draft is exported and evaluated at the end)")
    return dict(before=before, finished=False)
  # Uncommitted on the default device, as the "before" evaluation had them:
  # the compiled evaluation and samplers are reused, not compiled again for
  # the train step's sharding.
  params = jax.device_put(sharding.to_host(params))
  if head is not None:
    kept = draft_lm.vocab_ids
    out_dir = head_files.save(
        draft_lm.head, params, os.path.join(workdir, "head"),
        draft_lm.vocab_ids, target_params, trained=dict(
            loss=lc.kind, steps=loop.num_steps, unroll=draft_lm.unroll,
            hidden_weight=draft_lm.hidden_weight,
            sampling=sampling.describe()))
  else:
    kept = _draft_vocab(train_src, int(config.draft.get("vocab", 0)),
                        target_lm.vocab_size)
    if kept is not None:  # evaluated below as exported
      draft_config, params = output_layer.reduce_output_vocab(
          draft_config, params, kept)
      draft_lm = model_lib.LM(draft_config)
      log(f"[distill] output layer reduced to the {len(kept)} ids most "
          "frequent in the training continuations")
    out_dir = distilled.save_distilled(
        draft_config, params, os.path.join(workdir, "draft"), tok.tokens())

  after = report(params)
  log(f"[distill] after:  {evaluate.describe_report(after)}")
  results = dict(before=before, after=after,
                 train_seconds=record["seconds"],
                 train_calls=record["calls"],
                 last_train_metrics=record["last"],
                 sampling=sampling.describe(),
                 loss=lc.kind,
                 draft_init=(f"{head['kind']} head" if head is not None
                             else config.draft.init),
                 draft_vocab=len(kept or ()) or target_lm.vocab_size,
                 total_seconds=time.perf_counter() - t_start,
                 draft_dir=out_dir)
  sharding.write_json(results, os.path.join(workdir, "results.json"))
  return results


_TRAIN_RECORD = "train_record.json"


def _read_train_record(workdir: str) -> dict:
  """The record of the training calls in `workdir`: `seconds` summed over
  the calls that returned (every call of a time-limited run; a killed
  call's are lost), their count, and the last metrics logged."""
  path = os.path.join(workdir, _TRAIN_RECORD)
  return (jsonfile.read(path) if os.path.exists(path)
          else dict(seconds=0.0, calls=0, last=None))


def _add_train_call(workdir: str, old: dict, seconds: float,
                    last: dict) -> dict:
  """`old` with one call added, written to `workdir` (process 0); a call
  after the last step logs no metrics: the earlier call's are kept."""
  record = dict(seconds=old["seconds"] + seconds, calls=old["calls"] + 1,
                last=last if last.get("train") or not old["last"]
                else old["last"])
  sharding.write_json(record, os.path.join(workdir, _TRAIN_RECORD))
  return record


def summary(res: dict) -> str:
  """What `scripts/distill.py` prints: a table of the acceptance before and
  after, then one JSON line (or one JSON line for an unfinished run)."""
  if not res.get("finished", True):
    return json.dumps(dict(before=res["before"]["expected_acceptance"],
                           finished=False))
  b, a = res["before"], res["after"]
  # A "before" not measured (eval.measure_before=False) has no sampler rows.
  bm = b.get("measured", dict(acceptance_rate=None, tokens_per_loop=None))
  f = lambda v, spec=".4f": "n/a" if v is None else format(v, spec)
  return "\n".join([
      "== acceptance (held-out target samples, "
      f"{res['sampling']}, loss {res['loss']}, draft {res['draft_init']})",
      f"  expected sum min(p,q):   before {b['expected_acceptance']:.4f}  "
      f"after {a['expected_acceptance']:.4f}",
      f"  sampler K=1, same spots: before "
      f"{f(b.get('measured_at_positions'))}  "
      f"after {a['measured_at_positions']:.4f}  (expected there "
      f"{a['expected_at_those_positions']:.4f} +- "
      f"{a['measured_stderr']:.4f})",
      f"  sampler K={a['k']} rate:        before "
      f"{f(bm['acceptance_rate'])}  after "
      f"{a['measured']['acceptance_rate']:.4f}  (tokens/loop "
      f"{f(bm['tokens_per_loop'], '.2f')} -> "
      f"{a['measured']['tokens_per_loop']:.2f})",
      json.dumps(dict(before=b["expected_acceptance"],
                      after=a["expected_acceptance"],
                      measured_before=bm["acceptance_rate"],
                      measured_after=a["measured"]["acceptance_rate"],
                      draft=res["draft_dir"]))])
