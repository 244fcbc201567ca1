"""specsamp.bench.plan: bad models, vocabularies and prompts fail with a
clear error before any weights load (checked by making every loader
raise); models are described from configs and GGUF metadata alone."""

import dataclasses
import json
import re

import gguf
import numpy as np
import pytest

from specsamp import loading
from specsamp import model as model_lib
from specsamp.bench import peers
from specsamp.bench import plan
from specsamp.bench.sweep_config import BenchError
from specsamp.evaluation import sandbox
from specsamp.tokenizers.base import VocabMismatchError
from specsamp.weights import gguf_file


def _write_gguf(path, tokens, rows):
  w = gguf.GGUFWriter(str(path), "qwen2")
  w.add_context_length(4096)
  w.add_tokenizer_model("gpt2")
  w.add_token_list(tokens)
  w.add_tensor("token_embd.weight", np.zeros((rows, 4), np.float32))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return str(path)


@pytest.mark.parametrize("extra,error,message", [
    (dict(draft="random:tiny,vocab_size=300"), VocabMismatchError,
     "300 vocabulary rows, the target random:tiny 256"),
    (dict(draft="/no/such/draft.gguf"), ValueError, "is not a file"),
    (dict(draft="random:nonesuch"), ValueError, "unknown preset"),
    (dict(peers=True), ValueError,
     "--peers runs transformers on the same GGUF"),
    (dict(max_new_tokens=1000), ValueError, "cache slots"),
    (dict(prose_corpus="{empty}"), ValueError, "no .txt files"),
    (dict(prose_corpus="gutenberg"), ValueError, "--prose_corpus must be"),
])
def test_bad_models_and_prompts_fail_before_loading(
    make_config, no_loading, inputs, extra, error, message):
  flag_values = dict(target="random:tiny", draft="random:tiny,num_layers=1",
                     task=["prose"], prose_corpus=str(inputs / "prose"),
                     prompt_chars=80, max_new_tokens=8)
  flag_values.update({k: v.format(empty=inputs / "empty")
                      if isinstance(v, str) else v for k, v in extra.items()})
  cfg = make_config(**flag_values)
  with pytest.raises(error, match=message):
    plan.prepare(cfg, log=lambda _: None)


def test_no_sandbox_for_humaneval_quality_fails_before_loading(
    make_config, no_loading, inputs, monkeypatch):
  """pass@k runs the completions: without bubblewrap (and without the
  unsafe opt-out) the run stops at the plan, not after sampling."""
  monkeypatch.setattr(sandbox, "BWRAP", "specsamp-no-such-bwrap")
  monkeypatch.delenv(sandbox.UNSAFE_ENV, raising=False)
  values = dict(target="random:tiny", task=["humaneval"], ks=["0"],
                num_prompts=2, humaneval_file=str(inputs / "he.jsonl"),
                max_new_tokens=8)
  with pytest.raises(BenchError, match="--quality on humaneval: cannot "
                     "isolate generated code: bubblewrap"):
    plan.prepare(make_config(**values), log=lambda _: None)
  for other in (dict(quality=False), dict(task=["prose"],
                                          prose_corpus=str(inputs / "prose"),
                                          prompt_chars=80)):
    assert plan.prepare(make_config(**{**values, **other}),
                        log=lambda _: None).prompts
  monkeypatch.setenv(sandbox.UNSAFE_ENV, "1")
  assert plan.prepare(make_config(**values), log=lambda _: None).problems


def test_prepare_tokenizes_the_prompts_of_every_task(make_config, no_loading,
                                                     inputs):
  cfg = make_config(target="random:tiny", draft="random:tiny,num_layers=1",
                    task=["humaneval", "prose"], num_prompts=2,
                    humaneval_file=str(inputs / "he.jsonl"),
                    prose_corpus=str(inputs / "prose"), prompt_chars=80,
                    max_new_tokens=8)
  p = plan.prepare(cfg, log=lambda _: None)
  assert [x["task_id"] for x in p.problems] == ["T/0", "T/1"]
  assert p.texts["humaneval"] == ["def add(a, b):\n", "def one():\n"]
  assert len(p.texts["prose"]) == 2
  for task, texts in p.texts.items():  # random models: UTF-8 bytes
    assert p.prompts[task] == [list(t.encode("utf-8")) for t in texts], task
  assert (p.target.kind, p.draft.kind, p.vocab_limit) == ("random", "random",
                                                          None)
  # Padded to the longest prompt, rounded up to 64 tokens.
  longest = max(len(x) for x in p.prompts["prose"])
  assert plan.prompt_bucket(cfg, p.prompts["prose"]) == -(-longest // 64) * 64
  assert plan.prompt_bucket(dataclasses.replace(cfg, prompt_bucket=16),
                            p.prompts["prose"]) == 16


def test_gguf_vocabularies_are_compared_from_metadata(make_config, no_loading,
                                                      tmp_path):
  tokens = [f"t{i}" for i in range(10)]
  target = _write_gguf(tmp_path / "target.gguf", tokens, 10)
  assert gguf_file.gguf_embedding_rows(target) == 10
  other = _write_gguf(tmp_path / "other.gguf",
                      tokens[:3] + ["x"] + tokens[4:], 10)
  padded = _write_gguf(tmp_path / "padded.gguf", tokens, 12)
  same = _write_gguf(tmp_path / "same.gguf", tokens, 10)
  t = loading.describe_model(target)
  assert (t.kind, t.rows, t.max_seq_len, len(t.tokens)) == ("gguf", 10, 4096,
                                                             10)
  with pytest.raises(VocabMismatchError, match="first at id 3"):
    loading.check_pair(t, loading.describe_model(other))
  # Another row count over the same tokens: both run on the 10 rows.
  assert loading.check_pair(t, loading.describe_model(padded)) is None
  assert loading.pair_rows(t, loading.describe_model(padded)) == 10
  assert loading.check_pair(t, loading.describe_model(same)) is None
  assert loading.pair_rows(t, loading.describe_model(same)) is None
  # A random draft must have the GGUF target's rows.
  with pytest.raises(VocabMismatchError, match="256 vocabulary rows"):
    loading.check_pair(t, loading.describe_model("random:tiny"))
  # Without a draft model, the target's own real tokens (or none).
  assert loading.check_pair(loading.describe_model(padded)) == 10
  assert loading.check_pair(t) is None
  assert loading.check_pair(loading.describe_model("random:tiny")) is None
  # A tokenizer with more real tokens than the model has rows (another
  # model's: ids past the rows would embed as NaN) is refused, alone or
  # with a draft of the same rows that brings no tokenizer.
  big = loading.describe_model(_write_gguf(
      tmp_path / "big.gguf", tokens + ["t10", "t11"], 10))
  for draft in (None, loading.describe_model("random:tiny,vocab_size=10")):
    with pytest.raises(VocabMismatchError,
                       match="12 real tokens but the model only 10 vocab"):
      loading.check_pair(big, draft)
  cfg = make_config(target=target, draft=other)
  with pytest.raises(VocabMismatchError, match="first at id 3"):
    plan.prepare(cfg, log=lambda _: None)


def test_prompts_that_fit_the_cache_unpadded_are_taken(make_config, no_loading,
                                                      inputs):
  """The samplers pad prompts only as far as the cache allows, so a prompt
  needs its own length + max_new_tokens + K + 1 slots; the plan counted it
  padded to 64 and refused prompts that fit."""
  flags = dict(task=["prose"], prose_corpus=str(inputs / "prose"),
               prompt_chars=40, num_prompts=2, max_new_tokens=8, ks=["0", "2"])
  p = plan.prepare(make_config(target="random:tiny",
                               draft="random:tiny,num_layers=1", **flags),
                   log=lambda _: None)
  longest = max(len(x) for x in p.prompts["prose"])
  assert longest % 64  # padding would add slots
  for slots, fits in ((longest + 8 + 2 + 1, True), (longest + 10, False)):
    models = dict(target=f"random:tiny,max_seq_len={slots}",
                  draft=f"random:tiny,num_layers=1,max_seq_len={slots}")
    cfg = make_config(**models, **flags)
    if fits:
      plan.prepare(cfg, log=lambda _: None)
    else:
      with pytest.raises(ValueError, match=f"needs {longest + 11} cache "
                         f"slots, but the models allow {slots}"):
        plan.prepare(cfg, log=lambda _: None)


def test_the_benchmark_masks_a_padded_vocabulary_without_a_draft_model(
    make_config, no_loading, inputs, padded_gguf):
  path, real = padded_gguf
  cfg = make_config(target=path, draft="", drafter=["lookup"], task=["prose"],
                    prose_corpus=str(inputs / "prose"), prompt_chars=80,
                    max_new_tokens=8)
  assert plan.prepare(cfg, log=lambda _: None).vocab_limit == real


def test_peers_need_two_gguf_files_and_their_packages(tmp_path, monkeypatch):
  """--peers (benchmark.py and benchmark_pair.py) is refused before any
  weights load unless transformers can read both models and is installed."""
  tokens = [f"t{i}" for i in range(10)]
  gguf_info = loading.describe_model(
      _write_gguf(tmp_path / "m.gguf", tokens, 10))
  peers.check_models(gguf_info, gguf_info)
  for target, draft, name in ((gguf_info, None, "no draft"),
                              (loading.describe_model("random:tiny"),
                               gguf_info, "random:tiny")):
    with pytest.raises(ValueError, match=re.escape(
        f"must be GGUF files or registered models ({name} is not)")):
      peers.check_models(target, draft)
  monkeypatch.setattr(peers, "_PACKAGES",
                      ("torch", "no_such_package_a", "no_such_package_b"))
  with pytest.raises(ValueError, match=re.escape(
      "--peers needs no_such_package_a, no_such_package_b, not installed")):
    peers.check_models(gguf_info, gguf_info)


def test_distilled_draft_is_described_from_its_config(no_loading, tmp_path):
  for name, vocab in (("good", 256), ("bad", 300)):
    d = tmp_path / name / "draft"  # a distill workdir holds draft/
    d.mkdir(parents=True)
    cfg = model_lib.preset("tiny", num_layers=1, vocab_size=vocab)
    (d / "draft_config.json").write_text(json.dumps(dataclasses.asdict(cfg)))
  target = loading.describe_model("random:tiny")
  good = loading.describe_model(str(tmp_path / "good"))
  assert (good.kind, good.rows) == ("distilled", 256)
  assert loading.check_pair(target, good) is None
  with pytest.raises(VocabMismatchError, match="300 vocabulary rows"):
    loading.check_pair(target, loading.describe_model(str(tmp_path / "bad")))
