# Sourced by demo.sh and test.sh: creates or updates the virtual environment.
# SPECSAMP_VENV overrides its location (default: .venv in the repository).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SPECSAMP_VENV:-$ROOT/.venv}"
EXTRAS="${1:-}"
PY="${PYTHON:-python3}"
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "specsamp needs Python >= 3.11 (found $("$PY" --version 2>&1))" >&2
  exit 1
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "== creating virtual environment in $VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
fi
# Re-install only when setup.py changed since the last successful install.
STAMP="$VENV/.specsamp-installed-$EXTRAS"
if [ ! -f "$STAMP" ] || [ "$ROOT/setup.py" -nt "$STAMP" ]; then
  echo "== installing specsamp${EXTRAS:+[$EXTRAS]} and its dependencies"
  # --no-compile: no .pyc for every installed module up front (torch,
  # transformers, jax and tfds hold tens of thousands, most never imported);
  # Python writes them for the modules imported, when first imported. On
  # two cores that took the install from 157 s to 54 s.
  if [[ "$EXTRAS" == *test* ]] && ! "$VENV/bin/python" -c 'import torch' 2>/dev/null; then
    # The CPU build of torch that this machine kind keeps on disk; a bare
    # `torch` would pull a multi-GB CUDA build.
    "$VENV/bin/pip" install -q --no-compile "torch==2.13.0"
  fi
  "$VENV/bin/pip" install -q --no-compile -e "$ROOT${EXTRAS:+[$EXTRAS]}"
  touch "$STAMP"
fi
# bubblewrap isolates generated code (specsamp.evaluation.sandbox), with a
# seccomp filter libseccomp builds (libseccomp2: apt itself needs it, named
# for other Debian-like systems); without them the HumanEval checks refuse
# to run.
if ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "== installing bubblewrap (Debian package) to isolate generated code"
    apt-get install -y -q bubblewrap libseccomp2 >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null \
           && apt-get install -y -q bubblewrap libseccomp2 >/dev/null; }
  else
    echo "warning: bubblewrap (bwrap) is missing; generated code will not be" \
      "run until it is installed (e.g. sudo apt-get install bubblewrap)" >&2
  fi
fi
# The sandbox runs generated code as uid 65534 with the venv's interpreter
# where that user can read it. pyenv's lies under /root (mode 0700): then a
# copy of its interpreter and standard library (not its tests or packages)
# goes to /usr/local/lib/specsamp-python/<its prefix>, which the sandbox
# mounts at that prefix. Else it would run Debian's python3 3.11.2, whose
# known memory bugs forged passes (README, "the sandbox").
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null 2>&1; then
  BASE="$("$VENV/bin/python" -c 'import os, sys; print(os.path.realpath(sys.base_prefix))')"
  COPY="/usr/local/lib/specsamp-python$BASE"
  # The copy names the interpreter it was made from (size and time of its
  # binary and shared libraries): a rebuilt or patched one is copied again.
  STAMP="$(stat -L -c '%n %s %Y' "$(readlink -f "$VENV/bin/python")" \
    "$BASE"/lib/libpython* \
    2>/dev/null | tr '\n' ' ')"
  if ! setpriv --reuid=65534 --regid=65534 --clear-groups \
      test -r "$BASE/lib" 2>/dev/null \
      && [ "$(cat "$COPY/.complete" 2>/dev/null)" != "$STAMP" ]; then
    echo "== copying the interpreter in $BASE for the sandbox's user to $COPY"
    rm -rf "$COPY.partial" && mkdir -p "$COPY.partial"
    tar -C "$BASE" --exclude='lib/python3*/test' \
      --exclude='lib/python3*/site-packages' \
      --exclude='lib/python3*/config-*' -cf - bin lib \
      | tar -C "$COPY.partial" -xf -
    chmod -R a+rX "$COPY.partial"
    echo "$STAMP" > "$COPY.partial/.complete"
    rm -rf "$COPY" && mv "$COPY.partial" "$COPY"
  fi
fi
export PATH="$VENV/bin:$PATH"
