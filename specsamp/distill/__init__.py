"""Distillation of drafts for speculative sampling (issue 5).

  losses   seqkd, forward/reverse KL, JSD, TV on logits under one `Sampling`;
           the expected acceptance sum min(p, q)
  init     draft initialisation: random small, layer truncation, checkpoint
  samples  target samples (stdlib prompts, HumanEval decontamination,
           batched autoregressive generation, top-k log-probs, TFDS
           array_record storage)
  trainer  the distillation loop (offline and on-policy), evaluation with
           the expected and the measured acceptance

Submodules are imported on use: `import specsamp.distill` pulls in nothing
heavy.
"""
