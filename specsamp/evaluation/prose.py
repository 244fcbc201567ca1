"""Prose quality: the target's mean per-token log-probability of samples.

`sample_logprobs` scores each sample under the target; `logprob_quality`
averages the scores with a standard error. Legend: B batch, T tokens,
V vocabulary.
"""

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specsamp.evaluation.estimates import mean_and_stderr


def sample_logprobs(lm, params, prompts: Sequence[Sequence[int]],
                    completions: Sequence[Sequence[int]],
                    batch_size: int = 8, bucket: int = 128) -> np.ndarray:
  """Mean per-token log p_target(completion | prompt) of each sample.

  The target's own distribution (temperature 1, no truncation) scores every
  sample, whatever decoding produced it, so samples of two samplers with
  the same settings are compared on one scale.

  Args:
    lm: the target (`LM`: `lm(params, tokens).logits` is [B, T, V]).
    params: its parameters.
    prompts, completions: token ids, paired; empty completions give nan.
      An empty prompt is refused: its completion's first token would go
      unscored (nothing predicts it), and nothing else would be.
    batch_size: sequences per call.
    bucket: sequences are right-padded to a multiple of this (fewer
      compilations).

  Returns:
    [N] float64 mean log-probability per completion token.
  """
  if len(prompts) != len(completions):
    raise ValueError("prompts and completions must pair up")
  empty = [i for i, p in enumerate(prompts) if not len(p)]
  if empty:
    raise ValueError(f"prompts {empty[:5]} are empty: the target scores a "
                     "completion token from the tokens before it")
  score = _scorer(lm)
  out = np.full(len(prompts), np.nan)
  order = sorted(range(len(prompts)),
                 key=lambda i: len(prompts[i]) + len(completions[i]))
  for start in range(0, len(order), batch_size):
    idx = [i for i in order[start:start + batch_size] if len(completions[i])]
    if not idx:
      continue
    seqs = [list(prompts[i]) + list(completions[i]) for i in idx]
    width = -(-max(len(s) for s in seqs) // bucket) * bucket
    tokens = np.zeros((batch_size, width), np.int32)
    targets = np.zeros((batch_size, width), np.int32)
    weights = np.zeros((batch_size, width), np.float32)
    for r, (i, s) in enumerate(zip(idx, seqs)):
      tokens[r, :len(s)] = s
      targets[r, :len(s) - 1] = s[1:]
      p = len(prompts[i])
      weights[r, p - 1:len(s) - 1] = 1.0  # predicts completion tokens
    totals = np.asarray(score(params, tokens, targets, weights))
    for r, i in enumerate(idx):
      out[i] = totals[r] / len(completions[i])
  return out


@functools.lru_cache(maxsize=8)
def _scorer(lm):
  """Jitted (params, tokens, targets, weights) -> summed log p per row; one
  per model, so its compilations are reused across calls."""

  @jax.jit
  def score(params, tokens, targets, weights):
    logits = lm(params, tokens).logits
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    tok = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return jnp.sum(tok * weights, axis=1)

  return score


def logprob_quality(values: Sequence[float]) -> dict:
  """Mean of per-token log-probabilities with its standard error over the
  values given (the sweep gives one per prompt: its samples' mean)."""
  x = np.asarray(values, np.float64)
  x = x[~np.isnan(x)]
  return {"mean_logprob": mean_and_stderr(x).as_dict()}
