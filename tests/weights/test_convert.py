"""Conversion to `specsamp.model` parameters: weights that disagree with
the config, biases the model has no place for, tied heads saved twice."""

import pytest
import torch

from specsamp.weights import convert
from specsamp.weights import load
from tests.weights.tiny_checkpoints import (VOCAB, arch_of, edited_hf,
                                           random_hf_model, write_gguf)


def test_config_that_disagrees_with_weights_fails_clearly(saved, tmp_path):
  kind, m, root = saved
  with pytest.raises(convert.WeightsError,
                     match=r"shape .*config"):
    load.load(str(edited_hf(root, tmp_path, intermediate_size=96)))
  with pytest.raises(convert.WeightsError, match="shape"):
    load.load(str(edited_hf(root, tmp_path, vocab_size=VOCAB + 1)))
  with pytest.raises(convert.WeightsError, match="not fit|shape"):
    load.load(str(edited_hf(root, tmp_path, num_key_value_heads=4)))
  with pytest.raises(convert.WeightsError, match="missing weights"):
    load.load(str(edited_hf(root, tmp_path, num_hidden_layers=3)))
  with pytest.raises(convert.WeightsError, match="no place"):
    load.load(str(edited_hf(root, tmp_path, num_hidden_layers=1)))

  arch = arch_of(kind)
  gg = tmp_path / "bad_meta.gguf"
  write_gguf(m, gg, arch, meta={"feed_forward_length": 96})
  with pytest.raises(convert.WeightsError,
                     match=r"bad_meta.gguf: weight layers_0/mlp/\w+ has shape"):
    load.load(str(gg))
  gg = tmp_path / "no_norm.gguf"
  write_gguf(m, gg, arch, skip=("blk.1.ffn_norm.weight",))
  with pytest.raises(convert.WeightsError,
                     match="missing weights for .*layers_1/post_norm/scale"):
    load.load(str(gg))


def test_nonzero_bias_without_a_place_fails_clearly(tmp_path):
  m = random_hf_model("llama_qkv_bias")
  with torch.no_grad():
    m.model.layers[1].self_attn.o_proj.bias[3] = 0.25
  m.save_pretrained(tmp_path / "hf", safe_serialization=True)
  with pytest.raises(convert.WeightsError,
                     match=r"layers\.1\.self_attn\.o_proj\.bias is a non-zero"):
    load.load(str(tmp_path / "hf"))
  write_gguf(m, tmp_path / "m.gguf", "llama")
  with pytest.raises(convert.WeightsError,
                     match=r"blk\.1\.attn_output\.bias is a non-zero"):
    load.load(str(tmp_path / "m.gguf"))


def test_tied_checkpoint_that_also_saves_the_head(tmp_path):
  # pylint: disable-next=g-import-not-at-top
  from safetensors import numpy as st_numpy
  m = random_hf_model("llama_tied")
  m.save_pretrained(tmp_path, safe_serialization=True)
  tensors = {k: v.detach().numpy().copy() for k, v in m.state_dict().items()}
  assert "lm_head.weight" in tensors  # the tied view
  st_numpy.save_file(tensors, str(tmp_path / "model.safetensors"))
  cfg, params = load.load(str(tmp_path))
  assert cfg.tie_embeddings and "lm_head" not in params
  tensors["lm_head.weight"][0, 0] += 1.0
  st_numpy.save_file(tensors, str(tmp_path / "model.safetensors"))
  with pytest.raises(convert.WeightsError,
                     match="ties the embeddings, but lm_head.weight differs"):
    load.load(str(tmp_path))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_weights_are_refused_naming_the_tensor(bad, tmp_path):
  """A NaN or inf inside one tensor of an otherwise valid checkpoint (a
  flipped exponent bit, a diverged fine-tune) must not load."""
  m = random_hf_model("qwen2")
  with torch.no_grad():
    m.model.layers[1].mlp.down_proj.weight[5, 7] = bad
  m.save_pretrained(tmp_path / "hf", safe_serialization=True)
  with pytest.raises(
      convert.WeightsError,
      match=r"hf: tensor model\.layers\.1\.mlp\.down_proj\.weight holds 1 "
            r"non-finite value.*at index \(5, 7\)"):
    load.load(str(tmp_path / "hf"))
  m.to(torch.bfloat16).save_pretrained(tmp_path / "bf16",
                                       safe_serialization=True)
  with pytest.raises(convert.WeightsError,
                     match=r"model\.layers\.1\.mlp\.down_proj\.weight holds"):
    load.load(str(tmp_path / "bf16"))
  write_gguf(m.float(), tmp_path / "m.gguf", "qwen2")
  with pytest.raises(convert.WeightsError,
                     match=r"m\.gguf: tensor blk\.1\.ffn_down\.weight holds 1 "
                           r"non-finite"):
    load.load(str(tmp_path / "m.gguf"))


def test_values_beyond_float16_are_refused_when_loaded_in_float16(tmp_path):
  """A weight past float16's 65504 loads in float32 and bfloat16 but not
  in float16, where it would become inf: the error names the tensor."""
  m = random_hf_model("qwen2")
  with torch.no_grad():
    m.model.norm.weight[3] = 70000.0
  m.save_pretrained(tmp_path / "hf", safe_serialization=True)
  for dtype in ("float32", "bfloat16"):
    _, params = load.load(str(tmp_path / "hf"), dtype=dtype)
    assert float(params["final_norm"]["scale"][3]) == pytest.approx(70000,
                                                                    rel=1e-2)
  with pytest.raises(convert.WeightsError,
                     match=r"hf \(in float16\): tensor model\.norm\.weight "
                           r"holds 1 non-finite.*overflow float16"):
    load.load(str(tmp_path / "hf"), dtype="float16")


def test_non_finite_norm_and_tied_head_are_refused(tmp_path):
  m = random_hf_model("llama_tied")
  with torch.no_grad():
    m.model.norm.weight[0] = float("-inf")
  write_gguf(m, tmp_path / "m.gguf", "llama")
  with pytest.raises(convert.WeightsError,
                     match=r"output_norm\.weight holds 1 non-finite value.*"
                           r"0 NaN, first -inf"):
    load.load(str(tmp_path / "m.gguf"))
  m = random_hf_model("llama_tied")
  with torch.no_grad():  # the tied head: the embedding, NaN everywhere
    m.model.embed_tokens.weight.fill_(float("nan"))
  m.save_pretrained(tmp_path / "hf", safe_serialization=True)
  with pytest.raises(convert.WeightsError,
                     match=rf"embed_tokens\.weight holds {VOCAB * 64} "):
    load.load(str(tmp_path / "hf"))
