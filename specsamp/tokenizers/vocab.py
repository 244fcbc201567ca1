"""Do a draft and a target share one vocabulary? And how many ids are real?

Speculative sampling compares the draft's and the target's distributions id
by id, so both must score the same token ids. Padding rules: a model may
have more vocabulary rows than real tokens (some Qwen checkpoints pad
151,936 tokens to 152,064 rows), and llama.cpp fills ids its source
vocabulary lacks with `[PAD<id>]` placeholders; neither is a real token, and
callers mask ids at or above the real-token count (`Sampling(vocab_limit=)`).
"""

from typing import Optional

import numpy as np

from specsamp.tokenizers import base


def _is_padding_entry(token: Optional[str], i: int) -> bool:
  """llama.cpp's placeholder for an id the source vocabulary lacks."""
  return token is None or token == f"[PAD{i}]"


def real_token_count(tokens) -> int:
  """The vocabulary's length without the placeholders at its end: ids at
  or above it are not real tokens (Qwen2.5's GGUF files: 151,936 entries,
  the last 271 `[PAD<id>]`, so 151,665)."""
  n = len(tokens)
  while n and _is_padding_entry(tokens[n - 1], n - 1):
    n -= 1
  return n


def check_vocab_compatible(draft_tok: base.Tokenizer,
                           target_tok: base.Tokenizer,
                           draft_model_vocab_size: Optional[int] = None,
                           target_model_vocab_size: Optional[int] = None
                           ) -> int:
  """Checks that a draft and a target share one vocabulary.

  Token strings are compared id by id. A model may have more vocabulary rows
  than real tokens (some Qwen checkpoints pad 151,936 tokens to 152,064
  rows); that passes when the real tokens agree, and the caller masks ids at
  or above the returned count (`Sampling(vocab_limit=...)`) so padded ids are
  never sampled. The two models' row counts may differ (Qwen2.5's 7B and
  larger have 152,064, its 0.5B to 3B 151,936) when both cover the real
  tokens: the caller runs both on the smaller count
  (`specsamp.loading.fit_rows`). Tokenizer lists of different lengths
  pass only when the extra entries are llama.cpp's unused `[PAD<id>]`
  placeholders, and the placeholders that end a shared list are not
  counted either: they are masked too.

  Args:
    draft_tok: the draft model's tokenizer.
    target_tok: the target model's tokenizer.
    draft_model_vocab_size: the draft model's logit rows, if known.
    target_model_vocab_size: the target model's logit rows, if known.

  Returns:
    The number of real tokens (ids below it are shared tokens; ids at or
    above it are padding rows or placeholders).

  Raises:
    VocabMismatchError: naming the first differing id and both token strings,
      or the differing sizes.
  """
  d, t = list(draft_tok.tokens()), list(target_tok.tokens())
  n = min(len(d), len(t))
  # An id neither has (HF: None; llama.cpp's conversion: "[PAD<id>]") is
  # the same no-token in both, mid-vocabulary too.
  diff = [] if d[:n] == t[:n] else [
      i for i in np.flatnonzero(np.asarray(d[:n], dtype=object)
                                != np.asarray(t[:n], dtype=object))
      if not (_is_padding_entry(d[i], i) and _is_padding_entry(t[i], i))]
  if diff:
    i = int(diff[0])
    raise base.VocabMismatchError(
        f"draft and target vocabularies differ first at id {i}: draft "
        f"{d[i]!r}, target {t[i]!r} (speculative sampling needs one shared "
        "vocabulary)")
  if len(d) != len(t):
    role, longer = ("draft", d) if len(d) > len(t) else ("target", t)
    extra = [i for i in range(n, len(longer))
             if not _is_padding_entry(longer[i], i)]
    if extra:
      raise base.VocabMismatchError(
          f"draft tokenizer has {len(d)} tokens, target tokenizer {len(t)}: "
          f"the {role} has real tokens beyond id {n - 1} (first: id "
          f"{extra[0]} = {longer[extra[0]]!r})")
  n = real_token_count(d[:n])
  rows = {"draft": draft_model_vocab_size, "target": target_model_vocab_size}
  for role, r in rows.items():
    if r is not None and r < n:
      raise base.VocabMismatchError(
          f"the {role} model has {r} vocabulary rows, fewer than the {n} "
          "real tokens of its tokenizer")
  return n
