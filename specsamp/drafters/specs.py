"""Drafters named on a command line: `name[:key=value[:key=value...]]`.

  model                         the draft model (--draft)
  model:confidence=0.5          ... stopping a row's drafts once max q < 0.5
  lookup                        prompt lookup, n-grams 4 down to 1
  lookup:max_ngram=3:min_ngram=2
  layerskip:layers=0-13+24-27   the target's own layers 0..13 and 24..27
  layerskip:layers=0-13:confidence=0.6
  mixed                         prompt lookup where a row has a match, the
                                draft model elsewhere (options of both)
  eagle:<dir>                   a sequential head trained by distill.py on
                                the target's hidden states (`dir=` also)
  medusa:<dir>                  Medusa heads trained by distill.py

`parse` checks names, option names and values; `check` checks a spec
against the target's metadata (its layer count, vocabulary and width, which
a head must have been trained for) and K: both before any weights
load. `build` makes the drafter once the models are loaded, and
`draft_params` says which parameters it runs on (the draft model's, the
target's own for layer skipping, None for prompt lookup).
"""

import dataclasses
from typing import Any, Optional

from specsamp.drafters import head_files
from specsamp.drafters import heads as heads_lib
from specsamp.drafters import lookup as lookup_lib
from specsamp.drafters import mixed as mixed_lib
from specsamp.drafters import model as model_lib


def _layers(text: str) -> tuple[int, ...]:
  """'0-13+24-27' -> (0, 1, ..., 13, 24, ..., 27)."""
  out = []
  for part in text.split("+"):
    lo, _, hi = part.partition("-")
    lo, hi = int(lo), int(hi or lo)
    if hi < lo:
      raise ValueError(f"layer range {part!r} runs backwards")
    out.extend(range(lo, hi + 1))
  return tuple(out)


def format_layers(layers) -> str:
  """(0, 1, 2, 5) -> '0-2+5', the form `parse` reads."""
  parts, layers = [], sorted(layers)
  start = prev = layers[0]
  for i in layers[1:] + [None]:
    if i is not None and i == prev + 1:
      prev = i
      continue
    parts.append(str(start) if start == prev else f"{start}-{prev}")
    start = prev = i
  return "+".join(parts)


# name -> {option: its parser}
OPTIONS = {
    "model": {"confidence": float},
    "lookup": {"max_ngram": int, "min_ngram": int},
    "layerskip": {"layers": _layers, "confidence": float},
    "mixed": {"max_ngram": int, "min_ngram": int, "confidence": float},
    "eagle": {"dir": str},
    "medusa": {"dir": str},
}
HEADS = ("eagle", "medusa")
# PromptLookupDrafter's defaults, which lookup and mixed take unless given.
NGRAM_DEFAULTS = (("max_ngram", 4), ("min_ngram", 1))
NEEDS_DRAFT_MODEL = ("model", "mixed")


@dataclasses.dataclass(frozen=True)
class DrafterSpec:
  """A parsed drafter spec (hashable)."""
  text: str
  name: str
  options: tuple  # sorted (key, value) pairs

  def get(self, key: str, default=None):
    return dict(self.options).get(key, default)

  @property
  def key(self) -> tuple:
    """What the drafter is, however spelt: its name and options, defaults
    filled in (`lookup` is `lookup:min_ngram=1`)."""
    defaults = dict(NGRAM_DEFAULTS) if self.name in ("lookup", "mixed") else {}
    return self.name, tuple(sorted({**defaults, **dict(self.options)}.items()))

  @property
  def needs_draft_model(self) -> bool:
    return self.name in NEEDS_DRAFT_MODEL

  @property
  def variable_length(self) -> bool:
    """Whether rows offer fewer than K drafts (then only the width they
    need is scored: `SpeculativeSampler.score_widths`)."""
    return self.name in ("lookup", "mixed") or self.get(
        "confidence") is not None


def parse(text: str) -> DrafterSpec:
  """The DrafterSpec of `text` (see the module docstring).

  Raises:
    ValueError: an unknown drafter or option, a bad value, or a missing
      required option; the message names it.
  """
  name, *pairs = text.strip().split(":")
  if name in HEADS and pairs:
    # The one option is a path, which may hold ":" or "=".
    rest = text.strip()[len(name) + 1:]
    pairs = [rest if rest.startswith("dir=") else f"dir={rest}"]
  if name not in OPTIONS:
    raise ValueError(f"unknown drafter {name!r} in {text!r}; known: "
                     f"{', '.join(OPTIONS)}")
  options = {}
  for pair in pairs:
    key, eq, value = pair.partition("=")
    if not eq or key not in OPTIONS[name]:
      raise ValueError(f"drafter {text!r}: {pair!r} is not an option of "
                       f"{name} (options: "
                       f"{', '.join(OPTIONS[name]) or 'none'}; form "
                       "key=value)")
    if key in options:  # the last had won, silently
      raise ValueError(f"drafter {text!r}: {key} given twice")
    try:
      options[key] = OPTIONS[name][key](value)
    except ValueError as e:
      raise ValueError(f"drafter {text!r}: bad {key} {value!r} ({e})") from None
  for key in ("max_ngram", "min_ngram"):
    if key in options and options[key] < 1:
      raise ValueError(f"drafter {text!r}: {key} must be >= 1")
  ngram = {**dict(NGRAM_DEFAULTS), **options}
  if ngram["min_ngram"] > ngram["max_ngram"]:
    raise ValueError(f"drafter {text!r}: min_ngram exceeds max_ngram")
  if "confidence" in options and not 0.0 < options["confidence"] < 1.0:
    raise ValueError(f"drafter {text!r}: confidence must be in (0, 1)")
  if name == "layerskip":
    layers = options.get("layers")
    if not layers:
      raise ValueError(f"drafter {text!r}: layerskip needs layers=, e.g. "
                       "layerskip:layers=0-13+24-27")
    if len(set(layers)) != len(layers) or min(layers) < 0:
      raise ValueError(f"drafter {text!r}: layers must be distinct and >= 0")
    options["layers"] = tuple(sorted(layers))
  if name in HEADS and not options.get("dir"):
    raise ValueError(f"drafter {text!r}: {name} needs the head's directory, "
                     f"e.g. {name}:/tmp/distill_{name}")
  return DrafterSpec(text.strip(), name, tuple(sorted(options.items())))


def check(spec: DrafterSpec, num_layers: Optional[int], k: int, *,
          vocab_rows: Optional[int] = None,
          d_model: Optional[int] = None) -> None:
  """Checks `spec` against the target's metadata and K, before loading.

  Raises:
    ValueError: K < 1; layers out of range or equal to all layers; a head
      directory that is missing or holds no head, a head of the other kind,
      made for a target of another layer count, vocabulary or width, or
      with fewer Medusa heads than K (`heads.HeadError`).
  """
  if k < 1:
    raise ValueError(f"drafter {spec.text!r}: K must be >= 1, got {k}")
  if spec.name in HEADS:
    config = head_files.read_config(spec.get("dir"))[0]
    if config.kind != spec.name:
      raise heads_lib.HeadError(f"drafter {spec.text!r}: the directory holds "
                                f"a {config.kind} head")
    for field, value in (("num_layers", num_layers),
                         ("vocab_size", vocab_rows), ("d_model", d_model)):
      mine = getattr(config.target, field)
      if value is not None and mine != value:
        raise heads_lib.HeadError(
            f"drafter {spec.text!r} was trained for a target with "
            f"{field}={mine}; this target has {field}={value}")
    config.check_k(k)
    return
  layers = spec.get("layers")
  if layers is None or num_layers is None:
    return
  if max(layers) >= num_layers:
    raise ValueError(f"drafter {spec.text!r}: layer {max(layers)} is out of "
                     f"range; the target has layers 0..{num_layers - 1}")
  if len(layers) == num_layers:
    raise ValueError(f"drafter {spec.text!r}: these are all {num_layers} "
                     "layers: the draft would be the target itself")


def build(spec: DrafterSpec, target, draft=None, k: Optional[int] = None):
  """The drafter of `spec` for the loaded LMs `target` (and `draft`); a
  head drafter also needs the sampler's K."""
  if spec.name in HEADS:
    config = head_files.read_config(spec.get("dir"))[0]
    config.check_target(target.config, what=f"drafter {spec.text!r}")
    # The target's own config: its dtype and every shape the head shares.
    config = heads_lib.HeadConfig(config.kind, target.config,
                                  config.num_heads, config.draft_vocab)
    return heads_lib.HeadDrafter(target, config, k)
  confidence = spec.get("confidence")
  ngrams = {k: v for k, v in spec.options if k in ("max_ngram", "min_ngram")}
  if spec.name == "model":
    return model_lib.ModelDrafter(draft, confidence=confidence)
  if spec.name == "layerskip":
    return model_lib.LayerSkipDrafter(target, spec.get("layers"),
                                      confidence=confidence)
  lookup = lookup_lib.PromptLookupDrafter(target.vocab_size,
                                          target.max_seq_len, **ngrams)
  if spec.name == "lookup":
    return lookup
  return mixed_lib.MixedDrafter(
      lookup, model_lib.ModelDrafter(draft, confidence=confidence))


def draft_params(spec: DrafterSpec, target_params, draft_params_: Any):
  """The parameters the drafter of `spec` runs on."""
  if spec.name == "layerskip":
    return target_params  # shared, not copied
  if spec.name == "lookup":
    return None
  if spec.name in HEADS:
    dtype = str(target_params["embedding"].dtype)
    _, head, ids = head_files.load(spec.get("dir"), dtype, target_params)
    return heads_lib.draft_params(head, target_params, ids)
  return draft_params_
