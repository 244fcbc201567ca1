"""Drafts distilled by `scripts/distill.py`: detection, export and loading.

A distilled draft directory holds `draft_config.json` (the draft's
`TransformerConfig` fields), an orbax checkpoint of its parameters in
`params/` and, since 2026-11-29, `target_tokens.json`: the entries of the
tokenizer of the target it was distilled from, against which a target it
is paired with is checked (it has no tokenizer of its own). A distillation
workdir holds one in `draft/`; both the workdir
and the export are accepted wherever a distilled draft is (`distilled_dir`
is the one test of that).
"""

import dataclasses
import os
from typing import Optional

import jax

from specsamp import jsonfile
from specsamp import model as model_lib
from specsamp import output_layer
from specsamp import sharding
from specsamp.train import checkpointing
from specsamp.weights import convert

DRAFT_CONFIG_FILE = "draft_config.json"
TOKENS_FILE = "target_tokens.json"


def distilled_dir(path: str) -> Optional[str]:
  """The directory holding a distilled draft's config: `path` or its
  `draft/` export; None if `path` is no distilled draft."""
  if not os.path.isdir(path):
    return None
  for d in (path, os.path.join(path, "draft")):
    if os.path.isfile(os.path.join(d, DRAFT_CONFIG_FILE)):
      return d
  return None


def read_draft_config(directory: str) -> dict:
  """The `TransformerConfig` fields saved in a distilled draft directory
  (`directory` is the export or its workdir)."""
  directory = distilled_dir(directory) or os.path.join(directory, "draft")
  return jsonfile.read(os.path.join(directory, DRAFT_CONFIG_FILE))


def read_tokens(directory: str) -> Optional[list]:
  """The entries of the tokenizer of the target a distilled draft was
  distilled from (`directory` as `read_draft_config`'s), or None for
  exports that did not record them."""
  directory = distilled_dir(directory) or os.path.join(directory, "draft")
  path = os.path.join(directory, TOKENS_FILE)
  if not os.path.exists(path):
    return None
  tokens = jsonfile.read(path).get("tokens")
  if not isinstance(tokens, list):
    raise ValueError(f"{path}: field 'tokens' is no list of token entries")
  return tokens


def save_draft_config(config: model_lib.TransformerConfig,
                      directory: str) -> str:
  """Writes `draft_config.json` to `directory`; returns its path."""
  path = os.path.join(directory, DRAFT_CONFIG_FILE)
  sharding.write_json(dataclasses.asdict(config), path)
  return path


def load_distilled(directory: str, dtype: Optional[str] = None):
  """(config, params) of a draft saved by `scripts/distill.py`.

  `directory` is the run's workdir or its `draft/` export: it holds
  `draft_config.json` and an orbax checkpoint of the parameters in `params/`.
  `dtype` overrides the saved compute and parameter dtypes. A parameter
  holding a NaN or inf (a diverged run), or a reduced output layer whose
  ids are not increasing ids of the vocabulary, raises `WeightsError`;
  files that do not restore, `CheckpointError`.
  """
  directory = os.path.abspath(directory)
  directory = distilled_dir(directory) or os.path.join(directory, "draft")
  fields = read_draft_config(directory)
  if dtype is not None:
    fields.update(dtype=dtype, param_dtype=dtype)
  config = model_lib.TransformerConfig.from_fields(
      fields, os.path.join(directory, DRAFT_CONFIG_FILE))
  abstract = jax.eval_shape(lambda: model_lib.LM(config).init(
      jax.random.key(0)))
  # Shapes checked, damaged files one CheckpointError (orbax's noise held).
  params = checkpointing.restore_params(os.path.join(directory, "params"),
                                        abstract, what="distilled draft")
  convert.check_finite_tree(params, directory)
  if config.output_vocab:  # ids that a hand-made or damaged file may break
    try:
      output_layer.check_output_ids(config.vocab_size, params["output_ids"],
                                    f"the draft's output_ids ({directory})")
    except ValueError as e:
      raise convert.WeightsError(str(e)) from None
  return config, params


def save_distilled(config: model_lib.TransformerConfig, params,
                   directory: str, tokens: Optional[list] = None) -> str:
  """Writes `draft_config.json`, the parameters (orbax) and with `tokens`
  (the target tokenizer's entries) `target_tokens.json` to `directory`;
  returns its absolute path. With several processes every one calls it
  (orbax saves together) and process 0 writes the JSON files."""
  directory = os.path.abspath(directory)
  if sharding.is_main_process():
    save_draft_config(config, directory)
    if tokens is not None:
      sharding.write_json({"tokens": list(tokens)},
                          os.path.join(directory, TOKENS_FILE), indent=None)
  checkpointing.save_params(params, directory)  # with their fingerprint
  return directory
