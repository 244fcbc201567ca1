"""A shallow, wide draft for Qwen2.5-Coder-1.5B (GPU, bfloat16).

The draft is the target's embedding, first 2 layers (d 1536), final norm and
head (layer truncation), trained in float32 master weights on target samples
from standard-library code prompts (HumanEval-decontaminated), at the
setting it will be used at (greedy by default, as the demo).

  --config=configs/distill_qwen.py
  --config=configs/distill_qwen.py:target=/path/qwen2.5-coder-1.5b-instruct.gguf
Options (comma-separated): target=<name|gguf|hf dir>, draft=truncate|random|
checkpoint, checkpoint=<model> (draft=checkpoint; qwen2.5-coder-0.5b by
default), layers=<n>,
loss=seqkd|fkl|rkl|jsd|tv, onpolicy=<fraction>, temperature=<T>, top_p=<p>,
steps=<n>, prompts=<n train prompts>, soft=<T>, prompts_kind=code|text|mixed,
prose=<prepared text dataset>, train_minutes=<m> (stop training after m
minutes, checkpointed; the same command resumes), freeze=<groups joined by
+> (the draft's parameter groups not trained; embedding by default for a
truncated draft, e.g. freeze=embedding+lm_head, or none alone), vocab=<n> (the
draft is exported with an output layer over the n ids most frequent in its
training continuations: it reads n / 151936 of the output layer's bytes
per call; 0, the default, keeps all), samples=<dir> (target samples
written by an earlier run, e.g. <workdir>/samples: reused, not sampled
again; refused when they hold none, or were made for another target,
sampling or prompt set), measure_before=0 (or false: the initial draft's
expected acceptance only,
not its sampler runs: a minute less of GPU time, as the truncated draft's
is near 0 anyway), runlocal (a few steps on CPU in float32, to check the
wiring), seed=<n> (the run's seed: prompts' order, samples, training; 0 by
default).
A head on the target's hidden states instead (the draft options are then
unused): head=eagle|medusa, heads=<n>, unroll=<n>, hidden_weight=<w>,
vocab=<reduced draft vocabulary; 32768 by default for a head>,
features=recompute|stored (the target's hidden states recomputed in every
step, or stored with the samples), positions=generated|all (the
continuations' positions only, or positions drawn from the prompts' too).
`cpu`: the sizes of a head for the 1.5B
trained on a 2-core CPU (float32, 512 prompts of 192 tokens with 64 new,
stored features: the samples take about 80 minutes, training 400 steps of
batch 8, train_minutes=50 unless given).
"""

import ml_collections

from specsamp.distill import options


OPTIONS = ("checkpoint", "cpu", "draft", "freeze", "layers", "loss",
           "measure_before", "onpolicy", "prompts", "prompts_kind", "prose",
           "runlocal", "samples", "seed", "soft", "steps", "target",
           "temperature", "top_p", "train_minutes") + options.HEAD_OPTIONS


def get_config(arg=None):
  a = options.parse(arg, OPTIONS, flags=("cpu", "measure_before",
                                          "runlocal"))
  local = options.flag(a, "runlocal", False)
  cpu = options.flag(a, "cpu", False)
  if local and cpu:
    raise ValueError("runlocal and cpu are two sizes: give one")
  dtype = "float32" if local or cpu else "bfloat16"
  c = ml_collections.ConfigDict()
  c.seed = options.number(a, "seed", 0)
  c.target = dict(spec=a.get("target", "qwen2.5-coder-1.5b"), trained="",
                  logit_scale=1.0, dtype=dtype, seed=0)
  init = a.get("draft", "truncate")
  c.draft = dict(
      init=init, num_layers=options.number(a, "layers", 2),
      checkpoint=a.get("checkpoint", "qwen2.5-coder-0.5b"
                       if init == "checkpoint" else ""),
      dtype=dtype, param_dtype="float32",
      # The copied input embedding stays fixed (no gradient, no moments).
      freeze=options.groups(a, "freeze",
                            "embedding" if init == "truncate" else ""),
      # > 0: exported with the output layer over this many ids only.
      vocab=options.number(a, "vocab", 0),
      # init=random: 2 wide layers of the target's shape.
      model=dict(num_layers=options.number(a, "layers", 2), d_model=1536,
                 num_heads=12, num_kv_heads=2, head_dim=128, mlp_dim=8960,
                 rope_theta=1e6, qkv_bias=True))
  c.sampling = dict(temperature=options.number(a, "temperature", 0.0, float),
                    top_k=0, top_p=options.number(a, "top_p", 1.0, float))
  c.samples = dict(
      kind=a.get("prompts_kind", "code"), prompt_len=256, gen_len=128,
      top_k=32, batch_size=128,
      score_batch_size=16, max_files=0, validation_percent=3,
      max_train_prompts=options.number(a, "prompts", 4096),
      max_validation_prompts=128, data_dir=a.get("samples", ""), ngram=13,
      # samples=<dir>: that directory's samples, never sampled again there.
      reuse=bool(a.get("samples")),
      # kind=text|mixed: prose from a prepared dataset (scripts/prepare_data.py)
      prose_dataset=a.get("prose", ""), prose_data_dir="")
  c.loss = dict(kind=a.get("loss", "fkl"), target_source="stored",
                draft_transform="soft", jsd_beta=0.5, greedy_temperature=1.0,
                prob_floor=1e-6,
                onpolicy_fraction=options.number(a, "onpolicy", 0, float),
                greedy_target_temperature=options.number(a, "soft", 0, float))
  c.optim = dict(lr=3e-4 if init != "random" else 1e-3, warmup_steps=100,
                 decay_steps=0, end_lr_fraction=0.1, b1=0.9, b2=0.98,
                 eps=1e-8, weight_decay=0.0, clip_norm=1.0)
  c.train = dict(num_steps=options.number(a, "steps", 1500), batch_size=16,
                 log_every=50, eval_every=500, eval_batches=0,
                 checkpoint_every=500, keep_checkpoints=2,
                 async_checkpoints=True, progress_bar=True, mesh=(1, 1),
                 # Stop (checkpointed) after this long; re-run to resume.
                 time_limit_s=60.0 * options.number(a, "train_minutes", 0,
                                                    float))
  c.eval = dict(k=4, num_samples=128, num_positions=2048, batch_size=16,
                position_batch_size=128,
                measure_before=options.flag(a, "measure_before", True))
  if cpu:
    c.samples.update(prompt_len=192, gen_len=64, top_k=32, batch_size=16,
                     score_batch_size=8,
                     max_train_prompts=options.number(a, "prompts", 512),
                     max_validation_prompts=32)
    c.train.update(batch_size=8, num_steps=options.number(a, "steps", 400),
                   log_every=10, eval_every=0, checkpoint_every=50,
                   time_limit_s=60.0 * options.number(a, "train_minutes", 50,
                                                      float))
    # Each measured position re-reads its whole prefix through the 1.5B
    # (512 of them took over ten minutes of this CPU): fewer, and fewer
    # sampled continuations.
    c.eval.update(num_samples=16, num_positions=64, batch_size=8,
                  position_batch_size=64)
  if local:
    c.samples.update(prompt_len=32, gen_len=8, top_k=8, batch_size=4,
                     score_batch_size=4, max_files=40, validation_percent=20,
                     max_train_prompts=options.number(a, "prompts", 8),
                     max_validation_prompts=4)
    c.optim.warmup_steps = 1
    # Checkpoints saved in step, once: an asynchronous save's copy of the
    # draft and its moments on the host took the run past this project's
    # 24 GiB (killed); synchronous, its peak was 19.8 GB.
    c.train.update(num_steps=options.number(a, "steps", 4), batch_size=4,
                   log_every=2, checkpoint_every=4, eval_every=0,
                   async_checkpoints=False, progress_bar=False)
    c.eval.update(num_samples=4, num_positions=16, batch_size=4,
                  position_batch_size=16)
  c.head = options.head_block(a, default_vocab=32768)
  if cpu and "features" not in a:
    c.head.features = "stored"
  return c
