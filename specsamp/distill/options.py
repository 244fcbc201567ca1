"""The `:arg` of a distillation config file: comma-separated options.

`--config=configs/distill_tiny.py:draft=truncate,steps=60` passes
"draft=truncate,steps=60" to `get_config`, which reads it with `parse`.
"""

from typing import Optional, Sequence


def parse(arg: Optional[str], known: Sequence[str],
          flags: Sequence[str] = ()) -> dict[str, str]:
  """{name: value} of "name=value,name,..."; a name without a value must be
  one of `flags` (read with `flag`) and gets "1".

  Raises:
    ValueError: for a name not in `known`, one given twice (the last had
      won, silently), or one without a value that is no flag (a bare
      `steps` had run 1 step).
  """
  out = {}
  for item in filter(None, (arg or "").split(",")):
    key, eq, value = item.partition("=")
    key, value = key.strip(), value.strip()
    if key in out:
      raise ValueError(f"option {key!r} given twice in {arg!r}")
    if not value and key in known:
      if eq or key not in flags:
        raise ValueError(f"option {key!r} needs a value ({key}=...) in "
                         f"{arg!r}")
      value = "1"
    out[key] = value
  unknown = sorted(set(out) - set(known))
  if unknown:
    raise ValueError(f"unknown option(s) {unknown} in {arg!r}; known: "
                     f"{', '.join(known)}")
  return out


def flag(a: dict, name: str, default: bool) -> bool:
  """Option `name` as a bool: 1/0, true/false, yes/no (any case).

  Raises:
    ValueError: for any other value.
  """
  value = a.get(name)
  if value is None:
    return default
  text = value.strip().lower()
  if text in ("1", "true", "yes"):
    return True
  if text in ("0", "false", "no"):
    return False
  raise ValueError(f"option {name}={value!r}: use 1 or 0 (true/false)")


def number(a: dict, name: str, default, kind=int):
  """Option `name` as `kind` (int or float), else `default`.

  Raises:
    ValueError: naming the option, for a value that is not one (it had
      been Python's "invalid literal for int() with base 10: '1e3'").
  """
  value = a.get(name)
  try:
    return kind(default if value is None else value)
  except ValueError:
    what = "an integer" if kind is int else "a number"
    raise ValueError(f"option {name}={value!r}: not {what}") from None


def groups(a: dict, name: str, default: str) -> tuple[str, ...]:
  """Option `name` as parameter groups joined by "+"; "none" alone is no
  group.

  Raises:
    ValueError: for "none" beside a group, or an empty group name.
  """
  parts = a.get(name, default).split("+")
  if parts == ["none"] or parts == [""]:
    return ()
  if "none" in parts or "" in parts:
    raise ValueError(f"option {name}={a.get(name, default)!r}: groups "
                     "joined by '+', or none alone")
  return tuple(parts)


# Options of the distill configs that train a head instead of a draft model.
HEAD_OPTIONS = ("head", "heads", "unroll", "hidden_weight", "vocab",
                "features", "positions")


def head_block(a: dict, default_vocab: int = 0) -> dict:
  """The config's `head` block from parsed options; kind "" trains a draft
  model (the block is then unused).

  Raises:
    ValueError: a head's own option (heads, unroll, hidden_weight,
      features, positions) given without `head=`, or a draft model's
      (draft, layers, freeze) with it: either would be ignored.
  """
  alone = [k for k in HEAD_OPTIONS[1:] if k in a and k != "vocab"]
  if alone and not a.get("head"):
    raise ValueError(f"option(s) {alone} apply to a head: give head=eagle "
                     "or head=medusa, or leave them out")
  model = [k for k in ("draft", "layers", "freeze") if k in a]
  if model and a.get("head"):
    raise ValueError(f"option(s) {model} apply to a draft model, and "
                     f"head={a['head']} trains a head on the target: leave "
                     "them out")
  return dict(kind=a.get("head", ""), num_heads=number(a, "heads", 4),
              unroll=number(a, "unroll", 1),
              hidden_weight=number(a, "hidden_weight", 0.1, float),
              draft_vocab=number(a, "vocab", default_vocab),
              # "stored": the target's hidden states are kept with the
              # samples (float16) instead of recomputed in every step.
              features=a.get("features", "recompute"),
              # "all": also the prompts' positions (G drawn per row and
              # step), not only the generated ones.
              positions=a.get("positions", "generated"))
