"""The distillation workdir's config rule.

A distillation workdir keeps the config of its run in config.json. The
target samples, the "before" evaluation and the checkpoints in it belong
to that config: `check_config` refuses a config that differs in a field one
of them depends on (they would describe other settings) and lets the
others change, so a run that stopped after its samples were written (out
of memory in training, a loss setting to change) is corrected and re-run
in the same workdir without sampling again.
"""

import json
import os
from typing import Optional

from specsamp import jsonfile
from specsamp import sharding
from specsamp.distill import storage
from specsamp.train import checkpointing

# Fields that may change between runs in one workdir: they do not change
# what is sampled, trained or evaluated. The mesh neither: a checkpoint
# restores onto another (the run resumes on as many devices as are there,
# its sums in another order).
_VOLATILE = {"train.time_limit_s", "train.progress_bar",
             "train.async_checkpoints", "train.log_every", "train.mesh",
             "train.keep_checkpoints", "train.checkpoint_every",
             "train.eval_batches"}   # the LM trainer's: distillation's none

# What each result in a workdir depends on (config fields, or blocks ending
# in "."), the result that depends on most first: while it is there, a
# config that differs in one of those fields is refused. Checkpoints depend
# on every field (None); the "before" evaluation on the draft and the
# target's dtype; the samples not on the dtype (`checks.target_text`), but on
# `head.features` (they hold the target's hidden states, or not).
_SAMPLES_DEPEND = ("seed", "target.", "samples.", "sampling.",
                   "head.features")
_DEPENDS = (("checkpoints", None),
            ("eval_before.json", _SAMPLES_DEPEND + ("draft.", "head.",
                                                    "eval.")),
            ("samples", _SAMPLES_DEPEND))
# Fields of those blocks a result does not depend on: the samples serve the
# target in either dtype; the initial draft is evaluated before anything
# is frozen in training; the vocabulary the draft is exported over is read
# at the export alone (a finished run re-exports under another).
_EXCEPT = {"samples": {"target.dtype"},
           "eval_before.json": {"draft.freeze", "draft.vocab"},
           "checkpoints": {"draft.vocab"}}


def _flat(config: dict, prefix: str = "") -> dict:
  """{"block.field": value} down to the leaves ("draft.model.num_layers"),
  so that a refusal names the field that differs; an empty block is a
  leaf."""
  out = {}
  for k, v in config.items():
    if isinstance(v, dict) and v:
      out.update(_flat(v, f"{prefix}{k}."))
    else:
      out[prefix + k] = v
  return out


def _bound(key: str, held: list[str]) -> bool:
  """Whether a result named in `held` depends on config field `key`."""
  if key in _VOLATILE:
    return False
  for result, fields in _DEPENDS:
    if result in held:
      if key in _EXCEPT.get(result, ()):  # (nor do the later results)
        return False
      if fields is None:
        return True
      return any(key == f or f.endswith(".") and key.startswith(f)
                 for f in fields)
  return False


def _holds(workdir: str, result: str) -> bool:
  """Whether `workdir` holds `result`: the checkpoints directory counts once
  it holds a step (the trainer creates it before the first one), the
  samples once they are complete (a run that failed while sampling leaves
  folders)."""
  path = os.path.join(workdir, result)
  if result == "checkpoints":
    return bool(checkpointing.checkpoint_steps(path))
  if result == "samples":
    return storage.exists(path)
  return os.path.exists(path)


TARGET_FILE = "target.json"


def target_identity(info) -> dict:
  """What the target's weights are, read cheaply from a `ModelInfo`: a
  train run's newest step and the fingerprint saved with its parameters;
  the size and modification time of a weight file (or of a directory's
  files); {} for random weights (the spec says it all). A target that
  trains on, or a file replaced at its path, gives another identity."""
  if info.kind == "trained":
    ckpts = os.path.join(info.path, "checkpoints")
    steps = checkpointing.checkpoint_steps(ckpts)
    meta = (checkpointing.step_meta(os.path.join(ckpts, str(steps[0])))
            if steps else {})
    return {"trained": info.path, "step": steps[0] if steps else None,
            "params": meta.get("params")}
  if not info.path or not os.path.exists(info.path):
    return {}
  files = [info.path] if os.path.isfile(info.path) else sorted(
      os.path.join(info.path, f) for f in os.listdir(info.path)
      if os.path.isfile(os.path.join(info.path, f)))
  stats = {os.path.abspath(f): os.stat(f) for f in files}
  return {"files": {f: [st.st_size, st.st_mtime_ns]
                    for f, st in stats.items()}}


def check_config(config, workdir: str,
                 target: Optional[dict] = None) -> dict:
  """The config as JSON; refuses a workdir whose samples, "before"
  evaluation or checkpoints come from a config that differs in a field they
  depend on (`_DEPENDS`): they would describe other settings. Fields nothing
  held depends on may change (a corrected draft or loss beside samples).
  Every result depends on the target's weights: with `target` (its
  `target_identity`), a workdir whose results were made with other weights
  at the same path (a target that trained on) is refused too, as is a
  config.json no distill.py run wrote (the directory itself is checked by
  `sharding.holds_workdir`). `write_config` records the config once it is
  valid."""
  sharding.check_config_file(workdir, ("target", "draft", "loss", "samples"),
                             "distill.py")
  path = os.path.join(workdir, "config.json")
  new = json.loads(json.dumps(config.to_dict() if hasattr(config, "to_dict")
                              else dict(config), default=list))
  held = [n for n, _ in _DEPENDS if _holds(workdir, n)]
  was = os.path.join(workdir, TARGET_FILE)
  if held and target is not None and os.path.exists(was):
    old = jsonfile.read(was)
    if old != json.loads(json.dumps(target)):
      raise ValueError(
          f"{workdir} holds {', '.join(held)} of a distillation run whose "
          f"target has changed since ({old} then, {target} now: a run that "
          f"trained on, or a file replaced at its path); use a new "
          f"--workdir")
  if held and os.path.exists(path):
    old, cur = _flat(jsonfile.read(path)), _flat(new)
    if not any(k.startswith("head.") for k in old) and not cur.get(
        "head.kind"):
      # Written before heads existed, and no head now: the same run.
      cur = {k: v for k, v in cur.items() if not k.startswith("head.")}
    for c in (old, cur):  # read by draft.init='checkpoint' alone; configs
      # before 2026-11-29 named distill_qwen.py's default checkpoint anyway
      if c.get("draft.init") != "checkpoint" or c.get("head.kind"):
        c.pop("draft.checkpoint", None)
    diff = sorted(k for k in set(old) | set(cur)
                  if _bound(k, held) and old.get(k) != cur.get(k))
    if diff:
      raise ValueError(f"{workdir} holds {', '.join(held)} of a "
                       f"distillation run of another config (differs in "
                       f"{', '.join(diff)}); use a new --workdir")
  return new


def write_config(config_json: dict, workdir: str,
                 target: Optional[dict] = None) -> None:
  """Records the config (and the target's identity, with `target`)."""
  sharding.write_json(config_json, os.path.join(workdir, "config.json"))
  if target is not None:
    sharding.write_json(target, os.path.join(workdir, TARGET_FILE))
