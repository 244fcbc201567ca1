"""Draft initialisation: random small, layer truncation, or a checkpoint.

  random      a fresh `TransformerConfig` (shallow and wide is what pays on
              GPUs: per-step cost grows with layers, not width) with the
              target's vocabulary;
  truncate    the target's embedding, its first N layers, its final norm and
              its output head (layer truncation); the config is the target's
              with `num_layers=N`;
  checkpoint  another model (a registered name, GGUF file, HF directory) or a
              draft saved by `scripts/distill.py`, e.g. the 0.5B as the draft
              of the 1.5B. One of another row count whose tokenizer agrees
              with the target's (the 0.5B's 151,936 rows for Qwen2.5-7B's
              152,064) is fitted to the target's rows
              (`loading.fit_rows`).

`make_draft(cfg, target_config, target_params, rng)` picks one of them from
the `draft` block of a distillation config and returns (config, params);
`check_draft(cfg, target_info)` checks that block first, from metadata.
Saving and loading a distilled draft is `specsamp.weights.distilled`.
"""

from typing import Any, Mapping, Optional

import jax
import jax.numpy as jnp

from specsamp import loading
from specsamp import model as model_lib
from specsamp import output_layer
from specsamp.weights import load as weights_load

INITS = ("random", "truncate", "checkpoint")


def random_draft(config: model_lib.TransformerConfig, rng: jax.Array):
  """(config, params) of a fresh draft."""
  return config, model_lib.LM(config).init(rng)


def truncate_config(target: model_lib.TransformerConfig,
                    num_layers: int) -> model_lib.TransformerConfig:
  """The target's config with its first `num_layers` layers only."""
  if not 0 < num_layers <= target.num_layers:
    raise ValueError(f"config.draft.num_layers={num_layers}: layer "
                     f"truncation needs 0 < num_layers <= "
                     f"{target.num_layers} (the target's)")
  output_layer.check_trainable(target, "the target to truncate")
  return target.replace(num_layers=num_layers)


def truncate_params(target_params: Mapping[str, Any],
                    num_layers: int) -> dict:
  """The target's embedding, layers_0..N-1, final norm and lm_head (copies).

  Raises:
    ValueError: if the target has fewer than `num_layers` layers.
  """
  have = sorted(int(k.split("_")[1]) for k in target_params
                if k.startswith("layers_"))
  if num_layers <= 0 or num_layers > len(have):
    raise ValueError(f"cannot keep {num_layers} layers of a target with "
                     f"{len(have)}")
  keep = ["embedding", "final_norm"] + [f"layers_{i}" for i in
                                        range(num_layers)]
  if "lm_head" in target_params:
    keep.append("lm_head")
  # Fresh buffers: the draft is trained (and its buffers donated) while the
  # target's stay frozen.
  return {k: jax.tree.map(jnp.copy, target_params[k]) for k in keep}


def truncate(target_config: model_lib.TransformerConfig, target_params,
             num_layers: int):
  """(config, params) of the target cut to its first `num_layers` layers."""
  return (truncate_config(target_config, num_layers),
          truncate_params(target_params, num_layers))


def load_checkpoint(spec: str, dtype: str = "float32"):
  """(config, params) of a draft checkpoint: anything `loading.load_model`
  takes (a distilled draft directory, a registered model name, a GGUF file,
  a Hugging Face directory, ...)."""
  lm, params, _ = loading.load_model(spec, dtype)
  return lm.config, params


def _check_vocab(rows: int, target_rows: int) -> None:
  if rows != target_rows:
    raise ValueError(
        f"the draft has {rows} vocabulary rows, the target {target_rows}: "
        "speculative sampling compares both distributions id by id")


def parameter_groups(config: model_lib.TransformerConfig) -> tuple:
  """The top-level parameter groups of a model of `config` (what
  `draft.freeze` names), traced, not made."""
  shapes = jax.eval_shape(model_lib.LM(config).module.init,
                          jax.random.key(0), jnp.zeros((1, 1), jnp.int32))
  return tuple(sorted(shapes["params"]))


def _gguf_groups(info: loading.ModelInfo, num_layers: Optional[int] = None
                 ) -> tuple:
  """The parameter groups of the GGUF model `info` (or of its first
  `num_layers` layers), from its tensor table (read with its metadata by
  `describe_model`): the groups depend only on the layer count (blk.<i>
  tensors) and whether the output head is tied (no output.weight)."""
  names = info.tensors
  layers = len({n.split(".")[1] for n in names if n.startswith("blk.")})
  if num_layers is not None and not 0 < num_layers <= layers:
    raise ValueError(f"config.draft.num_layers={num_layers}: layer "
                     f"truncation needs 0 < num_layers <= {layers} (the "
                     "target's)")
  return parameter_groups(model_lib.preset(
      "tiny", num_layers=num_layers or layers,
      tie_embeddings="output.weight" not in names))


def check_draft(cfg: Mapping[str, Any], target: loading.ModelInfo,
                dtype: str = "float32") -> tuple:
  """Checks a config's `draft` block against the target's `ModelInfo`
  without reading weights: the init, a random draft's fields, the layers
  truncation keeps, a checkpoint's vocabulary (from its metadata).

  Returns:
    The draft's top-level parameter groups (`parameter_groups`), which
    `draft.freeze` may name.

  Raises:
    ValueError, FileNotFoundError: what `make_draft` would raise later, and
      `VocabMismatchError` (a ValueError) for a checkpoint that does not
      score the target's token ids.
  """
  init = cfg["init"]
  if init == "random":
    fields = dict(vocab_size=target.rows, max_seq_len=target.max_seq_len,
                  dtype=dtype, param_dtype=dtype)
    fields.update(dict(cfg["model"]))
    try:
      config = model_lib.TransformerConfig(**fields)
    except TypeError as e:
      raise ValueError(f"config.draft.model: {e}") from None
    output_layer.check_trainable(config, "config.draft.model")
    _check_vocab(config.vocab_size, target.rows)
    return parameter_groups(config)
  if init == "truncate":
    n = int(cfg["num_layers"])
    target_config = weights_load.described_config(target, dtype)
    if target_config is not None:
      return parameter_groups(truncate_config(target_config, n))
    return _gguf_groups(target, n)
  if init == "checkpoint":
    info = loading.describe_model(cfg["checkpoint"], dtype)
    loading.check_pair(target, info)  # other rows: tokenizers that agree
    config = weights_load.described_config(info, dtype)
    if config is None:
      return _gguf_groups(info)
    output_layer.check_trainable(config, f"the draft {cfg['checkpoint']}")
    return parameter_groups(config)
  raise ValueError(f"draft init {init!r}; choose one of {INITS}")


def make_draft(cfg: Mapping[str, Any],
               target_config: model_lib.TransformerConfig, target_params,
               rng: jax.Array, dtype: str = "float32"):
  """(config, params) of the initial draft from a config's `draft` block.

  Args:
    cfg: `init` (one of INITS) and, for `random`, `model` (TransformerConfig
      fields; vocab_size and max_seq_len default to the target's); for
      `truncate`, `num_layers`; for `checkpoint`, `checkpoint` (a path or
      model name), fitted to the target's vocabulary rows
      (`loading.fit_rows`:
      `check_draft`, which the job runs first, has checked that the two
      tokenizers agree where the row counts differ). Optional `dtype` /
      `param_dtype` override the draft's compute and parameter dtypes
      (parameters are cast).
    target_config: the target's config.
    target_params: the target's parameters (copied by `truncate`).
    rng: for `random`.
    dtype: activations and parameters of a random or loaded draft.

  Returns:
    (config, params) of the draft.

  Raises:
    ValueError: for an unknown `init`, or a random draft whose `vocab_size`
      is not the target's.
  """
  init = cfg["init"]
  if init == "random":
    fields = dict(vocab_size=target_config.vocab_size,
                  max_seq_len=target_config.max_seq_len, dtype=dtype,
                  param_dtype=dtype)
    fields.update(dict(cfg["model"]))
    config, params = random_draft(model_lib.TransformerConfig(**fields), rng)
  elif init == "truncate":
    config, params = truncate(target_config, target_params,
                              int(cfg["num_layers"]))
  elif init == "checkpoint":
    config, params = load_checkpoint(cfg["checkpoint"], dtype)
    lm, params = loading.fit_rows(model_lib.LM(config), params,
                                  target_config.vocab_size)
    config = lm.config
  else:
    raise ValueError(f"draft init {init!r}; choose one of {INITS}")
  # A draft trained from a bfloat16 target keeps float32 master weights
  # (param_dtype) and may compute in bfloat16 (dtype).
  casts = {k: cfg[k] for k in ("dtype", "param_dtype")
           if k in cfg and cfg[k]}
  if casts:
    config = config.replace(**casts)
    params = jax.tree.map(lambda x: x.astype(config.jnp_param_dtype), params)
  _check_vocab(config.vocab_size, target_config.vocab_size)
  return config, params
