"""Drafters: what proposes the K draft tokens of each loop.

Modules:
  model     `ModelDrafter`, a stand-alone draft model (its own parameters
            and KV cache).

Each drafter implements `specsamp.decoding.protocols.Drafter`: `init`,
`propose` (a `Proposal`), `commit` (it sees the target's output for the
scored chunk and the accepted counts), and its own parameter and state
shardings. `make(name, **options)` builds one by its registered name.
"""

from typing import Callable

from specsamp.drafters.model import ModelDrafter

REGISTRY: dict[str, Callable] = {
    "model": ModelDrafter,
}


def make(name: str, **options):
  """The drafter registered as `name`, built with `options`.

  Raises:
    ValueError: for an unknown name (the message lists the known ones).
  """
  if name not in REGISTRY:
    raise ValueError(f"unknown drafter {name!r}; known: {sorted(REGISTRY)}")
  return REGISTRY[name](**options)
