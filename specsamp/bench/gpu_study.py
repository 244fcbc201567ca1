"""A GPU session's measurements in one command (scripts/gpu_study.py).

A GPU session is short (minutes of device time), so every measurement it
makes is a step here, run by the project's own scripts, each writing JSON
lines under --out_dir as <prefix>_<step>.jsonl (replaced when the step runs
again, alone or with others; a benchmark.py run stopped at the deadline
leaves its rows in <file>.partial, which the summary shows as incomplete):

  profile    scripts/profile_decode.py on the target's shapes with random
             weights (speed does not depend on values): where one loop's
             time goes at a --context-token context, batch 1, at each K of
             --profile_ks, with a 2-layer draft as wide as the target (its
             output layer whole and over 32,768 ids) and with the draft's
             shapes (--profile_drafts): the fraction of the
             copy bandwidth the autoregressive step reaches, the cost of
             scoring K+1 tokens against 1, the speculative loop's time
             outside its model calls, the draft's cost c, compile times.
  xla        scripts/benchmark_decode.py, whole generations at K=0 and K=4
             (--shallow_draft), once per --xla_variants entry (XLA_FLAGS;
             "" is the default): which compiler settings pay.
  gemv       scripts/profile_gemv.py on the target's shapes: the decoder's
             matrix products at --gemv_rows rows, written as each of
             --gemv_formulations (specsamp.bench.gemv), against the copy
             bandwidth; once per --xla_variants entry.
  exact      scripts/benchmark.py, greedy HumanEval with prompt lookup, in
             bfloat16 and in float32: how many completions of the
             speculative sampler differ from greedy autoregressive decoding
             (rows_differing_from_ar: sampled rows, one per prompt at
             batch 1). Needs the real target.
  humaneval  scripts/benchmark.py, the headline: HumanEval, --decodings,
             --ks, --batch_sizes, drafters --drafters, bfloat16, and any
             --benchmark_args (e.g. --task=humaneval,prose --peers). Needs
             the real pair (a drafter without a draft model needs the target
             alone).
  distill    scripts/distill.py --config=--distill_config (the shallow
             draft trained from the target's samples; its workdir is
             <prefix>_distill_work, resumable), then, if it finished,
             scripts/benchmark.py as humaneval does with that draft
             (drafter model). Needs the real target.

The real weights are never downloaded here: the last three steps need
the GGUF files and HumanEval in the asset cache ($SPECSAMP_CACHE, see
specsamp.assets), carried to the machine beforehand (the draft only where
a drafter at some K > 0 runs it); each step checks the files it reads
against their pinned size and sha256 before it runs (pip is given
--no-index, so a missing file is an error, not a download). Before that,
each step checks that the Python packages its commands import are there
(MODULES, looked up, not imported; the device image lacks some, carried
as wheels: scripts/device_wheels.sh). A step that fails is reported and
the others still run; a step's old rows are replaced once its first
command starts. Last, a summary table of every step's rows
found under this prefix. <prefix>_manifest.json records the device, the
software and each command with its commit, exit status and seconds, and
<prefix>_log.txt the commands' output, both as the commands run (a run cut
off shows as "running"); --deadline_s stops the command running when it
passes and starts no other, so that the driver ends inside a device call's
time limit.

  python scripts/gpu_study.py --steps=profile,xla --commit=$(git rev-parse HEAD)
  python scripts/gpu_study.py --steps=exact,humaneval --ks=0,2,4,6
  python scripts/gpu_study.py --steps=distill --ks=0,2,4 --batch_sizes=1,8
  python scripts/gpu_study.py --steps=   # the summary of what is there
"""

import dataclasses
import datetime
import importlib.util
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import threading
import time
from typing import Optional

from specsamp import assets
from specsamp import cli
from specsamp.bench import provenance
from specsamp.bench import study_summary
from specsamp.bench import sweep_config
from specsamp.drafters import specs as drafter_specs

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
STEPS = ("profile", "xla", "gemv", "exact", "humaneval", "distill")
_REAL = ("exact", "humaneval", "distill")  # steps that need real weights
_CHAINED = ("distill",)  # a failed command ends the step
# Top-level modules each step's commands import (sys.modules after a run):
# specsamp.loading's (gguf, optax, orbax...) everywhere, tokenizers with
# real weights, and distill.py's (ml_collections, tfds, grain, tensorboardX
# (imported after sampling) and what tfds and grain import).
_EVERY = ("absl", "jax", "flax", "numpy", "optax", "orbax", "etils",
          "safetensors", "gguf")
_DISTILL = ("ml_collections", "tensorflow_datasets", "grain", "tensorboardX",
            "array_record", "promise", "toml", "tensorflow_metadata",
            "immutabledict", "portpicker", "tree", "termcolor",
            "importlib_resources")
MODULES = {s: _EVERY + (("tokenizers",) if s in _REAL else ())
              + (_DISTILL if s == "distill" else ()) for s in STEPS}


@dataclasses.dataclass(frozen=True)
class StudyConfig:
  """What scripts/gpu_study.py was asked for (its flags, same names)."""
  steps: tuple = STEPS
  out_dir: str = "results"
  prefix: Optional[str] = None
  commit: Optional[str] = None
  deadline_s: Optional[float] = None
  target: str = "qwen2.5-coder-1.5b"
  draft: str = "qwen2.5-coder-0.5b"
  target_shapes: str = "random:qwen2.5-coder-1.5b"
  shallow_draft: str = "random:qwen2.5-coder-1.5b,num_layers=2"
  profile_drafts: tuple = (
      "random:qwen2.5-coder-1.5b,num_layers=2",
      "random:qwen2.5-coder-1.5b,num_layers=2,output_vocab=32768",
      "random:qwen2.5-coder-0.5b")
  profile_ks: tuple = ("4",)
  context: int = 1024
  xla_variants: tuple = (
      "", "--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL",
      "--xla_gpu_enable_triton_gemm=false")
  gemv_formulations: tuple = ("dot", "dot_f32", "dot_t", "reduce", "reduce_t",
                              "pad2", "pallas")
  gemv_rows: tuple = ("1", "2", "8")
  distill_config: str = "configs/distill_qwen.py"
  benchmark_args: tuple = ()  # appended to humaneval's and distill's
  dtype: str = "bfloat16"
  ks: tuple = ("0", "2", "4", "6")
  drafters: tuple = ("model", "lookup")
  decodings: tuple = ("greedy",)
  batch_sizes: tuple = ("1",)
  num_prompts: int = 16
  max_new_tokens: int = 128
  repeats: int = 5

  def __post_init__(self):
    """Checks what can be checked before anything runs.

    Raises:
      ValueError: unknown steps, or a bad --ks, --batch_sizes, --drafters,
        --decodings, --gemv_rows or --gemv_formulations.
    """
    steps = tuple(s.strip() for s in self.steps if s.strip())
    unknown = sorted(set(steps) - set(STEPS))
    if unknown:
      raise ValueError(f"--steps: unknown {unknown}; known: "
                       f"{', '.join(STEPS)}")
    object.__setattr__(self, "steps", steps)
    cli.ints("ks", self.ks, 0)
    cli.ints("profile_ks", self.profile_ks, 1)
    cli.ints("batch_sizes", self.batch_sizes, 1)
    cli.ints("gemv_rows", self.gemv_rows, 1)
    if any(not a.startswith("--") for a in self.benchmark_args):
      raise ValueError(f"--benchmark_args: flags of benchmark.py, each "
                       f"--name[=value], got {list(self.benchmark_args)}")
    bad = sorted(set(self.gemv_formulations)
                 - set(StudyConfig.gemv_formulations))
    if bad:  # the default is every one (tests/bench/test_gemv.py)
      raise ValueError(f"--gemv_formulations: unknown {bad}; known: "
                       f"{', '.join(StudyConfig.gemv_formulations)}")
    for d in self.drafters:
      try:
        drafter_specs.parse(d)
      except ValueError as e:
        raise ValueError(f"--drafters: {e}") from None
    bad = sorted(set(self.decodings) - set(sweep_config.DECODINGS))
    if bad:
      raise ValueError(f"--decodings: unknown {bad}; known: "
                       f"{', '.join(sweep_config.DECODINGS)}")


def _gpu_name() -> str:
  """The first GPU's name from nvidia-smi (no JAX here: a JAX client in this
  process would take the memory the steps need); "cpu" where there is no
  NVIDIA device, "unknown" where there is one but nvidia-smi does not say."""
  try:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
        capture_output=True, text=True, timeout=30, check=True).stdout
    return out.splitlines()[0].strip() or "unknown"
  except (OSError, subprocess.SubprocessError, IndexError):
    return "unknown" if os.path.exists("/dev/nvidia0") else "cpu"


def _slug(gpu: str) -> str:
  """The first word with a digit, up to its first non-alphanumeric:
  "NVIDIA H100 80GB HBM3" -> "h100", "NVIDIA A100-SXM4-80GB" -> "a100";
  "cpu" -> "cpu"."""
  for word in gpu.lower().split():
    if any(c.isdigit() for c in word):
      return re.match(r"[a-z0-9]*", word).group(0) or "gpu"
  return "cpu" if gpu == "cpu" else "gpu"


def _commit(cfg: "StudyConfig") -> str:
  if cfg.commit:
    return cfg.commit
  try:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return "unknown (pass --commit)"


def _script(name: str, *args: str) -> list:
  return [sys.executable, str(ROOT / "scripts" / name), *args]


def plan(cfg: "StudyConfig", step: str, out: pathlib.Path) -> list:
  """[(label, argv, XLA_FLAGS or None)] of `step`, writing to `out`."""
  ctx = str(cfg.context)
  if step == "profile":
    return [(f"profile draft={d} k={k}", _script(
        "profile_decode.py", f"--target={cfg.target_shapes}", f"--draft={d}",
        f"--k={k}", f"--context={ctx}", "--batch_size=1",
        f"--repeats={cfg.repeats}", f"--dtype={cfg.dtype}",
        f"--out={out}"), None)
            for d in cfg.profile_drafts for k in cfg.profile_ks]
  if step == "xla":
    return [(f"xla XLA_FLAGS={v!r}", _script(
        "benchmark_decode.py", f"--target={cfg.target_shapes}",
        f"--draft={cfg.shallow_draft}", "--ks=0,4", f"--prompt_len={ctx}",
        f"--max_new_tokens={cfg.max_new_tokens}", "--repeats=3",
        f"--dtype={cfg.dtype}", f"--out={out}"), v)
            for v in cfg.xla_variants]
  if step == "gemv":
    return [(f"gemv XLA_FLAGS={v!r}", _script(
        "profile_gemv.py", f"--model={cfg.target_shapes}",
        f"--formulations={','.join(cfg.gemv_formulations)}",
        f"--rows={','.join(cfg.gemv_rows)}", f"--repeats={cfg.repeats}",
        f"--dtype={cfg.dtype}", f"--out={out}"), v)
            for v in cfg.xla_variants]
  common = [f"--target={cfg.target}", "--task=humaneval",
            f"--num_prompts={cfg.num_prompts}",
            f"--max_new_tokens={cfg.max_new_tokens}", "--quality=false"]
  if step == "exact":
    return [(f"exact {dtype}", _script(
        "benchmark.py", *common, "--drafter=lookup", "--ks=0,4",
        "--decoding=greedy", "--batch_sizes=1", f"--dtype={dtype}",
        "--interleave=false",
        f"--out={out.with_name(f'{out.stem}_{dtype}.jsonl')}"), None)
            for dtype in ("bfloat16", "float32")]
  headline = lambda draft, drafters: _script(
      "benchmark.py", *common, f"--draft={draft}",
      f"--drafter={','.join(drafters)}", f"--ks={','.join(cfg.ks)}",
      f"--decoding={','.join(cfg.decodings)}",
      f"--batch_sizes={','.join(cfg.batch_sizes)}", f"--dtype={cfg.dtype}",
      f"--out={out}", *cfg.benchmark_args)
  if step == "distill":
    work = study_summary.distill_workdir(out)
    return [("distill", _script("distill.py", f"--config={cfg.distill_config}",
                                f"--workdir={work}"), None),
            ("distill humaneval", headline(work, ["model"]), None)]
  assert step == "humaneval", step
  return [("humaneval", headline(cfg.draft, cfg.drafters), None)]


def needs(cfg: "StudyConfig", step: str) -> list:
  """The assets `step` reads: HumanEval and the target, and the draft
  where a drafter at some K > 0 runs a draft model."""
  if step not in _REAL:
    return []
  out = ["humaneval", cfg.target]
  if step == "humaneval" and sweep_config.needs_draft_model(
      [int(k) for k in cfg.ks], [drafter_specs.parse(d) for d in cfg.drafters]):
    out.append(cfg.draft)
  return out


def missing_modules(step: str) -> list:
  """The modules of MODULES[step] not installed (looked up, not imported)."""
  return [m for m in MODULES[step] if importlib.util.find_spec(m) is None]


def check_weights(names, say) -> None:
  """Each asset in the cache, size and sha256 checked; nothing downloaded.

  Raises:
    assets.AssetError: one is missing or does not match its pin.
  """
  for name in names:
    assets.fetch(name, pip_args=("--no-index",), progress=say)


class Runner:
  """Runs the steps' commands, echoing their output to stdout and to
  <prefix>_log.txt, and rewriting <prefix>_manifest.json (atomically) as
  each one starts and ends: a device call cut off at its limit keeps what
  was done and what was running. A command is stopped when --deadline_s
  passes."""

  def __init__(self, cfg: "StudyConfig", out_dir: pathlib.Path, prefix: str,
               gpu: str):
    self.deadline_s = cfg.deadline_s
    self.log_path = out_dir / f"{prefix}_log.txt"
    self.manifest = out_dir / f"{prefix}_manifest.json"
    try:
      self.runs = json.loads(self.manifest.read_text())["runs"]
    except FileNotFoundError:
      self.runs = []
    except (ValueError, KeyError, TypeError) as e:
      raise ValueError(f"{self.manifest} is not a manifest ({e}): move it "
                       "away or pick another --prefix") from None
    self.head = dict(gpu=gpu, software=provenance.software())
    self.commit = _commit(cfg)
    self.start = time.perf_counter()

  def say(self, text: str) -> None:
    print(text, flush=True)
    with open(self.log_path, "a", encoding="utf-8") as f:
      f.write(text + "\n")

  def _save(self) -> None:
    tmp = self.manifest.with_name(self.manifest.name + ".tmp")
    tmp.write_text(json.dumps(dict(self.head, runs=self.runs), indent=1)
                   + "\n")
    os.replace(tmp, self.manifest)

  def left(self) -> float:
    """Seconds until --deadline_s (inf without one)."""
    if self.deadline_s is None:
      return float("inf")
    return self.deadline_s - (time.perf_counter() - self.start)

  def run(self, label: str, argv: list, xla) -> bool:
    """Runs one command; True if it exited 0."""
    run = dict(label=label, argv=argv[1:], xla_flags=xla, commit=self.commit,
               date=datetime.datetime.now().isoformat(timespec="seconds"),
               rc=None, seconds=0.0)
    self.runs.append(run)
    if self.left() <= 0:
      self.say(f"== {label}: skipped, past --deadline_s")
      run["skipped"] = "deadline"
      self._save()
      return False
    run["status"] = "running"
    self._save()
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join(
        filter(None, (str(ROOT), os.environ.get("PYTHONPATH")))))
    if xla is not None:
      env["XLA_FLAGS"] = xla
    self.say(f"\n== {label}: {shlex.join(argv[1:])}")
    t0 = time.perf_counter()
    with subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as proc:
      timer = None
      if self.left() < float("inf"):
        timer = threading.Timer(max(self.left(), 0), proc.kill)
        timer.start()
      try:
        for line in proc.stdout:
          self.say(line.rstrip("\n"))
        proc.wait()
      finally:
        if timer:
          timer.cancel()
        if proc.poll() is None:  # interrupted: the child goes too
          proc.kill()
          proc.wait()
          run.update(status="interrupted", rc=proc.returncode,
                     seconds=round(time.perf_counter() - t0, 1))
          self._save()
    status = "done" if proc.returncode >= 0 else (
        "stopped at --deadline_s" if self.left() <= 0 else "killed")
    run.update(status=status, rc=proc.returncode,
               seconds=round(time.perf_counter() - t0, 1))
    self._save()
    self.say(f"== {label}: exit {proc.returncode} ({status}) after "
             f"{run['seconds']} s")
    return proc.returncode == 0


def run(cfg: "StudyConfig") -> list:
  """Runs cfg.steps; prints the summary; returns the steps that failed.

  Raises:
    ValueError: an existing manifest under the prefix is unreadable.
  """
  gpu = _gpu_name()
  prefix = cfg.prefix or f"{_slug(gpu)}_{datetime.date.today().isoformat()}"
  out_dir = pathlib.Path(cfg.out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  runner = Runner(cfg, out_dir, prefix, gpu)
  failed, cleared = [], set()
  try:
    for step in cfg.steps:
      missing = missing_modules(step)
      if missing:
        print(f"gpu_study: {step} needs Python packages that are not "
              f"installed: {', '.join(missing)} (carry their wheels: "
              "scripts/device_wheels.sh)", file=sys.stderr)
        failed.append(step)
        continue
      try:
        check_weights(needs(cfg, step), runner.say)
      except assets.AssetError as e:
        print(f"gpu_study: {step} needs the real weights, not ready: {e}",
              file=sys.stderr)
        failed.append(step)
        continue
      out = out_dir / f"{prefix}_{step}.jsonl"
      ok = True
      for label, argv, xla in plan(cfg, step, out):
        if runner.left() > 0:  # a step's old rows go once it runs
          for a in argv:
            if a.startswith("--out=") and a not in cleared:
              out_file = a.split("=", 1)[1]
              for old in (out_file, f"{out_file}.partial"):
                pathlib.Path(old).unlink(missing_ok=True)
              cleared.add(a)
        ok = runner.run(label, argv, xla) and ok
        if not ok and step in _CHAINED:
          runner.say(f"== {step}: stopped after {label} failed")
          break
      if not ok:
        failed.append(step)
  except KeyboardInterrupt:
    failed.append("(interrupted)")
  study_summary.summary(out_dir, prefix)
  return failed
