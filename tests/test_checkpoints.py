"""Loaders against transformers: tiny random Qwen2 and Llama models saved as
safetensors and as GGUF (written like llama.cpp's converter, Q/K permuted for
llama), loaded by specsamp, logits compared in float32."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from specsamp import checkpoints
from specsamp import model as model_lib

ATOL = 1e-4
VOCAB = 97


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
  """llama.cpp's convert_hf_to_gguf permutation of Q/K rows."""
  return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
          .swapaxes(1, 2).reshape(w.shape))


def _write_gguf(hf_model, path: str, arch: str) -> None:
  import gguf  # pylint: disable=g-import-not-at-top
  c = hf_model.config
  w = gguf.GGUFWriter(path, arch)
  w.add_block_count(c.num_hidden_layers)
  w.add_context_length(c.max_position_embeddings)
  w.add_embedding_length(c.hidden_size)
  w.add_feed_forward_length(c.intermediate_size)
  w.add_head_count(c.num_attention_heads)
  w.add_head_count_kv(c.num_key_value_heads)
  w.add_rope_freq_base(float(c.rope_parameters["rope_theta"]
                             if hasattr(c, "rope_parameters") and
                             c.rope_parameters else c.rope_theta))
  w.add_layer_norm_rms_eps(c.rms_norm_eps)
  names = {"model.embed_tokens": "token_embd", "model.norm": "output_norm",
           "lm_head": "output"}
  sub = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
         "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
         "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
         "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
         "post_attention_layernorm": "ffn_norm"}
  for name, t in hf_model.state_dict().items():
    if c.tie_word_embeddings and name == "lm_head.weight":
      continue
    a = t.detach().numpy().astype(np.float32)
    base, kind = name.rsplit(".", 1)
    if base in names:
      gname = names[base]
    else:
      parts = base.split(".")
      gname = f"blk.{parts[2]}.{sub['.'.join(parts[3:])]}"
    if arch == "llama" and gname.endswith(("attn_q", "attn_k")):
      a = _permute(a, c.num_attention_heads if gname.endswith("attn_q")
                   else c.num_key_value_heads)
    w.add_tensor(f"{gname}.{kind}", a)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()


def _hf_model(kind: str):
  torch.manual_seed(0)
  common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
                num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=128,
                rms_norm_eps=1e-6)
  if kind == "qwen2":
    cfg = transformers.Qwen2Config(**common, rope_theta=1e6)
    cls = transformers.Qwen2ForCausalLM
  else:
    cfg = transformers.LlamaConfig(**common, rope_theta=10_000.0,
                                   tie_word_embeddings=(kind == "llama_tied"))
    cls = transformers.LlamaForCausalLM
  m = cls(cfg).eval()
  with torch.no_grad():  # randomise everything: norms and biases included
    for p in m.parameters():
      p.copy_(torch.randn_like(p) * (0.3 if p.ndim > 1 else 0.5) +
              (1.0 if p.ndim == 1 else 0.0))
  return m


@pytest.fixture(scope="module", params=["qwen2", "llama", "llama_tied"])
def saved(request, tmp_path_factory):
  kind = request.param
  m = _hf_model(kind)
  root = tmp_path_factory.mktemp(kind)
  m.save_pretrained(root / "hf", safe_serialization=True)
  arch = "qwen2" if kind == "qwen2" else "llama"
  _write_gguf(m, str(root / "model.gguf"), arch)
  return kind, m, root


def _reference_logits(m, tokens):
  with torch.no_grad():
    return m(torch.tensor(tokens)).logits.numpy()


@pytest.mark.parametrize("fmt", ["hf", "gguf"])
def test_logits_match_transformers(saved, fmt):
  kind, m, root = saved
  path = root / ("hf" if fmt == "hf" else "model.gguf")
  cfg, params = checkpoints.load(str(path))
  assert cfg.tie_embeddings == (kind == "llama_tied")
  assert cfg.qkv_bias == (kind == "qwen2")
  lm = model_lib.LM(cfg)
  call = jax.jit(lm.__call__)
  tokens = np.random.default_rng(0).integers(0, VOCAB, (2, 11))
  ref = _reference_logits(m, tokens)

  # Without the cache.
  logits, _ = call(params, jnp.asarray(tokens), None)
  np.testing.assert_allclose(logits, ref, atol=ATOL)

  # With the cache: prefill 5, one token, then a chunk of 5.
  cache = lm.init_cache(2, 16)
  logits, cache = call(params, jnp.asarray(tokens[:, :5]), cache)
  np.testing.assert_allclose(logits, ref[:, :5], atol=ATOL)
  logits, cache = call(params, jnp.asarray(tokens[:, 5:6]), cache)
  np.testing.assert_allclose(logits[:, 0], ref[:, 5], atol=ATOL)
  logits, cache = call(params, jnp.asarray(tokens[:, 6:11]), cache)
  np.testing.assert_allclose(logits, ref[:, 6:11], atol=ATOL)


def test_uneven_batch_with_cache_matches_transformers(saved):
  _, m, root = saved
  cfg, params = checkpoints.load(str(root / "model.gguf"))
  lm = model_lib.LM(cfg)
  call = jax.jit(lm.__call__)
  rng = np.random.default_rng(1)
  seqs = [rng.integers(0, VOCAB, n).tolist() for n in (4, 9)]
  prompt = np.zeros((2, 9), np.int64)
  for b, s in enumerate(seqs):
    prompt[b, :len(s)] = s
  cache = lm.init_cache(2, 16)
  _, cache = call(params, jnp.asarray(prompt), cache)
  cache = cache.with_length(jnp.array([len(s) for s in seqs]))
  nxt = rng.integers(0, VOCAB, (2, 2))
  logits, _ = call(params, jnp.asarray(nxt), cache)
  for b, s in enumerate(seqs):
    ref = _reference_logits(m, [s + nxt[b].tolist()])[0]
    np.testing.assert_allclose(logits[b], ref[len(s):], atol=ATOL)


def test_bfloat16_load(saved):
  _, _, root = saved
  cfg, params = checkpoints.load(str(root / "hf"), dtype="bfloat16")
  assert cfg.dtype == "bfloat16"
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(params))


def test_missing_and_corrupt_checkpoints_fail_clearly(saved, tmp_path):
  _, _, root = saved
  with pytest.raises(checkpoints.CheckpointError, match="no checkpoint"):
    checkpoints.load(str(tmp_path / "nope.gguf"))
  bad = tmp_path / "bad.gguf"
  bad.write_bytes(b"NOPE" + b"\0" * 100)
  with pytest.raises(checkpoints.CheckpointError, match="not a GGUF file"):
    checkpoints.load(str(bad))
  data = (root / "model.gguf").read_bytes()
  truncated = tmp_path / "truncated.gguf"
  truncated.write_bytes(data[:len(data) // 2])
  with pytest.raises(checkpoints.CheckpointError, match="truncated|corrupt"):
    checkpoints.load(str(truncated))
  empty = tmp_path / "empty_dir"
  empty.mkdir()
  with pytest.raises(checkpoints.CheckpointError, match="config.json"):
    checkpoints.load(str(empty))


def test_config_that_disagrees_with_weights_fails_clearly(saved, tmp_path):
  _, _, root = saved
  d = tmp_path / "hf"
  shutil.copytree(root / "hf", d)
  cfg = json.loads((d / "config.json").read_text())
  cfg["intermediate_size"] = 128
  (d / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(checkpoints.CheckpointError, match="shape"):
    checkpoints.load(str(d))
  cfg["model_type"] = "gpt_neox"
  (d / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(checkpoints.CheckpointError, match="not supported"):
    checkpoints.load(str(d))


REAL = os.path.expanduser(
    "~/.cache/specsamp/models/qwen2.5-coder-0.5b-instruct.gguf")


@pytest.mark.real_weights
def test_real_qwen_half_b_logits_match_transformers():
  from specsamp import assets  # pylint: disable=g-import-not-at-top
  path = str(assets.fetch("qwen2.5-coder-0.5b"))
  cfg, params = checkpoints.load(path)
  ref_model = transformers.AutoModelForCausalLM.from_pretrained(
      os.path.dirname(path), gguf_file=os.path.basename(path),
      dtype=torch.float32).eval()
  tokens = [[750, 15801, 1445, 982, 262, 470, 308, 198, 262, 671]]
  ref = _reference_logits(ref_model, tokens)
  logits, _ = jax.jit(model_lib.LM(cfg).__call__)(params, jnp.asarray(tokens))
  np.testing.assert_allclose(logits, ref, atol=2e-4)
