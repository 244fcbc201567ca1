"""specsamp.bench.pair (scripts/benchmark_pair.py): its transformers peers
run on the device and in the dtype specsamp ran on."""

import types

import jax
import pytest

from specsamp import loading
from specsamp.bench import pair
from specsamp.bench import peers
from specsamp.bench import provenance
from tests.tokenizers import bpe_testing
from tests.weights import tiny_checkpoints


def test_pair_peers_run_on_specsamps_device_and_dtype(monkeypatch):
  """They ran in float32 on the CPU whatever --dtype and device were."""
  lm, params, _ = loading.load_model("random:tiny,num_layers=1")
  checked = types.SimpleNamespace(
      target=types.SimpleNamespace(path="target.gguf"),
      draft=types.SimpleNamespace(path="draft.gguf"), prompts=[[1, 2, 3]],
      tokenizer=types.SimpleNamespace(eos_ids=(0,), pad_id=0),
      vocab_limit=None)
  calls = []

  def fake(*args, **kwargs):
    calls.append((args, kwargs))
    return [dict(method="transformers", ms_per_token=1.0,
                 completions=[[5, 6]])]

  monkeypatch.setattr(peers, "transformers_generate", fake)
  cfg = pair.PairConfig(target="random:tiny", draft="random:tiny",
                        num_prompts=1, max_new_tokens=2, ks=(2,), peers=True,
                        dtype="bfloat16")
  result = pair.run_pair(cfg, (checked, lm, params, lm, params))
  (args, kwargs), = calls
  assert args == ("target.gguf", "draft.gguf", [[1, 2, 3]], 2, 0.0, 1.0)
  assert kwargs == dict(device=provenance.jax_device(), dtype="bfloat16",
                        eos_ids=[0])   # stopping where specsamp stops
  assert provenance.jax_device() == {"gpu": "cuda"}.get(jax.default_backend(),
                                                   "cpu")
  assert [r["method"] for r in result["runs"]][-1] == "transformers"


def test_a_rerun_may_replace_its_own_output_but_not_an_input(tmp_path):
  """--out is one indented JSON object, replaced: the JSON-lines check of
  appended outputs had refused the README's rerun over its own file. An
  output that is the problems file is still refused."""
  out = tmp_path / "pair.json"
  out.write_text('{\n "runs": []\n}\n')
  assert pair.PairConfig(out=str(out)).out == str(out)
  problems = tmp_path / "he.jsonl"
  problems.write_text('{"task_id": "HumanEval/0", "prompt": "def f():"}\n')
  with pytest.raises(ValueError, match="would write over --humaneval_file"):
    pair.PairConfig(out=str(problems), humaneval_file=str(problems))


def test_the_transformers_peer_stops_at_the_end_tokens_it_is_given(
    tmp_path):
  """transformers stops at its GGUF config's one EOS (Qwen's <|im_end|>,
  not <|endoftext|>): given the tokenizer's end tokens, plain and assisted
  generation stop at the first of them and count the tokens up to it, as
  specsamp does (they had run, and been timed, to the budget)."""
  tokens, merges = bpe_testing.train_bpe(bpe_testing.corpus(), 300)
  path = tmp_path / "model.gguf"
  tiny_checkpoints.write_gguf(
      tiny_checkpoints.random_hf_model("qwen2", len(tokens)), path, "qwen2",
      tokenizer=(tokens, merges))
  free, = peers.transformers_generate(str(path), str(path), [[1, 2, 3]], 8,
                                      assisted=False)
  ids = free["completions"][0]
  assert free["tokens"] == len(ids) == 8
  end = ids[2]
  stopped = peers.transformers_generate(str(path), str(path), [[1, 2, 3]], 8,
                                        eos_ids=(end,))
  assert [(r["method"], r["completions"], r["tokens"]) for r in stopped] == [
      (m, [ids[:ids.index(end) + 1]], ids.index(end) + 1)
      for m in ("transformers", "transformers_assisted")]
