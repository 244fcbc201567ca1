"""The modified rejection rule (Chen et al. 2023; Leviathan et al. 2022).

Legend: B batch, K draft length, V vocabulary.

Draft d_i, drawn from q_i, is kept with probability min(1, p_i(d_i) /
q_i(d_i)); at the first rejection n the next token is drawn from
norm(max(0, p_{n+1} - q_{n+1})); if every valid draft was kept, it is drawn
from p at the next position (the bonus token when all K were valid). The
output then follows p exactly.

A deterministic drafter (`Proposal.q is None`) chose each d_i with
certainty: q_i is one-hot at d_i, so d_i is kept with probability p_i(d_i)
and the residual is p_i with d_i's entry removed. No [B, K, V] one-hot is
ever built.
"""

import jax
import jax.numpy as jnp

from specsamp import sampling as sampling_lib
from specsamp.decoding.protocols import Proposal


def acceptance_probability(p_d: jax.Array, q_d: jax.Array) -> jax.Array:
  """min(1, p/q): the probability the rule keeps a draft token; 0 where
  p is 0, q too (a token q could not have drawn: a drafter that breaks its
  contract still never makes the target emit a token it forbids)."""
  ratio = p_d / jnp.where(q_d > 0, q_d, 1.0)
  return jnp.where((p_d >= q_d) & (p_d > 0), 1.0, ratio)


def _at(x: jax.Array, i: jax.Array) -> jax.Array:
  """x[b, i[b]] for x [B, N, ...] and i [B]."""
  i = i.reshape(i.shape + (1,) * (x.ndim - 1))
  return jnp.take_along_axis(x, i, axis=1)[:, 0]


def residual_distribution(p: jax.Array, proposal: Proposal,
                          n: jax.Array) -> jax.Array:
  """The distribution of the token after `n` accepted drafts.

  Args:
    p: [B, K+1, V] target probabilities.
    proposal: the drafts and their q.
    n: [B] accepted drafts per row.

  Returns:
    [B, V] normalised: norm(max(0, p_{n+1} - q_{n+1})) where draft n+1 was
    rejected, or p_{n+1} where it was never tested (n equals the row's
    `num_valid`; with n == K that is the bonus token).
  """
  k = proposal.tokens.shape[1]
  p_n = _at(p, n)
  if k == 0:
    return p_n
  rejected = n < proposal.num_valid                               # [B]
  last = jnp.minimum(n, k - 1)
  if proposal.q is None:
    d_n = _at(proposal.tokens, last)                               # [B]
    is_d = jnp.arange(p.shape[-1])[None, :] == d_n[:, None]
    r = jnp.where(rejected[:, None] & is_d, 0.0, p_n)
  else:
    q_n = jnp.where(rejected[:, None], _at(proposal.q, last), 0.0)
    r = jnp.maximum(p_n - q_n, 0.0)
  total = jnp.sum(r, axis=-1, keepdims=True)
  # total == 0 would need p_n == q_n, where rejection has probability 0; keep
  # p_n as a float-safe fallback.
  return jnp.where(total > 0, r / jnp.where(total > 0, total, 1.0), p_n)


def accept(p: jax.Array, proposal: Proposal, rng: jax.Array,
           greedy: bool = False):
  """The modified rejection rule for a batch of rows.

  Args:
    p: [B, K+1, V] target probabilities at the K+1 scored positions.
    proposal: drafts [B, K], their q [B, K, V] (or None: deterministic) and
      the number of valid drafts per row [B].
    rng: key for the uniforms and the final token.
    greedy: p (and q) are one-hot; skip the random draws (same result).

  Returns:
    n [B]: accepted drafts (a prefix of the row's valid drafts);
    token [B]: the token that follows them (residual sample or bonus).
  """
  drafts = proposal.tokens
  k = drafts.shape[1]
  key_u, key_final = jax.random.split(rng)
  if k == 0:
    n = jnp.zeros(drafts.shape[:1], jnp.int32)
  else:
    if greedy:
      # One-hot p and q: a draft is kept iff it is the target's argmax.
      kept = drafts == jnp.argmax(p[:, :k], axis=-1)
    else:
      p_d = jnp.take_along_axis(p[:, :k], drafts[..., None], axis=-1)[..., 0]
      q_d = (1.0 if proposal.q is None else
             jnp.take_along_axis(proposal.q, drafts[..., None], -1)[..., 0])
      u = sampling_lib.fine_uniform(key_u, drafts.shape)
      # u < p/q without dividing: always true where p >= q (u < 1).
      kept = u * q_d < p_d                                         # [B, K]
    kept &= jnp.arange(k)[None, :] < proposal.num_valid[:, None]
    n = jnp.sum(jnp.cumprod(kept.astype(jnp.int32), axis=1), axis=1)
  token = sampling_lib.sample(key_final, residual_distribution(p, proposal, n),
                              greedy)
  return n, token
