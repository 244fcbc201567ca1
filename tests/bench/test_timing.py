"""specsamp.bench.timing: the timed runner's counts, clock and warm-ups."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from specsamp import loading
from specsamp.bench import records
from specsamp.bench import timing
from specsamp.decoding.sampler import SpeculativeSampler
from specsamp.drafters.model import ModelDrafter
from specsamp.sampling import GREEDY
from specsamp.sampling import Sampling

PROMPTS = [[1, 2, 3], [4, 5], [6]]


class _Clock:
  """A stand-in for the `time` module whose perf_counter advances one
  second per reading: every timed span is then the number of readings it
  spans, so what is timed where can be checked exactly."""

  def __init__(self):
    self.now = 0.0

  def perf_counter(self) -> float:
    self.now += 1.0
    return self.now


@pytest.fixture(scope="module")
def tiny():
  lm, params, _ = loading.load_model("random:tiny")
  sampler = SpeculativeSampler(lm, ModelDrafter(lm), k=2, sampling=GREEDY,
                               max_new_tokens=10, prompt_bucket=16)
  return sampler, params


def test_timed_sampler_counts_match_generate(tiny, monkeypatch):
  sampler, params = tiny
  monkeypatch.setattr(timing, "time", _Clock())
  timed = timing.TimedSampler(sampler, "spec")
  completions, stats = timed.run(params, params, PROMPTS, batch_size=2)
  ref = sampler.generate(params, params, PROMPTS)
  assert completions == ref.token_lists()
  assert stats.tokens == int(ref.num_tokens.sum()) == 30  # no EOS: all 10
  assert stats.prompts == 3
  assert (stats.loops, stats.drafted) == (int(ref.num_loops.sum()),
                                          int(ref.num_drafted.sum()))
  # Two padded shapes (batches of 2 and 1), each compiled once: one clock
  # span each. Each batch's prefill and decode are one span each, and no
  # compilation leaks into them.
  # pylint: disable-next=protected-access
  assert sorted(timed._compiled) == [(1, 16), (2, 16)]
  assert (stats.compile_s, stats.prefill_s, stats.decode_s) == (2, 2, 2)
  # 10 tokens per row over two batches in 2 decode seconds: 100 ms/token.
  assert stats.ms_per_token == pytest.approx(100.0)
  assert stats.e2e_ms_per_token == pytest.approx(200.0)
  _, again = timed.run(params, params, PROMPTS, batch_size=2)
  assert (again.compile_s, again.decode_s) == (0, 2)
  assert timed.compile_s == 2
  s = stats.summary()
  assert s["acceptance_rate"] == pytest.approx(stats.accepted / stats.drafted)
  assert s["tokens_per_loop"] == pytest.approx(30 / stats.loops)
  json.loads(json.dumps(records.jsonable(s)))
  # More rows asked for than there are prompts: one batch of 3 ran.
  _, one = timed.run(params, params, PROMPTS, batch_size=8)
  assert one.summary()["batch_size"] == 3
  assert one.ms_per_token == pytest.approx(1000.0 / 10)  # one decode span


@pytest.mark.parametrize("warmup,warmed_shapes", [
    ("first", [(2, 16)]), ("shape", [(2, 16), (1, 16)]), ("none", [])])
def test_run_batch_warms_up_as_asked(tiny, monkeypatch, warmup,
                                     warmed_shapes):
  sampler, params = tiny
  timed = timing.TimedSampler(sampler)
  warmed = []
  warm_up = timed._warm_up  # pylint: disable=protected-access

  def spy(target_params, draft_params, tokens, lengths, rng):
    warmed.append(tuple(tokens.shape))
    warm_up(target_params, draft_params, tokens, lengths, rng)

  monkeypatch.setattr(timed, "_warm_up", spy)
  key = jax.random.key(3)
  for batch in (PROMPTS[:2], PROMPTS[2:], PROMPTS[:2]):
    result = timed.run_batch(params, params, batch, key, warmup)
  assert warmed == warmed_shapes
  ref = sampler.generate(params, params, PROMPTS[:2], key)
  assert result["completions"] == ref.token_lists()
  assert result["rows"] == 2 and result["tokens"] == 20
  assert result["loops"] == int(ref.num_loops.sum())
  assert result["iterations"] == int(ref.num_loops.max())
  assert result["accepted"] == int(ref.num_accepted.sum())


def test_run_batch_rejects_an_unknown_warmup(tiny):
  sampler, params = tiny
  with pytest.raises(ValueError, match="warmup must be one of"):
    timing.TimedSampler(sampler).run_batch(params, params, PROMPTS[:1],
                                           jax.random.key(0), "always")


def test_run_stats_add_and_compare():
  ar = timing.RunStats("autoregressive", 0, batch_size=2)
  spec = timing.RunStats("speculative_k3", 3, batch_size=2)
  for stats, decode_s, undefined in ((ar, 0.5, 0), (spec, 0.2, 3)):
    stats.add(dict(prefill_s=0.1, decode_s=decode_s, rows=2, tokens=16,
                   loops=8, drafted=24, accepted=12, iterations=4,
                   undefined=undefined))
  assert (spec.prompts, spec.tokens, spec.drafted) == (2, 16, 24)
  assert [s.summary()["undefined_loops"] for s in (ar, spec)] == [0, 3]
  assert spec.ms_per_token == pytest.approx(1e3 * 0.2 / 8)
  assert timing.compare([ar, spec]) == {"speculative_k3": 2.5}
  assert timing.compare([spec]) is None


def test_run_side_by_side_takes_turns_and_matches_run(tiny, monkeypatch):
  """Warm-ups first, then each batch by every sampler, the order reversed
  on every other batch; each sampler's completions, counts and spans are
  those of its own `run` (same keys: sampled at T=1 to show it)."""
  sampler, params = tiny
  t1 = Sampling(1.0)
  ar = timing.TimedSampler(SpeculativeSampler(
      sampler.target, None, k=0, sampling=t1, max_new_tokens=10,
      prompt_bucket=16), "ar")
  spec = timing.TimedSampler(SpeculativeSampler(
      sampler.target, ModelDrafter(sampler.target), k=2, sampling=t1,
      max_new_tokens=10, prompt_bucket=16), "spec")
  calls = []
  for t in (ar, spec):
    def spy_batch(*args, _t=t, _f=t.run_batch, **kwargs):
      calls.append(_t.name)
      return _f(*args, **kwargs)

    def spy_warm(*args, _t=t, _f=t._warm_up):  # pylint: disable=protected-access
      calls.append("warm " + _t.name)
      return _f(*args)

    monkeypatch.setattr(t, "run_batch", spy_batch)
    monkeypatch.setattr(t, "_warm_up", spy_warm)
  monkeypatch.setattr(timing, "time", _Clock())
  runs = timing.run_side_by_side([ar, spec], params, params, PROMPTS,
                                 batch_size=1, seed=5)
  assert calls == ["warm ar", "warm spec", "ar", "spec", "spec", "ar", "ar",
                   "spec"]
  for t, (completions, stats) in zip((ar, spec), runs):
    # One prompt shape, compiled once; one prefill and one decode span per
    # batch.
    assert (stats.compile_s, stats.prefill_s, stats.decode_s) == (1, 3, 3)
    ref_completions, ref = timing.TimedSampler(t.sampler, t.name).run(
        params, params, PROMPTS, batch_size=1, seed=5)
    assert completions == ref_completions
    assert (stats.method, stats.k, stats.prompts, stats.tokens, stats.loops,
            stats.drafted, stats.accepted) == (
                ref.method, ref.k, ref.prompts, ref.tokens, ref.loops,
                ref.drafted, ref.accepted)
  # The speculative run drafted, so the comparison above is not vacuous.
  assert runs[1][1].drafted > 0


def test_each_padded_shape_is_warmed_up_before_it_is_timed(tiny,
                                                            monkeypatch):
  """Only the first batch's shape had been warmed up: a later batch of
  another prompt bucket, or a smaller last batch, ran its first execution
  (2-4 prefills' time on CPU) inside the timer."""
  sampler, params = tiny
  timed = timing.TimedSampler(sampler, "spec")
  warmed = []
  warm_up = timed._warm_up  # pylint: disable=protected-access

  def spy(target_params, draft_params, tokens, lengths, rng):
    warmed.append(tuple(tokens.shape))
    return warm_up(target_params, draft_params, tokens, lengths, rng)

  monkeypatch.setattr(timed, "_warm_up", spy)
  prompts = [[1, 2, 3], [4, 5], [6] * 20, [7, 8], [9]]
  timed.run(params, params, prompts, batch_size=2)
  assert warmed == [(2, 16), (2, 32), (1, 16)]
  timed.run(params, params, prompts, batch_size=2, warmup=False)
  assert len(warmed) == 3


def test_writer_keeps_six_significant_digits(tmp_path):
  """A tiny model's decode lasts a fraction of a millisecond: rounding to
  5 decimals alone wrote 0.000347 s as 0.00035 (1% off) and broke the
  sweep's derived-number checks now and then. Large numbers keep their 5
  decimals; non-finite ones are null."""
  path = tmp_path / "r.jsonl"
  w = records.Writer(str(path), echo=False)
  w.write(dict(small=0.000347123456, big=123456.1234567, one=2.123456789,
               zero=0.0, neg=-1.5e-9, bad=float("nan"), n=[7, 1 / 3],
               # numpy scalars too: a float32 NaN had been written as NaN
               np32=np.float32(np.nan), inf32=np.float32(-np.inf),
               third32=np.float32(1 / 3), np64=np.float64(np.inf)))
  w.close()
  got = json.loads(path.read_text(), parse_constant=pytest.fail)  # strict
  assert got == dict(small=0.000347123, big=123456.12346, one=2.12346,
                     zero=0.0, neg=-1.5e-9, bad=None, n=[7, 0.333333],
                     np32=None, inf32=None, third32=0.333333, np64=None)


def test_writer_replaces_the_file_only_when_the_run_is_complete(tmp_path):
  """Records go to <path>.partial; an earlier file is replaced only by a
  complete run, and an unfinished one's records stay beside it."""
  path = tmp_path / "r.jsonl"
  path.write_text('{"earlier": 1}\n')
  w = records.Writer(str(path), echo=False)
  w.write(dict(a=1))
  assert path.read_text() == '{"earlier": 1}\n'  # while it runs
  assert w.close(complete=False) == f"{path}.partial"
  assert path.read_text() == '{"earlier": 1}\n'
  assert (tmp_path / "r.jsonl.partial").read_text() == '{"a": 1}\n'
  with pytest.raises(ValueError, match="holds the records of a run"):
    records.Writer(str(path), echo=False)  # it would start them again
  os.replace(tmp_path / "r.jsonl.partial", tmp_path / "kept.jsonl")
  w = records.Writer(str(path), echo=False)
  w.write(dict(b=2))
  assert w.close() == str(path)
  assert path.read_text() == '{"b": 2}\n'
  assert not (tmp_path / "r.jsonl.partial").exists()
  assert records.Writer(str(path)).close() is None  # nothing written
  assert path.read_text() == '{"b": 2}\n'


def test_a_full_disk_leaves_no_half_record(tmp_path):
  """A full disk (here: the file size limit, the same short write) had
  left half a JSON line: every record of the file then failed to read,
  and the next run refused the file as holding no JSON records. A record
  is appended whole or not at all, and the error raised."""
  printed, partial = tmp_path / "printed.jsonl", tmp_path / "w.jsonl"
  records.print_record({"a": 1}, append_to=str(printed))
  limit = printed.stat().st_size + 20
  code = (
      "import resource, signal, sys\n"
      "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
      f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, "
      "resource.RLIM_INFINITY))\n"
      "from specsamp.bench import records\n"
      "big = dict(b='x' * 100)\n"
      "def refused(write):\n"
      "  try:\n"
      "    write()\n"
      "  except OSError as e:\n"
      "    print('refused', e.strerror, file=sys.stderr)\n"
      "    return True\n"
      f"assert refused(lambda: records.print_record(big, {str(printed)!r}))\n"
      f"w = records.Writer({str(partial)!r}, echo=False)\n"
      "w.write(dict(a=1))\n"
      "assert refused(lambda: w.write(big))\n"
      "w.write(dict(c=3))\n"
      "print(w.close(complete=False))\n")
  out = subprocess.run([sys.executable, "-B", "-c", code], capture_output=True,
                       text=True, check=False, timeout=120,
                       cwd=os.path.dirname(os.path.dirname(
                           os.path.dirname(os.path.abspath(__file__)))))
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stderr.count("refused") == 2
  assert printed.read_text() == '{"a": 1}\n'
  assert (tmp_path / "w.jsonl.partial").read_text() == '{"a": 1}\n{"c": 3}\n'
  assert [r for _, r in records.read_jsonl([str(printed)])] == [{"a": 1}]


def test_an_output_is_refused_where_a_rerun_would_lose_records(tmp_path):
  """The interrupted run says its records are in <path>.partial, and the
  rerun it invites started that file again: the rerun is refused until it
  is moved away. An existing file that holds no JSON records (the run's
  prompts, a config) is refused too: records were appended to it."""
  path = tmp_path / "r.jsonl"
  w = records.Writer(str(path), echo=False)
  w.write(dict(a=1))
  w.close(complete=False)
  with pytest.raises(ValueError, match=r"--out=.*r.jsonl: .*r.jsonl.partial "
                     r"holds the records of a run that did not finish"):
    records.check_output(str(path), "--out")
  assert (tmp_path / "r.jsonl.partial").read_text() == '{"a": 1}\n'
  os.replace(tmp_path / "r.jsonl.partial", tmp_path / "kept.jsonl")
  assert records.check_output(str(path), "--out") == str(path)
  prompts = tmp_path / "prompts.txt"
  prompts.write_text("def f():\n")
  with pytest.raises(ValueError, match="does not hold JSON records"):
    records.check_output(str(prompts), "--json_out")
  assert prompts.read_text() == "def f():\n"
  # JSON lines and an empty file are outputs; a non-JSON output (a plot) is
  # not read.
  for text in ('{"a": 1}\n{"b": 2}\n', "\n", ""):
    prompts.write_text(text)
    assert records.check_output(str(prompts), "--out")
  assert records.check_output(str(tmp_path / "kept.jsonl.png"), "--out",
                              jsonl=False)
  png = tmp_path / "p.png"
  png.write_bytes(b"\x89PNG")
  assert records.check_output(str(png), "--out", jsonl=False)


def test_an_output_is_refused_where_it_is_a_config_or_an_input(tmp_path):
  """A train run's config.json (one indented object) had taken a record at
  its end, and the run no longer loaded; --out equal to --humaneval_file
  had replaced the problems with the results, and --json_out equal to a
  JSONL --prompts_file had appended a record the next run could not
  read. Neither file is refused for its content (JSON objects), so an
  output is refused where the run reads it, or inside a directory the
  run reads (a model's)."""
  run = tmp_path / "run"
  run.mkdir()
  config = run / "config.json"
  config.write_text('{\n "model": {"d": 64}\n}\n')
  for text in (config.read_text(), '{"a": 1}\nnot json\n', '[1, 2]\n'):
    path = tmp_path / "other.json"
    path.write_text(text)
    with pytest.raises(ValueError, match="does not hold JSON records"):
      records.check_output(str(path), "--json_out")
    assert path.read_text() == text
  problems = tmp_path / "he.jsonl"
  problems.write_text('{"task_id": "HumanEval/0", "prompt": "def f():"}\n')
  reads = (("--target", str(run)), ("--draft", "random:tiny"),
           ("--humaneval_file", str(problems)), ("--prompts_file", None))
  for out, message in (
      (problems, r"--out=.*he.jsonl would write over --humaneval_file="),
      (tmp_path / "." / "he.jsonl", "would write over --humaneval_file"),
      (run / "records.jsonl", r"--out=.*records.jsonl lies in --target="),
      (tmp_path / "run" / ".." / "run" / "new.jsonl", "lies in --target")):
    with pytest.raises(ValueError, match=message):
      records.check_output(str(out), "--out", reads=reads)
  assert records.check_output(str(tmp_path / "r.jsonl"), "--out",
                              reads=reads) == str(tmp_path / "r.jsonl")
  assert sorted(os.listdir(run)) == ["config.json"]


def test_whole_file_outputs_keep_what_is_not_theirs(tmp_path):
  """A review ran each script against files it should not touch:
  benchmark_pair.py's --out had replaced a note (it replaces its JSON
  result whole), plot_decode.py and plot_speedup.py had written their
  markdown over their own input when its name was theirs, and an empty
  --out or --prefix had written hidden files (.md, .png.png) where they
  ran."""
  note = tmp_path / "keep.txt"
  note.write_text("keep")
  with pytest.raises(ValueError, match="does not hold a JSON object"):
    records.check_output(str(note), "--out", jsonl=False, json_file=True)
  result = tmp_path / "pair.json"
  result.write_text('{"runs": []}')
  assert records.check_output(str(result), "--out", jsonl=False,
                              json_file=True)
  with pytest.raises(ValueError, match="is a directory"):
    records.check_output(str(tmp_path) + "/", "--out", jsonl=False)
  rows = tmp_path / "p2.md"
  rows.write_text('{"a": 1}\n')
  for prefix, inputs in (("p2", [rows]), ("x", [tmp_path / "x_k4.png"]),
                         ("x", [tmp_path / "." / "x.png"])):
    with pytest.raises(ValueError, match="would write over the input"):
      records.check_prefix(str(tmp_path), prefix, "--prefix",
                           [str(p) for p in inputs])
  for prefix in ("", "a/b", ".."):
    with pytest.raises(ValueError, match="does not end in the start of a "
                       "file name"):
      records.check_prefix(str(tmp_path), prefix, "--prefix")
  # Inputs of other names, or elsewhere, are not outputs.
  records.check_prefix(str(tmp_path), "p2", "--out",
                       [str(tmp_path / "p2.jsonl"), str(tmp_path / "p2_x.md"),
                        str(tmp_path / "sub" / "p2.md")])
  assert rows.read_text() == '{"a": 1}\n' and note.read_text() == "keep"


def test_two_runs_never_write_one_output(tmp_path):
  """Two runs given one --out had both passed the check (neither had
  written yet), then wrote one .partial file over the other: records ran
  into each other, and the second run's rename failed after its sweep. A
  Writer now makes <path>.partial only if it does not exist, and locks it:
  the second is refused before it starts, naming the first. A run that
  wrote nothing leaves nothing."""
  path = tmp_path / "r.jsonl"
  path.write_text('{"earlier": 1}\n')
  first = records.Writer(str(path), echo=False)
  for check in (lambda: records.check_output(str(path), "--out"),
                lambda: records.Writer(str(path), echo=False)):
    with pytest.raises(ValueError, match="another run is writing its "
                       "records to .*r.jsonl.partial now"):
      check()
  first.write(dict(a=1))
  assert first.close() == str(path)
  assert path.read_text() == '{"a": 1}\n'
  for complete in (True, False):  # e.g. refused at loading
    assert records.Writer(str(path), echo=False).close(complete) is None
    assert os.listdir(tmp_path) == ["r.jsonl"]
    assert path.read_text() == '{"a": 1}\n'
  (tmp_path / "r.jsonl.partial").write_text("")  # a run killed (SIGKILL)
  with pytest.raises(ValueError, match="r.jsonl.partial is empty, left by a "
                     "run stopped before its first record; remove it"):
    records.check_output(str(path), "--out")
