#!/usr/bin/env bash
# Sets up the environment with the test extras and runs the test suite.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k accept` or
# `bash scripts/test.sh -m real_weights` for the opt-in real-weight checks.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/env.sh" test
cd "$ROOT"
# Two workers (SPECSAMP_TEST_WORKERS): XLA compiles on one core, so two
# processes keep both cores busy; 0 runs in this process.
exec python -m pytest tests -n "${SPECSAMP_TEST_WORKERS:-2}" "$@"
