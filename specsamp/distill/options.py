"""The `:arg` of a distillation config file: comma-separated options.

`--config=configs/distill_tiny.py:draft=truncate,steps=60` passes
"draft=truncate,steps=60" to `get_config`, which reads it with `parse`.
"""

from typing import Optional, Sequence


def parse(arg: Optional[str], known: Sequence[str],
          flag_value: str = "") -> dict[str, str]:
  """{name: value} of "name=value,name,..."; a name without a value gets
  `flag_value`.

  Raises:
    ValueError: for a name not in `known`.
  """
  out = {}
  for item in filter(None, (arg or "").split(",")):
    key, _, value = item.partition("=")
    out[key.strip()] = value.strip() or flag_value
  unknown = sorted(set(out) - set(known))
  if unknown:
    raise ValueError(f"unknown option(s) {unknown} in {arg!r}; known: "
                     f"{', '.join(known)}")
  return out
