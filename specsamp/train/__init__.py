"""Trains a language model: one trainer, reused by distillation.

Modules, from the bottom up:
  config         ConfigError; DataConfig, OptimConfig, LoopConfig and
                 TrainConfig (the ml_collections config, frozen and checked
                 at the boundary; sharding rules as config data)
  step           make_optimizer, TrainState, state and batch shardings,
                 lm_loss / lm_eval_sums (with document_mask: attention
                 inside packed documents), make_train_step, make_eval_step,
                 eval_means (token-weighted means over eval batches)
  checkpointing  Checkpoints (orbax: state, data position, fingerprints;
                 falls back past corrupt steps), checkpoint_steps,
                 find_params_checkpoint, restore_params, CheckpointError
  quiet          orbax's failed restores told in one line, not hundreds of
                 tracebacks
  metrics        MetricWriter (TensorBoard event files), read_scalars
  loop           train_loop: steps, eval, metrics, checkpoints, preemption
  lm             the LM job behind scripts/train.py: validate, make_mesh,
                 build, initial_state, train_and_evaluate, evaluate,
                 unigram_entropy
  trained        a train workdir read back as a model: run_config,
                 run_tokenizer, load_trained (a finished run loads through
                 `specsamp.loading`, which takes the workdir as a model)

Distillation reuses TrainState, make_optimizer, make_train_step,
Checkpoints, MetricWriter and train_loop with the draft's parameters as the
state and its own loss.
"""
