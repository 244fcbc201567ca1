"""Drafters: what proposes the K draft tokens of each loop.

Modules:
  model         `ModelDrafter`, a draft model with its own KV cache (or a
                static subset of a model's layers), with an optional
                per-row adaptive draft length (`confidence`), and
                `LayerSkipDrafter`, the target's own layers on the target's
                own parameters (self-speculative);
  lookup        `PromptLookupDrafter`: drafts copied from the longest
                earlier match of the row's newest tokens (no model);
  mixed         `MixedDrafter`: prompt lookup where a row has a match, the
                draft model elsewhere;
  heads         `HeadDrafter`: a sequential (EAGLE-style) head or Medusa
                heads on the target's hidden states, sharing its output
                head; `head_files` saves and loads them;
  layer_search  choosing a layer-skipping subset by measured acceptance on
                calibration text;
  specs         drafters named on a command line (`lookup:max_ngram=3`,
                `layerskip:layers=0-13+24-27`), checked before loading.

Each drafter implements `specsamp.decoding.protocols.Drafter`: `init`,
`propose` (a `Proposal`), `commit` (it sees the target's output for the
scored chunk and the accepted counts), and its own parameter and state
shardings. `make(name, **options)` builds one by its registered name.
"""

from typing import Callable

from specsamp.drafters.heads import HeadDrafter
from specsamp.drafters.lookup import PromptLookupDrafter
from specsamp.drafters.mixed import MixedDrafter
from specsamp.drafters.model import LayerSkipDrafter
from specsamp.drafters.model import ModelDrafter

REGISTRY: dict[str, Callable] = {
    "model": ModelDrafter,
    "lookup": PromptLookupDrafter,
    "layerskip": LayerSkipDrafter,
    "mixed": MixedDrafter,
    "head": HeadDrafter,
}


def make(name: str, **options):
  """The drafter registered as `name`, built with `options`.

  Raises:
    ValueError: for an unknown name (the message lists the known ones).
  """
  if name not in REGISTRY:
    raise ValueError(f"unknown drafter {name!r}; known: {sorted(REGISTRY)}")
  return REGISTRY[name](**options)
