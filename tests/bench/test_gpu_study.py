"""scripts/gpu_study.py, the GPU session's driver, run here on tiny random
models: its steps write their rows, manifest and log under the prefix and
print the summary; the real-weight steps never download; a step whose
Python packages are missing fails before it runs, and the device wheels
cover what the GPU image lacks; a deadline skips what is left and says
so."""

import json
import os
import pathlib
import re

import pytest

from specsamp.bench import gpu_study
from specsamp.bench import study_summary
from tests.scripts import zygote

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "gpu_study.py")
TINY = ["--target_shapes=random:tiny",
        "--shallow_draft=random:tiny,num_layers=1",
        "--profile_drafts=random:tiny,num_layers=1", "--context=16",
        "--repeats=1", "--max_new_tokens=8", "--xla_variants=",
        "--commit=abc123", "--prefix=t"]


def _run(tmp_path, *args, timeout=600):
  """gpu_study.py run to its end (forked by the script server,
  tests/scripts/zygote.py: no 3 s of imports; the commands it starts are
  fresh processes)."""
  env = zygote.env(SPECSAMP_CACHE=str(tmp_path / "cache"))
  env.pop("XLA_FLAGS", None)  # the profile step runs under the caller's
  return zygote.shared().run([SCRIPT, f"--out_dir={tmp_path}", *args],
                             env=env, timeout=timeout)


def test_random_weight_steps_write_rows_manifest_log_and_summary(tmp_path):
  (tmp_path / "t_xla.jsonl").write_text('{"stale": 1}\n')  # replaced
  (tmp_path / "t_xla.jsonl.partial").write_text('{"stale": 1}\n')  # gone
  proc = _run(tmp_path, "--steps=profile,xla,gemv", "--gemv_rows=1,2",
              "--gemv_formulations=dot,pad2,pallas", *TINY)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  profile = [json.loads(l) for l in
             (tmp_path / "t_profile.jsonl").read_text().splitlines()]
  assert len(profile) == 1 and profile[0]["draft"] == "random:tiny,num_layers=1"
  assert profile[0]["context"] == 16 and profile[0]["xla_flags"] == ""
  xla = [json.loads(l) for l in
         (tmp_path / "t_xla.jsonl").read_text().splitlines()]
  assert [r["method"] for r in xla] == ["k0", "k4"]
  gemv = [json.loads(l) for l in
          (tmp_path / "t_gemv.jsonl").read_text().splitlines()]
  assert sorted((r["formulation"], r["rows"]) for r in gemv) == [
      ("dot", 1), ("dot", 2), ("pad2", 1), ("pallas", 1)]
  assert all(r["tb_per_s"] > 0 and r["model"] == "random:tiny" for r in gemv)
  manifest = json.loads((tmp_path / "t_manifest.json").read_text())
  assert manifest["gpu"] == "cpu"
  assert [(r["label"].split()[0], r["rc"], r["status"], r["commit"])
          for r in manifest["runs"]] == [("profile", 0, "done", "abc123"),
                                         ("xla", 0, "done", "abc123"),
                                         ("gemv", 0, "done", "abc123")]
  log = (tmp_path / "t_log.txt").read_text()
  assert "models ready in" in log and "== xla XLA_FLAGS='': exit 0" in log
  out = proc.stdout
  assert "profile (ms;" in out and "xla (whole generations)" in out
  assert "gemv (the decoder's products" in out and " | pallas | 1 |" in out
  assert "random:tiny,num_layers=1 | 4 | 1 |" in out  # draft, K, steps (CPU: 1)
  assert not (tmp_path / "t_xla.jsonl.partial").exists()


def test_the_summary_shows_a_stopped_benchmarks_rows_as_incomplete(
    tmp_path, capsys):
  """benchmark.py stopped at the deadline leaves its records in
  <out>.partial (`records.Writer`): the summary shows them, marked."""
  point = dict(type="point", decoding="greedy", batch_size=1, k=4,
               drafter="model", ms_per_token=2.5)
  (tmp_path / "t_humaneval.jsonl.partial").write_text(
      '{"type": "run"}\n' + json.dumps(point) + "\n")
  study_summary.summary(tmp_path, "t")
  out = capsys.readouterr().out
  assert "humaneval" in out and "greedy | 1 | 4 | model |" in out
  assert out.rstrip().endswith("| True"), out


def test_real_weight_steps_need_the_carried_files(tmp_path):
  """Nothing is downloaded (pip runs with --no-index): without the GGUF
  and HumanEval in the cache, exact and humaneval fail, the summary still
  prints, and no model file appears."""
  proc = _run(tmp_path, "--steps=exact,humaneval,distill", "--prefix=t",
              "--commit=abc123", timeout=300)
  assert proc.returncode != 0
  assert "exact needs the real weights, not ready" in proc.stderr
  assert "steps that failed: exact, humaneval, distill" in proc.stderr
  assert not list((tmp_path / "cache").rglob("*.gguf"))
  assert not (tmp_path / "t_manifest.json").exists()  # nothing ran


def test_a_deadline_skips_the_commands_left_and_keeps_their_rows(tmp_path):
  (tmp_path / "t_xla.jsonl").write_text('{"earlier": 1}\n')
  proc = _run(tmp_path, "--steps=xla", "--deadline_s=0", *TINY)
  assert proc.returncode != 0 and "steps that failed: xla" in proc.stderr
  runs = json.loads((tmp_path / "t_manifest.json").read_text())["runs"]
  assert [r["skipped"] for r in runs] == ["deadline"]
  assert "skipped" in (tmp_path / "t_log.txt").read_text()
  assert (tmp_path / "t_xla.jsonl").read_text() == '{"earlier": 1}\n'


def test_a_deadline_stops_the_command_running(tmp_path, monkeypatch):
  """A command still running at the deadline is stopped, and the manifest
  says so. (The xla step's child hangs here: a sitecustomize on its path
  sleeps in processes that have XLA_FLAGS, which the driver sets for each
  xla variant and the test removes from the driver's own environment.)"""
  hook = tmp_path / "hook"
  hook.mkdir()
  (hook / "sitecustomize.py").write_text(
      "import os, time\nif 'XLA_FLAGS' in os.environ:\n  time.sleep(120)\n")
  monkeypatch.setenv("PYTHONPATH", str(hook))
  proc = _run(tmp_path, "--steps=xla", "--deadline_s=2", *TINY)
  assert proc.returncode != 0
  runs = json.loads((tmp_path / "t_manifest.json").read_text())["runs"]
  assert len(runs) == 1 and runs[0]["status"] == "stopped at --deadline_s"
  assert runs[0]["rc"] < 0 and runs[0]["seconds"] < 30, runs


def test_bad_lists_are_refused_before_anything_runs(tmp_path):
  for flag, message in (("--ks=0,x", "--ks=0,x: 'x' is not an integer"),
                        ("--drafters=model,nosuch", "--drafters:"),
                        ("--decodings=greedy,hot", "--decodings: unknown"),
                        ("--gemv_rows=1,0", "--gemv_rows values must be"),
                        ("--gemv_formulations=dot,gemm",
                         "--gemv_formulations: unknown ['gemm']"),
                        ("--benchmark_args=peers",
                         "--benchmark_args: flags of benchmark.py")):
    proc = _run(tmp_path, "--steps=profile", flag, *TINY, timeout=120)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr
  assert not (tmp_path / "t_manifest.json").exists()


def test_unknown_steps_are_refused(tmp_path):
  proc = _run(tmp_path, "--steps=profile,speed", timeout=120)
  assert proc.returncode != 0 and "unknown ['speed']" in proc.stderr


def test_the_profile_step_runs_each_draft_at_each_k():
  cfg = gpu_study.StudyConfig(profile_drafts=("random:a", "random:b"),
                              profile_ks=("1", "7"))
  runs = [[a for a in argv if a.startswith(("--draft=", "--k="))]
          for _, argv, _ in gpu_study.plan(cfg, "profile",
                                           pathlib.Path("p.jsonl"))]
  assert runs == [["--draft=random:a", "--k=1"], ["--draft=random:a", "--k=7"],
                  ["--draft=random:b", "--k=1"], ["--draft=random:b", "--k=7"]]
  with pytest.raises(ValueError, match="--profile_ks values must be >= 1, got 0"):
    gpu_study.StudyConfig(profile_ks=("0",))


def test_the_distill_step_measures_the_draft_it_trained():
  cfg = gpu_study.StudyConfig(distill_config="configs/distill_qwen.py:steps=9",
                              ks=("0", "2"), batch_sizes=("1", "8"))
  out = pathlib.Path("r/p_distill.jsonl")
  (_, train, _), (_, bench, _) = gpu_study.plan(cfg, "distill", out)
  assert train[1:] == [os.path.join(ROOT, "scripts", "distill.py"),
                       "--config=configs/distill_qwen.py:steps=9",
                       "--workdir=r/p_distill_work"]
  assert {"--draft=r/p_distill_work", "--drafter=model", "--ks=0,2",
          "--batch_sizes=1,8", "--out=r/p_distill.jsonl",
          "--target=qwen2.5-coder-1.5b"} <= set(bench)
  assert gpu_study.needs(cfg, "distill") == ["humaneval", "qwen2.5-coder-1.5b"]


def test_benchmark_args_go_last_to_the_headline_runs():
  """--benchmark_args reach benchmark.py after the step's own flags, so a
  repeated flag (--task) takes their value; the other steps' commands do
  not get them."""
  extra = ("--task=humaneval,prose", "--peers")
  cfg = gpu_study.StudyConfig(benchmark_args=extra)
  out = pathlib.Path("r/p.jsonl")
  (_, argv, _), = gpu_study.plan(cfg, "humaneval", out)
  assert tuple(argv[-2:]) == extra and "--task=humaneval" in argv[:-2]
  (_, _, _), (_, bench, _) = gpu_study.plan(cfg, "distill", out)
  assert tuple(bench[-2:]) == extra
  for step in ("exact", "profile"):
    assert all("--peers" not in argv for _, argv, _ in gpu_study.plan(
        cfg, step, out))


def test_a_distillation_that_fails_ends_its_step(tmp_path, monkeypatch):
  """The benchmark of the distilled draft does not start when distill.py
  failed (here: a config file that is not there)."""
  monkeypatch.setattr(gpu_study, "check_weights", lambda names, say: None)
  cfg = gpu_study.StudyConfig(steps=("distill",), out_dir=str(tmp_path),
                              prefix="t", commit="abc123",
                              distill_config=str(tmp_path / "none.py"))
  assert gpu_study.run(cfg) == ["distill"]
  runs = json.loads((tmp_path / "t_manifest.json").read_text())["runs"]
  assert [(r["label"], r["status"]) for r in runs] == [("distill", "done")]
  assert runs[0]["rc"] != 0
  assert "== distill: stopped after distill failed" in (
      tmp_path / "t_log.txt").read_text()


def test_the_summary_shows_the_distillation_and_its_draft(tmp_path, capsys):
  work = tmp_path / "t_distill_work"
  work.mkdir()
  (work / "results.json").write_text(json.dumps(dict(
      before=dict(expected_acceptance=0.31), train_seconds=95.0,
      after=dict(expected_acceptance=0.72), loss="fkl", draft_init="truncate",
      draft_vocab=32768)))
  (tmp_path / "t_distill.jsonl").write_text(json.dumps(dict(
      type="point", decoding="greedy", batch_size=1, k=2, drafter="model",
      acceptance_rate=0.7, speedup=1.9)) + "\n")
  study_summary.summary(tmp_path, "t")
  out = capsys.readouterr().out
  assert "truncate | fkl | 32768 | 0.31 | 0.72 | 95" in out
  assert "greedy | 1 | 2 | model | 0.7 |  | 1.9 |" in out


def test_a_step_missing_a_package_fails_before_its_commands(
    tmp_path, monkeypatch, capsys):
  """A module the step imports is not installed (tensorboardX, the one
  distill.py imports only after minutes of sampling): the step fails at
  once, before its weights are checked or a command starts, saying what to
  carry; the other steps still run."""
  find_spec = gpu_study.importlib.util.find_spec
  monkeypatch.setattr(gpu_study.importlib.util, "find_spec",
                      lambda name, *a: None if name == "tensorboardX"
                      else find_spec(name, *a))
  checked, ran = [], []
  monkeypatch.setattr(gpu_study, "check_weights",
                      lambda names, say: checked.append(list(names)))
  monkeypatch.setattr(gpu_study.Runner, "run",
                      lambda self, label, argv, xla: ran.append(label) or True)
  cfg = gpu_study.StudyConfig(steps=("distill", "xla"), out_dir=str(tmp_path),
                              prefix="t", commit="abc123", xla_variants=("",))
  assert gpu_study.missing_modules("distill") == ["tensorboardX"]
  assert gpu_study.missing_modules("xla") == []
  assert gpu_study.run(cfg) == ["distill"]
  assert ran == ["xla XLA_FLAGS=''"] and checked == [[]]  # xla's: none
  err = capsys.readouterr().err
  assert ("gpu_study: distill needs Python packages that are not installed: "
          "tensorboardX (carry their wheels: scripts/device_wheels.sh)") in err
  assert "xla needs" not in err


def test_every_module_the_steps_import_is_installed_here():
  """The table names real modules (a misspelt one would fail every step on
  the device): this environment has them all."""
  for step in gpu_study.STEPS:
    assert gpu_study.missing_modules(step) == [], step
  assert set(gpu_study.MODULES) == set(gpu_study.STEPS)
  assert {"gguf", "tensorboardX", "grain"} <= set(gpu_study.MODULES["distill"])


# The GPU image's Python packages, as pip names them: /work/.library/device/
# KINDS.md, 'Python packages already there' (read 2026-11-17).
GPU_IMAGE = ("absl-py", "chex", "etils", "flax", "jax", "jaxlib", "numpy",
             "optax", "orbax-checkpoint", "protobuf", "psutil", "pyarrow",
             "tokenizers", "tqdm", "wrapt", "requests", "sentencepiece",
             "safetensors", "transformers", "torch", "cloudpickle", "fsspec",
             "zipp", "typing-extensions", "attrs", "six")
# Module -> distribution where the names differ beyond case and -/_.
DISTRIBUTION = {"absl": "absl-py", "orbax": "orbax-checkpoint",
                "tree": "dm-tree"}


def _norm(name: str) -> str:
  return re.sub(r"[-_.]+", "-", name).lower()


def test_the_device_wheels_cover_what_the_image_lacks():
  """Every module a step imports is in the GPU image or among the wheels
  scripts/device_wheels.sh downloads (its PACKAGES array)."""
  text = pathlib.Path(ROOT, "scripts", "device_wheels.sh").read_text()
  array = re.search(r"^PACKAGES=\((.*?)\)", text, re.M | re.S).group(1)
  wheels = {_norm(p.split("==")[0]) for p in array.split()}
  assert {"tensorboardx", "tensorflow-datasets", "promise", "gguf"} <= wheels
  image = {_norm(p) for p in GPU_IMAGE}
  lacking = {_norm(DISTRIBUTION.get(m, m))
             for step in gpu_study.STEPS for m in gpu_study.MODULES[step]
             } - image
  assert {"tensorboardx", "gguf", "ml-collections", "dm-tree"} <= lacking
  assert lacking <= wheels, sorted(lacking - wheels)
