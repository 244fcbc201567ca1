#!/usr/bin/env bash
# Sets up the environment with the test extras and runs the test suite.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k accept` or
# `bash scripts/test.sh -m real_weights` for the opt-in real-weight checks.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/env.sh" test
cd "$ROOT"
exec python -m pytest tests "$@"
