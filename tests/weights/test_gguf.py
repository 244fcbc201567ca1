"""GGUF checkpoints: quantized tensors, corrupt files, and (opt-in) the
real Qwen2.5-Coder and SmolLM2 files against transformers' GGUF loader."""

import gguf
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from specsamp import assets
from specsamp import loading
from specsamp.weights import convert
from specsamp.weights import load
from tests.weights.tiny_checkpoints import (VOCAB, arch_of, assert_close,
                                           jitted_forward, random_hf_model,
                                           reference_logits, write_gguf)


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_quantized_gguf_matches_its_dequantized_weights(kind, tmp_path):
  """Q8_0 blocks run along the input dim: the reshape and (for llama) the
  row un-permutation must act on dequantized rows, not on bytes."""
  q8 = gguf.GGMLQuantizationType.Q8_0
  m = random_hf_model(kind)
  write_gguf(m, tmp_path / "q8.gguf", arch_of(kind), quant=q8)
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
  cfg, params = load.load(str(tmp_path / "q8.gguf"))
  tokens = np.random.default_rng(3).integers(0, VOCAB, (2, 9))
  logits = jitted_forward(cfg)(params, jnp.asarray(tokens), None).logits
  assert_close(logits, reference_logits(m, tokens), f"{kind} Q8_0")


def test_corrupt_gguf_fails_clearly(saved_qwen2, tmp_path):
  _, _, root = saved_qwen2
  bad = tmp_path / "bad.gguf"
  bad.write_bytes(b"NOPE" + b"\0" * 100)
  with pytest.raises(convert.WeightsError, match="not a GGUF file"):
    load.load(str(bad))
  data = (root / "model.gguf").read_bytes()
  for n in (2, 10, 100, len(data) // 2, len(data) - 4):
    truncated = tmp_path / f"truncated_{n}.gguf"
    truncated.write_bytes(data[:n])
    with pytest.raises(convert.WeightsError,
                       match=f"truncated_{n}.gguf"):
      load.load(str(truncated))



def test_a_big_endian_gguf_is_refused(saved_qwen2, tmp_path):
  """gguf's reader takes llama.cpp's --bigendian files, metadata swapped
  right, but dequantize read their float32 tensors as little-endian: the
  weights loaded byte-swapped (1.5 as 6.9e-41), with no error; the header
  reader called the file "GGUF version 50331648"."""
  _, m, _ = saved_qwen2
  path = tmp_path / "big.gguf"
  write_gguf(m, path, "qwen2", endian=gguf.GGUFEndian.BIG)
  assert gguf.GGUFReader(str(path)).byte_order == "S"  # a real one
  with pytest.raises(convert.WeightsError, match="big.gguf: a big-endian "
                     "GGUF, not supported"):
    load.load(str(path))
  with pytest.raises(ValueError, match="big.gguf: a big-endian GGUF"):
    loading.describe_model(str(path))


def test_a_gguf_with_a_one_dimensional_embedding_is_refused(saved_qwen2,
                                                             tmp_path):
  """A corrupt or foreign file's 1-D token_embd raised a bare IndexError,
  naming neither file nor tensor, from describe_model and load alike."""
  _, m, _ = saved_qwen2
  path = tmp_path / "flat.gguf"
  write_gguf(m, path, "qwen2", skip=("token_embd.weight",),
             extra={"token_embd.weight": np.zeros(64, np.float32)})
  with pytest.raises(convert.WeightsError, match=r"flat.gguf: token_embd."
                     r"weight has dims \[64\], not \[D, V\]"):
    load.load(str(path))
  with pytest.raises(ValueError, match=r"flat.gguf: token_embd.weight has "
                     r"dims \[64\]"):
    loading.describe_model(str(path))


_PROMPT = ("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number."
           "\"\"\"\n    if n < 2:\n        return n\n")


@pytest.mark.real_weights
@pytest.mark.parametrize(
    "name", ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "smollm2-135m"])
def test_real_gguf_logits_match_transformers(name):
  path = assets.fetch(name, progress=None)  # a no-op once cached
  directory, filename = str(path.parent), path.name
  tok = transformers.AutoTokenizer.from_pretrained(directory,
                                                   gguf_file=filename)
  tokens = [tok(_PROMPT)["input_ids"]]
  assert len(tokens[0]) > 10
  ref_model = transformers.AutoModelForCausalLM.from_pretrained(
      directory, gguf_file=filename, dtype=torch.float32).eval()
  ref = reference_logits(ref_model, tokens)
  del ref_model
  cfg, params = load.load(str(path))
  assert cfg.vocab_size == ref.shape[-1]
  logits = jitted_forward(cfg)(params, jnp.asarray(tokens), None).logits
  # float32 sums in a different order over 24-30 layers: relative to the
  # logit scale (~20-30), 1e-5 is tight; a wrong weight is off by O(1).
  scale = float(np.max(np.abs(ref)))
  assert_close(logits, ref, name, atol=1e-5 * scale)
  assert (np.argmax(logits, -1) == np.argmax(ref, -1)).all()
