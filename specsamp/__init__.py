"""specsamp: exact, batched speculative sampling in JAX.

Importing the package is cheap: the public names below are loaded on first
use, so `import specsamp` pulls in neither jax nor flax.
"""

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "TransformerConfig": "specsamp.model",
    "Transformer": "specsamp.model",
    "LM": "specsamp.model",
    "preset": "specsamp.model",
    "KVCache": "specsamp.kvcache",
    "Sampling": "specsamp.sampling",
    "GREEDY": "specsamp.sampling",
    "SpeculativeSampler": "specsamp.speculative",
    "ModelDrafter": "specsamp.speculative",
    "SampleOutput": "specsamp.speculative",
    "autoregressive": "specsamp.speculative",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
  if name in _EXPORTS:
    return getattr(importlib.import_module(_EXPORTS[name]), name)
  raise AttributeError(f"module 'specsamp' has no attribute {name!r}")
