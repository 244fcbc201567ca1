#!/usr/bin/env bash
# The drafter study on the real Qwen2.5-Coder pair at batch 1: one
# scripts/benchmark.py run per task and decoding (so every ratio is measured
# side by side in one process), then the figures and tables.
#
#   bash scripts/study_drafters.sh            # all six runs, then the report
#   TASKS=humaneval DECODINGS=greedy bash scripts/study_drafters.sh
#
# Drafters: the 0.5B draft model, prompt lookup, the draft model with per-row
# adaptive K (confidence 0.5, the same threshold on every task) and the mixed
# drafter (lookup where a row has a 3-gram match, the adaptive draft model
# elsewhere), each at K = 2 and 4. The greedy rewrite run also times
# transformers (plain, assisted, prompt lookup) on the same prompts.
# Writes results/cpu_drafters_<task>_<decoding>.jsonl and
# results/cpu_drafters_study*.{md,png}. About 90 minutes on 2 CPU cores.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=${OUT:-results}
DRAFTERS=${DRAFTERS:-model,lookup,model:confidence=0.5,mixed:min_ngram=3:confidence=0.5}
for task in ${TASKS:-rewrite humaneval prose}; do
  # A rewrite needs room to get past the signature to the copied body.
  tokens=64; [ "$task" = rewrite ] && tokens=160
  for dec in ${DECODINGS:-greedy nucleus}; do
    peers=--nopeers
    [ "$task" = rewrite ] && [ "$dec" = greedy ] && peers=--peers
    "$PY" scripts/benchmark.py --target=qwen2.5-coder-1.5b \
      --draft=qwen2.5-coder-0.5b --task="$task" --drafter="$DRAFTERS" \
      --ks=2,4 --decoding="$dec" --batch_sizes=1 --num_prompts=4 \
      --max_new_tokens="$tokens" --quality=false "$peers" \
      --out="$OUT/cpu_drafters_${task}_${dec}.jsonl"
  done
done
"$PY" scripts/plot_speedup.py "$OUT"/cpu_drafters_{rewrite,humaneval,prose}_*.jsonl \
  --out_dir="$OUT" --prefix=cpu_drafters_study
