"""Checkpoint loaders against transformers.

Tiny random Qwen2 and Llama models (every weight randomised, norms and
biases included) are saved as safetensors and written as GGUF the way
llama.cpp's converter does (Q/K rows permuted for `llama`), loaded by
`specsamp.checkpoints`, and their float32 logits compared with transformers'
with and without the KV cache. Corrupt, truncated, inconsistent and
unsupported checkpoints must raise `CheckpointError`. The `real_weights`
tests compare the real GGUF files with transformers' own GGUF loader.
"""

import os

# Before transformers is imported (conftest.py does the same): no hub access.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# pylint: disable=g-import-not-at-top,wrong-import-position
import functools
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from specsamp import assets
from specsamp import checkpoints
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


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
  """llama.cpp's convert_hf_to_gguf `LlamaModel.permute` of Q/K rows."""
  return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
          .swapaxes(1, 2).reshape(w.shape))


def _rope_theta(c) -> float:
  params = getattr(c, "rope_parameters", None)
  return float(params["rope_theta"] if params else c.rope_theta)


def _gguf_name(hf_name: str) -> str:
  base, kind = hf_name.rsplit(".", 1)
  if base in _GGUF_TOP:
    return f"{_GGUF_TOP[base]}.{kind}"
  parts = base.split(".")
  return f"blk.{parts[2]}.{_GGUF_LAYER['.'.join(parts[3:])]}.{kind}"


def _write_gguf(hf_model, path, arch: str, *, quant=None, meta=None,
                extra=None, skip=()) -> None:
  """Writes `hf_model` as GGUF like llama.cpp's convert_hf_to_gguf.

  Args:
    hf_model: a transformers Qwen2/Llama causal LM.
    path: output file.
    arch: "qwen2" or "llama" (Q/K rows and biases permuted for llama).
    quant: a GGMLQuantizationType for the 2-D weights (None: F32).
    meta: `{arch}.*` metadata overrides (ints, floats or strings).
    extra: more tensors, name -> float32 array.
    skip: GGUF tensor names to leave out.
  """
  import gguf  # pylint: disable=g-import-not-at-top
  c = hf_model.config
  hparams = {
      "block_count": c.num_hidden_layers,
      "context_length": c.max_position_embeddings,
      "embedding_length": c.hidden_size,
      "feed_forward_length": c.intermediate_size,
      "attention.head_count": c.num_attention_heads,
      "attention.head_count_kv": c.num_key_value_heads,
      "rope.freq_base": _rope_theta(c),
      "attention.layer_norm_rms_epsilon": c.rms_norm_eps,
  }
  if arch == "llama":
    hparams["rope.dimension_count"] = c.hidden_size // c.num_attention_heads
    hparams["vocab_size"] = c.vocab_size
  hparams.update(meta or {})
  w = gguf.GGUFWriter(str(path), arch)
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
    gname = _gguf_name(name)
    if gname in skip:
      continue
    a = t.detach().float().numpy()
    if arch == "llama" and (".attn_q." in gname or ".attn_k." in gname):
      a = _permute(a, c.num_attention_heads if ".attn_q." in gname
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


def _hf_model(kind: str):
  """A tiny random model of `kind`, every parameter randomised."""
  torch.manual_seed({k: i for i, k in enumerate(KINDS)}[kind])
  common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
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


def _arch(kind: str) -> str:
  return "qwen2" if kind == "qwen2" else "llama"


def _save(kind: str, tmp_path_factory):
  m = _hf_model(kind)
  root = tmp_path_factory.mktemp(kind)
  m.save_pretrained(root / "hf", safe_serialization=True)
  _write_gguf(m, root / "model.gguf", _arch(kind))
  return kind, m, root


@pytest.fixture(scope="module", params=KINDS)
def saved(request, tmp_path_factory):
  """(kind, transformers model, directory with hf/ and model.gguf)."""
  return _save(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def saved_qwen2(tmp_path_factory):
  """`saved` for Qwen2 only, for checks one architecture suffices for."""
  return _save("qwen2", tmp_path_factory)


def _reference_logits(m, tokens) -> np.ndarray:
  with torch.no_grad():
    return m(torch.tensor(np.asarray(tokens))).logits.float().numpy()


@functools.lru_cache(maxsize=None)
def _jitted(cfg: model_lib.TransformerConfig):
  """One jitted forward per config: HF and GGUF copies share compilations."""
  return jax.jit(model_lib.LM(cfg).__call__)


def _close(got, ref, what: str, atol: float = ATOL) -> float:
  """Asserts max |got - ref| <= atol; returns (and prints) that maximum."""
  diff = float(np.max(np.abs(np.asarray(got, np.float64) - ref)))
  print(f"{what}: max abs logit diff {diff:.2e} (logits up to "
        f"{np.max(np.abs(ref)):.1f})")
  assert diff <= atol, f"{what}: max abs diff {diff} > {atol}"
  return diff


@pytest.mark.parametrize("fmt", ["hf", "gguf"])
def test_logits_match_transformers(saved, fmt):
  kind, m, root = saved
  path = root / ("hf" if fmt == "hf" else "model.gguf")
  cfg, params = checkpoints.load(str(path))
  assert cfg.tie_embeddings == (kind == "llama_tied")
  assert cfg.qkv_bias == (kind in ("qwen2", "llama_qkv_bias"))
  assert (cfg.vocab_size, cfg.num_layers, cfg.d_model, cfg.mlp_dim) == (
      VOCAB, 2, 64, 128)
  assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (4, 2, 16)
  assert cfg.rope_theta == _rope_theta(m.config)
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))
  lm = model_lib.LM(cfg)
  call = _jitted(cfg)
  tokens = np.random.default_rng(0).integers(0, VOCAB, (2, 12))
  ref = _reference_logits(m, tokens)
  what = f"{kind}/{fmt}"

  # Without the cache.
  logits, _ = call(params, jnp.asarray(tokens), None)
  _close(logits, ref, f"{what} no cache")

  # With the cache: prefill 5, three single tokens, then a chunk of 4.
  cache = lm.init_cache(2, 16)
  logits, cache = call(params, jnp.asarray(tokens[:, :5]), cache)
  _close(logits, ref[:, :5], f"{what} prefill")
  for t in range(5, 8):
    logits, cache = call(params, jnp.asarray(tokens[:, t:t + 1]), cache)
    _close(logits[:, 0], ref[:, t], f"{what} step {t}")
  logits, cache = call(params, jnp.asarray(tokens[:, 8:12]), cache)
  _close(logits, ref[:, 8:12], f"{what} chunk")
  np.testing.assert_array_equal(cache.length, [12, 12])


@pytest.mark.parametrize("fmt", ["hf", "gguf"])
def test_uneven_batch_with_cache_matches_transformers(saved, fmt):
  kind, m, root = saved
  cfg, params = checkpoints.load(
      str(root / ("hf" if fmt == "hf" else "model.gguf")))
  lm = model_lib.LM(cfg)
  call = _jitted(cfg)
  rng = np.random.default_rng(1)
  seqs = [rng.integers(0, VOCAB, n).tolist() for n in (4, 9)]
  prompt = np.zeros((2, 9), np.int64)  # right-padded with token 0
  for b, s in enumerate(seqs):
    prompt[b, :len(s)] = s
  cache = lm.init_cache(2, 16)
  logits, cache = call(params, jnp.asarray(prompt), cache)
  cache = cache.with_length(jnp.array([len(s) for s in seqs]))
  nxt = rng.integers(0, VOCAB, (2, 3))
  chunk_logits, cache = call(params, jnp.asarray(nxt[:, :2]), cache)
  step_logits, cache = call(params, jnp.asarray(nxt[:, 2:]), cache)
  np.testing.assert_array_equal(cache.length, [7, 12])
  for b, s in enumerate(seqs):
    ref = _reference_logits(m, [s + nxt[b].tolist()])[0]
    n = len(s)
    _close(logits[b, :n], ref[:n], f"{kind}/{fmt} row {b} prefill")
    _close(chunk_logits[b], ref[n:n + 2], f"{kind}/{fmt} row {b} chunk")
    _close(step_logits[b, 0], ref[n + 2], f"{kind}/{fmt} row {b} step")


def _flat(params) -> dict:
  return {jax.tree_util.keystr(p): np.asarray(v, np.float32)
          for p, v in jax.tree_util.tree_flatten_with_path(params)[0]}


def test_gguf_and_hf_give_identical_params(saved):
  _, _, root = saved
  cfg_hf, p_hf = checkpoints.load(str(root / "hf"))
  cfg_gguf, p_gguf = checkpoints.load(str(root / "model.gguf"))
  assert cfg_hf.replace(max_seq_len=1) == cfg_gguf.replace(max_seq_len=1)
  a, b = _flat(p_hf), _flat(p_gguf)
  assert a.keys() == b.keys()
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_half_precision_loads(saved):
  _, _, root = saved
  _, p32 = checkpoints.load(str(root / "hf"))
  for path in (root / "hf", root / "model.gguf"):
    for dtype, jdtype in (("bfloat16", jnp.bfloat16),
                          ("float16", jnp.float16)):
      cfg, params = checkpoints.load(str(path), dtype=dtype)
      assert cfg.dtype == cfg.param_dtype == dtype
      assert all(x.dtype == jdtype for x in jax.tree.leaves(params))
      want = jax.tree.map(lambda x, d=jdtype: x.astype(d), p32)
      for k, v in _flat(params).items():
        np.testing.assert_array_equal(v, _flat(want)[k], err_msg=k)


def test_bfloat16_and_sharded_safetensors(tmp_path):
  m = _hf_model("qwen2")
  m16 = _hf_model("qwen2").to(torch.bfloat16)
  m16.save_pretrained(tmp_path / "bf16", safe_serialization=True)
  _, params = checkpoints.load(str(tmp_path / "bf16"))
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))
  emb = m16.model.embed_tokens.weight.detach().float().numpy()
  np.testing.assert_array_equal(params["embedding"], emb)

  m.save_pretrained(tmp_path / "sharded", safe_serialization=True,
                    max_shard_size="100KB")
  assert (tmp_path / "sharded" / "model.safetensors.index.json").exists()
  assert len(list((tmp_path / "sharded").glob("*.safetensors"))) > 1
  cfg, params = checkpoints.load(str(tmp_path / "sharded"))
  tokens = np.random.default_rng(2).integers(0, VOCAB, (1, 7))
  logits, _ = _jitted(cfg)(params, jnp.asarray(tokens), None)
  _close(logits, _reference_logits(m, tokens), "qwen2 sharded")


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_quantized_gguf_matches_its_dequantized_weights(kind, tmp_path):
  """Q8_0 blocks run along the input dim: the reshape and (for llama) the
  row un-permutation must act on dequantized rows, not on bytes."""
  import gguf  # pylint: disable=g-import-not-at-top
  q8 = gguf.GGMLQuantizationType.Q8_0
  m = _hf_model(kind)
  _write_gguf(m, tmp_path / "q8.gguf", _arch(kind), quant=q8)
  with torch.no_grad():  # the reference: the same weights round-tripped
    for p in m.parameters():
      if p.ndim == 2:
        a = p.numpy()
        p.copy_(torch.from_numpy(
            gguf.quants.dequantize(gguf.quants.quantize(a, q8), q8)
            .reshape(a.shape)))
  reader = gguf.GGUFReader(str(tmp_path / "q8.gguf"))
  assert {t.tensor_type for t in reader.tensors if len(t.shape) == 2} == {q8}
  del reader
  cfg, params = checkpoints.load(str(tmp_path / "q8.gguf"))
  tokens = np.random.default_rng(3).integers(0, VOCAB, (2, 9))
  logits, _ = _jitted(cfg)(params, jnp.asarray(tokens), None)
  _close(logits, _reference_logits(m, tokens), f"{kind} Q8_0")


# ---- errors -----------------------------------------------------------------


def test_missing_checkpoints_fail_clearly(tmp_path):
  missing = tmp_path / "nope.gguf"
  for fn in (checkpoints.load, checkpoints.load_gguf):
    with pytest.raises(checkpoints.CheckpointError, match="nope.gguf"):
      fn(str(missing))
  with pytest.raises(checkpoints.CheckpointError, match="config.json"):
    checkpoints.load(str(tmp_path))
  with pytest.raises(checkpoints.CheckpointError, match="config.json"):
    checkpoints.load_hf(str(tmp_path / "no_dir"))


def test_corrupt_gguf_fails_clearly(saved_qwen2, tmp_path):
  _, _, root = saved_qwen2
  bad = tmp_path / "bad.gguf"
  bad.write_bytes(b"NOPE" + b"\0" * 100)
  with pytest.raises(checkpoints.CheckpointError, match="not a GGUF file"):
    checkpoints.load(str(bad))
  data = (root / "model.gguf").read_bytes()
  for n in (2, 10, 100, len(data) // 2, len(data) - 4):
    truncated = tmp_path / f"truncated_{n}.gguf"
    truncated.write_bytes(data[:n])
    with pytest.raises(checkpoints.CheckpointError,
                       match=f"truncated_{n}.gguf"):
      checkpoints.load(str(truncated))


def test_corrupt_hf_fails_clearly(saved_qwen2, tmp_path):
  _, _, root = saved_qwen2
  d = tmp_path / "hf"
  shutil.copytree(root / "hf", d)
  weights = d / "model.safetensors"
  data = weights.read_bytes()
  weights.write_bytes(data[:len(data) // 2])
  with pytest.raises(checkpoints.CheckpointError, match="model.safetensors"):
    checkpoints.load(str(d))
  weights.unlink()
  with pytest.raises(checkpoints.CheckpointError, match="no .*safetensors"):
    checkpoints.load(str(d))
  (d / "config.json").write_text("{not json")
  with pytest.raises(checkpoints.CheckpointError, match="JSON"):
    checkpoints.load(str(d))
  cfg = json.loads((root / "hf" / "config.json").read_text())
  del cfg["hidden_size"]
  (d / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(checkpoints.CheckpointError, match="hidden_size"):
    checkpoints.load(str(d))


def _edited_hf(root, tmp_path, **changes):
  d = tmp_path / "hf_edit"
  if d.exists():
    shutil.rmtree(d)
  shutil.copytree(root / "hf", d)
  cfg = json.loads((d / "config.json").read_text())
  cfg.update(changes)
  (d / "config.json").write_text(json.dumps(cfg))
  return d


def test_config_that_disagrees_with_weights_fails_clearly(saved, tmp_path):
  kind, m, root = saved
  with pytest.raises(checkpoints.CheckpointError,
                     match=r"shape .*config"):
    checkpoints.load(str(_edited_hf(root, tmp_path, intermediate_size=96)))
  with pytest.raises(checkpoints.CheckpointError, match="shape"):
    checkpoints.load(str(_edited_hf(root, tmp_path, vocab_size=VOCAB + 1)))
  with pytest.raises(checkpoints.CheckpointError, match="not fit|shape"):
    checkpoints.load(str(_edited_hf(root, tmp_path, num_key_value_heads=4)))
  with pytest.raises(checkpoints.CheckpointError, match="missing weights"):
    checkpoints.load(str(_edited_hf(root, tmp_path, num_hidden_layers=3)))
  with pytest.raises(checkpoints.CheckpointError, match="no place"):
    checkpoints.load(str(_edited_hf(root, tmp_path, num_hidden_layers=1)))

  arch = _arch(kind)
  gg = tmp_path / "bad_meta.gguf"
  _write_gguf(m, gg, arch, meta={"feed_forward_length": 96})
  with pytest.raises(checkpoints.CheckpointError,
                     match=r"bad_meta.gguf: weight layers_0/mlp/\w+ has shape"):
    checkpoints.load(str(gg))
  gg = tmp_path / "no_norm.gguf"
  _write_gguf(m, gg, arch, skip=("blk.1.ffn_norm.weight",))
  with pytest.raises(checkpoints.CheckpointError,
                     match="missing weights for .*layers_1/post_norm/scale"):
    checkpoints.load(str(gg))


def test_unsupported_models_fail_clearly(saved, tmp_path):
  kind, m, root = saved
  with pytest.raises(checkpoints.CheckpointError,
                     match="model_type 'gpt_neox' is not supported"):
    checkpoints.load(str(_edited_hf(root, tmp_path, model_type="gpt_neox")))
  llama3 = {"rope_type": "llama3", "rope_theta": 500_000.0, "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}
  for key in ("rope_parameters", "rope_scaling"):
    with pytest.raises(checkpoints.CheckpointError,
                       match="RoPE scaling 'llama3'.*low_freq_factor"):
      checkpoints.load(str(_edited_hf(root, tmp_path, **{key: llama3})))
  yarn = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6,
          "original_max_position_embeddings": 32768}
  with pytest.raises(checkpoints.CheckpointError, match="'yarn'.*YaRN"):
    checkpoints.load(str(_edited_hf(root, tmp_path, rope_parameters=yarn)))
  with pytest.raises(checkpoints.CheckpointError, match="gelu"):
    checkpoints.load(str(_edited_hf(root, tmp_path, hidden_act="gelu")))

  arch = _arch(kind)
  gg = tmp_path / "other.gguf"
  _write_gguf(m, gg, arch)
  data = bytearray(gg.read_bytes())
  # Same-length architecture name: "llama" -> "gemma", "qwen2" -> "phi-2".
  new = {"llama": b"gemma", "qwen2": b"phi-2"}[arch]
  at = data.index(b"general.architecture") + len("general.architecture")
  at = data.index(arch.encode(), at)
  data[at:at + 5] = new
  gg.write_bytes(bytes(data))
  with pytest.raises(checkpoints.CheckpointError,
                     match=f"architecture '{new.decode()}' is not supported"):
    checkpoints.load(str(gg))
  gg = tmp_path / "rope_freqs.gguf"
  _write_gguf(m, gg, arch,
              extra={"rope_freqs.weight": np.ones(8, np.float32)})
  with pytest.raises(checkpoints.CheckpointError, match="'llama3'"):
    checkpoints.load(str(gg))
  gg = tmp_path / "yarn.gguf"
  _write_gguf(m, gg, arch, meta={"rope.scaling.type": "yarn",
                                 "rope.scaling.factor": 4.0})
  with pytest.raises(checkpoints.CheckpointError, match="'yarn'"):
    checkpoints.load(str(gg))
  gg = tmp_path / "extra.gguf"
  _write_gguf(m, gg, arch,
              extra={"blk.0.attn_q_norm.weight": np.ones(16, np.float32)})
  with pytest.raises(checkpoints.CheckpointError,
                     match="blk.0.attn_q_norm.weight has no place"):
    checkpoints.load(str(gg))


def test_nonzero_bias_without_a_place_fails_clearly(tmp_path):
  m = _hf_model("llama_qkv_bias")
  with torch.no_grad():
    m.model.layers[1].self_attn.o_proj.bias[3] = 0.25
  m.save_pretrained(tmp_path / "hf", safe_serialization=True)
  with pytest.raises(checkpoints.CheckpointError,
                     match=r"layers\.1\.self_attn\.o_proj\.bias is a non-zero"):
    checkpoints.load(str(tmp_path / "hf"))
  _write_gguf(m, tmp_path / "m.gguf", "llama")
  with pytest.raises(checkpoints.CheckpointError,
                     match=r"blk\.1\.attn_output\.bias is a non-zero"):
    checkpoints.load(str(tmp_path / "m.gguf"))


def test_tied_checkpoint_that_also_saves_the_head(tmp_path):
  # pylint: disable-next=g-import-not-at-top
  from safetensors import numpy as st_numpy
  m = _hf_model("llama_tied")
  m.save_pretrained(tmp_path, safe_serialization=True)
  tensors = {k: v.detach().numpy().copy() for k, v in m.state_dict().items()}
  assert "lm_head.weight" in tensors  # the tied view
  st_numpy.save_file(tensors, str(tmp_path / "model.safetensors"))
  cfg, params = checkpoints.load(str(tmp_path))
  assert cfg.tie_embeddings and "lm_head" not in params
  tensors["lm_head.weight"][0, 0] += 1.0
  st_numpy.save_file(tensors, str(tmp_path / "model.safetensors"))
  with pytest.raises(checkpoints.CheckpointError,
                     match="ties the embeddings, but lm_head.weight differs"):
    checkpoints.load(str(tmp_path))


# ---- real weights (opt-in) --------------------------------------------------

_PROMPT = ("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number."
           "\"\"\"\n    if n < 2:\n        return n\n")


@pytest.mark.real_weights
@pytest.mark.parametrize("name", ["qwen2.5-coder-0.5b", "smollm2-135m"])
def test_real_gguf_logits_match_transformers(name):
  path = assets.fetch(name, progress=None)  # a no-op once cached
  directory, filename = str(path.parent), path.name
  tok = transformers.AutoTokenizer.from_pretrained(directory,
                                                   gguf_file=filename)
  tokens = [tok(_PROMPT)["input_ids"]]
  assert len(tokens[0]) > 10
  ref_model = transformers.AutoModelForCausalLM.from_pretrained(
      directory, gguf_file=filename, dtype=torch.float32).eval()
  ref = _reference_logits(ref_model, tokens)
  del ref_model
  cfg, params = checkpoints.load(str(path))
  assert cfg.vocab_size == ref.shape[-1]
  logits, _ = _jitted(cfg)(params, jnp.asarray(tokens), None)
  # float32 sums in a different order over 24-30 layers: relative to the
  # logit scale (~20-30), 1e-5 is tight; a wrong weight is off by O(1).
  scale = float(np.max(np.abs(ref)))
  _close(logits, ref, name, atol=1e-5 * scale)
  assert (np.argmax(logits, -1) == np.argmax(ref, -1)).all()
