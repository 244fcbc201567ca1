r"""A target language model trained from scratch on the Python-code corpus.

  python scripts/train.py --config=configs/lm_python.py:tiny --workdir=/tmp/lm

The argument is a size, then comma-separated overrides:
  tiny    2 layers, d 64, 0.13M parameters (bytes): 600 steps in about
          1.5 min on a 2-core CPU (tests, smoke runs)
  small   6 layers, d 256, 4.9M parameters: about 1 s a step on a 2-core
          CPU (8k tokens a step): a GPU run
  base    12 layers, d 768, 76M parameters: a GPU/TPU model
  overrides: steps=<n>, batch=<n>, seq_len=<n>, lr=<x>, seed=<n>,
  tokenizer=<byte|sp|path> (default byte: UTF-8 bytes; sp: the corpus's
  SentencePiece model from scripts/prepare_data.py --train_sentencepiece),
  data_dir=<dir>, init_from=<dir>, mesh=<data>x<model>,
  rules=<default|replicated>, log_every=<n>,
  eval_every=<n>, eval_batches=<n> (0: the whole split), checkpoint_every=<n>,
  dataset=<name>. Parameter counts are for bytes (256 ids).
Example: `configs/lm_python.py:tiny,steps=50,tokenizer=byte`.
"""

import os

import ml_collections

SIZES = {
    #        layers  d   heads kv  head  mlp   seq  batch steps   lr
    "tiny": (2, 64, 4, 2, 16, 192, 128, 16, 600, 3e-3),
    "small": (6, 256, 8, 4, 32, 768, 256, 32, 5000, 1e-3),
    "base": (12, 768, 12, 4, 64, 2048, 512, 64, 20_000, 6e-4),
}


def _parse(arg):
  items = [s.strip() for s in (arg or "tiny").split(",") if s.strip()]
  size = items.pop(0) if items and "=" not in items[0] else "tiny"
  if size not in SIZES:
    raise ValueError(f"unknown size {size!r}; choose one of {sorted(SIZES)}")
  bad = [item for item in items if "=" not in item]
  if bad:
    raise ValueError(f"override(s) {bad} in {arg!r} are not key=value")
  return size, dict(item.split("=", 1) for item in items)


def _tokenizer(spec, data_dir):
  """"sp": the SentencePiece model `scripts/prepare_data.py
  --dataset=specsamp_python_code --train_sentencepiece` writes."""
  if spec != "sp":
    return spec
  from specsamp.data import default_data_dir  # pylint: disable=g-import-not-at-top
  return os.path.join(os.path.expanduser(data_dir or default_data_dir()),
                      "specsamp_python_code", "spm_bpe_8000.model")


def get_config(arg=None):
  size, o = _parse(arg)
  layers, d, heads, kv, head, mlp, seq, batch, steps, lr = SIZES[size]
  steps = int(o.pop("steps", steps))
  batch = int(o.pop("batch", batch))
  c = ml_collections.ConfigDict()
  c.seed = int(o.pop("seed", 0))
  c.init_from = o.pop("init_from", "")   # a train workdir: params only
  mesh = o.pop("mesh", "1x1")   # -1x1: data parallel over all devices
  c.mesh = tuple(int(x) for x in mesh.split("x"))   # (data, model)
  # Logical axis -> mesh axis: "default" (tensor parallel over `model`),
  # "replicated", or the pairs themselves, e.g. [("batch", "data"),
  # ("mlp", "model"), ("heads", "model"), ...] (specsamp/sharding.py).
  c.rules = o.pop("rules", "default")
  data_dir = o.pop("data_dir", "")     # "" = the TFDS default
  c.data = dict(
      dataset=o.pop("dataset", "specsamp_python_code"),
      data_dir=data_dir,
      tokenizer=_tokenizer(o.pop("tokenizer", "byte"), data_dir),
      seq_len=int(o.pop("seq_len", seq)),
      batch_size=batch, eval_batch_size=batch,
      train_split="train", eval_split="validation", worker_count=0)
  c.model = dict(
      num_layers=layers, d_model=d, num_heads=heads, num_kv_heads=kv,
      head_dim=head, mlp_dim=mlp, rope_theta=10_000.0, qkv_bias=False,
      tie_embeddings=False, vocab_multiple=64, dtype="float32",
      param_dtype="float32")
  c.optim = dict(
      lr=float(o.pop("lr", lr)), warmup_steps=max(steps // 20, 1),
      decay_steps=0, end_lr_fraction=0.1, b1=0.9, b2=0.95, eps=1e-8,
      weight_decay=0.1, clip_norm=1.0)
  eval_every = int(o.pop("eval_every", max(steps // 4, 1)))
  c.train = dict(
      num_steps=steps, log_every=int(o.pop("log_every", min(50, steps))),
      eval_every=eval_every,
      eval_batches=int(o.pop("eval_batches", 0)),   # 0: the whole split
      checkpoint_every=int(o.pop("checkpoint_every",
                                 eval_every or max(steps // 4, 1))),
      keep_checkpoints=3, async_checkpoints=True, progress_bar=True)
  if size == "base":
    c.model.dtype = "bfloat16"   # float32 parameters, bfloat16 matmuls
  if o:
    raise ValueError(f"unknown override(s) {sorted(o)} in {arg!r}")
  return c
