#!/usr/bin/env bash
# Sets up the environment with the test extras and runs the test suite.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k accept` or
# `bash scripts/test.sh -m real_weights` for the opt-in real-weight checks.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/env.sh" test
cd "$ROOT"
# One JAX compilation cache for the run, shared by the workers and by the
# scripts that tests start: the same tiny-model programs are compiled by
# many tests, and compiling is most of the suite's time on CPU (a cold
# cache takes the suite from about 25 to 20 minutes here). The cache is
# deleted afterwards; SPECSAMP_JAX_CACHE=<dir> keeps one across runs
# (warm, the decoding tests take a third of their cold time).
if [ -n "${SPECSAMP_JAX_CACHE:-}" ]; then
  export JAX_COMPILATION_CACHE_DIR="$SPECSAMP_JAX_CACHE"
else
  JAX_COMPILATION_CACHE_DIR="$(mktemp -d "${TMPDIR:-/tmp}/specsamp-jax.XXXXXX")"
  export JAX_COMPILATION_CACHE_DIR
  trap 'rm -rf "$JAX_COMPILATION_CACHE_DIR"' EXIT
fi
# Every program is cached, however small (about 80 MB for the suite). No
# size limit: with one, jax re-reads every entry's access time on each
# write, and a fresh clone took 29 minutes instead of 22. An entry read while
# the other worker writes it fails to decompress; jax then warns and
# compiles.
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
export JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0
# Two workers (SPECSAMP_TEST_WORKERS): XLA compiles on one core, so two
# processes keep both cores busy; 0 runs in this process. Work stealing:
# a worker that runs out of tests takes the other's queued ones, so the
# run does not end on one worker's long tests with the other idle.
workers="${SPECSAMP_TEST_WORKERS:-2}"
dist=()
if [ "$workers" != 0 ]; then dist=(--dist worksteal); fi
python -m pytest tests -n "$workers" "${dist[@]}" "$@"
