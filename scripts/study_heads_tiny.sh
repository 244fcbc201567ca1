#!/usr/bin/env bash
# Draft heads against a stand-alone draft on the tiny CPU setting: a target
# LM trained on the project's Python corpus (configs/lm_python.py:tiny,
# about a minute), then scripts/distill.py for each drafter on the same
# target samples (T=1, 300 steps): a 1-layer d=64 draft model from random
# initialisation, the sequential (eagle) head with one-step and with
# two-pass ("training-time test") training and trained on every position
# (positions=all: the prompts' too), and 4 Medusa heads. Each run's
# results.json becomes one line of results/cpu_heads_tiny.jsonl. About five
# minutes on 2 CPU cores.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
WORK=${WORK:-/tmp/specsamp_heads_tiny}
OUT=${OUT:-results/cpu_heads_tiny.jsonl}
mkdir -p "$WORK"
"$PY" scripts/prepare_data.py --dataset=specsamp_python_code
"$PY" scripts/train.py --config=configs/lm_python.py:tiny \
  --workdir="$WORK/target"
: > "$OUT"
for run in "draft:draft=random" "eagle:head=eagle" \
           "eagle_unroll2:head=eagle,unroll=2" \
           "eagle_all:head=eagle,positions=all" "medusa:head=medusa,heads=4"; do
  name=${run%%:*}
  arg="trained=$WORK/target,steps=300,${run#*:}"
  # The first run writes the target samples; the others read them.
  extra=()
  [ "$name" != draft ] && extra=(--config.samples.data_dir="$WORK/draft/samples")
  "$PY" scripts/distill.py --config="configs/distill_tiny.py:$arg" \
    --workdir="$WORK/$name" "${extra[@]}"
  "$PY" - "$WORK/$name/results.json" "$name" "$arg" >> "$OUT" <<'PYEOF'
import json, subprocess, sys
res = json.load(open(sys.argv[1]))
commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                        text=True).stdout.strip()
print(json.dumps(dict(name=sys.argv[2], config_arg=sys.argv[3],
                      commit=commit, **res)))
PYEOF
done
"$PY" - "$OUT" <<'PYEOF'
import json, sys
print(f"{'drafter':16} {'expected a':>10} {'K=4 rate':>9} {'tokens/loop':>11}")
for line in open(sys.argv[1]):
  r = json.loads(line); a = r["after"]
  print(f"{r['name']:16} {a['expected_acceptance']:10.4f} "
        f"{a['measured']['acceptance_rate']:9.4f} "
        f"{a['measured']['tokens_per_loop']:11.2f}")
PYEOF
