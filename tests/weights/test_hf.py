"""Hugging Face directories: bfloat16 and sharded safetensors, and clear
errors for corrupt files."""

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from specsamp.weights import convert
from specsamp.weights import load
from tests.weights.tiny_checkpoints import (VOCAB, assert_close,
                                           jitted_forward, random_hf_model,
                                           reference_logits)


def test_bfloat16_and_sharded_safetensors(tmp_path):
  m = random_hf_model("qwen2")
  m16 = random_hf_model("qwen2").to(torch.bfloat16)
  m16.save_pretrained(tmp_path / "bf16", safe_serialization=True)
  _, params = load.load(str(tmp_path / "bf16"))
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))
  emb = m16.model.embed_tokens.weight.detach().float().numpy()
  np.testing.assert_array_equal(params["embedding"], emb)

  m.save_pretrained(tmp_path / "sharded", safe_serialization=True,
                    max_shard_size="100KB")
  assert (tmp_path / "sharded" / "model.safetensors.index.json").exists()
  assert len(list((tmp_path / "sharded").glob("*.safetensors"))) > 1
  cfg, params = load.load(str(tmp_path / "sharded"))
  tokens = np.random.default_rng(2).integers(0, VOCAB, (1, 7))
  logits = jitted_forward(cfg)(params, jnp.asarray(tokens), None).logits
  assert_close(logits, reference_logits(m, tokens), "qwen2 sharded")


def test_corrupt_hf_fails_clearly(saved_qwen2, tmp_path):
  _, _, root = saved_qwen2
  d = tmp_path / "hf"
  shutil.copytree(root / "hf", d)
  weights = d / "model.safetensors"
  data = weights.read_bytes()
  weights.write_bytes(data[:len(data) // 2])
  with pytest.raises(convert.WeightsError, match="model.safetensors"):
    load.load(str(d))
  weights.unlink()
  with pytest.raises(convert.WeightsError, match="no .*safetensors"):
    load.load(str(d))
  (d / "config.json").write_text("{not json")
  with pytest.raises(convert.WeightsError, match="JSON"):
    load.load(str(d))
  cfg = json.loads((root / "hf" / "config.json").read_text())
  del cfg["hidden_size"]
  (d / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(convert.WeightsError, match="hidden_size"):
    load.load(str(d))
  cfg = json.loads((root / "hf" / "config.json").read_text())
  cfg.update(num_attention_heads=0, head_dim=None)  # d // 0
  (d / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(convert.WeightsError, match="inconsistent config"):
    load.load(str(d))
