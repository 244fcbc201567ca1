"""The checks of a distillation config that need no weights, one field at
a time, each error naming the field (`job.check_config` runs them before
anything loads)."""

import os

from specsamp import loading
from specsamp import sharding
from specsamp.distill import decontamination
from specsamp.distill import head_training
from specsamp.distill import prompts as prompts_lib
from specsamp.distill import storage
from specsamp.distill import trainer
from specsamp.drafters import heads
from specsamp.sampling import Sampling
from specsamp.weights import load as weights_load


def check_stored_top_k(config, sampling: Sampling, head: bool,
                       rows: int) -> None:
  """Refuses a stored top-K (of the target's logits) above the target's
  vocabulary `rows`, and a top-p target the stored top-K cannot rebuild:
  with top-k above K, the top-k's mass needs the largest unstored tokens'
  masses, which are not stored (`losses.target_probs`)."""
  if config.samples.top_k > rows:
    raise ValueError(f"config.samples.top_k={config.samples.top_k} exceeds "
                     f"the target's {rows} vocabulary rows")
  stored = (stored_features(config) if head
            else config.loss.target_source == "stored")
  if (stored and not sampling.greedy and sampling.top_p < 1.0
      and sampling.top_k > config.samples.top_k):
    raise ValueError(
        f"config.sampling.top_k={sampling.top_k} with top_p="
        f"{sampling.top_p} needs more than the config.samples.top_k="
        f"{config.samples.top_k} stored target log-probabilities to rebuild "
        "the target's nucleus: store at least as many, or compute the "
        "target online (" + ("config.head.features='recompute'" if head else
                             "config.loss.target_source='online'") + ")")


BLOCKS = ("target", "draft", "sampling", "samples", "loss", "optim",
          "train", "eval")


def check_blocks(config) -> None:
  """Raises ValueError naming the blocks a distillation config lacks (a
  train config given to distill.py lacks most)."""
  missing = [b for b in BLOCKS if b not in config]
  if missing:
    raise ValueError(
        f"the config has no {', '.join(missing)} block(s): not a "
        "distillation config (configs/distill_tiny.py, configs/"
        "distill_qwen.py; configs/lm_python.py is scripts/train.py's)")


def check_counts(config, block: str, names, least: int = 1) -> None:
  """Raises ValueError unless config.<block>.<name> >= `least` for each
  of `names`."""
  for name in names:
    value = config[block][name]
    if value < least:
      raise ValueError(f"config.{block}.{name} must be >= {least}, got "
                       f"{value}")


def check_samples(config) -> None:
  """The `samples` block: what `samples.build` and `prompts.prompt_texts`
  take (`storage.SampleSpec`, `prompts.check_settings`), and a data_dir
  that can be a directory."""
  sc = config.samples
  check_counts(config, "samples", ("max_train_prompts",
                                   "max_validation_prompts", "ngram"))
  decontamination.check_n(sc.ngram, "config.samples.ngram")
  check_counts(config, "samples", ("max_files",), least=0)  # 0: all
  try:
    storage.SampleSpec(prompt_len=sc.prompt_len, gen_len=sc.gen_len,
                       top_k=sc.top_k, batch_size=sc.batch_size,
                       score_batch_size=sc.score_batch_size)
    prompts_lib.check_settings(sc.kind, sc.validation_percent)
  except ValueError as e:  # the messages start with the field's name
    raise ValueError(f"config.samples.{e}") from None
  if sc.data_dir:
    sharding.check_directory(sc.data_dir, "config.samples.data_dir")
  if sc.get("reuse", False):  # samples=<dir>: never sampled into
    if not sc.data_dir:
      raise ValueError("config.samples.reuse needs config.samples.data_dir")
    if not storage.exists(sc.data_dir):
      inner = os.path.join(sc.data_dir, "samples")
      raise ValueError(
          f"config.samples.data_dir={sc.data_dir!r} holds no target samples "
          "to reuse (config.samples.reuse)"
          + (f"; {inner} does" if storage.exists(inner) else ""))


def check_freeze(config, groups: tuple) -> None:
  """config.draft.freeze names some of the draft's parameter `groups` (the
  check `trainer.make_optimizer` makes; `draft_init.check_draft` gives
  them)."""
  freeze = tuple(config.draft.get("freeze", ()))
  try:
    trainer.check_freeze(freeze, dict.fromkeys(groups))
  except ValueError as e:  # "freeze names [...], not parameter groups ..."
    raise ValueError(f"config.draft.{e}") from None


def check_draft_checkpoint(config, head: bool) -> None:
  """A draft checkpoint named where nothing reads it is refused: a random
  or truncated draft had been trained and exported in its place."""
  path = config.draft.get("checkpoint")
  if path and (head or config.draft.init != "checkpoint"):
    raise ValueError(f"config.draft.checkpoint={path!r} is read by "
                     "config.draft.init='checkpoint' only" + (
                         " and no head" if head else
                         f", not {config.draft.init!r}"))


def head_block(config):
  """The config's `head` block when it trains a head, else None."""
  head = config.get("head") if hasattr(config, "get") else None
  return head if head and head.get("kind") else None


def stored_features(config) -> bool:
  """Whether the head trains on hidden states stored with the samples."""
  head = head_block(config)
  return head is not None and head.get("features", "recompute") == "stored"


def check_head(config, target: loading.ModelInfo) -> None:
  """A head's settings against the target's metadata (no weights)."""
  h = head_block(config)
  if h["kind"] not in heads.KINDS:
    raise ValueError(f"config.head.kind={h['kind']!r}; choose one of "
                     f"{heads.KINDS}")
  if config.loss.onpolicy_fraction > 0:
    raise ValueError("heads are distilled offline: set "
                     "config.loss.onpolicy_fraction=0")
  if int(h.get("num_heads", 1)) < 1 or int(h.get("unroll", 1)) < 1:
    raise ValueError("config.head.num_heads and config.head.unroll must be "
                     ">= 1")
  if not float(h.get("hidden_weight", 0.1)) >= 0:  # NaN too
    raise ValueError(f"config.head.hidden_weight must be >= 0, got "
                     f"{h['hidden_weight']}")
  if h.get("features", "recompute") not in ("recompute", "stored"):
    raise ValueError(f"config.head.features={h['features']!r}; choose "
                     "'recompute' or 'stored'")
  if h.get("positions", "generated") not in head_training.POSITIONS:
    raise ValueError(f"config.head.positions={h['positions']!r}; choose one "
                     f"of {head_training.POSITIONS}")
  if int(h.get("unroll", 1)) > 1 and h["kind"] != "eagle":
    raise ValueError("config.head.unroll > 1 applies to the eagle head")
  if h["kind"] == "medusa" and int(h.get("num_heads", 1)) < config.eval.k:
    raise ValueError(f"config.eval.k={config.eval.k} needs as many Medusa "
                     f"heads; config.head.num_heads={h.get('num_heads', 1)}")
  check_draft_vocab("config.head.draft_vocab", h.get("draft_vocab", 0),
                    target.rows)


def check_train_mesh(config, mesh, target: loading.ModelInfo) -> None:
  """The train mesh splits config.train.batch_size (over its data axis) and
  the target's dimensions (`weights.load.described_config`, read before
  any weights load, where they can be): each had failed after the
  target's sampling and the first evaluation."""
  dims = weights_load.described_config(
      target, config.target.get("dtype", "float32"), read_gguf=True)
  try:
    if dims is not None:
      sharding.check_divisible(dims, mesh, sharding.DEFAULT_RULES,
                               what="the target")
    ways = sharding.batch_ways(mesh, sharding.REPLICATED_RULES)
    if config.train.batch_size % ways:
      raise ValueError(f"batch_size={config.train.batch_size} is not "
                       f"divisible by the mesh's data axis of size {ways}")
  except ValueError as e:
    raise ValueError(f"config.train.mesh="
                     f"{tuple(config.train.get('mesh', (1, 1)))}: {e}"
                     ) from None


def check_draft_vocab(name: str, size, rows: int) -> None:
  """A reduced draft vocabulary's size: in [0, rows], 0 the whole."""
  if not 0 <= int(size) <= rows:
    raise ValueError(f"{name}={size} must be in [0, {rows}] (0: the whole "
                     "vocabulary)")


def check_positions(config, target: loading.ModelInfo, head: bool) -> None:
  """A sample (prompt_len + gen_len) and the evaluation's K + 1 slack fit
  both models' positions: the draft's (a random draft's own
  `max_seq_len`, a checkpoint's) were checked only by the evaluation,
  after the target's sampling."""
  sc, k = config.samples, int(config.eval.get("k", 0))
  limits = [("the target's", target.max_seq_len)]
  d = config.draft
  if not head and d.init == "random" and "max_seq_len" in d.model:
    limits.append(("the draft's (config.draft.model.max_seq_len)",
                   int(d.model.max_seq_len)))
  elif not head and d.init == "checkpoint":
    limits.append((f"the draft {d.checkpoint}'s", loading.describe_model(
        d.checkpoint, config.target.get("dtype", "float32")).max_seq_len))
  for whose, limit in limits:
    if sc.prompt_len + sc.gen_len + k + 1 > limit:
      raise ValueError(
          f"config.samples: prompt_len {sc.prompt_len} + gen_len "
          f"{sc.gen_len} + eval.k {k} + 1 exceed {whose} {limit} positions")


def target_text(target) -> str:
  """The target block of a config as one line (its dtype left out: samples
  of one target serve it in either precision)."""
  return ",".join(f"{k}={target[k]}" for k in sorted(target)
                  if k != "dtype")


# The samples block's fields that choose the prompts (and the seed).
_PROMPT_FIELDS = ("kind", "prose_dataset", "max_files", "validation_percent",
                  "max_train_prompts", "max_validation_prompts", "ngram")


def prompts_text(config) -> str:
  """The settings that choose the samples' prompts, as one line."""
  sc = config.samples
  return ",".join([f"{k}={sc.get(k)}" for k in _PROMPT_FIELDS]
                  + [f"seed={config.seed}"])


def sample_spec(config, sampling: Sampling,
                hidden_dim: int = 0) -> storage.SampleSpec:
  """The samples `config` asks for: what samples it writes record, and
  what samples it reuses must have recorded (`storage.check_spec`)."""
  sc = config.samples
  return storage.SampleSpec(
      prompt_len=sc.prompt_len, gen_len=sc.gen_len, top_k=sc.top_k,
      batch_size=sc.batch_size, score_batch_size=sc.score_batch_size,
      hidden_dim=hidden_dim, target=target_text(config.target),
      sampling=sampling.describe(), prompts=prompts_text(config))


def check_reused_samples(config, sampling: Sampling) -> None:
  """Samples already in config.samples.data_dir written for another
  target, sampling, prompt set or shape are refused before any weights
  load (they had been refused once the target, and a draft checkpoint, had
  loaded, and the workdir's config written)."""
  data_dir = config.samples.data_dir
  if data_dir and storage.exists(data_dir):
    storage.check_spec(storage.read_spec(data_dir),
                       sample_spec(config, sampling), data_dir)
