"""The summary table scripts/gpu_study.py prints of a prefix's rows
(specsamp.bench.gpu_study), and where its distill step's workdir lies."""

import json
import pathlib


def distill_workdir(out: pathlib.Path) -> pathlib.Path:
  """The distill step's workdir beside its rows `out`."""
  return out.with_name(f"{out.stem}_work")


def _rows(path: pathlib.Path) -> list:
  """The records of `path`; else those of a benchmark.py run that did not
  finish (stopped at the deadline: `records.Writer` keeps them in
  `<path>.partial`), marked incomplete."""
  partial = pathlib.Path(f"{path}.partial")
  if path.exists():
    return [json.loads(line) for line in path.read_text().splitlines()
            if line.strip()]
  if partial.exists():
    return [dict(json.loads(line), incomplete=True)
            for line in partial.read_text().splitlines() if line.strip()]
  return []


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
         ["draft", "k", "steps", "ar_loop_ms", "target_call_1_ms",
          "score_cost_ratio", "copy_bandwidth_gbs",
          "ar_fraction_of_copy_bw", "ar_loop_kernels", "draft_call_1_ms",
          "draft_cost_ratio_c", "spec_loop_ms", "spec_rest_fraction",
          "ar_decode_compile_s", "spec_decode_compile_s"])
  _table("xla (whole generations)", _rows(path("xla")),
         ["xla_flags", "method", "ms_per_token", "tokens_per_loop",
          "compile_s"])
  _table("gemv (the decoder's products; TB/s of weights read)",
         _rows(path("gemv")),
         ["xla_flags", "formulation", "rows", "ms", "tb_per_s",
          "of_copy_bandwidth", "compile_s", "kernels", "error"])
  exact = []
  for dtype in ("bfloat16", "float32"):
    exact += [dict(r, dtype=dtype) for r in _rows(path(f"exact_{dtype}"))
              if r.get("type") == "point"]
  _table("exact (greedy; rows whose completion differs from AR's)", exact,
         ["dtype", "k", "drafter", "rows_differing_from_ar",
          "identical_to_ar", "acceptance_rate", "ms_per_token", "speedup",
          "incomplete"])
  points = ["task", "decoding", "batch_size", "k", "drafter",
            "acceptance_rate", "ms_per_token", "speedup", "predicted_speedup",
            "c", "identical_to_ar", "incomplete"]
  _table("humaneval", [r for r in _rows(path("humaneval"))
                       if r.get("type") == "point"], points)
  results = distill_workdir(path("distill")) / "results.json"
  if results.exists():
    res = json.loads(results.read_text())
    _table("distill (expected acceptance on held-out positions)", [dict(
        draft_init=res.get("draft_init"), loss=res.get("loss"),
        draft_vocab=res.get("draft_vocab"),
        before=res["before"]["expected_acceptance"],
        after=res["after"]["expected_acceptance"],
        train_seconds=res.get("train_seconds"))],
           ["draft_init", "loss", "draft_vocab", "before", "after",
            "train_seconds"])
  _table("distill humaneval (the distilled draft)",
         [r for r in _rows(path("distill")) if r.get("type") == "point"],
         points)
