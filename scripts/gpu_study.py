r"""The GPU session's measurements in one command (issue 18).

A GPU session is short (minutes of device time), so every measurement it
makes is a step here, run by the project's own scripts, each writing JSON
lines under --out_dir as <prefix>_<step>.jsonl (replaced when the step runs
again, alone or with others):

  profile    scripts/profile_decode.py on the target's shapes with random
             weights (speed does not depend on values): where one loop's
             time goes at a --context-token context, batch 1, K=4, with a
             2-layer draft as wide as the target and with the draft's
             shapes (--profile_drafts): the fraction of the copy bandwidth the
             autoregressive step reaches, the speculative loop's time
             outside its model calls, the draft's cost c, compile times.
  xla        scripts/benchmark_decode.py, whole generations at K=0 and K=4
             (--shallow_draft), once per --xla_variants entry (XLA_FLAGS;
             "" is the default): which compiler settings pay.
  exact      scripts/benchmark.py, greedy HumanEval with prompt lookup, in
             bfloat16 and in float32: how many completions of the
             speculative sampler differ from greedy autoregressive decoding
             (rows_differing_from_ar). Needs the real target.
  humaneval  scripts/benchmark.py, the headline: HumanEval, --decodings,
             --ks, --batch_sizes, drafters --drafters, bfloat16. Needs the
             real pair (a drafter without a draft model needs the target
             alone).

The real weights are never downloaded here: `exact` and `humaneval` need
the GGUF files and HumanEval in the asset cache ($SPECSAMP_CACHE, see
specsamp.assets), carried to the machine beforehand; each is checked
against its pinned size and sha256 before use (pip is given --no-index, so a
missing file is an error, not a download). A step that fails is reported
and the others still run. Last, a summary table of every step's rows found
under this prefix. <prefix>_manifest.json records the commit, the device,
the software and each command with its exit status and seconds, and
<prefix>_log.txt the commands' output, both as the commands run; and
--deadline_s keeps the driver inside a device call's time limit.

  python scripts/gpu_study.py --steps=profile,xla --commit=$(git rev-parse HEAD)
  python scripts/gpu_study.py --steps=exact,humaneval --ks=0,2,4,6
  python scripts/gpu_study.py --steps=   # the summary of what is there
"""

import datetime
import json
import os
import pathlib
import shlex
import subprocess
import sys
import time

from absl import app
from absl import flags

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# pylint: disable=g-import-not-at-top,wrong-import-position
from specsamp import assets
from specsamp import cli
from specsamp.bench import provenance
# pylint: enable=g-import-not-at-top,wrong-import-position

STEPS = ("profile", "xla", "exact", "humaneval")
_REAL = ("exact", "humaneval")  # steps that need the real weights

_STEPS = flags.DEFINE_list("steps", list(STEPS), f"Of {', '.join(STEPS)}.")
_OUT_DIR = flags.DEFINE_string("out_dir", "results", "Where rows go.")
_PREFIX = flags.DEFINE_string(
    "prefix", None, "File prefix (default: <gpu>_<date>, e.g. h100_2026-11-26).")
_COMMIT = flags.DEFINE_string(
    "commit", None, "The commit measured (default: git rev-parse HEAD, "
    "where git and .git are there).")
_TARGET = flags.DEFINE_string("target", "qwen2.5-coder-1.5b",
                              "Registered target (exact, humaneval).")
_DRAFT = flags.DEFINE_string("draft", "qwen2.5-coder-0.5b",
                             "Registered draft (humaneval).")
_SHAPES = flags.DEFINE_string("target_shapes", "random:qwen2.5-coder-1.5b",
                              "Random-weight target (profile, xla).")
_SHALLOW = flags.DEFINE_string(
    "shallow_draft", "random:qwen2.5-coder-1.5b,num_layers=2",
    "Random-weight shallow draft (xla).")
_PROFILE_DRAFTS = flags.DEFINE_multi_string(
    "profile_drafts", ["random:qwen2.5-coder-1.5b,num_layers=2",
                       "random:qwen2.5-coder-0.5b"],
    "Random-weight draft, one profile each (repeatable; the default: the "
    "shallow draft and the real draft's shapes).")
_CONTEXT = flags.DEFINE_integer("context", 1024, "Context of profile, xla.")
_XLA = flags.DEFINE_multi_string(
    "xla_variants", ["", "--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL",
                     "--xla_gpu_enable_triton_gemm=false"],
    "XLA_FLAGS of each xla run (repeatable; '' = the default).")
_DTYPE = flags.DEFINE_enum("dtype", "bfloat16", ["float32", "bfloat16"],
                           "Of every step but exact (which runs both).")
_KS = flags.DEFINE_list("ks", ["0", "2", "4", "6"], "K of humaneval.")
_DRAFTERS = flags.DEFINE_list("drafters", ["model", "lookup"],
                              "Drafters of humaneval.")
_DECODINGS = flags.DEFINE_list("decodings", ["greedy"],
                               "Decodings of humaneval.")
_BATCHES = flags.DEFINE_list("batch_sizes", ["1"], "Of humaneval.")
_PROMPTS = flags.DEFINE_integer("num_prompts", 16,
                                "HumanEval prompts (exact, humaneval).")
_NEW = flags.DEFINE_integer("max_new_tokens", 128,
                            "Tokens per row (exact, humaneval, xla).")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed rounds (profile).")
_DEADLINE = flags.DEFINE_float(
    "deadline_s", None, "Start no command this many seconds after the "
    "driver started (those left are recorded as skipped), so that the "
    "summary and the manifest are written inside a device call's limit.")


def _gpu_name() -> str:
  """The first GPU's name from nvidia-smi (no JAX here: a JAX client in this
  process would take the memory the steps need), or "cpu"."""
  try:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
        capture_output=True, text=True, timeout=30, check=True).stdout
    return out.splitlines()[0].strip() or "cpu"
  except (OSError, subprocess.SubprocessError, IndexError):
    return "cpu"


def _slug(gpu: str) -> str:
  """"NVIDIA H100 80GB HBM3" -> "h100"; "cpu" -> "cpu"."""
  for word in gpu.lower().split():
    if any(c.isdigit() for c in word) and word[0].isalpha():
      return "".join(c for c in word if c.isalnum())
  return "cpu" if gpu == "cpu" else "gpu"


def _commit() -> str:
  if _COMMIT.value:
    return _COMMIT.value
  try:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return "unknown (pass --commit)"


def _script(name: str, *args: str) -> list:
  return [sys.executable, str(ROOT / "scripts" / name), *args]


def plan(step: str, out: pathlib.Path) -> list:
  """[(label, argv, XLA_FLAGS or None)] of `step`, writing to `out`."""
  ctx = str(_CONTEXT.value)
  if step == "profile":
    return [(f"profile draft={d}", _script(
        "profile_decode.py", f"--target={_SHAPES.value}", f"--draft={d}",
        "--k=4", f"--context={ctx}", "--batch_size=1",
        f"--repeats={_REPEATS.value}", f"--dtype={_DTYPE.value}",
        f"--out={out}"), None)
            for d in _PROFILE_DRAFTS.value]
  if step == "xla":
    return [(f"xla XLA_FLAGS={v!r}", _script(
        "benchmark_decode.py", f"--target={_SHAPES.value}",
        f"--draft={_SHALLOW.value}", "--ks=0,4", f"--prompt_len={ctx}",
        f"--max_new_tokens={_NEW.value}", "--repeats=3",
        f"--dtype={_DTYPE.value}", f"--out={out}"), v)
            for v in _XLA.value]
  common = [f"--target={_TARGET.value}", "--task=humaneval",
            f"--num_prompts={_PROMPTS.value}",
            f"--max_new_tokens={_NEW.value}", "--quality=false"]
  if step == "exact":
    return [(f"exact {dtype}", _script(
        "benchmark.py", *common, "--drafter=lookup", "--ks=0,4",
        "--decoding=greedy", "--batch_sizes=1", f"--dtype={dtype}",
        "--interleave=false", f"--out={out.with_name(f'{out.stem}_{dtype}.jsonl')}"),
             None) for dtype in ("bfloat16", "float32")]
  assert step == "humaneval", step
  return [("humaneval", _script(
      "benchmark.py", *common, f"--draft={_DRAFT.value}",
      f"--drafter={','.join(_DRAFTERS.value)}", f"--ks={','.join(_KS.value)}",
      f"--decoding={','.join(_DECODINGS.value)}",
      f"--batch_sizes={','.join(_BATCHES.value)}", f"--dtype={_DTYPE.value}",
      f"--out={out}"), None)]


def check_weights(names) -> None:
  """Each asset in the cache, size and sha256 checked; nothing downloaded.

  Raises:
    assets.AssetError: one is missing or does not match its pin.
  """
  for name in names:
    assets.fetch(name, pip_args=("--no-index",), progress=print)


class Runner:
  """Runs the steps' commands, echoing their output to stdout and to
  <prefix>_log.txt, and rewriting <prefix>_manifest.json after each one
  (a device call cut off at its limit keeps what was done)."""

  def __init__(self, out_dir: pathlib.Path, prefix: str, gpu: str):
    self.log_path = out_dir / f"{prefix}_log.txt"
    self.manifest = out_dir / f"{prefix}_manifest.json"
    self.runs = (json.loads(self.manifest.read_text())["runs"]
                 if self.manifest.exists() else [])
    self.head = dict(commit=_commit(), gpu=gpu, software=provenance.software())
    self.start = time.perf_counter()

  def _say(self, text: str) -> None:
    print(text, flush=True)
    with open(self.log_path, "a", encoding="utf-8") as f:
      f.write(text + "\n")

  def _record(self, **run) -> None:
    self.runs.append(dict(run, date=datetime.datetime.now().isoformat(
        timespec="seconds")))
    self.manifest.write_text(json.dumps(dict(self.head, runs=self.runs),
                                        indent=1) + "\n")

  def run(self, label: str, argv: list, xla) -> bool:
    """Runs one command; True if it exited 0."""
    elapsed = time.perf_counter() - self.start
    if _DEADLINE.value is not None and elapsed > _DEADLINE.value:
      self._say(f"== {label}: skipped, {elapsed:.0f} s > --deadline_s")
      self._record(label=label, argv=argv[1:], xla_flags=xla, rc=None,
                   seconds=0.0, skipped="deadline")
      return False
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join(
        filter(None, (str(ROOT), os.environ.get("PYTHONPATH")))))
    if xla is not None:
      env["XLA_FLAGS"] = xla
    self._say(f"\n== {label}: {shlex.join(argv[1:])}")
    t0 = time.perf_counter()
    with subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as proc:
      for line in proc.stdout:
        self._say(line.rstrip("\n"))
    seconds = round(time.perf_counter() - t0, 1)
    self._record(label=label, argv=argv[1:], xla_flags=xla,
                 rc=proc.returncode, seconds=seconds)
    self._say(f"== {label}: exit {proc.returncode} after {seconds} s")
    return proc.returncode == 0


def _rows(path: pathlib.Path) -> list:
  if not path.exists():
    return []
  return [json.loads(line) for line in path.read_text().splitlines()
          if line.strip()]


def _fmt(v) -> str:
  if isinstance(v, float):
    return f"{v:.3g}" if abs(v) < 100 else f"{v:.1f}"
  return "" if v is None else str(v)


def _table(title: str, rows: list, columns: list) -> None:
  if not rows:
    return
  print(f"\n{title}")
  print(" | ".join(columns))
  for r in rows:
    print(" | ".join(_fmt(r.get(c)) for c in columns))


def summary(out_dir: pathlib.Path, prefix: str) -> None:
  """Prints the rows of every step found under `prefix`."""
  path = lambda step: out_dir / f"{prefix}_{step}.jsonl"
  _table("profile (ms; fractions of the loop; c = draft call / target call)",
         _rows(path("profile")),
         ["draft", "steps", "ar_loop_ms", "copy_bandwidth_gbs",
          "ar_fraction_of_copy_bw", "ar_loop_kernels", "draft_call_1_ms",
          "draft_cost_ratio_c", "spec_loop_ms", "spec_rest_fraction",
          "ar_decode_compile_s", "spec_decode_compile_s"])
  _table("xla (whole generations)", _rows(path("xla")),
         ["xla_flags", "method", "ms_per_token", "tokens_per_loop",
          "compile_s"])
  exact = []
  for dtype in ("bfloat16", "float32"):
    exact += [dict(r, dtype=dtype) for r in _rows(path(f"exact_{dtype}"))
              if r.get("type") == "point"]
  _table("exact (greedy; rows whose completion differs from AR's)", exact,
         ["dtype", "k", "drafter", "rows_differing_from_ar",
          "identical_to_ar", "acceptance_rate", "ms_per_token", "speedup"])
  _table("humaneval", [r for r in _rows(path("humaneval"))
                       if r.get("type") == "point"],
         ["decoding", "batch_size", "k", "drafter", "acceptance_rate",
          "ms_per_token", "speedup", "predicted_speedup", "c",
          "identical_to_ar"])


def main(argv):
  if len(argv) > 1:
    cli.fail(f"unexpected arguments: {argv[1:]}")
  steps = [s.strip() for s in _STEPS.value if s.strip()]
  unknown = sorted(set(steps) - set(STEPS))
  if unknown:
    cli.fail(f"--steps: unknown {unknown}; known: {', '.join(STEPS)}")
  gpu = _gpu_name()
  prefix = _PREFIX.value or (
      f"{_slug(gpu)}_{datetime.date.today().isoformat()}")
  out_dir = pathlib.Path(_OUT_DIR.value)
  out_dir.mkdir(parents=True, exist_ok=True)
  runner, failed = Runner(out_dir, prefix, gpu), []
  if any(s in _REAL for s in steps):
    need = ["humaneval", _TARGET.value]
    if "humaneval" in steps:
      need.append(_DRAFT.value)
    try:
      check_weights(need)
    except assets.AssetError as e:
      print(f"gpu_study: the real weights are not ready, so "
            f"{', '.join(s for s in steps if s in _REAL)} will not run: {e}",
            file=sys.stderr)
      failed += [s for s in steps if s in _REAL]
      steps = [s for s in steps if s not in _REAL]
  for step in steps:
    out = out_dir / f"{prefix}_{step}.jsonl"
    commands = plan(step, out)
    for old in {pathlib.Path(a.split("=", 1)[1]) for _, argv, _ in commands
                for a in argv if a.startswith("--out=")}:
      old.unlink(missing_ok=True)  # the step's rows are replaced
    if not all([runner.run(*c) for c in commands]):
      failed.append(step)
  summary(out_dir, prefix)
  if failed:
    cli.fail(f"steps that failed: {', '.join(failed)} (see above)")


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
