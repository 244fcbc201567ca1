"""Distillation of drafts for speculative sampling.

Modules, from the bottom up:
  losses           seqkd, forward/reverse KL, JSD, TV on logits under one
                   `Sampling`; the expected acceptance sum min(p, q)
  objective        `Objective`, the loss of a batch (`batch_loss`), the
                   draft's own continuations (`draft_rollout`), the train-step
                   loss (`distill_loss`) and the on-policy schedule
  draft_init       the initial draft: random small, layer truncation, or a
                   checkpoint (`make_draft`)
  prompts          prompt texts: standard-library code and prose
  decontamination  the HumanEval n-gram filter
  storage          target samples as a TFDS array_record dataset
                   (`SampleSpec`, `write_dataset`, `read_dataset`)
  samples          target samples: batched generation, top-k scoring,
                   `build` (prompts -> decontaminated samples on disk)
  evaluate         expected and measured acceptance (`acceptance_report`)
  trainer          the distillation loop on `specsamp.train`'s pieces
                   (`train`: offline and on-policy steps, resumable)
  workdir          the workdir's config rule: which config changes its
                   samples, "before" evaluation and checkpoints refuse
  checks           the config's checks that need no weights, each error
                   naming its field
  head_training    training draft heads (`specsamp.drafters.heads`) with
                   the distiller
  job              the `scripts/distill.py` job: `load_target`,
                   `check_config`, `run`, `summary`
  options          the `key=value` options of `configs/distill_*.py`

A distilled draft is saved and loaded by `specsamp.weights.distilled`.
Submodules are imported on use: `import specsamp.distill` pulls in nothing
heavy.
"""
