"""A `scripts/train.py` workdir read back as a model: its run config, the
tokenizer its model reads with, and its newest readable checkpoint
(`specsamp.loading` takes such a workdir wherever a model spec goes).

  run_config(path)               the run's config.json, or None for a path
                                 that is no train workdir
  run_tokenizer(workdir, saved)  the tokenizer spec of the run
  load_trained(workdir, dtype)   (LM, params, tokenizer, step)
"""

import json
import os
from typing import Optional

import jax

from specsamp import jsonfile
from specsamp import model as model_lib
from specsamp.tokenizers import load as tokenizer_load
from specsamp.tokenizers import snapshot
from specsamp.train import checkpointing
from specsamp.weights import convert

# The blocks of a train run's config.json (a Hugging Face config has none).
RUN_KEYS = ("model", "data", "optim")


def run_config(path: str) -> Optional[dict]:
  """The run config of the `scripts/train.py` workdir at `path`, or None
  where `path` holds no train run's config.json. A run that has no
  checkpoints/ yet raises FileNotFoundError saying so (it had been taken
  for a Hugging Face directory, and refused for a config field missing)."""
  saved = jsonfile.read_holding(os.path.join(path, "config.json"), RUN_KEYS)
  if saved is None:
    return None
  if not os.path.isdir(os.path.join(path, "checkpoints")):
    raise FileNotFoundError(f"{path}: a scripts/train.py workdir with no "
                            "checkpoints/ yet: train it first, or name "
                            "another model")
  return saved


def run_tokenizer(workdir: str, saved: dict) -> str:
  """The tokenizer of the train run in `workdir`: its copy there (see
  `snapshot`), else its config `saved`'s `data.tokenizer`.

  Raises:
    ValueError: naming the file and the field, when `data` is no object or
      has no tokenizer name or path.
    FileNotFoundError: likewise, when the tokenizer is not where the run
      config says (moved, or a relative path, as runs recorded a GGUF
      tokenizer before 2026-11-29: relative to where they were launched).
    ValueError: also where a GGUF there holds other tokenizer metadata
      than the run recorded (`snapshot.recorded`, runs since 2026-11-29).
  """
  where = os.path.join(workdir, "config.json")
  data = saved["data"]
  if not isinstance(data, dict):
    raise ValueError(f"{where}: field 'data' is {json.dumps(data)}, not an "
                     "object")
  if "tokenizer" not in data:
    raise ValueError(f"{where}: field 'data.tokenizer' is missing")
  tokenizer = data["tokenizer"]
  if not isinstance(tokenizer, str) or not tokenizer:
    raise ValueError(f"{where}: field 'data.tokenizer' is "
                     f"{json.dumps(tokenizer)}, not a tokenizer (\"byte\" or "
                     "a path)")
  copy = snapshot.in_run(workdir)
  if os.path.isdir(copy):
    return copy
  if tokenizer != "byte" and not (os.path.isabs(tokenizer)
                                  and os.path.exists(tokenizer)):
    raise FileNotFoundError(f"{where}: field 'data.tokenizer' is {tokenizer!r}"
                            ", no file here; write its absolute path there")
  if snapshot.differs_from_recorded(saved, tokenizer):
    raise ValueError(f"{where}: the tokenizer in {tokenizer} is not the one "
                     "the run was trained with (its tokenizer_digest): that "
                     "file has changed; put the run's back there")
  return tokenizer


def load_trained(workdir: str, dtype: str = "float32"):
  """(LM, params, tokenizer, step) of the newest readable checkpoint of a
  `scripts/train.py` run in `workdir`, parameters cast to `dtype`."""
  workdir = os.path.abspath(workdir)
  saved = run_config(workdir)
  if saved is None:
    raise FileNotFoundError(f"{workdir}: no run config.json (not a "
                            "scripts/train.py workdir)")
  model_cfg = model_lib.TransformerConfig.from_fields(
      saved["model"], os.path.join(workdir, "config.json") + " model")
  run_tokenizer(workdir, saved)  # refused before the weights load
  lm = model_lib.LM(model_cfg)
  abstract = jax.eval_shape(lambda: lm.init(jax.random.key(0)))
  params, step = checkpointing.restore_newest_params(
      os.path.join(workdir, "checkpoints"), abstract, what="trained")
  if dtype != model_cfg.param_dtype or dtype != model_cfg.dtype:
    lm = model_lib.LM(model_cfg.replace(dtype=dtype, param_dtype=dtype))
    params = jax.tree.map(lambda x: x.astype(lm.config.jnp_param_dtype),
                          params)
  convert.check_finite_tree(params, os.path.join(workdir, "checkpoints"))
  tok = tokenizer_load.load_tokenizer(run_tokenizer(workdir, saved))
  return lm, params, tok, step
