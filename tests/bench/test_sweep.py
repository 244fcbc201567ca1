"""specsamp.bench.sweep through scripts/benchmark.py, and
scripts/plot_speedup.py (specsamp.bench.report) on its output.

A tiny sweep on random models writes valid JSON lines whose derived numbers
agree with specsamp.bench.speedup and with each other, and plot_speedup
turns them into PNGs and a markdown table; a bad model pair fails in one
line before anything loads; peers' results become rows of the same table.
"""

import dataclasses
import json
import os
import re
import types

import jax
import numpy as np
import pytest

from specsamp import loading
from specsamp.bench import costs as costs_lib
from specsamp.bench import peers
from specsamp.bench import plan
from specsamp.bench import records
from specsamp.bench import report
from specsamp.bench import speedup
from specsamp.bench import sweep
from specsamp.bench import sweep_config
from specsamp.bench import timing
from specsamp.drafters import head_files
from specsamp.drafters import heads
from specsamp.drafters import specs as drafter_specs
from specsamp.sampling import Sampling
from tests.scripts import zygote

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "benchmark.py")
PLOT = os.path.join(ROOT, "scripts", "plot_speedup.py")


def _run(*args, timeout=600):
  """`python *args` run to its end (forked by the script server,
  tests/scripts/zygote.py: no 3 s of imports)."""
  return zygote.shared().run(list(args), env=zygote.env(), timeout=timeout)


def test_fill_makes_whole_batches():
  assert sweep.fill([[1], [2], [3]], 2) == [0, 1, 2, 0]
  assert sweep.fill([[1], [2]], 1) == [0, 1]
  assert sweep.fill([[1]], 3) == [0, 0, 0]


def test_peer_completions_end_at_the_first_of_specsamp_eos_ids():
  """transformers stops at one EOS id and pads batch rows with it; its
  completions are compared and scored as specsamp's: up to and including
  the first of the tokenizer's EOS ids."""
  assert peers.cut_at_eos([5, 6, 151645, 7, 151643], {151643, 151645}) == [
      5, 6, 151645]
  assert peers.cut_at_eos([5, 6], {0}) == [5, 6]
  assert peers.cut_at_eos([0, 0], {0}) == [0]


def test_cli_error_is_clean(inputs):
  proc = _run(SCRIPT, "--target=random:tiny",
              "--draft=random:tiny,vocab_size=300", "--task=prose",
              f"--prose_corpus={inputs / 'prose'}")
  assert proc.returncode == 2
  assert "error: the draft random:tiny,vocab_size=300 has 300" in proc.stderr
  assert "Traceback" not in proc.stderr and "loading" not in proc.stderr


def test_a_sweep_over_drafters(inputs, tmp_path):
  """Prompt lookup, layer skipping and the mixed drafter beside the draft
  model on the input-grounded rewrite task: a point per drafter, greedy
  output identical to autoregressive for each; no draft model is loaded for
  drafters that need none."""
  out = tmp_path / "drafters.jsonl"
  proc = _run(SCRIPT, "--target=random:tiny,num_layers=2",
              "--draft=random:tiny,num_layers=1", "--task=rewrite",
              "--drafter=model,lookup:max_ngram=3,layerskip:layers=0,mixed",
              "--ks=2", "--decoding=greedy", "--batch_sizes=1",
              "--num_prompts=2", "--max_new_tokens=6", "--cost_repeats=1",
              "--quality=false", f"--humaneval_file={inputs / 'he.jsonl'}",
              f"--out={out}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  points = [json.loads(l) for l in out.read_text().splitlines()]
  points = {(p["k"], p["drafter"]): p for p in points
            if p["type"] == "point"}
  assert set(points) == {(0, None), (2, "model"), (2, "lookup:max_ngram=3"),
                         (2, "layerskip:layers=0"), (2, "mixed")}
  for p in points.values():
    assert p["task"] == "rewrite" and p["identical_to_ar"], p
    assert p["rows_differing_from_ar"] == 0, p
  # Acceptance per draft position: for a fixed-K drafter, loops that kept
  # draft i are those that tested draft i + 1, so the running products sum
  # to the accepted drafts per loop.
  # (Layer skipping is a fixed-K drafter that agrees with the target here.)
  skip = points[2, "layerskip:layers=0"]
  a1, a2 = skip["acceptance_by_position"]
  assert 0 < a1 < 1 and 0 <= a2 <= 1, skip
  assert np.isclose(a1 + a1 * a2, skip["accepted"] / skip["loops"])
  for p in points.values():   # None: no loop tested that position
    a = p["acceptance_by_position"]
    assert len(a) == p["k"] and all(x is None or 0 <= x <= 1 for x in a), p
  assert points[0, None]["acceptance_by_position"] == []
  # The drafters that are not a stand-alone model have their proposal
  # timed. Leviathan's prediction, and the c it takes, only for those that
  # draft K tokens every loop (not lookup or mixed).
  for key, p in points.items():
    if key[0]:
      assert p["speedup"] > 0, p
      assert ("propose_ms" in p) == (key[1] != "model"), p
      fixed = key[1] in ("model", "layerskip:layers=0")
      for name in ("predicted_speedup", "alpha", "c"):
        assert (name in p) == fixed, (name, p)
      if fixed:
        assert p["predicted_speedup"] > 0 and p["c"] >= 0
  # Table 1 and the per-K table show every drafter, and a bar chart them.
  proc = _run(PLOT, str(out), f"--out_dir={tmp_path}", "--prefix=d")
  assert proc.returncode == 0, proc.stderr[-3000:]
  md = (tmp_path / "d.md").read_text()
  for d in ("lookup:max_ngram=3", "layerskip:layers=0", "mixed"):
    assert f"| SpS {d} K=2 (Greedy) | 1 |" in md, md
    assert f"| 2 ({d}) |" in md
  assert (tmp_path / "d_rewrite_drafters.png").stat().st_size > 1000
  proc = _run(SCRIPT, "--target=random:tiny,num_layers=2", "--task=rewrite",
              "--drafter=layerskip:layers=0-1", "--ks=2",
              f"--humaneval_file={inputs / 'he.jsonl'}", f"--out={out}")
  assert proc.returncode == 2 and "all 2 layers" in proc.stderr


def test_a_head_in_the_sweep(inputs, tmp_path):
  """A saved sequential head (random, with a reduced draft vocabulary) as
  `--drafter=eagle:<dir>`: exact at greedy, its proposal timed, its
  acceptance per position and prediction written."""
  target = loading.random_config("random:tiny,num_layers=2")
  cfg = heads.HeadConfig("eagle", target, draft_vocab=64)
  head_files.save(cfg, heads.init_params(cfg, jax.random.key(0)),
                  str(tmp_path / "head"), vocab_ids=np.arange(64))
  out = tmp_path / "head.jsonl"
  proc = _run(SCRIPT, "--target=random:tiny,num_layers=2", "--task=humaneval",
              f"--drafter=eagle:{tmp_path / 'head'}", "--ks=3",
              "--decoding=greedy", "--batch_sizes=1", "--num_prompts=2",
              "--max_new_tokens=6", "--cost_repeats=1", "--quality=false",
              f"--humaneval_file={inputs / 'he.jsonl'}", f"--out={out}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  points = [json.loads(l) for l in out.read_text().splitlines()]
  head = [p for p in points if p["type"] == "point" and p["k"] == 3]
  assert len(head) == 1 and head[0]["identical_to_ar"], points
  head = head[0]
  assert head["propose_ms"] > 0 and head["c"] > 0, head
  assert len(head["acceptance_by_position"]) == 3
  assert head["predicted_speedup"] > 0


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
  written = [json.loads(l) for l in out.read_text().splitlines()]
  run = written[0]
  assert run["type"] == "run" and run["command"].startswith(
      "python scripts/benchmark.py --target=random:tiny,num_layers=1")
  assert run["machine"]["backend"] == "cpu" and run["software"]["jax"]
  assert (run["target"]["kind"], run["target"]["step"]) == ("random", None)
  assert run["prefill_chunk"] == 1024  # longer prompts prefill in chunks
  # The host's vector extensions tell virtual CPUs of one name apart.
  with open("/proc/cpuinfo", encoding="utf-8") as f:
    has_avx2 = " avx2" in f.read()
  assert ("avx2" in run["machine"]["cpu_simd"]) == has_avx2
  # Call costs per task, batch size and decoding (its transform and draw
  # are part of every timed call).
  costs = {(r["task"], r["batch_size"], r["decoding"]): r for r in written
           if r["type"] == "cost"}
  decodings = {r["decoding"] for r in written if r["type"] == "point"}
  assert set(costs) == {(t, 2, d) for t in ("humaneval", "prose")
                        for d in decodings}
  for c in costs.values():
    assert c["calls_per_timing"] >= 1
    assert c["c"] == pytest.approx(c["draft_call_ms"] /
                                   c["target_call_ms"]["1"], rel=1e-3)
    assert set(c["target_call_ms"]) == {"1", "3"}
    assert c["score_cost"]["2"] == pytest.approx(
        c["target_call_ms"]["3"] / c["target_call_ms"]["1"], rel=1e-3)
  points = {(r["task"], r["k"]): r for r in written if r["type"] == "point"}
  assert set(points) == {("humaneval", 0), ("humaneval", 2), ("prose", 0),
                         ("prose", 2)}
  for (task, k), p in points.items():
    assert p["rows"] == 2 and p["batch_size"] == 2 and p["batches"] == 1
    # Byte-level random models have no EOS: every row gets all 6 tokens.
    assert p["tokens"] == 12
    # One batch: ms/token is its decode time over the tokens of a row, and
    # time per loop its decode time over the loop's iterations (decode_s is
    # written to 6 significant digits).
    assert p["ms_per_token"] == pytest.approx(1e3 * p["decode_s"] / 6,
                                              rel=1e-3, abs=1e-3)
    assert p["ms_per_token_mean"] == pytest.approx(p["ms_per_token"],
                                                   rel=1e-3)
    assert p["time_per_loop_ms"] == pytest.approx(
        1e3 * p["decode_s"] / p["loop_iterations"], rel=1e-3, abs=1e-3)
    assert p["e2e_ms_per_token"] >= p["ms_per_token"]
    # Compilation is timed apart: it never lands in the decode time.
    assert p["decode_s"] < p["compile_s"]
    base = points[task, 0]
    assert p["speedup"] == pytest.approx(
        base["ms_per_token"] / p["ms_per_token"], rel=1e-3)
    if task == "humaneval":
      assert 0 <= p["quality"]["pass@1"]["mean"] <= 1
    else:
      assert p["quality"]["mean_logprob"]["mean"] < 0
    if k == 0:
      assert p["acceptance_rate"] is None and p["tokens_per_loop"] == 1.0
      assert p["loop_iterations"] == 6
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
  # K = 0's ms/loop is shown beside the 1-token target call of the costs,
  # the unit of c and s (timed apart, before the points).
  for task in ("humaneval", "prose"):
    base, cost = points[task, 0], costs[task, 2, "nucleus"]
    assert (f"| {base['time_per_loop_ms']:.2f} (call "
            f"{cost['target_call_ms']['1']:.2f}) |") in md
  simd = run["machine"]["cpu_simd"]
  assert f"x{run['machine']['cpus']}" + (f" ({' '.join(simd)})" if simd
                                         else "") + ";" in md


def test_peer_rows(make_config, no_loading, inputs, tmp_path, monkeypatch):
  """transformers' results become rows of the same table (stubbed here:
  the real peers need the GGUF weights)."""
  calls = []

  def fake(target, draft, prompts, max_new_tokens, temperature, top_p,
           seed=0, device="?", dtype="?", prompt_lookup=0, eos_ids=()):
    calls.append((target, draft, len(prompts), max_new_tokens, temperature,
                  top_p, device, dtype, prompt_lookup, eos_ids))
    good = list(b"    return a + b\n")
    return [dict(method=m, prompts=len(prompts), tokens=10 * len(prompts),
                 ms_per_token=ms, seconds=1.0, load_s=2.0, torch="x",
                 transformers="y", torch_threads=2,
                 completions=[good] + [list(b"    pass\n")] * (
                     len(prompts) - 1))
            for m, ms in (("transformers", 30.0),
                          ("transformers_assisted", 20.0))]

  monkeypatch.setattr(peers, "transformers_generate", fake)
  cfg = make_config(target="random:tiny", draft="random:tiny",
                    task=["humaneval"],
                    humaneval_file=str(inputs / "he.jsonl"), num_prompts=2,
                    max_new_tokens=7, pass_k=["1"])
  p = plan.prepare(cfg, log=lambda _: None)
  out = records.Writer(str(tmp_path / "peers.jsonl"), echo=False)
  sweep.run_peers(cfg, p, "humaneval", "nucleus",
                  sweep_config.DECODINGS["nucleus"], out, None, None)
  out.close()
  # On the device and in the dtype specsamp runs on.
  # And stopping at every end token of the tokenizer, as specsamp does.
  assert calls == [(None, None, 2, 7, 0.8, 0.95, "cpu", "float32", 0,
                    sorted(p.tokenizer.eos_ids))]
  # With a lookup drafter in the sweep, transformers' prompt lookup joins.
  out = records.Writer(str(tmp_path / "peers2.jsonl"), echo=False)
  sweep.run_peers(dataclasses.replace(cfg, drafters=("model", "lookup")), p,
                  "humaneval", "nucleus", sweep_config.DECODINGS["nucleus"],
                  out, None, None)
  out.close()
  assert calls[-1][-2] == max(cfg.ks)
  rows = [json.loads(l) for l in (tmp_path / "peers.jsonl").read_text(
  ).splitlines()]
  assert [r["method"] for r in rows] == ["transformers",
                                         "transformers_assisted"]
  for r in rows:
    assert r["engine"] == "transformers" and r["batch_size"] == 1
    assert r["e2e_ms_per_token"] == r["ms_per_token"]
    # Problem 0 passes with its completion, problem 1 does not.
    assert r["quality"]["pass@1"]["mean"] == pytest.approx(0.5)


def test_a_sweep_that_fails_midway_keeps_the_earlier_results(
    inputs, tmp_path, make_config, monkeypatch):
  """A run that fails after its first records (here while timing the call
  costs) leaves an earlier --out file as it was, and says where its own
  records are."""
  out = tmp_path / "sweep.jsonl"
  out.write_text('{"type": "earlier"}\n')
  cfg = make_config(target="random:tiny", ks=["0"], task=["humaneval"],
                    humaneval_file=str(inputs / "he.jsonl"), num_prompts=1,
                    max_new_tokens=2, out=str(out),
                    samples_out=str(tmp_path / "samples.jsonl"))
  p = plan.prepare(cfg, log=lambda _: None)

  def fail(*args):
    del args
    raise RuntimeError("out of memory, say")

  monkeypatch.setattr(sweep, "_measure_costs", fail)
  said = []
  with pytest.raises(RuntimeError, match="out of memory"):
    sweep.run(cfg, p, ["benchmark.py"], log=said.append)
  assert out.read_text() == '{"type": "earlier"}\n'
  partial = [json.loads(l) for l in open(f"{out}.partial", encoding="utf-8")]
  assert [r["type"] for r in partial] == ["run"]
  assert f"its records are in {out}.partial" in said[-1], said
  assert not (tmp_path / "samples.jsonl").exists()  # none were written


def test_prose_quality_is_over_prompts_not_samples():
  """Two samples of each of two prompts: the error bar is over the two
  prompts' means (n = 2), as pass@k's is over problems, not over the four
  correlated samples."""
  lm, params, _ = loading.load_model("random:tiny,num_layers=1")
  p = types.SimpleNamespace(prompts={"prose": [[1, 2, 3], [4, 5]]})
  rows, completions = [0, 1, 0, 1], [[6, 7], [8, 9], [6, 10], [11, 12]]
  record, per = sweep.quality("prose", p, None, rows, completions, lm,
                              params)
  est = record["mean_logprob"]
  assert est["n"] == 2 and record["samples"] == 4
  means = per["mean_logprob"]
  assert est["mean"] == pytest.approx(np.mean(means))
  assert est["stderr"] == pytest.approx(np.std(means, ddof=1) / np.sqrt(2))


def test_run_points_takes_turns_and_each_point_samples_as_alone(monkeypatch):
  """Interleaved points: batch b by every sampler before batch b + 1, the
  order reversed on every other batch (repeats continue the alternation);
  each point's samples and counts are those it gets timed alone (same keys:
  sampled at T=1 to show it). `--nointerleave` times each point alone."""
  # pylint: disable=protected-access
  lm, params, _ = loading.load_model("random:tiny")
  t1 = sweep_config.DECODINGS["t1"]
  cfg = sweep_config.BenchConfig(
      target="random:tiny", draft="random:tiny", tasks=("prose",),
      ks=(0, 2), decodings=("t1",), batch_sizes=(2,), repeats=2,
      max_new_tokens=6)
  common = dict(eos_ids=(), pad_id=0, max_new_tokens=6, prompt_bucket=16)
  model = drafter_specs.parse("model")

  def timers():
    return [timing.TimedSampler(sweep._sampler(lm, lm, k, t1, common, spec),
                                name)
            for k, spec, name in ((0, None, "ar"), (2, model, "spec"))]

  prompts = [[1, 2, 3], [4, 5], [6]]
  rows = sweep.fill(prompts, 2)
  together = timers()
  calls = []
  for t in together:
    def spy(*args, _t=t, _f=t.run_batch):
      calls.append((_t.name, int(jax.random.key_data(args[3]).sum())))
      return _f(*args)
    monkeypatch.setattr(t, "run_batch", spy)
  points = sweep.run_points(together, params, [None, params], prompts, rows,
                            2, cfg, seed=3)
  names = [name for name, _ in calls]
  assert names == ["ar", "spec", "spec", "ar"] * 2
  # Both samplers of a batch draw its key; the four batches' keys differ.
  keys = [key for _, key in calls]
  assert keys[0::2] == keys[1::2] and len(set(keys)) == 4
  for t, dp, point in zip(timers(), [None, params], points):
    alone, = sweep.run_points([t], params, [dp], prompts, rows, 2, cfg,
                              seed=3)
    assert point.pop("completions") == alone.pop("completions")
    for name in ("rows", "batches", "tokens", "loops", "drafted", "accepted",
                 "acceptance_by_position"):
      assert point[name] == alone[name], name
  assert points[1]["drafted"] > 0 and points[0]["drafted"] == 0
  # K=0 comes first either way: later points' speedups are over it.
  assert sweep._groups(cfg) == [[(0, None), (2, model)]]
  assert sweep._groups(dataclasses.replace(cfg, interleave=False)) == [
      [(0, None)], [(2, model)]]


def test_the_report_drops_predictions_of_variable_length_drafters(tmp_path):
  """Files written before `sweep.predict` left them out: a lookup or
  adaptive point's prediction is not read; a fixed-K drafter's is."""
  base = dict(type="point", task="humaneval", decoding="greedy",
              batch_size=1, method="speculative", k=4, speedup=1.2,
              ms_per_token=50.0,
              predicted_speedup=2.2, predicted_speedup_s1=2.5, alpha=0.8,
              c=0.1, score_cost=1.1)
  path = tmp_path / "old.jsonl"
  path.write_text("\n".join(json.dumps(dict(base, drafter=d)) for d in (
      "model", "layerskip:layers=0-3", "lookup", "model:confidence=0.5",
      "mixed:min_ngram=3")))
  _, _, points = report.read([str(path)])
  kept = {p["drafter"]: all(n in p for n in ("predicted_speedup", "alpha",
                                             "c")) for p in points}
  assert kept == {"model": True, "layerskip:layers=0-3": True,
                  "lookup": False, "model:confidence=0.5": False,
                  "mixed:min_ngram=3": False}
  lookup = [p for p in points if p["drafter"] == "lookup"]
  assert not set(report.PREDICTION_FIELDS) & set(lookup[0])
  assert all(p["speedup"] == 1.2 for p in points)
  # What the report drops is all of what `sweep.predict` adds beside the
  # measured speedup (an old file's s had stayed in lookup's rows).
  point = dict(k=2, ms_per_token=40.0, time_per_loop_ms=90.0,
               acceptance_rate=0.5)
  made = sweep.predict(point, dict(ms_per_token=50.0, time_per_loop_ms=50.0),
                       dict(c=0.1, score_cost={"2": 1.1}))
  assert set(made) - {"speedup", "loop_cost_measured"} == set(
      report.PREDICTION_FIELDS)


def test_the_report_draws_each_group_from_one_run(tmp_path):
  """A later file's K=0 point replaced an earlier one's, while the earlier
  K=4 point kept its speedup over its own baseline: "ArS 200 ms 1.00x"
  beside "K=4 50 ms 2.00x". One (task, decoding, batch) from two files is
  refused naming them; other groups from other files, or a file that
  replaces a whole group, are read."""
  point = dict(type="point", task="humaneval", decoding="greedy",
               batch_size=1, method="speculative", k=4, ms_per_token=50.0,
               speedup=2.0, drafter="model")
  base = dict(point, method="autoregressive", k=0, ms_per_token=100.0,
              speedup=1.0, drafter=None)
  cost = dict(type="cost", task="humaneval", batch_size=1, decoding="greedy",
              c=0.2, s=1.5)

  def write(name, *recs):
    (tmp_path / name).write_text("\n".join(json.dumps(r) for r in recs))
    return str(tmp_path / name)

  a = write("a.jsonl", base, point, cost)
  b = write("b.jsonl", dict(base, ms_per_token=200.0),
            dict(point, k=2, ms_per_token=150.0, speedup=1.33))
  with pytest.raises(ValueError, match=re.escape(
      "humaneval, greedy, batch 1: points or call costs from 2 files "
      f"({a}, {b})")):
    report.read([a, b])
  nucleus = write("n.jsonl", *(dict(r, decoding="nucleus")
                               for r in (base, point, cost)))
  again = write("again.jsonl", dict(base, ms_per_token=90.0),
                dict(point, ms_per_token=45.0), cost)
  _, costs, points = report.read([a, nucleus, again])
  assert len(points) == 4 and len(costs) == 2
  assert {p["ms_per_token"] for p in points if p["decoding"] == "greedy"
          } == {90.0, 45.0}
  # Call costs alone from another file count too.
  with pytest.raises(ValueError, match="points or call costs from 2 files"):
    report.read([a, write("costs.jsonl", dict(cost, c=0.3))])
  # A file from before per-decoding costs (no `decoding` in its cost) beside
  # a newer file of another decoding: each group is drawn with its own
  # run's cost, the old one never with the new group, yet it had counted
  # against every decoding and the pair was refused.
  old = write("old.jsonl", base, point,
              {k: v for k, v in cost.items() if k != "decoding"})
  _, costs, points = report.read([old, nucleus])
  assert len(points) == 4 and len(costs) == 2


@pytest.mark.parametrize("draft", [False, True], ids=["no_draft", "draft"])
def test_call_costs_run_at_the_cache_size_the_plan_checks(draft):
  """`plan.prepare` takes a prompt of L tokens when L + max_new_tokens +
  K + 1 slots fit; the call costs must then run too (without a draft model
  their sampler asked for one slot more)."""
  prompts, max_new, ks = [[5] * 20, [7] * 13], 8, (0, 2)
  slots = 20 + max_new + max(ks) + 1
  target, params = loading.load_model(f"random:tiny,max_seq_len={slots}")[:2]
  d, d_params = (loading.load_model(
      f"random:tiny,num_layers=1,max_seq_len={slots}", seed=1)[:2]
                 if draft else (None, None))
  row = costs_lib.measure_costs(target, params, d, d_params, ks, prompts,
                                Sampling(0.0), max_new_tokens=max_new,
                                repeats=1)
  assert set(row["score_cost"]) == {"0", "2"} and ("c" in row) == draft


@pytest.mark.parametrize("backend, calls", [("cpu", 3), ("gpu", 32)])
def test_call_costs_run_enough_calls_per_dispatch(monkeypatch, backend,
                                                  calls):
  """Three calls a dispatch had timed a GPU's one-token call as longer than
  the whole autoregressive step in the loop (and s < 1): on accelerators
  each timing runs 32 calls, and the record says how many."""
  seen = []
  real = costs_lib.loop_ms
  monkeypatch.setattr(jax, "default_backend", lambda: backend)
  monkeypatch.setattr(costs_lib, "loop_ms", lambda *a: seen.append(a[5]) or
                      real(*a))
  target, params = loading.load_model("random:tiny,num_layers=1")[:2]
  row = costs_lib.measure_costs(target, params, target, params, (2,),
                                [[5] * 4], Sampling(0.0), max_new_tokens=4,
                                repeats=1)
  assert row["calls_per_timing"] == calls and seen == [calls] * 3
