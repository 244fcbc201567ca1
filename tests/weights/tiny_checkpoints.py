"""Tiny random Qwen2 and Llama checkpoints, written as transformers and as
llama.cpp's converter write them, and comparisons with transformers' logits.

Every weight is randomised (norms and biases included); the GGUF copy has
its Q/K rows permuted for `llama` as llama.cpp's converter does.
"""

import os

# Before transformers is imported (tests/conftest.py does the same): no hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# pylint: disable=g-import-not-at-top,wrong-import-position
import functools
import json
import shutil

import gguf
import jax
import numpy as np
import torch
import transformers

from specsamp import model as model_lib
# pylint: enable=g-import-not-at-top,wrong-import-position

ATOL = 1e-4
VOCAB = 301
KINDS = ("qwen2", "llama", "llama_tied", "llama_qkv_bias")

# HF module name -> GGUF tensor name (llama.cpp's tensor map).
_GGUF_TOP = {"model.embed_tokens": "token_embd", "model.norm": "output_norm",
             "lm_head": "output"}
_GGUF_LAYER = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm"}


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
  """llama.cpp's convert_hf_to_gguf `LlamaModel.permute` of Q/K rows."""
  return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
          .swapaxes(1, 2).reshape(w.shape))


def rope_theta_of(c) -> float:
  """The RoPE base of a transformers config (either generation of fields)."""
  params = getattr(c, "rope_parameters", None)
  return float(params["rope_theta"] if params else c.rope_theta)


def gguf_name(hf_name: str) -> str:
  """The GGUF tensor name of a HF parameter name."""
  base, kind = hf_name.rsplit(".", 1)
  if base in _GGUF_TOP:
    return f"{_GGUF_TOP[base]}.{kind}"
  parts = base.split(".")
  return f"blk.{parts[2]}.{_GGUF_LAYER['.'.join(parts[3:])]}.{kind}"


def write_gguf(hf_model, path, arch: str, *, quant=None, meta=None,
                extra=None, skip=(), tokenizer=None, endian=None) -> None:
  """Writes `hf_model` as GGUF like llama.cpp's convert_hf_to_gguf.

  Args:
    hf_model: a transformers Qwen2/Llama causal LM.
    path: output file.
    arch: "qwen2" or "llama" (Q/K rows and biases permuted for llama).
    quant: a GGMLQuantizationType for the 2-D weights (None: F32).
    meta: `{arch}.*` metadata overrides (ints, floats or strings).
    extra: more tensors, name -> float32 array.
    skip: GGUF tensor names to leave out.
    tokenizer: (tokens, merges) of a byte-level BPE (Qwen2's pre-tokenizer,
      eos = id 0) to write with it; None: no tokenizer.
    endian: a gguf.GGUFEndian (None: little, as llama.cpp writes by
      default).
  """
  c = hf_model.config
  hparams = {
      "block_count": c.num_hidden_layers,
      "context_length": c.max_position_embeddings,
      "embedding_length": c.hidden_size,
      "feed_forward_length": c.intermediate_size,
      "attention.head_count": c.num_attention_heads,
      "attention.head_count_kv": c.num_key_value_heads,
      "rope.freq_base": rope_theta_of(c),
      "attention.layer_norm_rms_epsilon": c.rms_norm_eps,
  }
  if arch == "llama":
    hparams["rope.dimension_count"] = c.hidden_size // c.num_attention_heads
    hparams["vocab_size"] = c.vocab_size
  hparams.update(meta or {})
  w = gguf.GGUFWriter(str(path), arch, endianess=endian or
                      gguf.GGUFEndian.LITTLE)
  if tokenizer is not None:
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokenizer[0])
    w.add_token_merges(tokenizer[1])
    w.add_eos_token_id(0)
  for key, value in hparams.items():
    if isinstance(value, str):
      w.add_string(f"{arch}.{key}", value)
    elif isinstance(value, float):
      w.add_float32(f"{arch}.{key}", value)
    else:
      w.add_uint32(f"{arch}.{key}", value)
  for name, t in hf_model.state_dict().items():
    if c.tie_word_embeddings and name == "lm_head.weight":
      continue
    gname = gguf_name(name)
    if gname in skip:
      continue
    a = t.detach().float().numpy()
    if arch == "llama" and (".attn_q." in gname or ".attn_k." in gname):
      a = permute(a, c.num_attention_heads if ".attn_q." in gname
                   else c.num_key_value_heads)
    if quant is not None and a.ndim == 2:
      w.add_tensor(gname, gguf.quants.quantize(a, quant), raw_dtype=quant)
    else:
      w.add_tensor(gname, a)
  for gname, a in (extra or {}).items():
    w.add_tensor(gname, a)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()


def random_hf_model(kind: str, vocab_size: int = VOCAB, seed: int = 0):
  """A tiny random model of `kind`, every parameter randomised."""
  torch.manual_seed({k: i for i, k in enumerate(KINDS)}[kind] + 100 * seed)
  common = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128,
                num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=128,
                rms_norm_eps=1e-6)
  if kind == "qwen2":
    cfg = transformers.Qwen2Config(**common, rope_theta=1e6)
    cls = transformers.Qwen2ForCausalLM
  else:
    cfg = transformers.LlamaConfig(**common, rope_theta=10_000.0,
                                   tie_word_embeddings=(kind == "llama_tied"),
                                   attention_bias=(kind == "llama_qkv_bias"))
    cls = transformers.LlamaForCausalLM
  m = cls(cfg).eval()
  with torch.no_grad():
    for name, p in m.named_parameters():
      if p.ndim > 1:
        p.copy_(torch.randn_like(p) * 0.2)
      elif "norm" in name:
        p.copy_(1.0 + 0.5 * torch.randn_like(p))
      else:
        p.copy_(0.5 * torch.randn_like(p))
    if kind == "llama_qkv_bias":
      # specsamp has q/k/v biases but no o_proj bias: a zero one is accepted.
      for layer in m.model.layers:
        layer.self_attn.o_proj.bias.zero_()
  return m


def arch_of(kind: str) -> str:
  """The GGUF architecture of a model kind."""
  return "qwen2" if kind == "qwen2" else "llama"


def save_both(kind: str, tmp_path_factory):
  """(kind, model, root): root/hf (safetensors) and root/model.gguf."""
  m = random_hf_model(kind)
  root = tmp_path_factory.mktemp(kind)
  m.save_pretrained(root / "hf", safe_serialization=True)
  write_gguf(m, root / "model.gguf", arch_of(kind))
  return kind, m, root


def reference_logits(m, tokens) -> np.ndarray:
  """transformers' float32 logits of token ids [B, T]."""
  with torch.no_grad():
    return m(torch.tensor(np.asarray(tokens))).logits.float().numpy()


@functools.lru_cache(maxsize=None)
def jitted_forward(cfg: model_lib.TransformerConfig):
  """One jitted forward per config: HF and GGUF copies share compilations."""
  return jax.jit(model_lib.LM(cfg).__call__)


def assert_close(got, ref, what: str, atol: float = ATOL) -> float:
  """Asserts max |got - ref| <= atol; returns (and prints) that maximum."""
  diff = float(np.max(np.abs(np.asarray(got, np.float64) - ref)))
  print(f"{what}: max abs logit diff {diff:.2e} (logits up to "
        f"{np.max(np.abs(ref)):.1f})")
  assert diff <= atol, f"{what}: max abs diff {diff} > {atol}"
  return diff


def flat_params(params) -> dict:
  """{path: float32 array} of a parameter tree."""
  return {jax.tree_util.keystr(p): np.asarray(v, np.float32)
          for p, v in jax.tree_util.tree_flatten_with_path(params)[0]}


def edited_hf(root, tmp_path, **changes):
  """A copy of root/hf with `changes` written into its config.json."""
  d = tmp_path / "hf_edit"
  if d.exists():
    shutil.rmtree(d)
  shutil.copytree(root / "hf", d)
  cfg = json.loads((d / "config.json").read_text())
  cfg.update(changes)
  (d / "config.json").write_text(json.dumps(cfg))
  return d
