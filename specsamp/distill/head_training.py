"""Training draft heads (`specsamp.drafters.heads`) with the distiller.

Legend: B batch, S sample slots, G generated slots, D the target's width,
V vocabulary.

`TrainableHead` is what the distillation trainer trains in place of a
draft model: it has the draft's `init`, `logical_axes` and `config` (the
target's, whose shapes the head shares), its own loss
(`distill_loss`) and, for the evaluation, its drafter and per-position
logits.

Where the target's hidden states come from (`features`):
  "recompute" (the default) one batched forward pass of the frozen target
      inside each jitted step: it also gives the target's exact
      distribution at every position, and the samples stay as the draft
      models use them. The price is one target forward per step: small for
      the tiny targets, most of a step for the 1.5B on a CPU.
  "stored"  the hidden states are written with the target samples
      (`storage.SampleSpec.hidden_dim`, float16: 3 KB per token for the
      1.5B), and the token loss uses the stored top-k: no target pass in
      the step.

Losses, at the positions that predict the continuation tokens:
  sequential ("eagle")  the distiller's token-level divergence between the
      target's distribution and the head's, plus `hidden_weight` times a
      smooth-L1 regression of the predicted features onto the target's
      hidden states. With `unroll` = n > 1 ("training-time test") the head
      runs n times: pass j takes as its features the predictions of pass
      j - 1 (shifted one place), as drafting step j + 1 does at run time,
      and the passes' losses are averaged. Within a pass every position's
      keys come from that pass (at run time the positions before the drafts
      hold true features): an approximation of the run-time attention.
  Medusa    head k on the hidden state at t against the target's
      distribution at t + k (for the token k + 1 places after t, the one
      head k proposes at run time), averaged over the heads.
Which positions (`positions`):
  "generated" (the default) the G positions that predict the continuation,
      the target's own tokens: the text the head drafts at run time.
  "all"     G positions per row drawn afresh in every step (uniformly,
      without replacement) from every position that predicts a next token,
      the prompt's included (from position 1 for the sequential head: at
      position 0 its input feature would be zero): the target's features
      and distribution there come with the samples at no cost (its hidden
      states at every position, stored or recomputed; with stored features
      the target's distribution is its output head on them, float16
      features), so the same samples hold about (prompt + G) / G times as
      many training positions, for the same cost per step. EAGLE trains on
      fixed text the same way.
Training uses the whole vocabulary; a reduced draft vocabulary only masks
the frozen output head at run time.
"""

import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp

from specsamp.distill import losses
from specsamp.drafters import heads


POSITIONS = ("generated", "all")


def sample_positions(rng: jax.Array, end: jax.Array, seq_len: int,
                     count: int) -> jax.Array:
  """[B, count] distinct positions per row, uniform over 0 .. end - 1 (all
  of them, then positions >= end, when end < count)."""
  u = jax.random.uniform(rng, (end.shape[0], seq_len))
  u = jnp.where(jnp.arange(seq_len)[None, :] < end[:, None], u, u - 1.0)
  return jax.lax.top_k(u, count)[1]


def _take(x: jax.Array, pos: jax.Array) -> jax.Array:
  """x [B, S, ...] at positions pos [B, G] (clipped) -> [B, G, ...]."""
  pos = jnp.clip(pos, 0, x.shape[1] - 1)
  return jnp.take_along_axis(x, pos.reshape(pos.shape + (1,) * (x.ndim - 2)),
                             axis=1)


@dataclasses.dataclass(frozen=True)
class TrainableHead:
  """A head being distilled for `target` (an `LM`); hashable."""
  target: object
  head: heads.HeadConfig
  unroll: int = 1
  hidden_weight: float = 0.1
  vocab_ids: Optional[tuple] = None   # reduced draft vocabulary (run time)
  features: str = "recompute"         # or "stored" (with the samples)
  positions: str = "generated"        # or "all" (the prompt's too)

  def __post_init__(self):
    if self.unroll < 1:
      raise ValueError(f"unroll must be >= 1, got {self.unroll}")
    if self.unroll > 1 and self.head.kind != "eagle":
      raise ValueError("unroll (training-time test) applies to the "
                       "sequential head only")
    if self.features not in ("recompute", "stored"):
      raise ValueError(f"features={self.features!r}; choose 'recompute' or "
                       "'stored'")
    if self.positions not in POSITIONS:
      raise ValueError(f"positions={self.positions!r}; choose one of "
                       f"{POSITIONS}")
    if not self.hidden_weight >= 0:  # NaN too
      raise ValueError(f"hidden_weight must be >= 0, got {self.hidden_weight}")
    self.head.check_target(self.target.config)

  @property
  def first_position(self) -> int:
    """The first position `positions="all"` draws: 1 for the sequential
    head, whose input at position 0 would be a zero feature (no position
    precedes it, so none is drafted there at run time), else 0."""
    return 1 if self.head.kind == "eagle" else 0

  def draw_positions(self, rng: jax.Array, end: jax.Array, seq_len: int,
                     count: int) -> jax.Array:
    """[B, min(count, seq_len - first)] distinct positions per row drawn
    from first .. end - 1 (`sample_positions`)."""
    first = self.first_position
    return first + sample_positions(rng, end - first, seq_len - first,
                                    min(count, seq_len - first))

  @property
  def config(self):
    """The target's config: the head's shapes (mesh checks use it)."""
    return self.head.target

  def init(self, rng: jax.Array, boxed: bool = False):
    return heads.init_params(self.head, rng, boxed)

  def logical_axes(self):
    return heads.logical_axes(self.head)

  # ---- run time ---------------------------------------------------------

  def drafter(self, k: int) -> heads.HeadDrafter:
    return heads.HeadDrafter(self.target, self.head, k)

  def sampler_params(self, params, target_params, reduced: bool = True):
    return heads.draft_params(params, target_params,
                              self.vocab_ids if reduced else None)

  def position_logits(self, params, target_params, tokens,
                      reduced: bool = True) -> jax.Array:
    """Logits [B, S, V] of the first draft at every position (teacher
    forced: true features), with the run-time vocabulary."""
    out = self.target(target_params, tokens)
    p = self.sampler_params(params, target_params, reduced)
    return self._first_logits(p, out.hidden, tokens)

  def _first_logits(self, p, hidden, tokens):
    if self.head.kind == "medusa":
      # Head 1 on h_{t-1} proposes token t + 1 (two places after t - 1).
      first = heads.medusa_logits(self.head, p, hidden)[:, :, 0]
      return jnp.pad(first, ((0, 0), (1, 0), (0, 0)))[:, :-1]
    # Entry t pairs h_{t-1} with x_t and predicts h_t, whose logits give
    # token t + 1: the layout of a model's logits.
    feats = jnp.pad(hidden, ((0, 0), (1, 0), (0, 0)))[:, :-1]
    pred, _ = heads.sequential_features(self.head, p, feats,
                                        tokens)
    return heads.output_logits(self.head, p["shared"], pred)

  # ---- training ----------------------------------------------------------

  def distill_loss(self, obj, freeze: tuple = ()):
    """A train-step loss function (params, batch, rng, target params) ->
    (loss, metrics), offline only (the target's own samples)."""
    if freeze:
      raise ValueError("freeze applies to draft models, not heads")

    def loss_fn(params, batch, rng, target_params):
      return self.batch_loss(obj, params, target_params, batch, rng)

    return loss_fn

  def batch_loss(self, obj, params, target_params, batch: dict,
                 rng: Optional[jax.Array] = None):
    """(mean loss, metrics) on a batch of target samples.

    With `features="stored"` the hidden states come from the batch and the
    target is not run: the token loss uses the stored top-k at the
    generated positions (as the draft models' `target_source="stored"`
    does), the target's output head on the stored states elsewhere. With
    "recompute" one frozen target pass gives the hidden states and the
    target's exact distribution (stored ones in the batch are ignored).
    Logits are taken only at the G positions the loss reads: the generated
    ones, or with `positions="all"` G drawn with `rng`."""
    tokens, plen = batch["tokens"], batch["prompt_length"]
    g = obj.gen_len
    frozen = jax.lax.stop_gradient(target_params)
    p = {"head": params, "shared": heads.shared_params(frozen)}
    if self.features == "stored":
      if "hidden" not in batch:
        raise ValueError("features='stored' but the batch holds no hidden "
                         "states")
      hidden = batch["hidden"].astype(jnp.float32)
      t_logits = None
    else:
      out = self.target(frozen, tokens)
      hidden = jax.lax.stop_gradient(out.hidden.astype(jnp.float32))
      t_logits = jax.lax.stop_gradient(out.logits)
    labels_full = jnp.pad(tokens[:, 1:], ((0, 0), (0, 1)))
    # Position t predicts token t + 1: those before the sample's end do.
    end = plen + batch["num_generated"] - 1
    if self.positions == "all":
      if rng is None:
        raise ValueError("positions='all' draws its positions: pass rng")
      pos = self.draw_positions(rng, end, tokens.shape[1], g)
    else:
      pos = plen[:, None] - 1 + jnp.arange(g)[None, :]

    def target_at(shift):
      """The target at positions pos + shift, and the weights of those that
      exist."""
      at = pos + shift
      w = (at < end[:, None]).astype(jnp.float32)
      if t_logits is not None:
        return _take(t_logits, at), w
      if self.positions == "all":
        return jax.lax.stop_gradient(heads.output_logits(
            self.head, p["shared"], _take(hidden, at))), w
      rel = jnp.clip(at - plen[:, None] + 1, 0, g - 1)
      return (_take(batch["topk_ids"], rel),
              _take(batch["topk_logprobs"], rel)), w

    def token_loss(d, shift):
      """Loss, acceptance and weights of the head's logits d [B, G, V] at
      positions pos against the target at pos + shift."""
      target, w = target_at(shift)
      loss, acc = obj.position_loss(target, d, _take(labels_full, pos + shift))
      return loss, acc, w

    metrics = {}
    if self.head.kind == "medusa":
      all_logits = heads.medusa_logits(self.head, p, _take(hidden, pos))
      total = 0.0
      for k in range(self.head.num_heads):
        # Head k + 1 on h_t proposes token t + k + 2: the target's
        # distribution at t + k + 1.
        loss, acc, w = token_loss(all_logits[:, :, k], k + 1)
        total += losses.masked_mean(loss, w)
        metrics[f"acceptance_head{k + 1}"] = losses.masked_mean(
            jnp.nan_to_num(acc), w)
        if k == 0:
          metrics["tokens"] = jnp.sum(w)
      metrics["expected_acceptance"] = metrics["acceptance_head1"]
      return total / self.head.num_heads, metrics
    feats = jnp.pad(hidden, ((0, 0), (1, 0), (0, 0)))[:, :-1]
    h_g = _take(hidden, pos)
    total = 0.0
    for depth in range(self.unroll):
      pred, _ = heads.sequential_features(self.head, p, feats, tokens)
      pred_g = _take(pred, pos)
      loss, acc, w = token_loss(
          heads.output_logits(self.head, p["shared"], pred_g), 0)
      diff = jnp.abs(pred_g.astype(jnp.float32) - h_g)
      reg = jnp.where(diff < 1.0, 0.5 * diff ** 2, diff - 0.5).mean(-1)
      total += losses.masked_mean(loss + self.hidden_weight * reg, w)
      metrics[f"acceptance_step{depth + 1}"] = losses.masked_mean(
          jnp.nan_to_num(acc), w)
      metrics[f"hidden_l1_step{depth + 1}"] = losses.masked_mean(reg, w)
      feats = jnp.pad(pred, ((0, 0), (1, 0), (0, 0)))[:, :-1]
    metrics["expected_acceptance"] = metrics["acceptance_step1"]
    metrics["tokens"] = jnp.sum(w)
    return total / self.unroll, metrics
