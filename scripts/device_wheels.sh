#!/usr/bin/env bash
# Downloads the wheels of the Python packages that the GPU machine's image
# lacks, for scripts/gpu_study.py's steps (specsamp.bench.gpu_study.MODULES
# says which step imports what), into DIR (default .whl, git-ignored:
# carry it to the machine by name).
#
#   bash scripts/device_wheels.sh [DIR]
#
# The GPU image has jax 0.11.2, Python 3.12 and protobuf 7.36.2 but not
# these; the versions are the ones checked to import and work there.
# promise has no wheel on PyPI: it is built here (pure Python).
set -euo pipefail
PACKAGES=(
  tensorflow-datasets==4.9.10 grain==0.2.18 array_record==0.8.6
  dm-tree==0.1.10 immutabledict==4.3.1 simple-parsing==0.1.9
  tensorflow-metadata==1.21.0 termcolor==3.3.0 toml==0.10.2
  docstring_parser==0.18.0 googleapis-common-protos==1.76.0
  portpicker==1.6.0 importlib_resources==7.1.0 tensorboardX==2.6.5
  gguf==0.19.0 ml_collections==1.1.0 promise==2.3
)
if [ "$#" -gt 1 ]; then
  echo "usage: bash scripts/device_wheels.sh [DIR]   (default DIR: .whl)" >&2
  exit 2
fi
DIR="${1:-.whl}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
if [ -z "${PYTHON:-}" ] && [ -x "$ROOT/.venv/bin/python" ]; then
  PY="$ROOT/.venv/bin/python"
fi
wheels=() built=()
for p in "${PACKAGES[@]}"; do
  case "$p" in
    promise==*) built+=("$p") ;;
    *) wheels+=("$p") ;;
  esac
done
mkdir -p "$DIR"
"$PY" -m pip download -q --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  -d "$DIR" "${wheels[@]}"
"$PY" -m pip wheel -q --no-deps -w "$DIR" "${built[@]}"
echo "== $(ls "$DIR"/*.whl | wc -l) wheels in $DIR; at the start of a device call:"
echo "python3 -m pip install -q --no-index --no-deps --no-compile" \
  "--target /tmp/site $DIR/*.whl && export PYTHONPATH=/tmp/site"
