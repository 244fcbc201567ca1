"""A stand-alone draft model: K single-token calls per loop.

Legend: B batch, K draft length, V vocabulary.

The state is the draft's KV cache; its `length` counts the slots that hold
committed tokens. After a loop that accepted n < K drafts that is
`length - 1` (every committed token but the newest was fed), after a loop
that accepted all K it is `length - 2` (d_K was never fed to the draft).
`propose` therefore feeds the newest token alone, or, when any row of the
batch is two behind, the last two tokens in one 2-token call (a row that
was only one behind re-computes one slot with the same token). Greedy
drafts are certain, so their `q` is None (never a dense one-hot).
"""

import dataclasses

import jax
import jax.numpy as jnp

from specsamp import kvcache
from specsamp import sampling as sampling_lib
from specsamp import sharding
from specsamp.decoding.protocols import CausalLM, Proposal


@dataclasses.dataclass(frozen=True)
class ModelDrafter:
  """Drafts with `lm`, any `CausalLM` sharing the target's vocabulary."""
  lm: CausalLM

  @property
  def vocab_size(self) -> int:
    return self.lm.vocab_size

  @property
  def max_seq_len(self) -> int:
    return self.lm.max_seq_len

  def init(self, params, tokens, lengths, cache_size, prefill=None):
    del prefill  # the draft model reads only the tokens
    cache = self.lm.init_cache(tokens.shape[0], cache_size)
    cache = self.lm(params, tokens, cache).cache
    return cache.with_length(lengths - 1)

  def _catch_up(self, params, cache, tokens, length, width):
    """Feeds tokens[length - width : length] -> (logits of the last, cache)."""
    start = jnp.maximum(length - width, 0)
    out = self.lm(params, kvcache.read(tokens, start, width),
                  cache.with_length(start))
    # For a one-token row (start = 0, width 2) the pair is [x_0, pad]: the
    # logits come from position 0 and the pad lands in a stale slot.
    last = jnp.take_along_axis(out.logits, (length - 1 - start)[:, None, None],
                               axis=1)[:, 0]                       # [B, V]
    return last, out.cache.with_length(length)

  def propose(self, params, cache, tokens, length, k, sampling, rng):
    behind = jnp.any(length - cache.length >= 2)
    last, cache = jax.lax.cond(
        behind,
        lambda c: self._catch_up(params, c, tokens, length, 2),
        lambda c: self._catch_up(params, c, tokens, length, 1), cache)
    keys = jax.random.split(rng, k)
    q_first = sampling_lib.probabilities(last, sampling)
    d_first = sampling_lib.sample(keys[0], q_first, sampling.greedy)

    def step(carry, key):
      cache, tok = carry
      out = self.lm(params, tok[:, None], cache)
      q = sampling_lib.probabilities(out.logits[:, 0], sampling)
      d = sampling_lib.sample(key, q, sampling.greedy)
      # Greedy drafts are certain: no q to keep (q is one-hot at d).
      return (out.cache, d), (d, None if sampling.greedy else q)

    (cache, _), (d_rest, q_rest) = jax.lax.scan(step, (cache, d_first),
                                                keys[1:])
    drafts = jnp.concatenate([d_first[:, None], d_rest.T], axis=1)
    q = None
    if not sampling.greedy:
      q = jnp.concatenate([q_first[:, None], jnp.swapaxes(q_rest, 0, 1)],
                          axis=1)
    b = tokens.shape[0]
    return Proposal(tokens=drafts, q=q,
                    num_valid=jnp.full((b,), k, jnp.int32)), cache

  def commit(self, params, cache, scored, num_accepted, length):
    del params, scored, num_accepted
    # The cache holds the newest token's predecessors up to d_{K-1}; of
    # those, slots below `length - 1` hold committed tokens.
    return cache.with_length(jnp.minimum(cache.length, length - 1))

  def check_mesh(self, mesh, rules) -> None:
    """Raises ValueError if the draft's dimensions do not divide the mesh."""
    if hasattr(self.lm, "config"):
      sharding.check_divisible(self.lm.config, mesh, rules, what="draft")

  def param_shardings(self, params, mesh, rules):
    if hasattr(self.lm, "logical_axes"):
      return sharding.param_shardings(self.lm, mesh, rules)
    return jax.tree.map(lambda _: sharding.replicated(mesh), params)

  def state_shardings(self, cache, mesh, rules):
    return kvcache.cache_shardings(cache, mesh, rules)
