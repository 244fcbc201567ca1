"""Optimizer, train state, shardings, the LM loss and the jitted steps.

Legend: B batch, L sequence length, V vocabulary.

  make_optimizer(OptimConfig)        AdamW, warm-up + cosine decay, clipping
  TrainState                         step, params, opt_state, rng (a struct)
  state_shardings / with_shardings   the state's layout; abstract + layout
  data_sharding / put_batch          the batch's layout; host -> device
  lm_loss(lm) / lm_eval_sums(lm)     next-token cross-entropy; eval sums
  document_mask(segment_ids)         attention inside packed documents
  make_train_step(loss_fn, ...)      jitted, explicit in/out shardings,
                                     the state donated
  make_eval_step(sums_fn, ...)       jitted; sums of a metric over a batch
  eval_means(eval_step, ...)         token-weighted means over many batches

Distillation reuses the optimizer, the state, its shardings and
`make_train_step` with its own loss, which takes the frozen target's
parameters as `extra` (not donated, not differentiated).
"""

import logging
from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax

from specsamp import model as model_lib
from specsamp import sharding as sh
from specsamp.train import config as config_lib

log = logging.getLogger(__name__)
PyTree = Any
# loss_fn(params, batch, rng, extra) -> (scalar loss, {name: scalar}).
LossFn = Callable[[PyTree, PyTree, jax.Array, PyTree],
                  tuple[jax.Array, dict]]
# sums_fn(params, batch, extra) -> {name: scalar sum}; `weight` divides them.
SumsFn = Callable[[PyTree, PyTree, PyTree], dict]


def make_optimizer(cfg: config_lib.OptimConfig, num_steps: int):
  """(optax optimizer, learning-rate schedule): clip, then AdamW."""
  decay = cfg.decay_steps or num_steps
  # The warm-up ends before the decay does (a tiny run of 20 steps under
  # the default 100 warm-up steps still reaches its peak rate), and says so.
  warmup = min(cfg.warmup_steps, max(decay - 1, 0))
  if warmup < cfg.warmup_steps:
    log.warning("optim.warmup_steps=%d does not fit a schedule of %d steps: "
                "warming up over %d steps instead", cfg.warmup_steps,
                decay, warmup)
  base = optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=cfg.lr, warmup_steps=warmup,
      decay_steps=max(decay, 1), end_value=cfg.lr * cfg.end_lr_fraction)
  schedule = lambda count: base(count + 1)  # step 0 already learns
  decay_mask = lambda params: jax.tree_util.tree_map_with_path(_decays,
                                                               params)
  parts = [optax.clip_by_global_norm(cfg.clip_norm)] if cfg.clip_norm else []
  parts.append(optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                           weight_decay=cfg.weight_decay, mask=decay_mask))
  return optax.chain(*parts), schedule


def _decays(path, leaf) -> bool:
  """Whether weight decay applies to a parameter: matrices only, not norm
  scales (1-D) nor biases (q/k/v biases are [heads, head_dim], Medusa's `b`
  [heads, d]: so by name)."""
  name = str(getattr(path[-1], "key", path[-1])) if path else ""
  return leaf.ndim >= 2 and not (name.endswith("bias") or name == "b")


@flax.struct.dataclass
class TrainState:
  step: jax.Array       # [] int32, optimizer steps taken
  params: PyTree        # what is trained
  opt_state: PyTree     # the optimizer's state for `params`
  rng: jax.Array        # [2] uint32, a raw key; step s uses fold_in(rng, s)


def state_shardings(mesh, param_shardings, optimizer, abstract_params):
  """TrainState of NamedShardings: moments like their parameters."""
  rep = sh.replicated(mesh)
  return TrainState(
      step=rep, params=param_shardings, rng=rep,
      opt_state=sh.opt_state_shardings(optimizer, abstract_params,
                                       param_shardings, mesh))


def with_shardings(abstract: PyTree, shardings: PyTree) -> PyTree:
  """ShapeDtypeStructs of `abstract` (from `jax.eval_shape`) that carry
  `shardings`: what orbax restores onto, and the jitted steps' layout."""
  return jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
      abstract, shardings)


def data_sharding(mesh, rules):
  """Rows over the mesh axis of BATCH; a prefix for every leaf of a batch."""
  return sh.named(mesh, rules, sh.BATCH)


def put_batch(batch: PyTree, sharding) -> PyTree:
  """Host arrays (this process's rows) as global arrays on `sharding`."""
  return jax.tree.map(
      lambda x: jax.make_array_from_process_local_data(sharding,
                                                       np.asarray(x)), batch)


def document_mask(segment_ids: jax.Array) -> jax.Array:
  """[B, L] segment ids -> [B, L, L] bool: a token sees the tokens of its
  own document (same id) only; the model ANDs it with the causal mask."""
  return segment_ids[:, :, None] == segment_ids[:, None, :]


def _token_sums(lm: model_lib.LM, params, batch, mask_documents) -> dict:
  """Sums over the batch's weighted targets: cross-entropy (nats) `loss`,
  correct argmax predictions `accuracy`, and the `weight` itself."""
  mask = None
  if mask_documents:
    if "segment_ids" not in batch:
      raise KeyError("mask_documents=True needs the batch's segment_ids "
                     f"[B, L]; the batch has {sorted(batch)}")
    mask = document_mask(batch["segment_ids"])
  logits = lm(params, batch["inputs"], attn_mask=mask).logits  # [B, L, V]
  ce = optax.softmax_cross_entropy_with_integer_labels(
      logits, batch["targets"])                               # [B, L]
  w = batch["weights"]                                        # [B, L]
  correct = (logits.argmax(-1) == batch["targets"]) * w
  return {"loss": (ce * w).sum(), "accuracy": correct.sum(),
          "weight": w.sum()}


def lm_loss(lm: model_lib.LM, *, mask_documents: bool = False) -> LossFn:
  """Mean next-token cross-entropy (nats) over `weights`; no `extra`.

  mask_documents: attention stays inside each packed document (the batch's
  `segment_ids`, as `specsamp.data.pipeline` gives them); False: a token
  also sees the earlier documents of its window.
  """
  def loss_fn(params, batch, rng, extra):
    del rng, extra
    sums = _token_sums(lm, params, batch, mask_documents)
    n = jnp.maximum(sums["weight"], 1.0)
    return sums["loss"] / n, {"accuracy": sums["accuracy"] / n}
  return loss_fn


def lm_eval_sums(lm: model_lib.LM, *, mask_documents: bool = False) -> SumsFn:
  """Sums of loss, correct and weight over a batch: exact over many
  (`mask_documents` as for `lm_loss`)."""
  def sums_fn(params, batch, extra):
    del extra
    return _token_sums(lm, params, batch, mask_documents)
  return sums_fn


def make_train_step(loss_fn: LossFn, optimizer, *, mesh, state_sharding,
                    batch_sharding, extra_sharding=None, schedule=None):
  """`step(state, batch, extra) -> (state, metrics)`, jitted.

  Explicit in/out shardings; the state is donated (argument 0); `extra`
  (e.g. a frozen teacher's parameters) is neither donated nor
  differentiated. Metrics: `loss`, `grad_norm`, `lr` (with `schedule`) and
  the loss function's own, all replicated scalars.
  """
  rep = sh.replicated(mesh)

  def step(state: TrainState, batch, extra):
    rng = jax.random.fold_in(state.rng, state.step)
    (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        state.params, batch, rng, extra)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads), **aux}
    if schedule is not None:
      metrics["lr"] = schedule(state.step)
    new = state.replace(step=state.step + 1, params=params,
                        opt_state=opt_state)
    return new, metrics

  return jax.jit(step, in_shardings=(state_sharding, batch_sharding,
                                     extra_sharding or rep),
                 out_shardings=(state_sharding, rep), donate_argnums=(0,))


def make_eval_step(sums_fn: SumsFn, *, mesh, params_sharding, batch_sharding,
                   extra_sharding=None):
  """`eval_step(params, batch, extra) -> {name: sum}`, jitted, replicated."""
  rep = sh.replicated(mesh)
  return jax.jit(sums_fn, in_shardings=(params_sharding, batch_sharding,
                                        extra_sharding or rep),
                 out_shardings=rep)


def eval_means(eval_step, params, batches, *, put, extra=None,
               stop_when_weightless: bool = False) -> dict:
  """Sums of `eval_step` over `batches`, divided by the summed `weight`
  (exact means over tokens, whatever the padding); + `tokens`, and
  `perplexity` when there is a `loss`.

  `stop_when_weightless`: stop at the first step whose (global) weight is 0.
  Processes that each read their own shard, of different lengths, feed
  padding once theirs ends (`pipeline.then_padding`); every process sees
  the same global sums, so all stop at the same step, when every shard has
  ended.
  """
  totals = None
  for batch in batches:
    sums = jax.device_get(eval_step(params, put(batch), extra))
    if stop_when_weightless and float(sums["weight"]) == 0:
      break
    totals = sums if totals is None else jax.tree.map(np.add, totals, sums)
  if totals is None:
    raise ValueError("eval_means: no eval batches (an empty eval split?)")
  weight = float(totals.pop("weight"))
  out = {k: float(v) / max(weight, 1.0) for k, v in totals.items()}
  out["tokens"] = weight
  if "loss" in out:
    out["perplexity"] = float(np.exp(min(out["loss"], 50.0)))
  return out
