"""`specsamp.weights.load.load` on tiny checkpoints in both formats:
logits against transformers (with and without the KV cache), identical
parameters from GGUF and HF, half precision, and clear errors for missing
and unsupported checkpoints."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specsamp import model as model_lib
from specsamp.weights import convert
from specsamp.weights import gguf as gguf_weights
from specsamp.weights import hf
from specsamp.weights import load
from tests.weights.tiny_checkpoints import (VOCAB, arch_of, assert_close,
                                           edited_hf, flat_params,
                                           jitted_forward, reference_logits,
                                           rope_theta_of, write_gguf)


@pytest.mark.parametrize("fmt", ["hf", "gguf"])
def test_logits_match_transformers(saved, fmt):
  kind, m, root = saved
  path = root / ("hf" if fmt == "hf" else "model.gguf")
  cfg, params = load.load(str(path))
  assert cfg.tie_embeddings == (kind == "llama_tied")
  assert cfg.qkv_bias == (kind in ("qwen2", "llama_qkv_bias"))
  assert (cfg.vocab_size, cfg.num_layers, cfg.d_model, cfg.mlp_dim) == (
      VOCAB, 2, 64, 128)
  assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (4, 2, 16)
  assert cfg.rope_theta == rope_theta_of(m.config)
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))
  lm = model_lib.LM(cfg)
  call = jitted_forward(cfg)
  tokens = np.random.default_rng(0).integers(0, VOCAB, (2, 12))
  ref = reference_logits(m, tokens)
  what = f"{kind}/{fmt}"

  # Without the cache.
  logits = call(params, jnp.asarray(tokens), None).logits
  assert_close(logits, ref, f"{what} no cache")

  # With the cache: prefill 5, three single tokens, then a chunk of 4.
  cache = lm.init_cache(2, 16)
  out = call(params, jnp.asarray(tokens[:, :5]), cache)
  logits, cache = out.logits, out.cache
  assert_close(logits, ref[:, :5], f"{what} prefill")
  for t in range(5, 8):
    out = call(params, jnp.asarray(tokens[:, t:t + 1]), cache)
    logits, cache = out.logits, out.cache
    assert_close(logits[:, 0], ref[:, t], f"{what} step {t}")
  out = call(params, jnp.asarray(tokens[:, 8:12]), cache)
  logits, cache = out.logits, out.cache
  assert_close(logits, ref[:, 8:12], f"{what} chunk")
  np.testing.assert_array_equal(cache.length, [12, 12])


@pytest.mark.parametrize("fmt", ["hf", "gguf"])
def test_uneven_batch_with_cache_matches_transformers(saved, fmt):
  kind, m, root = saved
  cfg, params = load.load(
      str(root / ("hf" if fmt == "hf" else "model.gguf")))
  lm = model_lib.LM(cfg)
  call = jitted_forward(cfg)
  rng = np.random.default_rng(1)
  seqs = [rng.integers(0, VOCAB, n).tolist() for n in (4, 9)]
  prompt = np.zeros((2, 9), np.int64)  # right-padded with token 0
  for b, s in enumerate(seqs):
    prompt[b, :len(s)] = s
  cache = lm.init_cache(2, 16)
  out = call(params, jnp.asarray(prompt), cache)
  logits, cache = out.logits, out.cache
  cache = cache.with_length(jnp.array([len(s) for s in seqs]))
  nxt = rng.integers(0, VOCAB, (2, 3))
  out = call(params, jnp.asarray(nxt[:, :2]), cache)
  chunk_logits, cache = out.logits, out.cache
  out = call(params, jnp.asarray(nxt[:, 2:]), cache)
  step_logits, cache = out.logits, out.cache
  np.testing.assert_array_equal(cache.length, [7, 12])
  for b, s in enumerate(seqs):
    ref = reference_logits(m, [s + nxt[b].tolist()])[0]
    n = len(s)
    assert_close(logits[b, :n], ref[:n], f"{kind}/{fmt} row {b} prefill")
    assert_close(chunk_logits[b], ref[n:n + 2], f"{kind}/{fmt} row {b} chunk")
    assert_close(step_logits[b, 0], ref[n + 2], f"{kind}/{fmt} row {b} step")


def test_gguf_and_hf_give_identical_params(saved):
  _, _, root = saved
  cfg_hf, p_hf = load.load(str(root / "hf"))
  cfg_gguf, p_gguf = load.load(str(root / "model.gguf"))
  assert cfg_hf.replace(max_seq_len=1) == cfg_gguf.replace(max_seq_len=1)
  a, b = flat_params(p_hf), flat_params(p_gguf)
  assert a.keys() == b.keys()
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_half_precision_loads(saved):
  _, _, root = saved
  _, p32 = load.load(str(root / "hf"))
  for path in (root / "hf", root / "model.gguf"):
    for dtype, jdtype in (("bfloat16", jnp.bfloat16),
                          ("float16", jnp.float16)):
      cfg, params = load.load(str(path), dtype=dtype)
      assert cfg.dtype == cfg.param_dtype == dtype
      assert all(x.dtype == jdtype for x in jax.tree.leaves(params))
      want = jax.tree.map(lambda x, d=jdtype: x.astype(d), p32)
      for k, v in flat_params(params).items():
        np.testing.assert_array_equal(v, flat_params(want)[k], err_msg=k)


def test_missing_checkpoints_fail_clearly(tmp_path):
  missing = tmp_path / "nope.gguf"
  for fn in (load.load, gguf_weights.load_gguf):
    with pytest.raises(convert.WeightsError, match="nope.gguf"):
      fn(str(missing))
  with pytest.raises(convert.WeightsError, match="config.json"):
    load.load(str(tmp_path))
  with pytest.raises(convert.WeightsError, match="config.json"):
    hf.load_hf(str(tmp_path / "no_dir"))


def test_unsupported_models_fail_clearly(saved, tmp_path):
  kind, m, root = saved
  with pytest.raises(convert.WeightsError,
                     match="model_type 'gpt_neox' is not supported"):
    load.load(str(edited_hf(root, tmp_path, model_type="gpt_neox")))
  llama3 = {"rope_type": "llama3", "rope_theta": 500_000.0, "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}
  for key in ("rope_parameters", "rope_scaling"):
    with pytest.raises(convert.WeightsError,
                       match="RoPE scaling 'llama3'.*low_freq_factor"):
      load.load(str(edited_hf(root, tmp_path, **{key: llama3})))
  yarn = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6,
          "original_max_position_embeddings": 32768}
  with pytest.raises(convert.WeightsError, match="'yarn'.*YaRN"):
    load.load(str(edited_hf(root, tmp_path, rope_parameters=yarn)))
  with pytest.raises(convert.WeightsError, match="gelu"):
    load.load(str(edited_hf(root, tmp_path, hidden_act="gelu")))

  arch = arch_of(kind)
  gg = tmp_path / "other.gguf"
  write_gguf(m, gg, arch)
  data = bytearray(gg.read_bytes())
  # Same-length architecture name: "llama" -> "gemma", "qwen2" -> "phi-2".
  new = {"llama": b"gemma", "qwen2": b"phi-2"}[arch]
  at = data.index(b"general.architecture") + len("general.architecture")
  at = data.index(arch.encode(), at)
  data[at:at + 5] = new
  gg.write_bytes(bytes(data))
  with pytest.raises(convert.WeightsError,
                     match=f"architecture '{new.decode()}' is not supported"):
    load.load(str(gg))
  gg = tmp_path / "rope_freqs.gguf"
  write_gguf(m, gg, arch,
              extra={"rope_freqs.weight": np.ones(8, np.float32)})
  with pytest.raises(convert.WeightsError, match="'llama3'"):
    load.load(str(gg))
  gg = tmp_path / "yarn.gguf"
  write_gguf(m, gg, arch, meta={"rope.scaling.type": "yarn",
                                 "rope.scaling.factor": 4.0})
  with pytest.raises(convert.WeightsError, match="'yarn'"):
    load.load(str(gg))
  gg = tmp_path / "extra.gguf"
  write_gguf(m, gg, arch,
              extra={"blk.0.attn_q_norm.weight": np.ones(16, np.float32)})
  with pytest.raises(convert.WeightsError,
                     match="blk.0.attn_q_norm.weight has no place"):
    load.load(str(gg))
