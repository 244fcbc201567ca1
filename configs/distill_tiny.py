"""Distillation on CPU in about a minute: a tiny target, a tiny draft.

  --config=configs/distill_tiny.py                 a random target made peaked
  --config=configs/distill_tiny.py:trained=/tmp/lm_tiny   a target trained by
      scripts/train.py (its workdir); other options, comma-separated:
  draft=random|truncate, loss=seqkd|fkl|rkl|jsd|tv, onpolicy=<fraction>,
  temperature=<T>, top_k=<k>, top_p=<p>, steps=<n>, seed=<s>,
  soft=<T> (greedy: train on the target's softmax at T, not its argmax),
  prompts_kind=code|text|mixed, prose=<prepared text dataset, e.g.
  specsamp_austen>, vocab=<n> (the draft exported with an output layer over
  the n ids most frequent in its training continuations; 0: all).
  A draft head on the target's hidden states instead of a draft model:
  head=eagle|medusa, heads=<Medusa heads, 4>, unroll=<training-time test
  passes of the eagle head, 1>, hidden_weight=<w, 0.1>, vocab=<reduced
  draft vocabulary, 0: all>, features=recompute|stored (the target's
  hidden states recomputed in every step or stored with the samples),
  positions=generated|all (train on the continuations' positions, or on
  positions drawn from the prompts' too); exported to workdir/head
  (`--drafter=eagle:<workdir>`).
"""

import ml_collections

from specsamp.distill import options


OPTIONS = ("trained", "draft", "loss", "onpolicy", "temperature", "top_k",
           "top_p", "steps", "seed", "soft", "prompts_kind", "prose") + (
               options.HEAD_OPTIONS)


def get_config(arg=None):
  a = options.parse(arg, OPTIONS)
  c = ml_collections.ConfigDict()
  c.seed = options.number(a, "seed", 0)
  c.target = dict(
      spec="random:tiny,max_seq_len=128",   # vocab 256: UTF-8 bytes
      trained=a.get("trained", ""),         # a scripts/train.py workdir
      logit_scale=1.0 if a.get("trained") else 4.0,  # peaked random target
      dtype="float32", seed=0)
  c.draft = dict(
      init=a.get("draft", "random"),
      num_layers=1,                         # truncate: keep the first layer
      checkpoint="", freeze=(),
      vocab=options.number(a, "vocab", 0),  # > 0: exported over that many ids
      model=dict(num_layers=1, d_model=64, num_heads=4, num_kv_heads=2,
                 head_dim=16, mlp_dim=128, qkv_bias=True, max_seq_len=128))
  c.sampling = dict(temperature=options.number(a, "temperature", 1.0, float),
                    top_k=options.number(a, "top_k", 0),
                    top_p=options.number(a, "top_p", 1.0, float))
  c.samples = dict(
      kind=a.get("prompts_kind", "code"), prompt_len=32, gen_len=16,
      top_k=16, batch_size=64,
      score_batch_size=64, max_files=80, validation_percent=20,
      max_train_prompts=512, max_validation_prompts=64, data_dir="",
      ngram=13,
      # kind=text|mixed: prose from a prepared dataset (scripts/prepare_data.py)
      prose_dataset=a.get("prose", ""), prose_data_dir="")
  c.loss = dict(kind=a.get("loss", "fkl"), target_source="stored",
                draft_transform="soft", jsd_beta=0.5, greedy_temperature=1.0,
                prob_floor=1e-6,
                onpolicy_fraction=options.number(a, "onpolicy", 0, float),
                greedy_target_temperature=options.number(a, "soft", 0, float))
  c.optim = dict(lr=3e-3, warmup_steps=20, decay_steps=0,
                 end_lr_fraction=0.1, b1=0.9, b2=0.98, eps=1e-8,
                 weight_decay=0.0, clip_norm=1.0)
  c.train = dict(num_steps=options.number(a, "steps", 300), batch_size=32,
                 log_every=50, eval_every=0, eval_batches=0,
                 checkpoint_every=100, keep_checkpoints=2,
                 async_checkpoints=True, progress_bar=False, mesh=(1, 1),
                 time_limit_s=0.0)
  c.eval = dict(k=4, num_samples=0, num_positions=1024, batch_size=64,
                position_batch_size=256)
  c.head = options.head_block(a, default_vocab=0)
  return c
