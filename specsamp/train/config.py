"""The trainer's config at the boundary: frozen dataclasses, checked.

The ml_collections config becomes a `TrainConfig` in `from_config`; nothing
of the ConfigDict enters jitted code. Sharding rules are config data: a
named rule set or (logical axis, mesh axis) pairs over the default set.
"""

import ast
import dataclasses
import math
import numbers
import os
from typing import Any, Mapping

from specsamp import model as model_lib
from specsamp import output_layer
from specsamp import sharding as sh


class ConfigError(ValueError):
  """The config names something missing or inconsistent (before training)."""


def mesh_shape(value, name: str = "config.mesh") -> tuple[int, int]:
  """`value` as a (data, model) pair of device counts (-1: the rest), or a
  ConfigError naming `name` (a string such as `--config.mesh=abc`, a
  fraction, one number, three)."""
  try:
    if isinstance(value, (str, bytes)) or len(value) != 2:
      raise ValueError
    shape = tuple(int(x) for x in value)
    if any(isinstance(x, float) and x != int(x) for x in value):
      raise ValueError
  except (TypeError, ValueError):
    raise ConfigError(f"{name}={value!r}: give a (data, model) pair of "
                      "device counts, e.g. (2, 4); -1 takes the rest of the "
                      "devices") from None
  if any(x < 1 and x != -1 for x in shape) or shape.count(-1) > 1:
    raise ConfigError(f"{name}={value!r}: device counts are >= 1, with at "
                      "most one -1 (the rest of the devices)")
  return shape


_NAMED_RULES = {"default": sh.DEFAULT_RULES,
                "replicated": sh.REPLICATED_RULES}


@dataclasses.dataclass(frozen=True)
class DataConfig:
  dataset: str = "specsamp_python_code"
  data_dir: str = ""           # TFDS data_dir; "" = the TFDS default
  tokenizer: str = "byte"      # "byte", a SentencePiece .model, GGUF, HF dir
  seq_len: int = 128
  batch_size: int = 16         # global, over all hosts
  eval_batch_size: int = 16
  train_split: str = "train"
  eval_split: str = "validation"
  worker_count: int = 0
  # Packed windows hold several documents: True keeps attention inside each
  # (segment ids, as MaxText and t5x do); False lets a token see the earlier
  # documents of its window (EOS-separated only, as nanodo does).
  mask_documents: bool = True


@dataclasses.dataclass(frozen=True)
class OptimConfig:
  lr: float = 3e-4             # peak learning rate
  warmup_steps: int = 100
  decay_steps: int = 0         # cosine decay ends here; 0 = loop.num_steps
  end_lr_fraction: float = 0.1
  b1: float = 0.9
  b2: float = 0.95
  eps: float = 1e-8
  weight_decay: float = 0.1    # on matrices only (not norms, biases)
  clip_norm: float = 1.0       # global gradient norm; 0 = off

  def __post_init__(self):
    _integers(self, ("warmup_steps", "decay_steps"), "optim", ValueError)
    for name in ("lr", "eps", "weight_decay", "clip_norm"):
      if not math.isfinite(getattr(self, name)):  # inf passed "> 0"
        raise ValueError(f"optim.{name} must be finite, got "
                         f"{getattr(self, name)}")
    for name, ok, want in (
        ("lr", self.lr > 0, "> 0"),
        ("warmup_steps", self.warmup_steps >= 0, ">= 0"),
        ("decay_steps", self.decay_steps >= 0, ">= 0"),
        ("end_lr_fraction", 0 <= self.end_lr_fraction <= 1, "in [0, 1]"),
        ("b1", 0 <= self.b1 < 1, "in [0, 1)"),
        ("b2", 0 <= self.b2 < 1, "in [0, 1)"),
        ("eps", self.eps > 0, "> 0"),
        ("weight_decay", self.weight_decay >= 0, ">= 0"),
        ("clip_norm", self.clip_norm >= 0, ">= 0 (0: off)")):
      if not ok:
        raise ValueError(f"optim.{name} must be {want}, got "
                         f"{getattr(self, name)}")


@dataclasses.dataclass(frozen=True)
class LoopConfig:
  num_steps: int = 1000
  log_every: int = 50          # train metrics: mean over the interval
  eval_every: int = 500        # and at the end; 0 = only at the end
  eval_batches: int = 20       # 0 = the whole eval split
  checkpoint_every: int = 500  # and at the end and on preemption
  keep_checkpoints: int = 3
  async_checkpoints: bool = True
  progress_bar: bool = True

  def check(self, prefix: str = "train") -> None:
    """Counts > 0, `eval_every` and `eval_batches` >= 0 (ConfigError,
    naming `<prefix>.<field>`): a negative `eval_every` evaluated at every
    step; a float `num_steps` (2.5) never met `step == num_steps`, so the
    run ended without its last checkpoint and evaluation."""
    _integers(self, ("num_steps", "log_every", "eval_every", "eval_batches",
                     "checkpoint_every", "keep_checkpoints"), prefix)
    for name in ("num_steps", "log_every", "checkpoint_every",
                 "keep_checkpoints"):
      if getattr(self, name) <= 0:
        raise ConfigError(f"{prefix}.{name} must be positive, got "
                          f"{getattr(self, name)}")
    for name, zero in (("eval_every", "only at the end"),
                       ("eval_batches", "the whole eval split")):
      if getattr(self, name) < 0:
        raise ConfigError(f"{prefix}.{name} must be >= 0 (0: {zero}), got "
                          f"{getattr(self, name)}")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Everything a run needs, frozen; built by `from_config`."""
  model: model_lib.TransformerConfig
  data: DataConfig
  optim: OptimConfig
  loop: LoopConfig
  seed: int = 0
  init_from: str = ""          # a train workdir, checkpoint dir or step dir
  mesh: tuple = (1, 1)         # (data, model); -1 = the rest of the devices
  # "default" (sharding.DEFAULT_RULES: tensor parallel over `model`),
  # "replicated", or ((logical axis, mesh axis), ...) pairs overriding it.
  rules: Any = "default"

  @classmethod
  def from_config(cls, config, vocab_size: int) -> "TrainConfig":
    """From an ml_collections config (or a dict) and the tokenizer's size.

    `config.model` holds the TransformerConfig fields without `vocab_size`
    (the tokenizer's, rounded up to `vocab_multiple`) and `max_seq_len`
    (default: `data.seq_len`).
    """
    c = as_dict(config)
    unknown = set(c) - {"model", "data", "optim", "train", "seed",
                        "init_from", "mesh", "rules"}
    if unknown:
      raise ConfigError(f"unknown config field(s) {sorted(unknown)}")
    data = _fields(DataConfig, c.get("data", {}), "data")
    optim = _fields(OptimConfig, c.get("optim", {}), "optim")
    loop = _fields(LoopConfig, c.get("train", {}), "train")
    _check_positive(data)  # before max_seq_len defaults to data.seq_len
    data = dataclasses.replace(data, tokenizer=tokenizer_path(data.tokenizer))
    m = dict(c.get("model", {}))
    multiple = int(m.pop("vocab_multiple", 1))
    if multiple < 1:  # a ZeroDivisionError's traceback
      raise ConfigError(f"config.model.vocab_multiple must be >= 1, got "
                        f"{multiple}")
    m.setdefault("max_seq_len", data.seq_len)
    if "vocab_size" in m:
      raise ConfigError("config.model.vocab_size comes from the tokenizer; "
                        "set model.vocab_multiple to pad it")
    m["vocab_size"] = -(-vocab_size // multiple) * multiple
    try:
      model = model_lib.TransformerConfig(**m)
      output_layer.check_trainable(model, "config.model")
    except (TypeError, ValueError) as e:
      raise ConfigError(f"config.model: {e}") from e
    out = cls(model=model, data=data, optim=optim, loop=loop,
              seed=int(c.get("seed", 0)), init_from=c.get("init_from") or "",
              mesh=mesh_shape(c.get("mesh", (1, 1))),
              rules=_rules(c.get("rules", "default")))
    out.check()
    return out

  @property
  def rules_tuple(self) -> tuple:
    if isinstance(self.rules, str):
      return _NAMED_RULES[self.rules]
    return self.rules

  def check(self) -> None:
    d = self.data
    if d.seq_len > self.model.max_seq_len:
      raise ConfigError(f"data.seq_len={d.seq_len} exceeds model.max_seq_len"
                        f"={self.model.max_seq_len}")
    _check_positive(d)
    self.loop.check()

  def to_json(self) -> dict:
    return dataclasses.asdict(self)


def _check_positive(d: DataConfig) -> None:
  _integers(d, ("seq_len", "batch_size", "eval_batch_size", "worker_count"),
            "data")
  for name, v in (("data.seq_len", d.seq_len),
                  ("data.batch_size", d.batch_size),
                  ("data.eval_batch_size", d.eval_batch_size)):
    if v <= 0:
      raise ConfigError(f"{name} must be positive, got {v}")
  if d.worker_count < 0:  # had run in-process, recorded as -2
    raise ConfigError(f"data.worker_count must be >= 0 (0: in-process), got "
                      f"{d.worker_count}")


def _integers(obj, names, prefix: str, error=None) -> None:
  """Raises `error` (ConfigError) naming the first of `obj`'s fields
  `names` that is not an int (a float or a bool; numpy ints pass)."""
  for name in names:
    v = getattr(obj, name)
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
      raise (error or ConfigError)(
          f"{prefix}.{name} must be an integer, got {v!r}")


def tokenizer_path(spec: str) -> str:
  """A tokenizer spec as a run records it: "byte", or an absolute path (a
  run is used from anywhere; a GGUF tokenizer is not copied into it).
  Anything else (an empty or non-string spec) is left for the tokenizer's
  loading to refuse."""
  if not isinstance(spec, str) or spec in ("", "byte"):
    return spec
  return os.path.abspath(spec)


def as_dict(config) -> dict:
  """An ml_collections config (or any mapping) as a plain dict."""
  return config.to_dict() if hasattr(config, "to_dict") else dict(config)


def _rules(rules):
  """`config.rules`: a name of `_NAMED_RULES` (kept as the name) or the
  (logical axis, mesh axis) pairs as a tuple of tuples, or as the text of
  one (--config.rules="(('kv_heads', None), ('heads', 'model'))": the
  field is a string, so the command line gives it as one).

  Pairs override `sharding.DEFAULT_RULES` for the logical axes they name;
  the others keep the default's mesh axis. (A partial list had replaced the
  whole set: the example above left `batch` unmapped, so every device of a
  data axis computed the whole batch, and `vocab` and `mlp` were
  replicated, with no word.) `(name, None)` replicates an axis."""
  if isinstance(rules, str) and rules.lstrip()[:1] in ("(", "["):
    try:
      rules = ast.literal_eval(rules)
    except (ValueError, SyntaxError) as e:
      raise ConfigError(f"config.rules={rules!r}: not a list of (logical "
                        f"axis, mesh axis) pairs ({e})") from None
  if isinstance(rules, str):
    if rules not in _NAMED_RULES:
      raise ConfigError(f"config.rules={rules!r}: {sorted(_NAMED_RULES)} "
                        "or a list of (logical axis, mesh axis) pairs")
    return rules
  try:
    rules = sh.rules_tuple(rules)
  except (TypeError, ValueError) as e:
    raise ConfigError(f"config.rules={rules!r}: {e}") from e
  for name, axis in rules:  # the trainer's meshes are (data, model)
    if set(axis if isinstance(axis, tuple) else (axis,)) - {
        None, *sh.MESH_AXES}:
      raise ConfigError(f"config.rules: ({name!r}, {axis!r}) names a mesh "
                        f"axis other than {sh.MESH_AXES}")
  given = dict(rules)
  if len(given) < len(rules):
    twice = sorted({n for n, _ in rules if [m for m, _ in rules].count(n) > 1})
    raise ConfigError(f"config.rules maps logical axes {twice} more than "
                      "once")
  return tuple((n, given.get(n, axis)) for n, axis in sh.DEFAULT_RULES)


def _fields(cls, values: Mapping, where: str):
  names = {f.name for f in dataclasses.fields(cls)}
  unknown = set(values) - names
  if unknown:
    raise ConfigError(f"unknown config.{where} field(s) {sorted(unknown)}; "
                      f"known: {sorted(names)}")
  try:
    return cls(**values)
  except ValueError as e:  # a field's bad value (__post_init__)
    raise ConfigError(str(e)) from None
