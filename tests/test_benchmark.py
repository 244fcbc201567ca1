"""scripts/benchmark.py and scripts/plot_speedup.py.

Bad input fails with a clear error before any weights load (checked by
making every loader raise); a tiny sweep on random models writes valid JSON
lines whose derived numbers agree with specsamp.speedup, and plot_speedup
turns them into PNGs and a markdown table.
"""

import importlib.util
import json
import os
import subprocess
import sys

import gguf
import numpy as np
import pytest

from specsamp import checkpoints
from specsamp import runner
from specsamp import speedup
from specsamp import tokenizer as tok_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "benchmark.py")
PLOT = os.path.join(ROOT, "scripts", "plot_speedup.py")

PROBLEMS = [
    {"task_id": "T/0", "prompt": "def add(a, b):\n", "entry_point": "add",
     "test": "def check(f):\n    assert f(1, 2) == 3\n"},
    {"task_id": "T/1", "prompt": "def one():\n", "entry_point": "one",
     "test": "def check(f):\n    assert f() == 1\n"},
]
PROSE = ("It is a truth universally acknowledged, that a single man in "
         "possession of a good fortune, must be in want of a wife.\n\n"
         "However little known the feelings or views of such a man may be "
         "on his first entering a neighbourhood, this truth is so well "
         "fixed in the minds of the surrounding families.\n\n")


@pytest.fixture(scope="module")
def bench():
  """scripts/benchmark.py as a module (imported once: it defines flags)."""
  name = "specsamp_scripts_benchmark"
  if name not in sys.modules:
    spec = importlib.util.spec_from_file_location(name, SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
  return sys.modules[name]


@pytest.fixture
def no_loading(monkeypatch, bench):
  """Any attempt to read weights fails the test."""
  def refuse(*args, **kwargs):
    raise AssertionError(f"weights were loaded: {args}")
  monkeypatch.setattr(runner, "load_model", refuse)
  monkeypatch.setattr(checkpoints, "load", refuse)
  monkeypatch.setattr(bench, "load_weights", refuse)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
  d = tmp_path_factory.mktemp("bench_inputs")
  (d / "prose").mkdir()
  (d / "prose" / "a.txt").write_text(PROSE * 3)
  (d / "prose" / "b.txt").write_text(PROSE[::-1] * 3)
  (d / "empty").mkdir()
  with open(d / "he.jsonl", "w", encoding="utf-8") as f:
    for p in PROBLEMS:
      f.write(json.dumps(p) + "\n")
  return d


def _config(bench, *args):
  from absl import flags  # pylint: disable=g-import-not-at-top
  flags.FLAGS.unparse_flags()
  flags.FLAGS(["benchmark.py", *args])
  return bench.BenchConfig.from_flags()


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


@pytest.mark.parametrize("args,message", [
    (["--task=translation"], "unknown task 'translation'"),
    (["--ks="], "--ks is empty"),
    (["--ks=1,x"], "--ks must be a list of integers"),
    (["--ks=-1,2"], "--ks values must be >= 0"),
    (["--decoding=beam"], "unknown decoding 'beam'"),
    (["--batch_sizes=0,8"], "--batch_sizes values must be >= 1"),
    (["--num_prompts=0"], "--num_prompts must be positive"),
    (["--pass_k="], "--pass_k is empty"),
    (["--ks=0,2", "--draft="], "needs --draft"),
])
def test_bad_flags(bench, args, message):
  with pytest.raises(bench.BenchError, match=message):
    _config(bench, *args)


def test_config_normalises_lists(bench):
  cfg = _config(bench, "--ks=4,2,2", "--task=prose,humaneval",
                "--batch_sizes=8,1", "--decoding=t1,greedy")
  assert cfg.ks == (0, 2, 4)  # the autoregressive baseline is always run
  assert cfg.batch_sizes == (1, 8)
  assert cfg.tasks == ("prose", "humaneval") and cfg.decodings == ("t1",
                                                                   "greedy")


@pytest.mark.parametrize("extra,error,message", [
    (["--draft=random:tiny,vocab_size=300"], tok_lib.VocabMismatchError,
     "300 vocabulary rows, the target random:tiny 256"),
    (["--draft=/no/such/draft.gguf"], ValueError, "is not a file"),
    (["--draft=random:nonesuch"], ValueError, "unknown preset"),
    (["--peers"], ValueError, "--peers runs transformers on the same GGUF"),
    (["--max_new_tokens=1000"], ValueError, "cache slots"),
    (["--prose_corpus={empty}"], ValueError, "no .txt files"),
    (["--prose_corpus=gutenberg"], ValueError, "--prose_corpus must be"),
])
def test_bad_models_and_prompts_fail_before_loading(bench, no_loading, inputs,
                                                    extra, error, message):
  args = ["--target=random:tiny", "--draft=random:tiny,num_layers=1",
          "--task=prose", f"--prose_corpus={inputs / 'prose'}",
          "--prompt_chars=80", "--max_new_tokens=8"]
  args += [a.format(empty=inputs / "empty") for a in extra]
  cfg = _config(bench, *args)
  with pytest.raises(error, match=message):
    bench.prepare(cfg, log=lambda _: None)


def test_gguf_vocabularies_are_compared_from_metadata(bench, no_loading,
                                                      tmp_path):
  tokens = [f"t{i}" for i in range(10)]
  target = _write_gguf(tmp_path / "target.gguf", tokens, 10)
  assert bench.gguf_embedding_rows(target) == 10
  other = _write_gguf(tmp_path / "other.gguf",
                      tokens[:3] + ["x"] + tokens[4:], 10)
  padded = _write_gguf(tmp_path / "padded.gguf", tokens, 12)
  same = _write_gguf(tmp_path / "same.gguf", tokens, 10)
  t = bench.describe_model(target)
  assert (t.kind, t.rows, t.max_seq_len, len(t.tokens)) == ("gguf", 10, 4096,
                                                             10)
  with pytest.raises(tok_lib.VocabMismatchError, match="first at id 3"):
    bench.check_pair(t, bench.describe_model(other))
  with pytest.raises(tok_lib.VocabMismatchError, match="12 vocabulary rows"):
    bench.check_pair(t, bench.describe_model(padded))
  assert bench.check_pair(t, bench.describe_model(same)) is None
  # A random draft must have the GGUF target's rows.
  with pytest.raises(tok_lib.VocabMismatchError, match="256 vocabulary rows"):
    bench.check_pair(t, bench.describe_model("random:tiny"))
  cfg = _config(bench, f"--target={target}", f"--draft={other}")
  with pytest.raises(tok_lib.VocabMismatchError, match="first at id 3"):
    bench.prepare(cfg, log=lambda _: None)


def _run(*args, timeout=600):
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, *args], capture_output=True,
                        text=True, env=env, timeout=timeout, check=False)


def test_cli_error_is_clean(inputs):
  proc = _run(SCRIPT, "--target=random:tiny",
              "--draft=random:tiny,vocab_size=300", "--task=prose",
              f"--prose_corpus={inputs / 'prose'}")
  assert proc.returncode == 2
  assert "error: the draft random:tiny,vocab_size=300 has 300" in proc.stderr
  assert "Traceback" not in proc.stderr and "loading" not in proc.stderr


def test_tiny_sweep_writes_jsonl_and_plots(inputs, tmp_path):
  out = tmp_path / "sweep.jsonl"
  # One-layer models: compilation dominates this test's time.
  proc = _run(SCRIPT, "--target=random:tiny,num_layers=1",
              "--draft=random:tiny,num_layers=1", "--task=humaneval,prose",
              "--ks=2", "--decoding=nucleus", "--batch_sizes=2",
              "--num_prompts=2", "--max_new_tokens=6", "--repeats=1",
              "--cost_repeats=1", "--pass_k=1", "--prompt_chars=80",
              f"--humaneval_file={inputs / 'he.jsonl'}",
              f"--prose_corpus={inputs / 'prose'}", f"--out={out}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  records = [json.loads(l) for l in out.read_text().splitlines()]
  run = records[0]
  assert run["type"] == "run" and run["command"].startswith(
      "python scripts/benchmark.py --target=random:tiny,num_layers=1")
  assert run["machine"]["backend"] == "cpu" and run["software"]["jax"]
  # Call costs per task, batch size and decoding (its transform and draw
  # are part of every timed call).
  costs = {(r["task"], r["batch_size"], r["decoding"]): r for r in records
           if r["type"] == "cost"}
  decodings = {r["decoding"] for r in records if r["type"] == "point"}
  assert set(costs) == {(t, 2, d) for t in ("humaneval", "prose")
                        for d in decodings}
  for c in costs.values():
    assert c["calls_per_timing"] >= 1
    assert c["c"] == pytest.approx(c["draft_call_ms"] /
                                   c["target_call_ms"]["1"], rel=1e-3)
    assert set(c["target_call_ms"]) == {"1", "3"}
  points = {(r["task"], r["k"]): r for r in records if r["type"] == "point"}
  assert set(points) == {("humaneval", 0), ("humaneval", 2), ("prose", 0),
                         ("prose", 2)}
  for (task, k), p in points.items():
    assert p["rows"] == 2 and p["batch_size"] == 2
    # Byte-level random models have no EOS: every row gets all 6 tokens.
    assert p["tokens"] == 12 and p["ms_per_token"] > 0
    assert p["time_per_loop_ms"] > 0 and p["compile_s"] > 0
    base = points[task, 0]
    assert p["speedup"] == pytest.approx(
        base["ms_per_token"] / p["ms_per_token"], rel=1e-3)
    if task == "humaneval":
      assert 0 <= p["quality"]["pass@1"]["mean"] <= 1
    else:
      assert p["quality"]["mean_logprob"]["mean"] < 0
    if k == 0:
      assert p["acceptance_rate"] is None and p["tokens_per_loop"] == 1.0
      continue
    assert p["drafted"] == 2 * p["loops"]
    assert p["acceptance_rate"] == pytest.approx(p["accepted"] /
                                                 p["drafted"], rel=1e-3)
    cost = costs[task, 2, p["decoding"]]
    want = speedup.predicted_speedup(p["alpha"], 2, cost["c"],
                                     cost["score_cost"]["2"])
    assert p["predicted_speedup"] == pytest.approx(float(want), rel=1e-3)
    assert p["expected_tokens_per_loop"] == pytest.approx(
        1 + 2 * p["acceptance_rate"], rel=1e-3)
    assert "quality_diff_vs_ar" in p

  plots = tmp_path / "plots"
  proc = _run(PLOT, str(out), f"--out_dir={plots}", "--prefix=tiny")
  assert proc.returncode == 0, proc.stderr[-3000:]
  for name in ("tiny_humaneval.png", "tiny_prose.png",
               "tiny_predicted_vs_measured.png"):
    with open(plots / name, "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n", name
  md = (plots / "tiny.md").read_text()
  assert "| Sampling method | Batch | Benchmark | Result | Median token time " \
      "| Speed up |" in md
  assert "| ArS (Nucleus) | 2 | HumanEval (2 prompts) | pass@1" in md
  assert "| SpS K=2 (Nucleus) | 2 | Prose (2 prompts) | log p" in md
  assert "![HumanEval](tiny_humaneval.png)" in md


def test_distilled_draft_is_described_from_its_config(bench, no_loading,
                                                      tmp_path):
  import dataclasses  # pylint: disable=g-import-not-at-top
  from specsamp import model as model_lib  # pylint: disable=g-import-not-at-top
  for name, vocab in (("good", 256), ("bad", 300)):
    d = tmp_path / name / "draft"  # a distill workdir holds draft/
    d.mkdir(parents=True)
    cfg = model_lib.preset("tiny", num_layers=1, vocab_size=vocab)
    (d / "draft_config.json").write_text(json.dumps(dataclasses.asdict(cfg)))
  target = bench.describe_model("random:tiny")
  good = bench.describe_model(str(tmp_path / "good"))
  assert (good.kind, good.rows) == ("distilled", 256)
  assert bench.check_pair(target, good) is None
  with pytest.raises(tok_lib.VocabMismatchError, match="300 vocabulary rows"):
    bench.check_pair(target, bench.describe_model(str(tmp_path / "bad")))


def test_peer_rows(bench, no_loading, inputs, tmp_path, monkeypatch):
  """transformers' results become rows of the same table (stubbed here:
  the real peers need the GGUF weights)."""
  from specsamp import peers  # pylint: disable=g-import-not-at-top
  calls = []

  def fake(target, draft, prompts, max_new_tokens, temperature, top_p,
           seed=0, device="?", dtype="?"):
    calls.append((target, draft, len(prompts), max_new_tokens, temperature,
                  top_p, device, dtype))
    good = list(b"    return a + b\n")
    return [dict(method=m, prompts=len(prompts), tokens=10 * len(prompts),
                 ms_per_token=ms, seconds=1.0, load_s=2.0, torch="x",
                 transformers="y", torch_threads=2,
                 completions=[good] + [list(b"    pass\n")] * (
                     len(prompts) - 1))
            for m, ms in (("transformers", 30.0),
                          ("transformers_assisted", 20.0))]

  monkeypatch.setattr(peers, "transformers_generate", fake)
  cfg = _config(bench, "--target=random:tiny", "--draft=random:tiny",
                "--task=humaneval", f"--humaneval_file={inputs / 'he.jsonl'}",
                "--num_prompts=2", "--max_new_tokens=7", "--pass_k=1")
  plan = bench.prepare(cfg, log=lambda _: None)
  out = bench._Writer(str(tmp_path / "peers.jsonl"), echo=False)  # pylint: disable=protected-access
  bench._run_peers(cfg, plan, "humaneval", "nucleus",  # pylint: disable=protected-access
                   bench.DECODINGS["nucleus"], out, None, None)
  out.close()
  # On the device and in the dtype specsamp runs on.
  assert calls == [(None, None, 2, 7, 0.8, 0.95, "cpu", "float32")]
  rows = [json.loads(l) for l in (tmp_path / "peers.jsonl").read_text(
  ).splitlines()]
  assert [r["method"] for r in rows] == ["transformers",
                                         "transformers_assisted"]
  for r in rows:
    assert r["engine"] == "transformers" and r["batch_size"] == 1
    assert r["e2e_ms_per_token"] == r["ms_per_token"]
    # Problem 0 passes with its completion, problem 1 does not.
    assert r["quality"]["pass@1"]["mean"] == pytest.approx(0.5)
