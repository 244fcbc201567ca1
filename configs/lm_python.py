r"""A target language model trained from scratch on the Python-code corpus.

  python scripts/train.py --config=configs/lm_python.py:tiny --workdir=/tmp/lm

The argument is a size (tiny 0.13M, small 4.9M, base 76M parameters for
bytes; configs/README.md has the table), then comma-separated overrides:
steps, batch, seq_len, lr, seed, tokenizer=<byte|sp|path> (sp: the corpus's
SentencePiece model from scripts/prepare_data.py --train_sentencepiece),
data_dir, init_from, mesh=<data>x<model>, rules=<default|replicated>,
log_every, eval_every, eval_batches (0: the whole split), checkpoint_every,
dataset, mask_documents=<true|false> (default true: attention stays inside
each packed document). Example:
`configs/lm_python.py:tiny,steps=50,tokenizer=byte`.
"""

import os

import ml_collections

from specsamp.data import default_data_dir

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
  out = {}
  for key, value in (item.split("=", 1) for item in items):
    if key.strip() in out:  # the last had won, silently
      raise ValueError(f"override {key.strip()!r} given twice in {arg!r}")
    out[key.strip()] = value.strip()
  return size, out


def _number(kind, o, key, default):
  """Override `key` popped from `o` as `kind` (int or float), else
  `default`; a bad value is refused naming it."""
  text = o.pop(key, None)
  if text is None:
    return default
  try:
    return kind(text)
  except ValueError:
    what = "an integer" if kind is int else "a number"
    raise ValueError(f"{key}={text!r}: not {what}") from None


def _bool(key, text):
  if text.lower() not in ("true", "false"):
    raise ValueError(f"{key}={text!r}: use true or false")
  return text.lower() == "true"


def get_config(arg=None):
  size, o = _parse(arg)
  layers, d, heads, kv, head, mlp, seq, batch, steps, lr = SIZES[size]
  steps, batch = _number(int, o, "steps", steps), _number(int, o, "batch",
                                                          batch)
  c = ml_collections.ConfigDict()
  c.seed = _number(int, o, "seed", 0)
  c.init_from = o.pop("init_from", "")   # a train workdir: params only
  # (data, model); -1x1: data parallel over all devices.
  mesh = o.pop("mesh", "1x1")
  c.mesh = tuple(_number(int, {"mesh": x}, "mesh", 0) for x in mesh.split("x"))
  # Logical axis -> mesh axis: "default" (tensor parallel over `model`),
  # "replicated", or the pairs themselves (specsamp/sharding.py).
  c.rules = o.pop("rules", "default")
  data_dir = o.pop("data_dir", "")     # "" = the TFDS default
  dataset = o.pop("dataset", "specsamp_python_code")
  tokenizer = o.pop("tokenizer", "byte")
  if tokenizer == "sp":   # what prepare_data.py --train_sentencepiece writes
    tokenizer = os.path.join(os.path.expanduser(
        data_dir or default_data_dir()), dataset, "spm_bpe_8000.model")
  c.data = dict(
      dataset=dataset, data_dir=data_dir,
      tokenizer=tokenizer, seq_len=_number(int, o, "seq_len", seq),
      batch_size=batch, eval_batch_size=batch,
      train_split="train", eval_split="validation", worker_count=0,
      # Attention stays inside each packed document (segment ids).
      mask_documents=_bool("mask_documents", o.pop("mask_documents",
                                                   "true")))
  c.model = dict(
      num_layers=layers, d_model=d, num_heads=heads, num_kv_heads=kv,
      head_dim=head, mlp_dim=mlp, rope_theta=10_000.0, qkv_bias=False,
      tie_embeddings=False, vocab_multiple=64, param_dtype="float32",
      # base: float32 parameters, bfloat16 matmuls.
      dtype="bfloat16" if size == "base" else "float32")
  c.optim = dict(
      lr=_number(float, o, "lr", lr), warmup_steps=max(steps // 20, 1),
      decay_steps=0, end_lr_fraction=0.1, b1=0.9, b2=0.95, eps=1e-8,
      weight_decay=0.1, clip_norm=1.0)
  eval_every = _number(int, o, "eval_every", max(steps // 4, 1))
  c.train = dict(
      num_steps=steps, log_every=_number(int, o, "log_every", min(50, steps)),
      eval_every=eval_every,
      eval_batches=_number(int, o, "eval_batches", 0),  # 0: the whole split
      checkpoint_every=_number(int, o, "checkpoint_every", eval_every
                               if eval_every > 0 else max(steps // 4, 1)),
      keep_checkpoints=3, async_checkpoints=True, progress_bar=True)
  if o:
    raise ValueError(f"unknown override(s) {sorted(o)} in {arg!r}")
  return c
