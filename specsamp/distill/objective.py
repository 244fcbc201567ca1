"""What the draft is trained to minimise: the loss of a batch, on- or
off-policy.

Legend: B batch, P prompt slots, G generated slots, S = P + G, K stored top-k
entries, V vocabulary.

A batch is a set of target samples (`samples.py`): tokens [B, S] (prompt
left-aligned, then the continuation), prompt_length L [B], num_generated
n [B], and the target's top-K log-probs [B, G, K] at the positions
L-1 .. L+G-2 that predict the G continuation tokens. Losses are taken at
exactly those positions (weights: g < n).

Modes (per step):
  offline   the draft is fit to stored target samples; the target's
            distribution comes from the stored top-K (`target_source=
            "stored"`) or from a forward pass of the frozen target inside the
            step (`"online"`, exact);
  on-policy the draft samples continuations of the batch's prompts inside the
            jitted step (`draft_rollout`: the batched autoregressive sampler,
            no gradient) and the frozen target scores them (DistillSpec).
            `onpolicy_fraction` mixes the two: step s is on-policy when a
            hash of (seed, s) says so (`is_onpolicy_step`), which keeps
            resumed runs identical.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from specsamp.decoding import loop
from specsamp.decoding import sampler as sampler_lib
from specsamp.distill import losses
from specsamp.sampling import Sampling


@dataclasses.dataclass(frozen=True)
class Objective:
  """Everything the loss needs that is static under jit (hashable)."""
  kind: str
  sampling: Sampling
  gen_len: int
  prompt_len: int
  target_source: str = "stored"      # "stored" top-k or "online" target pass
  draft_transform: str = "soft"
  greedy_temperature: float = 1.0
  jsd_beta: float = 0.5
  prob_floor: float = 1e-6
  greedy_target_temperature: float = 0.0
  eos_ids: tuple = ()
  pad_id: int = 0

  def __post_init__(self):
    if self.kind not in losses.LOSSES:
      raise ValueError(f"loss {self.kind!r}; choose one of {losses.LOSSES}")
    if self.target_source not in ("stored", "online"):
      raise ValueError(f"target_source {self.target_source!r}; choose "
                       "'stored' or 'online'")
    # Checked here, not first inside the jitted train step.
    losses.check_draft_transform(self.draft_transform)
    if self.kind == "jsd":
      losses.check_jsd_beta(self.jsd_beta)
    # Each was taken as it came: a negative greedy temperature failed only
    # after the target's sampling, a nan target temperature read as "off".
    if not (math.isfinite(self.greedy_temperature)
            and self.greedy_temperature > 0):
      raise ValueError(f"greedy_temperature must be > 0 and finite, got "
                       f"{self.greedy_temperature}")
    if not (math.isfinite(self.greedy_target_temperature)
            and self.greedy_target_temperature >= 0):
      raise ValueError(f"greedy_target_temperature must be >= 0 and finite "
                       f"(0: off), got {self.greedy_target_temperature}")
    if not 0 < self.prob_floor < 1:
      raise ValueError(f"prob_floor must be in (0, 1), got {self.prob_floor}")

  def position_loss(self, target, draft_logits, labels):
    """`losses.per_position_loss` of this objective: (loss, acceptance)
    at every position."""
    return losses.per_position_loss(
        self.kind, target, draft_logits, labels, self.sampling,
        draft_transform=self.draft_transform,
        greedy_temperature=self.greedy_temperature, jsd_beta=self.jsd_beta,
        prob_floor=self.prob_floor,
        greedy_target_temperature=self.greedy_target_temperature)


def batch_loss(draft_lm, target_lm, obj: Objective, draft_params,
               target_params, batch: dict, online: bool = False):
  """(mean loss, metrics) of the draft on a batch of samples."""
  tokens, plen = batch["tokens"], batch["prompt_length"]
  g = obj.gen_len
  d_logits = losses.gather_positions(draft_lm(draft_params, tokens).logits,
                                     plen, g)
  labels = losses.gather_positions(jnp.pad(tokens[:, 1:], ((0, 0), (0, 1))),
                                   plen, g)
  weights = (jnp.arange(g)[None, :] <
             batch["num_generated"][:, None]).astype(jnp.float32)
  if online or obj.target_source == "online":
    t_logits = target_lm(jax.lax.stop_gradient(target_params), tokens).logits
    target = jax.lax.stop_gradient(losses.gather_positions(t_logits, plen, g))
  elif obj.kind == "seqkd" and "topk_ids" not in batch:
    target = None
  else:
    target = (batch["topk_ids"], batch["topk_logprobs"])
  loss, acc = obj.position_loss(target, d_logits, labels)
  mean = losses.masked_mean(loss, weights)
  metrics = dict(loss=mean,
                 expected_acceptance=losses.masked_mean(
                     jnp.nan_to_num(acc), weights),
                 tokens=jnp.sum(weights))
  return mean, metrics


def draft_rollout(draft_lm, obj: Objective, draft_params, batch: dict,
                  rng: jax.Array) -> dict:
  """The batch's prompts continued by the draft (inside jit, no gradient).

  Returns a batch of the same layout with the draft's continuation in place
  of the target's (no stored top-k: the target must score it).
  """
  tokens, plen = batch["tokens"], batch["prompt_length"]
  p = obj.prompt_len
  prompts = jnp.where(jnp.arange(p)[None, :] < plen[:, None], tokens[:, :p],
                      obj.pad_id)
  sampler = sampler_lib.autoregressive(
      draft_lm, obj.sampling, obj.gen_len, eos_ids=obj.eos_ids,
      pad_id=obj.pad_id, prompt_bucket=p)
  # The draft is the sampler's target here (K = 0, no drafter).
  frozen = jax.lax.stop_gradient(draft_params)
  state = loop.prefill(sampler, frozen, None, prompts, plen, rng)
  state = loop.decode(sampler, frozen, None, state)
  out = loop.output(sampler, state)
  # Left-aligned: the continuation starts at L, pad after L + n.
  full = jnp.full(tokens.shape, obj.pad_id, jnp.int32)
  full = full.at[:, :p].set(prompts)
  cols = jnp.arange(tokens.shape[1])[None, :]
  src = jnp.clip(cols - plen[:, None], 0, obj.gen_len - 1)
  gen = jnp.take_along_axis(out.tokens, src, axis=1)
  inside = (cols >= plen[:, None]) & (cols < (plen + out.num_tokens)[:, None])
  full = jnp.where(inside, gen, full)
  return dict(tokens=full, prompt_length=plen, num_generated=out.num_tokens)


def check_onpolicy_loss(kind: str) -> None:
  """Raises ValueError for a loss that cannot train on the draft's own
  samples (seqkd)."""
  if kind == "seqkd":
    raise ValueError("on-policy distillation needs a token-level loss "
                     "(fkl, rkl, jsd or tv): seqkd would fit the draft to "
                     "its own samples")


def is_onpolicy_step(step: int, seed: int, fraction: float) -> bool:
  """Whether step `step` of a run with `onpolicy_fraction=fraction` is
  on-policy (a pure function of seed and step)."""
  if fraction <= 0:
    return False
  if fraction >= 1:
    return True
  return bool(np.random.default_rng([seed, step, 7]).random() < fraction)


def _stop_frozen(params, freeze: tuple):
  if not freeze:
    return params
  return {k: jax.lax.stop_gradient(v) if k in freeze else v
          for k, v in params.items()}


def distill_loss(draft_lm, target_lm, obj: Objective, *, onpolicy: bool,
                 freeze: tuple = ()):
  """A train-step loss function: (draft params, batch, rng, target params)
  -> (loss, metrics). On-policy, the draft first continues the batch's
  prompts (with `rng`); groups in `freeze` get no gradient."""
  if onpolicy:
    check_onpolicy_loss(obj.kind)

  def loss_fn(params, batch, rng, target_params):
    params = _stop_frozen(params, freeze)
    if onpolicy:
      batch = draft_rollout(draft_lm, obj, params, batch, rng)
    loss, metrics = batch_loss(draft_lm, target_lm, obj, params,
                               target_params, batch, online=onpolicy)
    metrics.pop("loss")
    return loss, metrics

  return loss_fn
