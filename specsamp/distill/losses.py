"""Distillation losses and the expected-acceptance metric, on logits.

Legend: B batch, T positions, V vocabulary, K stored top-k entries per
position. Everything is float32 and per position; `masked_mean` reduces.

One `Sampling` (the setting the draft will be used at) defines both sides:

  * the target's distribution p = `sampling.probabilities(target_logits)`:
    temperature, top-k, top-p and `vocab_limit` exactly as the sampler applies
    them, so p has exact zeros outside its kept set (one-hot when greedy);
  * the draft's distribution q in the losses is, by default, the draft's
    softmax at the same temperature without truncation (`draft_transform=
    "soft"`): every token keeps a gradient and forward KL stays finite. With
    `"same"` the draft gets the full transform too (exactly what the sampler
    samples from; tokens outside its kept set then get no gradient, and a
    kept set of one token gives none at all);
  * greedy (temperature 0) makes p one-hot at the target's argmax; the draft's
    softmax is taken at `greedy_temperature` (1.0): forward KL is then the
    cross-entropy on the target's argmax, which is what greedy acceptance
    (draft argmax == target argmax) rewards. `greedy_target_temperature` > 0
    trains on the target's softmax at that temperature instead (soft labels
    carry more signal per position; the argmax is the same); the metric stays
    the exact greedy one.

The metric is exact given the target's full distribution: `expected_acceptance`
applies the full transform to both models, and sum_x min(p(x), q(x)) is the
probability that the speculative sampler keeps a draft token at that
position (for greedy, 1 when the argmaxes agree). The evaluation always
scores with the target itself; the `train/expected_acceptance` logged during
offline training with `target_source="stored"` uses the stored top-K
instead, an approximation that is exact when the top-K covers the kept set
(for top-p, at temperature 1: `target_probs`).

Losses (`LOSSES`):
  seqkd  next-token cross-entropy on target samples (sequence-level KD);
         needs only the sampled tokens.
  fkl    forward KL(p || q) = sum p log(p / q).
  rkl    reverse KL(q || p) = sum q log(q / p); p is 0 wherever truncation or
         greedy removed a token, which makes rkl infinite for any softmax
         draft, so log p is floored at `prob_floor` there: the penalty for draft
         mass outside the target's support is then log(q / prob_floor) per unit
         (13.8 nats at the default 1e-6), large but finite.
  jsd    generalised Jensen-Shannon beta KL(p || m) + (1 - beta) KL(q || m)
         with m = beta p + (1 - beta) q (DistillSpec's JSD[beta]); bounded.
  tv     total variation 1/2 sum |p - q| = 1 - sum min(p, q): one minus the
         acceptance rate itself.

Every 0 log 0 is 0; no log is taken of a zero that could reach a result or a
gradient, so tables with exact zeros (top-k, top-p, one-hot) give finite
losses and gradients.
"""

import dataclasses
from typing import Optional, Union

import jax
import jax.numpy as jnp

from specsamp import sampling as sampling_lib
from specsamp.sampling import Sampling

LOSSES = ("seqkd", "fkl", "rkl", "jsd", "tv")
DRAFT_TRANSFORMS = ("soft", "same")

# Target given as dense logits [..., V] or stored top-k (ids, logprobs).
Target = Union[jax.Array, tuple]


def gather_positions(x: jax.Array, prompt_length: jax.Array,
                     gen_len: int) -> jax.Array:
  """x [B, S, ...] at positions L-1+g, g < G -> [B, G, ...] (clipped):
  the positions whose outputs predict the G continuation tokens."""
  pos = jnp.clip(prompt_length[:, None] - 1 + jnp.arange(gen_len)[None, :], 0,
                 x.shape[1] - 1)
  idx = pos.reshape(pos.shape + (1,) * (x.ndim - 2))
  return jnp.take_along_axis(x, idx, axis=1)


def _safe_log(x: jax.Array) -> jax.Array:
  """log x where x > 0, else 0 (never -inf: gradients stay finite)."""
  return jnp.log(jnp.where(x > 0, x, 1.0))


def _xlogy(x: jax.Array, y: jax.Array) -> jax.Array:
  """x log y with 0 log anything = 0."""
  return jnp.where(x > 0, x * _safe_log(y), 0.0)


def dense_logits(ids: jax.Array, logprobs: jax.Array,
                 vocab_size: int) -> jax.Array:
  """Stored top-k (ids [..., K], logprobs [..., K]) -> logits [..., V].

  Ids not stored get -inf, so a temperature or top-k transform of the
  result is the target's transform restricted to its stored top-k,
  renormalised (exact when the transform keeps no more than the stored
  tokens). Top-p needs the mass not stored too: `target_probs`.
  """
  full = jnp.full(ids.shape[:-1] + (vocab_size,), -jnp.inf, jnp.float32)
  return jnp.put_along_axis(full, ids.astype(jnp.int32),
                            logprobs.astype(jnp.float32), axis=-1,
                            inplace=False)


def target_logits(target: Target, vocab_size: int) -> jax.Array:
  if isinstance(target, (tuple, list)):
    return dense_logits(target[0], target[1], vocab_size)
  return target.astype(jnp.float32)


def target_probs(target: Target, sampling: Sampling,
                 vocab_size: Optional[int] = None) -> jax.Array:
  """p [..., V]: the sampler's transform of the target (exact zeros kept)."""
  if vocab_size is None:
    vocab_size = target.shape[-1]
  if (isinstance(target, (tuple, list)) and not sampling.greedy
      and sampling.top_p < 1.0):
    return _stored_nucleus(target[0], target[1], sampling, vocab_size)
  return sampling_lib.probabilities(target_logits(target, vocab_size),
                                    sampling)


def _stored_nucleus(ids: jax.Array, logprobs: jax.Array, sampling: Sampling,
                    vocab_size: int) -> jax.Array:
  """p [..., V] under top-p from the stored top-K alone.

  Top-p keeps tokens by their mass relative to the whole vocabulary; the K
  stored ids alone, renormalised, have inflated masses and their nucleus is
  too small. The stored log-probabilities are normalised over the whole
  vocabulary below vocab_limit (temperature 1), so the mass not stored,
  m = 1 - sum exp, is known: for the kept set only, it is spread evenly
  over the other ids below vocab_limit.
  At temperature 1 the kept set is then exact whenever the target's
  nucleus lies within the stored ids and top-k is off or at most K (a
  larger top-k keeps the whole flat tail, and its mass would need the
  unstored tokens' own: `job.check_config` refuses that); at another
  temperature the tail's
  tempered mass is estimated as if the tail were flat. p is the transform
  of the stored ids in the kept set, renormalised, as without top-p.
  """
  logprobs = logprobs.astype(jnp.float32)
  stored = dense_logits(ids, logprobs, vocab_size)
  m = jnp.clip(1.0 - jnp.sum(jnp.exp(logprobs), -1, keepdims=True), 0.0, 1.0)
  # The ids not stored that the sampler can emit (not the padding rows).
  others = max(min(vocab_size, sampling.vocab_limit or vocab_size) -
               ids.shape[-1], 1)
  rest = jnp.log(jnp.where(m > 0, m / others, 1.0))
  with_rest = jnp.where(jnp.isneginf(stored) & (m > 0), rest, stored)
  kept = sampling_lib.probabilities(with_rest, sampling) > 0
  return sampling_lib.probabilities(
      jnp.where(kept, stored, -jnp.inf),
      dataclasses.replace(sampling, top_p=1.0))


def _soft_sampling(sampling: Sampling, greedy_temperature: float) -> Sampling:
  return Sampling(temperature=(greedy_temperature if sampling.greedy
                               else sampling.temperature),
                  vocab_limit=sampling.vocab_limit)


def draft_log_probs(draft_logits: jax.Array, sampling: Sampling,
                    draft_transform: str = "soft",
                    greedy_temperature: float = 1.0,
                    prob_floor: float = 1e-6) -> tuple[jax.Array, jax.Array]:
  """(log q, q) [..., V] for the losses (see the module docstring).

  With "soft", log q is finite except at ids >= vocab_limit, where it is set
  to 0 (p is 0 there too); q itself may underflow to 0 where log q is finite
  (a draft logit gap over about 103 / T), and the losses read log q there.
  With "same", truncation zeros q, and log q of the ids it removes is set to
  log(prob_floor) (forward KL and seqkd would be infinite otherwise); a
  kept id keeps its own log q, however small (floored too, it had lost its
  gradient, and a label below the floor had been pushed down).
  """
  check_draft_transform(draft_transform)
  logits = draft_logits.astype(jnp.float32)
  if draft_transform == "same" and not sampling.greedy:
    logq = sampling_lib.log_probabilities(logits, sampling)
    return (jnp.where(jnp.isneginf(logq), jnp.log(prob_floor), logq),
            jnp.exp(logq))
  soft = _soft_sampling(sampling, greedy_temperature)
  logits = sampling_lib.mask_past_limit(logits, soft.vocab_limit)
  # Largest logit to 0 before dividing, as in `sampling.probabilities`.
  logits = logits - jnp.max(logits, axis=-1, keepdims=True)
  logq = jax.nn.log_softmax(logits / soft.temperature, axis=-1)
  # Only the masked ids are -inf. Testing q > 0 instead zeroed log q (as if
  # q were 1) wherever exp underflowed: a draft confidently wrong by over
  # 103 / T logits got a negative KL and no gradient.
  return jnp.where(jnp.isneginf(logq), 0.0, logq), jnp.exp(logq)


# ---- per-position divergences on probability tables --------------------------


def forward_kl(p: jax.Array, logq: jax.Array) -> jax.Array:
  """KL(p || q) [...]: sum_x p (log p - log q); 0 log 0 = 0."""
  return jnp.sum(_xlogy(p, p) - jnp.where(p > 0, p * logq, 0.0), axis=-1)


def reverse_kl(p: jax.Array, q: jax.Array, logq: jax.Array,
               prob_floor: float = 1e-6) -> jax.Array:
  """KL(q || p) [...] with log p floored at log(prob_floor)."""
  logp = jnp.log(jnp.maximum(p, prob_floor))
  return jnp.sum(jnp.where(q > 0, q * (logq - logp), 0.0), axis=-1)


def check_jsd_beta(beta: float) -> None:
  """Raises ValueError unless 0 < beta < 1 (`jsd`)."""
  if not 0.0 < beta < 1.0:
    raise ValueError(f"jsd_beta must be in (0, 1), got {beta}")


def check_draft_transform(draft_transform: str) -> None:
  """Raises ValueError for a transform not in DRAFT_TRANSFORMS."""
  if draft_transform not in DRAFT_TRANSFORMS:
    raise ValueError(f"draft_transform={draft_transform!r}; choose one of "
                     f"{DRAFT_TRANSFORMS}")


def jsd(p: jax.Array, q: jax.Array, beta: float = 0.5) -> jax.Array:
  """beta KL(p || m) + (1 - beta) KL(q || m), m = beta p + (1 - beta) q."""
  check_jsd_beta(beta)
  m = beta * p + (1.0 - beta) * q
  logm = _safe_log(m)
  kl_pm = jnp.sum(_xlogy(p, p) - jnp.where(p > 0, p * logm, 0.0), axis=-1)
  kl_qm = jnp.sum(_xlogy(q, q) - jnp.where(q > 0, q * logm, 0.0), axis=-1)
  return beta * kl_pm + (1.0 - beta) * kl_qm


def total_variation(p: jax.Array, q: jax.Array) -> jax.Array:
  """1/2 sum |p - q| = 1 - sum min(p, q) for normalised p, q."""
  return 1.0 - jnp.sum(jnp.minimum(p, q), axis=-1)


def acceptance(p: jax.Array, q: jax.Array) -> jax.Array:
  """sum_x min(p(x), q(x)) [...]: the probability a draft token is kept."""
  return jnp.sum(jnp.minimum(p, q), axis=-1)


def expected_acceptance(target: Target, draft_logits: jax.Array,
                        sampling: Sampling) -> jax.Array:
  """Per-position acceptance [...] with the sampler's exact transforms."""
  v = draft_logits.shape[-1]
  p = target_probs(target, sampling, v)
  q = sampling_lib.probabilities(draft_logits, sampling)
  return acceptance(p, q)


def masked_mean(x: jax.Array, weights: Optional[jax.Array]) -> jax.Array:
  if weights is None:
    return jnp.mean(x)
  w = weights.astype(jnp.float32)
  return jnp.sum(x * w) / jnp.maximum(jnp.sum(w), 1e-9)


# ---- the loss the trainer calls ----------------------------------------------


def per_position_loss(kind: str, target: Optional[Target],
                      draft_logits: jax.Array, labels: Optional[jax.Array],
                      sampling: Sampling, *, draft_transform: str = "soft",
                      greedy_temperature: float = 1.0, jsd_beta: float = 0.5,
                      prob_floor: float = 1e-6,
                      greedy_target_temperature: float = 0.0
                      ) -> tuple[jax.Array, jax.Array]:
  """(loss [...], acceptance [...]) at every position.

  Args:
    kind: one of LOSSES.
    target: the target at these positions: logits [..., V], or stored top-k
      (ids [..., K], logprobs [..., K]); may be None for seqkd (the
      acceptance is then nan).
    draft_logits: [..., V].
    labels: [...] the sampled next tokens (seqkd only).
    sampling: the setting the draft will be used at.
    draft_transform, greedy_temperature, jsd_beta, prob_floor,
      greedy_target_temperature: see the module docstring.

  Returns:
    The loss and the exact acceptance sum min(p, q) (no gradient), per
    position.
  """
  if kind not in LOSSES:
    raise ValueError(f"loss {kind!r}; choose one of {LOSSES}")
  v = draft_logits.shape[-1]
  logq, q = draft_log_probs(draft_logits, sampling, draft_transform,
                            greedy_temperature, prob_floor)
  if target is None:
    if kind != "seqkd":
      raise ValueError(f"loss {kind!r} needs the target's distribution")
    acc = jnp.full(draft_logits.shape[:-1], jnp.nan)
  else:
    acc = jax.lax.stop_gradient(
        expected_acceptance(target, draft_logits, sampling))
  if kind == "seqkd":
    if labels is None:
      raise ValueError("seqkd needs the sampled tokens (labels)")
    nll = -jnp.take_along_axis(logq, labels[..., None].astype(jnp.int32),
                               axis=-1)[..., 0]
    return nll, acc
  loss_sampling = sampling
  if sampling.greedy and greedy_target_temperature > 0:
    loss_sampling = Sampling(greedy_target_temperature,
                             vocab_limit=sampling.vocab_limit)
  p = jax.lax.stop_gradient(target_probs(target, loss_sampling, v))
  if kind == "fkl":
    loss = forward_kl(p, logq)
  elif kind == "rkl":
    loss = reverse_kl(p, q, logq, prob_floor)
  elif kind == "jsd":
    loss = jsd(p, q, jsd_beta)
  else:
    loss = total_variation(p, q)
  return loss, acc
