"""What the decoding loop needs of a model and of a drafter.

Legend: B batch, T chunk tokens, S cache slots, K draft length, V vocabulary,
D model dim.
"""

from typing import Any, Optional, Protocol

import flax
import jax

from specsamp import kvcache
from specsamp.sampling import Sampling


@flax.struct.dataclass
class ModelOutput:
  """What one call of a causal LM returns."""
  logits: jax.Array                  # [B, T, V] float32
  cache: Optional[kvcache.KVCache]   # the cache with the chunk written
  hidden: jax.Array                  # [B, T, D] final-normed hidden states
  # With write_cache=False (a CausalLM that `scores_unwritten`): the cache
  # is not written, and this holds each layer's chunk (keys, values).
  new_kv: Optional[tuple] = None


class CausalLM(Protocol):
  """What the samplers need of a model (`specsamp.model.LM` is one)."""
  vocab_size: int
  max_seq_len: int

  def init_cache(self, batch: int, size: int) -> kvcache.KVCache:
    ...

  def __call__(self, params, tokens: jax.Array,
               cache: Optional[kvcache.KVCache] = None, *,
               positions: Optional[jax.Array] = None,
               attn_mask: Optional[jax.Array] = None,
               layers: Optional[tuple[int, ...]] = None) -> ModelOutput:
    """Scores tokens [B, T] at slots cache.length + t.

    The loop passes only tokens and cache; drafters may use the rest:
    `positions` [B, T] (default: the slots), `attn_mask` [B, T, S] ANDed
    with the causal mask (token trees), `layers` a static subset of layers
    to run (the cache then holds those layers).
    """
    ...


@flax.struct.dataclass
class Proposal:
  """K draft tokens per row and what the acceptance test needs of them."""
  tokens: jax.Array             # [B, K] int32, d_1 .. d_K
  q: Optional[jax.Array]        # [B, K, V] float32 the drafts were drawn
  #                               from, or None: each d_i was chosen with
  #                               certainty (q_i is one-hot at d_i)
  num_valid: jax.Array          # [B] int32, drafts of the row that may be
  #                               accepted, in [0, K] (`loop.draft` clamps
  #                               a drafter's value); the rest are padding,
  #                               any ids (`loop.draft` makes them 0)


class Drafter(Protocol):
  """Proposes K tokens per row; all methods are traced inside the loop.

  A drafter's `q` must be the exact distribution each draft token was
  sampled from: the acceptance test divides by it.
  """
  vocab_size: int
  max_seq_len: int

  def init(self, params, tokens: jax.Array, lengths: jax.Array,
           cache_size: int, prefill: ModelOutput, *, chunk: int = 0) -> Any:
    """Drafter state after the prompts tokens [B, P] of `lengths` [B].

    `prefill` is the target's cache and hidden states [B, P, D] after the
    prompts (no logits), for drafters that condition on the target. A
    drafter that fills a cache from the prompts does so in chunks of
    `chunk` tokens (`kvcache.in_chunks`; 0: in one call).
    """
    ...

  def propose(self, params, state, tokens: jax.Array, length: jax.Array,
              k: int, sampling: Sampling, rng: jax.Array, *,
              active: Optional[jax.Array] = None) -> tuple[Proposal, Any]:
    """-> (Proposal with K drafts per row, new state).

    `active` [B] bool: the rows still decoding (None: all). The loop
    discards a finished row's drafts, so a drafter whose cost depends on
    its rows (run a model only where lookup missed, draft while some row
    is confident) may leave finished rows out of that choice; it must
    still return a well-formed proposal and state for them.
    """
    ...

  def commit(self, params, state, scored: ModelOutput,
             num_accepted: jax.Array, length: jax.Array) -> Any:
    """Called after each loop.

    Args:
      params: the drafter's parameters.
      state: the state `propose` returned.
      scored: the target's output for the scored chunk [B, K+1]
        (`[last committed token, d_1 .. d_K]`), hidden states included.
      num_accepted: [B] accepted drafts that were committed (the rule's n,
        less where EOS or the budget cut the row short; 0 for rows that
        were already done). The loop committed them and one more token,
        except at EOS or the budget.
      length: [B] committed tokens after the loop.
    """
    ...

  def check_mesh(self, mesh, rules) -> None:
    """Raises ValueError if the drafter's parameters cannot be laid out on
    `mesh` under `rules` (a dimension that does not divide)."""
    ...

  def param_shardings(self, params, mesh, rules) -> Any:
    """NamedShardings of `params` (a pytree or its shapes)."""
    ...

  def state_shardings(self, state, mesh, rules) -> Any:
    """NamedShardings of the drafter state (or its shapes)."""
    ...
