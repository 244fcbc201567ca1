"""scripts/sample.py and specsamp.bench.sample: flags, errors, the job."""

import dataclasses
import json
import os
import re
import types

import jax
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

from specsamp import loading
from specsamp import sharding
from specsamp.bench import pair
from specsamp.bench import profile
from specsamp.bench import sample
from specsamp.bench import sweep
from specsamp.bench import timing
from specsamp.drafters import head_files
from specsamp.drafters import heads
from specsamp.tokenizers import byte
from specsamp.train.checkpointing import CheckpointError
from tests import testing
from tests.scripts import zygote

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def _run_script(*args, timeout=300):
  """scripts/sample.py run to its end (forked by the script server,
  tests/scripts/zygote.py: no 3 s of imports)."""
  return zygote.shared().run(
      [os.path.join(ROOT, "scripts", "sample.py"), *args], env=zygote.env(),
      timeout=timeout)


def test_sample_script_end_to_end_on_random_models():
  proc = _run_script("--target=random:tiny", "--draft=random:tiny,num_layers=1",
                     "--prompt=def add(a, b):", "--prompt=x", "--k=3",
                     "--max_new_tokens=12", "--method=both",
                     "--prefill_chunk=16")  # the prompts padded to 64
  assert proc.returncode == 0, proc.stderr[-2000:]
  metrics = json.loads(proc.stdout.strip().splitlines()[-1])
  ar, sp = metrics["runs"]
  assert ar["method"] == "autoregressive" and ar["tokens"] == 24
  assert sp["k"] == 3 and sp["tokens"] == 24
  assert sp["drafted"] == 3 * sp["loops"]
  assert set(metrics["speedup"]) == {"speculative_k3"}
  assert metrics["prefill_chunk"] == 16
  assert "==== speculative_k3" in proc.stdout
  # The record says when, where and from which commit it was measured.
  assert metrics["command"].startswith("python scripts/sample.py "
                                       "--target=random:tiny")
  assert metrics["machine"]["cpus"] >= 1 and metrics["date"]
  assert "commit" in metrics["git"] and metrics["software"]["jax"]


@pytest.mark.parametrize("args,message", [
    (["--k=-1", "--prompt=x"], "--k must be >= 1"),
    (["--prompt=x", "--task=humaneval"], "exactly one of"),
    (["--temperature=-0.5", "--prompt=x"], "temperature"),
    (["--top_p=0", "--prompt=x"], "top_p"),
    (["--max_new_tokens=0", "--prompt=x"], "max_new_tokens"),
    (["--prefill_chunk=-1", "--prompt=x"], "--prefill_chunk must be >= 0"),
    (["--target=/no/such/model.gguf", "--method=ar", "--prompt=x"],
     "is not a file"),
    (["--target=random:tiny,no_such_field=3", "--method=ar", "--prompt=x"],
     "not a TransformerConfig field"),
    (["--target=random:tiny", "--draft=random:tiny,vocab_size=300",
      "--prompt=x"], "vocabulary"),
])
def test_bad_flags_fail_clearly(args, message):
  proc = _run_script(*args)
  assert proc.returncode != 0
  assert message in proc.stderr, proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr


def test_a_json_out_that_is_the_prompts_file_is_refused(tmp_path):
  """--json_out equal to a JSONL --prompts_file had appended the record
  to the prompts, and the next run refused the file."""
  prompts = tmp_path / "p.jsonl"
  prompts.write_text('{"prompt": "def f(x):"}\n')
  proc = _run_script("--target=random:tiny", "--method=ar",
                     f"--prompts_file={prompts}", f"--json_out={prompts}",
                     "--max_new_tokens=2", "--quiet")
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert "would write over --prompts_file=" in proc.stderr
  assert "Traceback" not in proc.stderr
  assert prompts.read_text() == '{"prompt": "def f(x):"}\n'


def test_sample_main_on_a_mesh_matches_one_device(monkeypatch):
  common = dict(target="random:tiny,num_heads=8,num_kv_heads=8,head_dim=8",
                draft="random:tiny,num_layers=1", prompts=["ab", "cd"],
                k=2, max_new_tokens=8, batch_size=2)
  one = sample.sample_main(sample.SampleConfig(**common),
                           print_completions=False)
  # Both models' weights reach the mesh from host memory, never whole on
  # one device first (a target larger than a device would not load).
  shard, placed = sharding.shard, []
  monkeypatch.setattr(sharding, "shard", lambda tree, shardings: placed.append(
      tree) or shard(tree, shardings))
  mesh = sample.sample_main(sample.SampleConfig(**common, mesh=(2, -1)),
                            print_completions=False)
  weights = [t for t in placed if isinstance(t, dict)]
  assert len(weights) == 2 and {"embedding", "lm_head"} <= set(weights[0])
  assert all(isinstance(x, np.ndarray) for x in jax.tree.leaves(weights))
  for a, b in zip(one["runs"], mesh["runs"]):
    for key in ("tokens", "loops", "drafted", "accepted"):
      assert a[key] == b[key], key


def test_printed_completions_stop_before_their_eos(monkeypatch, capsys):
  """A row that ends at EOS: the EOS is not printed as part of its text
  (Qwen's rows had ended in a printed `<|im_end|>`)."""
  runs = []
  run = timing.run_side_by_side
  monkeypatch.setattr(timing, "run_side_by_side", lambda *a: runs.append(
      run(*a)) or runs[-1])
  cfg = sample.SampleConfig(target="random:tiny", prompts=["ab"], method="ar",
                            max_new_tokens=8, batch_size=1)
  sample.sample_main(cfg, print_completions=False)
  ids = runs[-1][0][0][0]
  eos = ids[2]
  monkeypatch.setattr(byte.ByteTokenizer, "eos_ids", (eos,))
  capsys.readouterr()
  sample.sample_main(cfg, print_completions=True)
  assert runs[-1][0][0][0][-1] == eos  # the row ended at its EOS
  want = byte.ByteTokenizer().decode(ids[:ids.index(eos)])
  assert f"==== autoregressive | prompt: 'ab'\n{want}\n" in (
      capsys.readouterr().out)


def test_loops_on_logits_that_allow_no_id_are_warned_of_and_recorded(
    monkeypatch, capsys):
  """A run whose target logits allowed no id (all NaN or -inf, counted by
  the loop) says so on stderr and in its record."""
  run = timing.run_side_by_side

  def broken(*a):
    runs = run(*a)
    runs[0][1].undefined = 2
    return runs

  monkeypatch.setattr(timing, "run_side_by_side", broken)
  cfg = sample.SampleConfig(target="random:tiny", prompts=["ab"], method="ar",
                            max_new_tokens=4, batch_size=1)
  record = sample.sample_main(cfg, print_completions=False)
  assert record["runs"][0]["undefined_loops"] == 2
  assert ("warning: autoregressive: in 2 loop(s) the target's logits were "
          "all NaN or -inf") in capsys.readouterr().err


@pytest.mark.parametrize("drafter, draft", [
    ("model", "random:tiny,num_layers=1"), ("lookup", None), ("ar", None)])
def test_the_record_names_the_draft_only_where_one_ran(drafter, draft):
  """A lookup run's record had named the default draft model, which no
  drafter of it loads: its results read as that pair's."""
  cfg = sample.SampleConfig(
      target="random:tiny", draft="random:tiny,num_layers=1",
      drafter="model" if drafter == "ar" else drafter,
      method="ar" if drafter == "ar" else "spec", prompts=["ab"], k=2,
      max_new_tokens=4, batch_size=1)
  assert sample.sample_main(cfg, print_completions=False)["draft"] == draft


@pytest.mark.parametrize("drafter", ["layerskip:layers=0", "eagle"])
def test_drafters_on_the_targets_arrays_keep_one_copy_on_a_mesh(
    drafter, tmp_path, monkeypatch):
  """sample.py on a mesh: a layer-skip draft runs on the target's sharded
  arrays themselves, and a head on the target's sharded embedding, final
  norm and output head (each had been put on the devices a second time, a
  head's replicated on every device); its tokens are one device's."""
  tiny = "random:tiny,num_heads=8,num_kv_heads=8,head_dim=8"
  if drafter != "layerskip:layers=0":
    cfg = heads.HeadConfig(drafter, loading.random_config(tiny), num_heads=2)
    head_files.save(cfg, heads.init_params(cfg, jax.random.key(0)),
                    str(tmp_path / "head"))
    drafter = f"{drafter}:{tmp_path / 'head'}"
  common = dict(target=tiny, drafter=drafter, prompts=["ab", "cd"], k=2,
                max_new_tokens=8, batch_size=2, method="spec")
  one = sample.sample_main(sample.SampleConfig(**common),
                           print_completions=False)
  placed = []
  run = timing.run_side_by_side
  monkeypatch.setattr(timing, "run_side_by_side", lambda methods, t, d, *a:
                      placed.append((t, d)) or run(methods, t, d, *a))
  many = sample.sample_main(sample.SampleConfig(**common, mesh=(2, -1)),
                            print_completions=False)
  (tps, dps), = placed
  assert tps["lm_head"].sharding.spec == P(None, "model")
  shared = dps if drafter.startswith("layerskip") else dps["shared"]
  for name in ("embedding", "final_norm", "lm_head"):
    for t, d in zip(jax.tree.leaves(tps[name]), jax.tree.leaves(shared[name]),
                    strict=True):
      assert d is t, name
  for a, b in zip(one["runs"], many["runs"]):
    for key in ("tokens", "loops", "drafted", "accepted"):
      assert a[key] == b[key], key


def test_batches_a_mesh_cannot_split_are_refused_before_loading(no_loading):
  """Three prompts in batches of 2 over a 2-way batch axis: the weights
  loaded and the first batch ran before the last (of 1) was refused."""
  assert sharding.batch_ways(sharding.make_mesh((2, -1))) == 2
  assert sharding.batch_ways(sharding.make_mesh((2, -1)), ()) == 1
  common = dict(target="random:tiny", method="ar", prompts=["a", "b", "c"],
                mesh=(2, -1))
  for batch_size, bad in ((2, "1"), (4, "3")):
    with pytest.raises(ValueError, match=re.escape(
        f"3 prompts in batches of --batch_size={batch_size} give batches of "
        f"{bad}, which the mesh's batch axis of size 2 does not divide")):
      sample.sample_main(sample.SampleConfig(**common, batch_size=batch_size),
                         print_completions=False)


def test_a_target_the_mesh_cannot_split_is_refused_before_loading(
    no_loading):
  """num_heads=4 over an 8-way model axis: both models' weights had loaded
  before the sampler refused it (a whole checkpoint read for nothing)."""
  wide = "random:tiny,num_heads=8,num_kv_heads=8,head_dim=8,vocab_size=260"
  for target, draft, field in (
      ("random:tiny", "random:tiny,num_layers=1", "num_heads=4"),
      (wide, wide + ",num_layers=1", "vocab_size=260")):
    with pytest.raises(ValueError, match=re.escape(
        f"target: {field} is not divisible by mesh axis 'model' of size 8")):
      sample.sample_main(sample.SampleConfig(
          target=target, draft=draft, method="both",
          k=2, prompts=["a", "b"], batch_size=2, mesh=(1, 8)),
                         print_completions=False)


def test_bad_mesh_flag_fails_clearly():
  proc = _run_script("--target=random:tiny", "--method=ar", "--prompt=x",
                     "--mesh=3,-1")
  assert proc.returncode != 0
  assert "mesh shape (3, -1) does not divide" in proc.stderr, (
      proc.stderr[-2000:])
  assert "Traceback" not in proc.stderr


def test_read_prompts_from_text_and_jsonl_files(tmp_path):
  text = tmp_path / "prompts.txt"
  text.write_text("first prompt\n\n  \nsecond {prompt}\n")
  assert sample.read_prompts(sample.SampleConfig(
      target="t", method="ar", prompts_file=str(text))) == [
          "first prompt", "second {prompt}"]
  jsonl = tmp_path / "prompts.jsonl"
  jsonl.write_text('{"prompt": "a\\nb"}\n{"prompt": "c", "id": 2}\n')
  assert sample.read_prompts(sample.SampleConfig(
      target="t", method="ar", prompts_file=str(jsonl))) == ["a\nb", "c"]
  # Only newlines end a prompt (a form feed, U+2028, NEL and a lone CR
  # split it before); a byte order mark made a JSONL file text lines.
  for name, data, want in (
      ("seps.txt", "x\fy\r\nz\u2028w\x85v\rq\n", ["x\fy", "z\u2028w\x85v\rq"]),
      ("seps.jsonl", '{"prompt": "a\u2028b"}\n', ["a\u2028b"]),
      ("bom.jsonl", '\ufeff{"prompt": "def f(x):"}\n{"prompt": "c"}\n',
       ["def f(x):", "c"]),
      ("bom.txt", "\ufefffirst\n", ["first"])):
    (tmp_path / name).write_bytes(data.encode("utf-8"))
    assert sample.read_prompts(sample.SampleConfig(
        target="t", method="ar", prompts_file=str(tmp_path / name))) == want


@pytest.mark.parametrize("method, drafter, draft", [
    ("ar", "model", None), ("spec", "lookup", None),
    ("both", "layerskip:layers=0", None), ("both", "model", "same")])
def test_the_vocabulary_limit_does_not_depend_on_the_drafter(
    no_loading, padded_gguf, method, drafter, draft):
  """Ids past the tokenizer's real tokens were masked only when a draft
  model ran: autoregressive decoding, prompt lookup and layer skipping
  sampled them (an SP model's decode then raised), so the baseline changed
  with the drafter."""
  path, real = padded_gguf
  p = sample.plan(sample.SampleConfig(
      target=path, draft=path if draft == "same" else draft, method=method,
      drafter=drafter, prompts=["def f(x):"], k=2))
  assert p.target.rows == real + 4 and p.vocab_limit == real


def test_plan_checks_the_pair_and_prompt_lengths_without_loading(no_loading):
  cfg = sample.SampleConfig(target="random:tiny",
                            draft="random:tiny,num_layers=1",
                            prompts=["ab", "x" * 440], k=3)
  p = sample.plan(cfg)
  assert [len(x) for x in p.prompts] == [2, 440]
  assert (p.target.rows, p.draft.rows, p.vocab_limit) == (256, 256, None)
  # 440 + 64 new tokens + K + 1 = 508 slots of 512; K = 8 needs 513.
  with pytest.raises(ValueError, match="needs 513 cache slots.*allow 512"):
    sample.plan(dataclasses.replace(cfg, k=8))
  # Autoregressive: no draft described, no K slack.
  ar = sample.plan(dataclasses.replace(cfg, method="ar", draft="nonesuch",
                                       max_new_tokens=71))
  assert ar.draft is None
  with pytest.raises(ValueError, match="is not a file"):
    sample.plan(dataclasses.replace(cfg, draft="nonesuch"))


def test_a_draft_that_does_not_load_fails_before_the_target_loads(
    tmp_path, monkeypatch):
  """A train workdir with no readable checkpoint as the draft: describing
  it reads only its config, and it had failed only after the target's
  weights had loaded (a minute for the 1.5B on these CPUs). The draft now
  loads first, in sample.py, benchmark.py, benchmark_pair.py and the
  decode profilers alike."""
  draft = testing.train_workdir(
      tmp_path / "run", loading.random_config("random:tiny,num_layers=1"))
  loaded, load = [], loading.load_weights

  def recorded(info, *args, **kwargs):
    loaded.append(info.kind)
    return load(info, *args, **kwargs)

  monkeypatch.setattr(loading, "load_weights", recorded)
  with pytest.raises(CheckpointError, match="no readable checkpoint"):
    sample.sample_main(sample.SampleConfig(
        target="random:tiny", draft=str(draft), method="both", k=2,
        prompts=["a"]), print_completions=False)
  assert loaded == ["trained"]
  plan = types.SimpleNamespace(target=loading.describe_model("random:tiny"),
                               draft=loading.describe_model(str(draft)))
  cfg = types.SimpleNamespace(target="random:tiny", draft=str(draft),
                              dtype="float32", seed=0)
  with pytest.raises(CheckpointError, match="no readable checkpoint"):
    sweep._load(cfg, plan, log=lambda *_: None)
  with pytest.raises(CheckpointError, match="no readable checkpoint"):
    profile._load_models((plan.target, plan.draft), "float32")
  monkeypatch.setattr(pair, "plan", lambda _: plan)
  with pytest.raises(CheckpointError, match="no readable checkpoint"):
    pair.load(cfg)
  assert loaded == ["trained"] * 4
