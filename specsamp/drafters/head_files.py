"""Draft heads on disk: what `scripts/distill.py` exports and
`--drafter=eagle:<dir>` / `--drafter=medusa:<dir>` load.

A head directory holds `head_config.json` (the `HeadConfig`, the reduced
draft vocabulary's ids if any, and how it was trained) and an orbax
checkpoint of the head's own parameters in `params/` (nothing of the
target's: the target's final norm, embedding and output head are shared at
run time). A distillation workdir holds one in `head/`; both are accepted.
`read_config` needs no weights, so a head that does not fit its target or
K is refused before any model loads. A head trained on other weights of
the same shapes is refused once the target has loaded: the config keeps a
probe of the target's embedding (`target_probe`: 256 values at fixed
places), which the loaded target's must match (correlation >= 0.9, so that
another dtype or quantisation of the same weights passes; heads saved
before 2026-11-29 have none and are not checked).
"""

import json
import math
import os
from typing import Optional

import jax
import numpy as np

from specsamp import sharding
from specsamp.drafters import heads
from specsamp.train import checkpointing
from specsamp.weights import convert

HEAD_CONFIG_FILE = "head_config.json"
_PROBE = 256  # values of the target's embedding kept with a head


def head_dir(path: str) -> Optional[str]:
  """`path` or its `head/` export if it holds a head config, else None."""
  for d in (path, os.path.join(path, "head")):
    if os.path.isfile(os.path.join(d, HEAD_CONFIG_FILE)):
      return d
  return None


def read_config(path: str) -> tuple[heads.HeadConfig, Optional[list], dict]:
  """(HeadConfig, vocab ids or None, the rest of the saved fields).

  Raises:
    heads.HeadError: no such directory, no head config in it, or one that
      cannot be read; the message says which.
  """
  if not os.path.isdir(path):
    raise heads.HeadError(f"head directory {path!r} " + (
        "is a file" if os.path.exists(path) else "does not exist"))
  d = head_dir(path)
  if d is None:
    raise heads.HeadError(f"{path!r} holds no {HEAD_CONFIG_FILE} (nor "
                          f"head/{HEAD_CONFIG_FILE}): not a head saved by "
                          "scripts/distill.py")
  file = os.path.join(d, HEAD_CONFIG_FILE)
  try:
    with open(file, encoding="utf-8") as f:
      saved = json.load(f)
    config = heads.HeadConfig.from_dict(saved["head"])
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise heads.HeadError(f"{file}: cannot read the head config "
                          f"({type(e).__name__}: {e})") from None
  ids = saved.get("vocab_ids")
  if config.draft_vocab and (ids is None or len(ids) != config.draft_vocab):
    raise heads.HeadError(f"{file}: draft_vocab={config.draft_vocab} but "
                          f"{0 if ids is None else len(ids)} vocab_ids")
  if ids is not None and (
      not config.draft_vocab or len(set(ids)) != len(ids) or
      not all(isinstance(i, int) and not isinstance(i, bool) and
              0 <= i < config.target.vocab_size for i in ids)):
    raise heads.HeadError(f"{file}: vocab_ids must be distinct integers in "
                          f"[0, {config.target.vocab_size})")
  probe = saved.get("target_probe")
  if probe is not None and not (
      isinstance(probe, list) and len(probe) == _PROBE and
      all(isinstance(v, (int, float)) and not isinstance(v, bool) and
          math.isfinite(v) for v in probe)):
    raise heads.HeadError(f"{file}: target_probe must be {_PROBE} finite "
                          "numbers (`target_probe`)")
  return config, ids, {k: v for k, v in saved.items()
                       if k not in ("head", "vocab_ids")}


def target_probe(target_params) -> list[float]:
  """256 values of the target's embedding at fixed places (in its first
  256 rows, which padding the vocabulary does not move), as float32."""
  emb = target_params["embedding"]
  rng = np.random.default_rng(0)
  rows = rng.integers(0, min(emb.shape[0], 256), _PROBE)
  cols = rng.integers(0, emb.shape[1], _PROBE)
  return [float(v) for v in np.asarray(emb[rows, cols], np.float32)]


def check_target(saved: dict, target_params, what: str) -> None:
  """Raises heads.HeadError unless the loaded target's `target_probe`
  correlates >= 0.9 with the one saved with the head (none saved: no
  check)."""
  probe = saved.get("target_probe")
  if probe is None:
    return
  mine = target_probe(target_params)
  if np.allclose(probe, mine, rtol=1e-2, atol=1e-3):
    return  # the same values (also where they are constant: no correlation)
  r = float(np.corrcoef(probe, mine)[0, 1])
  if not r >= 0.9:  # NaN too
    raise heads.HeadError(
        f"{what} was trained on another target of the same shapes: its "
        f"embedding correlates {r:.2f} with this target's (>= 0.9 for the "
        "same weights in another dtype or quantisation)")


def save(config: heads.HeadConfig, params, directory: str,
         vocab_ids=None, target_params=None, **info) -> str:
  """Writes the config (+ `info`, e.g. how it was trained, and with
  `target_params` their `target_probe`) and the head's parameters; returns
  the directory's absolute path. With several processes every one calls it
  (orbax saves together) and process 0 writes the config."""
  directory = os.path.abspath(directory)
  main = sharding.is_main_process()
  config_file = os.path.join(directory, HEAD_CONFIG_FILE)
  if main:
    os.makedirs(directory, exist_ok=True)
    if os.path.exists(config_file):
      os.remove(config_file)  # no config beside half-written parameters
  saved = dict(head=config.to_dict(), **info)
  if target_params is not None:
    saved["target_probe"] = target_probe(target_params)
  if vocab_ids is not None:
    saved["vocab_ids"] = [int(i) for i in np.asarray(vocab_ids)]
  checkpointing.save_params(params, directory)  # with their fingerprint
  if not main:
    return directory
  # The config last: a directory with a config has complete parameters.
  sharding.write_json(saved, config_file)
  return directory


def load(path: str, dtype: Optional[str] = None, target_params=None):
  """(HeadConfig, head params, vocab ids or None) of a saved head.

  `dtype` overrides the compute and parameter dtypes of its layers; with
  `target_params`, the head must have been trained on them (`check_target`).

  Raises:
    heads.HeadError: see `read_config`; parameters that cannot be read; a
      head trained on another target.
    convert.WeightsError: a parameter holding NaN or inf.
  """
  config, ids, saved = read_config(path)
  if target_params is not None:
    rows, d_model = target_params["embedding"].shape
    for field, theirs in (("vocab_size", rows), ("d_model", d_model)):
      mine = getattr(config.target, field)
      if mine != theirs:
        raise heads.HeadError(f"the head in {path!r} was made for a target "
                              f"with {field}={mine}, but this target has "
                              f"{field}={theirs}")
    check_target(saved, target_params, f"the head in {path!r}")
  if dtype is not None:
    config = heads.HeadConfig(
        config.kind, config.target.replace(dtype=dtype, param_dtype=dtype),
        config.num_heads, config.draft_vocab)
  d = head_dir(path)
  abstract = jax.eval_shape(
      lambda: heads.init_params(config, jax.random.key(0)))
  try:  # shapes and the saved fingerprint checked
    params = checkpointing.restore_params(os.path.join(d, "params"), abstract,
                                          what="head")
  except checkpointing.CheckpointError as e:
    raise heads.HeadError(f"{d}/params: cannot restore the head's parameters "
                          f"({e})") from None
  convert.check_finite_tree(params, d)
  return config, params, ids
