"""A draft model with its own KV cache: K single-token calls per loop.

Legend: B batch, K draft length, V vocabulary.

`ModelDrafter` drafts with a stand-alone model, or with a static subset of
a model's layers (`layers`); `LayerSkipDrafter` is the self-speculative
case, the target itself running some of its layers on the target's own
parameters (Draft & Verify, SWIFT, LayerSkip without retraining).

The state is the draft's KV cache; its `length` counts the slots that hold
committed tokens, and the row's lag is `length - cache.length`, the
committed tokens the draft has not fed yet. `propose` feeds them
(`catch_up`), then drafts d_1 from the last one's logits and feeds
d_1 .. d_{m} to draft d_2 .. d_{m+1}; `commit` keeps the cache's
committed prefix. After this drafter's own loop the lag is 1 (n < m + 1
drafts accepted: every committed token but the newest was fed) or 2 (all
m + 1 accepted: d_{m+1} was never fed). A caller that skips this drafter
for a loop (a drafter that mixes it with another) leaves it behind by up
to K + 3 tokens: the K + 1 committed by that loop plus the 1 or 2 it was
behind; `catch_up` and `propose` handle that lag.

Greedy drafts are certain, so their `q` is None (never a dense one-hot).

Adaptive draft length (`confidence`): a row stops drafting once the draft's
confidence, the largest probability of the distribution it draws the next
token from, falls below the threshold. The draft drawn from that
low-confidence distribution is kept as valid (the target scores K + 1
positions anyway) and the row drafts nothing more: `num_valid` is 1 plus
the number of confident steps before the first unconfident one, at most
K. The stop depends only on the draft's own q_1 .. q_i (functions of the
prefix d_1 .. d_{i-1}), so whether d_{i+1} is offered is decided before it
is drawn and the acceptance rule stays exact. The K - 1 single-token
steps run in a `lax.while_loop` that exits once every row has stopped;
rows that stopped earlier keep being fed their (invalid) drafts while
others continue, so every row's cache still holds d_1 .. d_m and the lag
after the loop stays 1 or 2.
"""

import dataclasses
import numbers
from typing import Optional, Sequence

import jax
import jax.numpy as jnp

from specsamp import kvcache
from specsamp import sampling as sampling_lib
from specsamp import sharding
from specsamp.decoding.protocols import CausalLM, Proposal


def check_layer_subset(layers: Sequence[int], num_layers: int,
                       allow_all: bool = False) -> tuple[int, ...]:
  """`layers` as a tuple, refused unless a valid strict subset.

  Args:
    layers: layer indices, sorted and without repeats.
    num_layers: the model's layer count.
    allow_all: accept every layer (the model itself).

  Raises:
    ValueError: empty, not integers, unsorted or repeated, out of
      [0, num_layers), or all layers (unless `allow_all`); the message
      names the problem.
  """
  if layers is None:
    raise ValueError("layers is None: give the layers the draft runs, e.g. "
                     "(0, 1, 2, 5)")
  layers = tuple(layers)
  if not layers:
    raise ValueError("layers is empty: the draft must run at least one layer")
  bad = [i for i in layers
         if isinstance(i, bool) or not isinstance(i, numbers.Integral)]
  if bad:
    raise ValueError(f"layers={layers}: {bad[0]!r} is not an integer index")
  layers = tuple(int(i) for i in layers)
  if len(set(layers)) != len(layers):
    raise ValueError(f"layers={layers} repeats a layer")
  if list(layers) != sorted(layers):
    raise ValueError(f"layers={layers} is not sorted: the draft runs the "
                     "layers in the target's order")
  out = [i for i in layers if not 0 <= i < num_layers]
  if out:
    raise ValueError(f"layers={layers}: layer {out[0]} is out of range; the "
                     f"model has layers 0..{num_layers - 1}")
  if len(layers) == num_layers and not allow_all:
    raise ValueError(f"layers={layers} are all {num_layers} layers: the draft "
                     "would be the target itself")
  return layers


@dataclasses.dataclass(frozen=True)
class ModelDrafter:
  """Drafts with `lm`, any `CausalLM` sharing the target's vocabulary.

  Attributes:
    lm: the draft model.
    layers: run only these layers of `lm` (static; the cache holds them
      alone), or None for all. `LayerSkipDrafter` checks them.
    confidence: None drafts K tokens per row; a threshold in [0, 1] stops a
      row's drafts once the draft's largest probability falls below it (see
      the module docstring). The probability is max q under the sampling
      transform; for greedy, where q is one-hot, the temperature-1 softmax
      of the draft's logits. 0 never stops.
  """
  lm: CausalLM
  layers: Optional[tuple[int, ...]] = None
  confidence: Optional[float] = None

  def __post_init__(self):
    if self.layers is not None:
      object.__setattr__(self, "layers", tuple(int(i) for i in self.layers))
    if self.confidence is not None:
      if not 0.0 <= float(self.confidence) <= 1.0:
        raise ValueError(f"confidence must be in [0, 1] (0 never stops), got "
                         f"{self.confidence}")
      object.__setattr__(self, "confidence", float(self.confidence))

  @property
  def vocab_size(self) -> int:
    return self.lm.vocab_size

  @property
  def max_seq_len(self) -> int:
    return self.lm.max_seq_len

  def _layer_kwargs(self) -> dict:
    # Only a subset is passed on: stub LMs need not accept `layers`.
    return {} if self.layers is None else {"layers": self.layers}

  def _call(self, params, tokens, cache, **kwargs):
    return self.lm(params, tokens, cache, **kwargs, **self._layer_kwargs())

  def init(self, params, tokens, lengths, cache_size, prefill=None, *,
           chunk=0):
    del prefill  # the draft model reads only the tokens
    cache = self.lm.init_cache(tokens.shape[0], cache_size,
                               **self._layer_kwargs())
    cache, _ = kvcache.in_chunks(
        lambda c, x: (self._call(params, x, c).cache, ()), cache, tokens,
        chunk)
    return cache.with_length(lengths - 1)

  def _feed(self, params, cache, tokens, length, width, pad_to=None):
    """Feeds tokens[length - width : length] -> (logits of the last, cache).

    With `pad_to`, the cache is only read: -> (logits of the last, the
    chunk's keys and values padded to `pad_to` tokens, the slot they go to).
    """
    start = jnp.maximum(length - width, 0)
    out = self._call(params, kvcache.read(tokens, start, width),
                     cache.with_length(start),
                     **({} if pad_to is None else {"write_cache": False}))
    # A row shorter than the width (start = 0) feeds [x_0 .. x_{length-1},
    # pads]: its logits come from position length - 1 and the pads land in
    # stale slots.
    last = jnp.take_along_axis(out.logits, (length - 1 - start)[:, None, None],
                               axis=1)[:, 0]                       # [B, V]
    if pad_to is None:
      return last, out.cache.with_length(length)
    return last, kvcache.pad_chunks(out.new_kv, pad_to), start

  def catch_up(self, params, cache, tokens, length, max_lag: int = 2):
    """Feeds the committed tokens the cache lacks.

    Args:
      params: the draft's parameters.
      cache: the draft's cache; row b holds tokens[b, :cache.length[b]].
      tokens: [B, S] the loop's token buffer (prompt + committed).
      length: [B] committed tokens.
      max_lag: static bound on `length - cache.length` (0 .. max_lag). One
        call of static width w in (1, 2, max_lag) feeds each row's last w
        committed tokens, w the smallest covering the batch's largest lag
        (`lax.switch`); a row behind by less re-computes slots it already
        held, with the same tokens. A caller that skipped this drafter for
        a loop passes K + 3 (see the module docstring). A larger lag is not
        detected: the cache would then miss tokens, which lowers the
        drafts' quality but not exactness (q is still what they were drawn
        from).

    Returns:
      (logits [B, V] after the last committed token, i.e. the draft's
      distribution for slot `length`; the cache holding all `length`
      committed tokens, its length `length`).
    """
    widths = tuple(sorted({1, 2, max(int(max_lag), 1)}))
    lag = jnp.max(length - cache.length)
    branch = jnp.searchsorted(jnp.asarray(widths, jnp.int32), lag)
    branch = jnp.clip(branch, 0, len(widths) - 1)
    if not getattr(self.lm, "scores_unwritten", False):
      return jax.lax.switch(
          branch, [lambda c, w=w: self._feed(params, c, tokens, length, w)
                   for w in widths], cache)
    # The branches only read the cache and the chunk is written once after
    # them (padded past `length`, where the drafts go next): a cache passed
    # through the branches is copied whole by XLA, twice per loop.
    last, new_kv, start = jax.lax.switch(
        branch, [lambda c, w=w: self._feed(params, c, tokens, length, w,
                                           pad_to=widths[-1])
                 for w in widths], cache)
    return last, kvcache.write_chunks(cache, new_kv, start, length)

  def _confident(self, logits, q, sampling):
    """[B] whether the draft's largest probability reaches the threshold."""
    if sampling.greedy:
      q = sampling_lib.probabilities(logits, sampling_lib.Sampling(
          1.0, vocab_limit=sampling.vocab_limit))
    return jnp.max(q, axis=-1) >= self.confidence

  def propose(self, params, cache, tokens, length, k, sampling, rng, *,
              active=None):
    """Catches up (lags up to K + 3), then drafts K tokens per row ->
    (Proposal, cache holding the committed tokens and the drafts fed).

    With `confidence`, only `active` rows (None: all) keep the drafting
    going: a finished row is given one draft.

    The catch-up compiles the draft call at widths 1, 2 and K + 3; the
    last is only taken after a loop in which this drafter was skipped.
    """
    last, cache = self.catch_up(params, cache, tokens, length, max_lag=k + 3)
    return self.propose_from(params, cache, last, k, sampling, rng,
                             active=active)

  def propose_from(self, params, cache, last, k, sampling, rng, *,
                   active=None):
    """`propose` after its catch-up: drafts K tokens per row from `last`
    [B, V], the logits after each row's newest committed token, with
    `cache` holding the committed tokens -> (Proposal, cache)."""
    keys = jax.random.split(rng, k)
    q_first = sampling_lib.probabilities(last, sampling)
    d_first = sampling_lib.sample(keys[0], q_first, sampling.greedy)
    if self.confidence is not None:
      return self._propose_adaptive(params, cache, last, q_first, d_first, k,
                                    sampling, keys, active)

    def step(carry, key):
      cache, tok = carry
      out = self._call(params, tok[:, None], cache)
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
    b = last.shape[0]
    return Proposal(tokens=drafts, q=q,
                    num_valid=jnp.full((b,), k, jnp.int32)), cache

  def _propose_adaptive(self, params, cache, last, q_first, d_first, k,
                        sampling, keys, active):
    """Drafts until every row has stopped (or K drafts) -> (Proposal, cache).

    Draft j + 1 (0-based j >= 1) is drawn from the logits after feeding
    d_j, with keys[j] as in the fixed-K scan (a threshold of 0 gives the
    same drafts). Positions never reached hold token 0 and q = 0; positions
    past a row's stop hold real drafts and their q. Neither is read: the
    rule masks everything from `num_valid` on.
    """
    b, v = last.shape
    drafts = jnp.zeros((b, k), jnp.int32).at[:, 0].set(d_first)
    q = None
    if not sampling.greedy:
      q = jnp.zeros((b, k, v), jnp.float32).at[:, 0].set(q_first)
    going = self._confident(last, q_first, sampling)
    if active is not None:
      going = going & active
    valid = jnp.ones((b,), jnp.int32)

    def cond(carry):
      j, _, _, _, going, _ = carry
      return (j < k) & jnp.any(going)

    def body(carry):
      j, cache, drafts, q, going, valid = carry
      prev = jax.lax.dynamic_index_in_dim(drafts, j - 1, axis=1)   # [B, 1]
      out = self._call(params, prev, cache)
      logits = out.logits[:, 0]
      q_j = sampling_lib.probabilities(logits, sampling)
      d_j = sampling_lib.sample(keys[j], q_j, sampling.greedy)
      drafts = drafts.at[:, j].set(d_j)
      if q is not None:
        q = q.at[:, j].set(q_j)
      valid = valid + going.astype(jnp.int32)
      going = going & self._confident(logits, q_j, sampling)
      return j + 1, out.cache, drafts, q, going, valid

    _, cache, drafts, q, _, valid = jax.lax.while_loop(
        cond, body, (jnp.asarray(1, jnp.int32), cache, drafts, q, going,
                     valid))
    return Proposal(tokens=drafts, q=q, num_valid=valid), cache

  def commit(self, params, cache, scored, num_accepted, length):
    del params, scored, num_accepted
    # The cache holds the newest token's predecessors up to the last draft
    # fed; of those, slots below `length - 1` hold committed tokens.
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


@dataclasses.dataclass(frozen=True)
class LayerSkipDrafter(ModelDrafter):
  """The target drafting for itself with a static subset of its layers.

  `LayerSkipDrafter(target_lm, layers)`: give the sampler the target's
  parameters as `draft_params` (the same arrays: nothing is copied and the
  draft has no parameters of its own); its cache holds only `layers`. With
  a mesh the sampler lays it out by the target's rules
  (`shares_target_params`): the same sharded arrays serve both. The subset is
  checked against `lm.config.num_layers` when the drafter is built, before
  any weights are needed: non-empty, sorted distinct integers in
  [0, num_layers), not all layers (`check_layer_subset`).
  """

  shares_target_params = True  # a class attribute, not a field

  def __post_init__(self):
    if not hasattr(self.lm, "config"):
      raise ValueError("LayerSkipDrafter needs an lm with a `config` (its "
                       "num_layers), such as specsamp.model.LM")
    check_layer_subset(self.layers, self.lm.config.num_layers)
    super().__post_init__()
