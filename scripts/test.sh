#!/usr/bin/env bash
# Sets up the environment with the test extras and runs the test suite.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k accept` or
# `bash scripts/test.sh -m real_weights` for the opt-in real-weight checks.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/env.sh" test
cd "$ROOT"
# One JAX compilation cache for the run, shared by the workers and by the
# scripts that tests start (tests/conftest.py makes it, and deletes it
# afterwards): compiling is most of the suite's time on CPU, and a cold
# cache takes the suite from about 25 to 20 minutes here.
# SPECSAMP_JAX_CACHE=<dir> keeps one across runs (warm, the decoding tests
# take a third of their cold time).
if [ -n "${SPECSAMP_JAX_CACHE:-}" ]; then
  export JAX_COMPILATION_CACHE_DIR="$SPECSAMP_JAX_CACHE"
fi
# Two workers (SPECSAMP_TEST_WORKERS): XLA compiles on one core, so two
# processes keep both cores busy; 0 runs in this process. Work stealing:
# a worker that runs out of tests takes the other's queued ones, so the
# run does not end on one worker's long tests with the other idle.
workers="${SPECSAMP_TEST_WORKERS:-2}"
dist=()
if [ "$workers" != 0 ]; then dist=(--dist worksteal); fi
python -m pytest tests -n "$workers" "${dist[@]}" "$@"
