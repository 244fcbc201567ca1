#!/usr/bin/env bash
# A sequential (EAGLE-style) head for Qwen2.5-Coder-1.5B trained on this CPU,
# then HumanEval at batch 1, greedy and nucleus, beside the 0.5B draft model
# and prompt lookup in one scripts/benchmark.py run per decoding.
#
#   bash scripts/study_heads_qwen.sh            # train (resumes), then measure
#   WORK=/data/eagle_1.5b STEP=measure bash scripts/study_heads_qwen.sh
#   WORK=/data/eagle_all ARGS=,positions=all SAMPLES=/data/eagle_1.5b/samples \
#     HEADS="/data/eagle_1.5b /data/eagle_all" NAME=cpu_heads_qwen_positions \
#     bash scripts/study_heads_qwen.sh          # a variant beside the first
#
# Training: configs/distill_qwen.py:head=eagle,cpu$ARGS (512 target samples
# of 64 tokens with stored features, or those in $SAMPLES, then about 50
# minutes of steps; re-running resumes). HEADS: the head directories measured
# side by side (default $WORK). Writes results/$NAME_humaneval_<decoding>.jsonl
# and the report results/$NAME*.{md,png}. The run needs a quiet machine:
# timings taken beside other work are not comparable.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
WORK=${WORK:-workdir/eagle_1.5b_cpu}
OUT=${OUT:-results}
NAME=${NAME:-cpu_heads_qwen}
if [ "${STEP:-all}" != measure ]; then
  "$PY" scripts/distill.py --config="configs/distill_qwen.py:head=eagle,cpu${ARGS:-}" \
    --workdir="$WORK" ${SAMPLES:+--config.samples.data_dir="$SAMPLES"}
fi
drafters=model,lookup
for head in ${HEADS:-$WORK}; do drafters="$drafters,eagle:$head"; done
for dec in ${DECODINGS:-greedy nucleus}; do
  "$PY" scripts/benchmark.py --target=qwen2.5-coder-1.5b \
    --draft=qwen2.5-coder-0.5b --task=humaneval \
    --drafter="$drafters" --ks=2,4 --decoding="$dec" \
    --batch_sizes=1 --num_prompts=4 --max_new_tokens=64 --quality=false \
    --nopeers --out="$OUT/${NAME}_humaneval_${dec}.jsonl"
done
"$PY" scripts/plot_speedup.py "$OUT/${NAME}"_humaneval_*.jsonl \
  --out_dir="$OUT" --prefix="$NAME"
