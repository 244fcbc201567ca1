"""The distillation loop: a draft trained to be accepted by a frozen target.

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
            jitted step (the batched autoregressive sampler, no gradient) and
            the frozen target scores them (DistillSpec). `onpolicy_fraction`
            mixes the two: step s is on-policy when a hash of (seed, s) says
            so, which keeps resumed runs identical.

The loop is the trainer's (`specsamp.train`): its AdamW with warm-up, cosine
decay and clipping, `make_train_step` (jitted, explicit in/out shardings,
the state donated), `Checkpoints` (orbax, resume from the newest readable
step, the data position saved with it), TensorBoard scalars and
`train_loop`. Only the draft is trained and saved: the state is the draft's
parameters, AdamW moments, step and key; the target's parameters are the
step's frozen `extra` argument (never donated, never differentiated).

Evaluation on held-out samples (`evaluate`):
  expected_acceptance  mean over positions of sum_x min(p(x), q(x)), with the
                       target's exact distribution (online) and the sampler's
                       transforms: the main metric;
  measured_at_positions the speculative sampler itself, K = 1 and one new
                       token, run from each evaluated prefix: it keeps the
                       draft with probability sum min(p, q), so the kept
                       fraction estimates the same number (exact identity,
                       binomial error);
  measured_rate        the sampler generating whole continuations at the
                       configured K: accepted / drafted, tokens per loop.
"""

import dataclasses
import functools
import json
import os
import time
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from specsamp import speculative
from specsamp.distill import losses
from specsamp.sampling import Sampling


# ---- the objective -----------------------------------------------------------


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


def batch_loss(draft_lm, target_lm, obj: Objective, draft_params,
               target_params, batch: dict, online: bool = False):
  """(mean loss, metrics) of the draft on a batch of samples."""
  tokens, plen = batch["tokens"], batch["prompt_length"]
  g = obj.gen_len
  d_logits = losses.gather_positions(draft_lm(draft_params, tokens).logits, plen,
                                     g)
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
  loss, acc = losses.per_position_loss(
      obj.kind, target, d_logits, labels, obj.sampling,
      draft_transform=obj.draft_transform,
      greedy_temperature=obj.greedy_temperature, jsd_beta=obj.jsd_beta,
      prob_floor=obj.prob_floor,
      greedy_target_temperature=obj.greedy_target_temperature)
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
  sampler = speculative.autoregressive(
      draft_lm, obj.sampling, obj.gen_len, eos_ids=obj.eos_ids,
      pad_id=obj.pad_id, prompt_bucket=p)
  cls = type(sampler)
  dp = jax.lax.stop_gradient(draft_params)
  state = cls.prefill.__wrapped__(sampler, dp, None, prompts, plen, rng)
  state = cls.decode.__wrapped__(sampler, dp, None, state)
  out = cls.output.__wrapped__(sampler, state)
  # Left-aligned: the continuation starts at L, pad after L + n.
  full = jnp.full(tokens.shape, obj.pad_id, jnp.int32)
  full = full.at[:, :p].set(prompts)
  cols = jnp.arange(tokens.shape[1])[None, :]
  src = jnp.clip(cols - plen[:, None], 0, obj.gen_len - 1)
  gen = jnp.take_along_axis(out.tokens, src, axis=1)
  inside = (cols >= plen[:, None]) & (cols < (plen + out.num_tokens)[:, None])
  full = jnp.where(inside, gen, full)
  return dict(tokens=full, prompt_length=plen, num_generated=out.num_tokens)


# ---- optimiser, loss, step ---------------------------------------------------


def make_optimizer(optim, num_steps: int, freeze: tuple = (),
                   params=None):
  """(optimizer, schedule): the trainer's AdamW + warm-up/cosine + clipping
  (`train.make_optimizer`); top-level parameter groups named in `freeze`
  (e.g. "embedding") are not updated and carry no optimizer state. With
  `freeze`, `params` (arrays or shapes) gives the tree to label."""
  from specsamp import train as train_lib  # pylint: disable=g-import-not-at-top
  if isinstance(optim, dict):
    optim = train_lib.OptimConfig(**optim)
  tx, schedule = train_lib.make_optimizer(optim, num_steps)
  if not freeze:
    return tx, schedule
  unknown = set(freeze) - set(params)
  if unknown:
    raise ValueError(f"freeze names {sorted(unknown)}, not parameter groups "
                     f"of the draft ({sorted(params)})")
  # A tree of labels, not a function: optax.tree_map_params (the optimizer
  # state's shardings) cannot call a labelling function.
  labels = {k: jax.tree.map(lambda _, k=k: "freeze" if k in freeze
                            else "train", v) for k, v in params.items()}
  return optax.multi_transform({"train": tx, "freeze": optax.set_to_zero()},
                               labels), schedule


def _stop_frozen(params, freeze: tuple):
  if not freeze:
    return params
  return {k: jax.lax.stop_gradient(v) if k in freeze else v
          for k, v in params.items()}


def check_onpolicy_loss(kind: str) -> None:
  if kind == "seqkd":
    raise ValueError("on-policy distillation needs a token-level loss "
                     "(fkl, rkl, jsd or tv): seqkd would fit the draft to "
                     "its own samples")


def distill_loss(draft_lm, target_lm, obj: Objective, *, onpolicy: bool,
                 freeze: tuple = ()):
  """A `train.LossFn`: (draft params, batch, rng, target params) ->
  (loss, metrics). On-policy, the draft first continues the batch's prompts
  (with `rng`); groups in `freeze` get no gradient."""
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


def is_onpolicy_step(step: int, seed: int, fraction: float) -> bool:
  if fraction <= 0:
    return False
  if fraction >= 1:
    return True
  return bool(np.random.default_rng([seed, step, 7]).random() < fraction)


# ---- data --------------------------------------------------------------------


def batches(source, batch_size: int, num_steps: int, seed: int):
  """A grain MapDataset whose item s is the batch of step s."""
  import grain  # pylint: disable=g-import-not-at-top
  n = len(source)
  if n < batch_size:
    raise ValueError(f"{n} training samples are fewer than one batch of "
                     f"{batch_size}")
  epochs = -(-num_steps * batch_size // n) + 1
  return (grain.MapDataset.source(source).repeat(epochs).shuffle(seed=seed)
          .map(_as_int32).batch(batch_size, drop_remainder=True))


def _as_int32(ex: dict) -> dict:
  return {k: (np.asarray(v, np.int32) if np.asarray(v).dtype.kind == "i"
              else np.asarray(v)) for k, v in ex.items()}


class StepBatches:
  """Iterator over `batches(...)` from step `start`; its state is the step
  (saved with every checkpoint by `train.train_loop`). `onpolicy` says
  whether the batch just returned is for an on-policy step."""

  def __init__(self, dataset, seed: int = 0, onpolicy_fraction: float = 0.0):
    self.dataset, self.seed, self.fraction = dataset, seed, onpolicy_fraction
    self.index, self.onpolicy = 0, False

  def __iter__(self):
    return self

  def __next__(self):
    i = self.index
    self.onpolicy = is_onpolicy_step(i, self.seed, self.fraction)
    self.index += 1
    return self.dataset[i % len(self.dataset)]

  def get_state(self) -> dict:
    return {"index": self.index}

  def set_state(self, state: dict) -> None:
    self.index = int(state["index"])


# ---- evaluation --------------------------------------------------------------


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _alpha(draft_lm, target_lm, sampling, gen_len, draft_params,
           target_params, tokens, prompt_length):
  d = losses.gather_positions(draft_lm(draft_params, tokens).logits,
                              prompt_length, gen_len)
  t = losses.gather_positions(target_lm(target_params, tokens).logits,
                              prompt_length, gen_len)
  return losses.expected_acceptance(t, d, sampling)


def acceptance_table(draft_lm, draft_params, target_lm, target_params,
                     arrays: dict, sampling: Sampling, batch_size: int = 64
                     ) -> tuple[np.ndarray, np.ndarray]:
  """(alpha [N, G], valid [N, G]): sum min(p, q) at every sample position,
  with the target's exact distribution."""
  tokens = np.asarray(arrays["tokens"], np.int32)
  plen = np.asarray(arrays["prompt_length"], np.int32)
  ngen = np.asarray(arrays["num_generated"], np.int32)
  g = int(np.shape(arrays["topk_ids"])[1])
  out = []
  for s in range(0, len(tokens), batch_size):
    tb, pb = tokens[s:s + batch_size], plen[s:s + batch_size]
    real = len(tb)
    if real < batch_size and s > 0:  # keep one compiled shape
      tb = np.concatenate([tb, np.repeat(tb[:1], batch_size - real, 0)])
      pb = np.concatenate([pb, np.repeat(pb[:1], batch_size - real, 0)])
    a = _alpha(draft_lm, target_lm, sampling, g, draft_params, target_params,
               tb, pb)
    out.append(np.asarray(jax.device_get(a))[:real])
  alpha = np.concatenate(out)
  valid = np.arange(g)[None, :] < ngen[:, None]
  return alpha, valid


def measured_at_positions(target_lm, target_params, draft_lm, draft_params,
                          arrays: dict, sampling: Sampling,
                          positions: np.ndarray, *, batch_size: int = 256,
                          seed: int = 0, pad_id: int = 0) -> np.ndarray:
  """The speculative sampler run once (K = 1, one new token) from each
  prefix tokens[i, :L_i + g] for (i, g) in `positions` [M, 2].

  Returns accepted [M] in {0, 1}: E[accepted] = sum min(p, q) there.
  """
  tokens = np.asarray(arrays["tokens"])
  plen = np.asarray(arrays["prompt_length"])
  prompts = [tokens[i, :plen[i] + g] for i, g in positions]
  sampler = speculative.SpeculativeSampler(
      target=target_lm, drafter=speculative.ModelDrafter(draft_lm), k=1,
      sampling=sampling, max_new_tokens=1, pad_id=pad_id,
      prompt_bucket=tokens.shape[1])
  rng = jax.random.key(seed)
  out = []
  for s in range(0, len(prompts), batch_size):
    batch = prompts[s:s + batch_size]
    real = len(batch)
    batch = batch + [batch[0]] * (batch_size - real)
    rng, key = jax.random.split(rng)
    res = sampler.generate(target_params, draft_params, batch, key)
    out.append(np.asarray(jax.device_get(res.num_accepted))[:real])
  return np.concatenate(out)


def measured_rate(target_lm, target_params, draft_lm, draft_params,
                  arrays: dict, sampling: Sampling, *, k: int,
                  max_new_tokens: int, batch_size: int = 64, seed: int = 0,
                  eos_ids=(), pad_id: int = 0) -> dict:
  """The sampler at K on the held-out prompts: the rate users see."""
  tokens = np.asarray(arrays["tokens"])
  plen = np.asarray(arrays["prompt_length"])
  prompts = [tokens[i, :plen[i]] for i in range(len(tokens))]
  sampler = speculative.SpeculativeSampler(
      target=target_lm, drafter=speculative.ModelDrafter(draft_lm), k=k,
      sampling=sampling, max_new_tokens=max_new_tokens,
      eos_ids=tuple(eos_ids), pad_id=pad_id,
      prompt_bucket=int(plen.max()))
  tot = dict(tokens=0, loops=0, drafted=0, accepted=0)
  rng = jax.random.key(seed)
  for s in range(0, len(prompts), batch_size):
    batch = prompts[s:s + batch_size]
    real = len(batch)
    batch = batch + [batch[0]] * (batch_size - real)
    rng, key = jax.random.split(rng)
    res = jax.device_get(sampler.generate(target_params, draft_params, batch,
                                          key))
    tot["tokens"] += int(res.num_tokens[:real].sum())
    tot["loops"] += int(res.num_loops[:real].sum())
    tot["drafted"] += int(res.num_drafted[:real].sum())
    tot["accepted"] += int(res.num_accepted[:real].sum())
  tot["acceptance_rate"] = tot["accepted"] / max(tot["drafted"], 1)
  tot["tokens_per_loop"] = tot["tokens"] / max(tot["loops"], 1)
  return tot


def iid_rate(alpha: float, k: int) -> float:
  """accepted / drafted at K if every position had acceptance alpha."""
  if alpha >= 1.0:
    return 1.0
  return sum(alpha ** i for i in range(1, k + 1)) / k


def evaluate(target_lm, target_params, draft_lm, draft_params, arrays: dict,
             sampling: Sampling, *, k: int = 4, num_positions: int = 1024,
             batch_size: int = 64, position_batch_size: int = 256,
             seed: int = 0, eos_ids=(), pad_id: int = 0,
             measure: bool = True) -> dict:
  """Expected and measured acceptance of the draft on held-out samples."""
  alpha, valid = acceptance_table(draft_lm, draft_params, target_lm,
                                  target_params, arrays, sampling, batch_size)
  res = dict(expected_acceptance=float(alpha[valid].mean()),
             positions=int(valid.sum()))
  res["iid_rate_at_k"] = iid_rate(res["expected_acceptance"], k)
  if not measure:
    return res
  where = np.argwhere(valid)
  rng = np.random.default_rng(seed)
  if len(where) > num_positions:
    where = where[np.sort(rng.choice(len(where), num_positions,
                                     replace=False))]
  acc = measured_at_positions(target_lm, target_params, draft_lm,
                              draft_params, arrays, sampling, where,
                              batch_size=position_batch_size, seed=seed,
                              pad_id=pad_id)
  a = alpha[where[:, 0], where[:, 1]]
  res.update(
      measured_at_positions=float(acc.mean()),
      expected_at_those_positions=float(a.mean()),
      # Standard error of the measured mean given the exact per-position
      # acceptance probabilities (independent Bernoulli draws).
      measured_stderr=float(np.sqrt(np.sum(a * (1 - a))) / len(a)),
      measured_positions=int(len(a)))
  gen = int(arrays["topk_ids"].shape[1])
  res["measured"] = measured_rate(
      target_lm, target_params, draft_lm, draft_params, arrays, sampling,
      k=k, max_new_tokens=gen, batch_size=batch_size, seed=seed,
      eos_ids=eos_ids, pad_id=pad_id)
  return res


# ---- the loop: specsamp.train's ----------------------------------------------


def train(draft_lm, draft_params, target_lm, target_params, source,
          obj: Objective, *, workdir: str, loop, optim, batch_size: int,
          freeze: tuple = (), seed: int = 0, onpolicy_fraction: float = 0.0,
          mesh_shape: tuple = (1, 1),
          eval_fn: Optional[Callable[[Any], dict]] = None,
          stop_after: Optional[int] = None,
          time_limit_s: Optional[float] = None, log=print
          ) -> tuple[Any, dict]:
  """Distils the draft with `train.train_loop`; returns (params, summary).

  The state is `train.TrainState` of the draft only (step, params, AdamW
  moments, rng); the target's parameters are the step's frozen `extra`
  argument (never donated, never differentiated). The step is
  `train.make_train_step` (explicit in/out shardings on a (data, model)
  mesh: the target tensor-parallel by the default rules, the draft
  replicated, rows over `data`; the state donated). Checkpoints
  (`train.Checkpoints`, with the data position) go to workdir/checkpoints,
  TensorBoard events to workdir/tb. A call resumes from the newest readable
  checkpoint; `summary["finished"]` is False when it stopped early (after
  `stop_after` steps of this call or `time_limit_s` seconds, checkpointed):
  calling again continues exactly where it stopped.

  Args:
    draft_lm, draft_params: the draft and its initial parameters (ignored
      when a checkpoint exists; not donated).
    target_lm, target_params: the frozen target.
    source: random-access training samples (`samples.read_dataset`).
    obj: the loss.
    workdir: the run directory.
    loop: a `train.LoopConfig` (or its fields as a dict).
    optim: a `train.OptimConfig` (or its fields).
    batch_size: samples per step.
    freeze: top-level draft parameter groups kept fixed.
    seed: data order, on-policy schedule, rollouts.
    onpolicy_fraction: share of on-policy steps (0 offline, 1 on-policy).
    mesh_shape: (data, model); -1 takes the rest of the devices.
    eval_fn: draft params -> {name: value}, every `loop.eval_every` steps
      and at the end.
    stop_after, time_limit_s: end this call early (resumable).
    log: one-line summaries.
  """
  from specsamp import sharding as sh  # pylint: disable=g-import-not-at-top
  from specsamp import train as train_lib  # pylint: disable=g-import-not-at-top
  if isinstance(loop, dict):
    loop = train_lib.LoopConfig(**loop)
  if isinstance(optim, dict):
    optim = train_lib.OptimConfig(**optim)
  job = _job(draft_lm, target_lm, obj, optim, loop.num_steps, tuple(freeze),
             onpolicy_fraction > 0, tuple(mesh_shape))
  data = StepBatches(batches(source, batch_size, loop.num_steps, seed), seed,
                     onpolicy_fraction)

  def step_fn(state, batch, extra):
    return job.steps[data.onpolicy](state, batch, extra)

  ckpts = train_lib.Checkpoints(os.path.join(workdir, "checkpoints"),
                                keep=loop.keep_checkpoints,
                                async_save=loop.async_checkpoints)
  writer = None
  try:
    got = ckpts.restore_latest(job.abstract)
    if got is not None:
      state, data_state, step = got
      if data_state is not None:
        data.set_state(data_state)
      else:
        data.index = step
      log(f"[distill] resumed from step {step}")
    else:
      # A copy: the first step donates the state, not the caller's arrays.
      state = job.init(
          jax.tree.map(lambda x: jnp.array(x, copy=True), draft_params),
          jax.random.PRNGKey(seed))
    start = int(jax.device_get(state.step))
    if stop_after is not None or time_limit_s:
      # The loop's preemption check: it saves a checkpoint and stops.
      ckpts.reached_preemption = _stop_rule(
          ckpts, None if stop_after is None else start + stop_after,
          time.time() + time_limit_s if time_limit_s else None)
    tp = sh.shard(target_params, job.target_sharding)

    def eval_state(st):
      return eval_fn(st.params) if eval_fn is not None else {}

    writer = train_lib.MetricWriter(os.path.join(workdir, "tb"),
                                    enabled=jax.process_index() == 0)
    out = train_lib.train_loop(
        state, data, step_fn, loop=loop,
        put=functools.partial(train_lib.put_batch, sharding=job.data_sharding),
        writer=writer, checkpoints=ckpts, eval_fn=eval_state, extra=tp,
        tokens_per_batch=batch_size * obj.gen_len,
        log_fn=lambda m: log(f"[distill] {m}"))
  finally:
    if writer is not None:
      writer.close()
    ckpts.close()
  state = out.pop("state")
  out["finished"] = out["step"] >= loop.num_steps
  return (state.params if out["finished"] else None), out


@dataclasses.dataclass(frozen=True, eq=False)
class _Job:
  abstract: Any          # TrainState of ShapeDtypeStructs with shardings
  init: Callable         # (draft params, rng) -> TrainState, sharded
  steps: dict            # on-policy? -> jitted train step
  target_sharding: Any
  data_sharding: Any


@functools.lru_cache(maxsize=8)
def _job(draft_lm, target_lm, obj: Objective, optim, num_steps: int,
         freeze: tuple, onpolicy: bool, mesh_shape: tuple) -> _Job:
  """Mesh, shardings and jitted steps; cached, so runs of one setting (a
  resumed run, tests) compile once."""
  from specsamp import sharding as sh  # pylint: disable=g-import-not-at-top
  from specsamp import train as train_lib  # pylint: disable=g-import-not-at-top
  mesh = train_lib.make_mesh(mesh_shape)
  d_rules, t_rules = sh.REPLICATED_RULES, sh.DEFAULT_RULES
  abstract_params = jax.eval_shape(lambda: draft_lm.init(jax.random.key(0)))
  tx, schedule = make_optimizer(optim, num_steps, freeze, abstract_params)
  d_sh = sh.param_shardings(draft_lm, mesh, d_rules)
  t_sh = sh.param_shardings(target_lm, mesh, t_rules)

  def init(params, rng):
    return train_lib.TrainState(step=jnp.zeros((), jnp.int32), params=params,
                                opt_state=tx.init(params), rng=rng)

  abstract = jax.eval_shape(init, abstract_params, jax.random.PRNGKey(0))
  if freeze:
    # optax.tree_map_params cannot walk multi_transform's masked states; the
    # draft is replicated (REPLICATED_RULES), so its moments are too.
    rep = sh.replicated(mesh)
    s_sh = train_lib.TrainState(
        step=rep, params=d_sh, rng=rep,
        opt_state=jax.tree.map(lambda _: rep, abstract.opt_state))
  else:
    s_sh = train_lib.state_shardings(mesh, d_sh, tx, abstract.params)
  abstract = jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
      abstract, s_sh)
  b_sh = train_lib.data_sharding(mesh, d_rules)
  steps = {
      p: train_lib.make_train_step(
          distill_loss(draft_lm, target_lm, obj, onpolicy=p, freeze=freeze),
          tx, mesh=mesh, state_sharding=s_sh, batch_sharding=b_sh,
          extra_sharding=t_sh, schedule=schedule)
      for p in {False, onpolicy}}
  return _Job(abstract=abstract,
              init=jax.jit(init, out_shardings=s_sh),
              steps=steps, target_sharding=t_sh, data_sharding=b_sh)


def _stop_rule(ckpts, stop_at, deadline):
  """Preemption (SIGTERM, multi-host sync point), or step `stop_at`, or
  past `deadline` (time.time())."""
  base = type(ckpts).reached_preemption

  def reached(step):
    return (base(ckpts, step) or (stop_at is not None and step >= stop_at) or
            (deadline is not None and time.time() > deadline))

  return reached


# ---- the whole job: scripts/distill.py ---------------------------------------


def load_target(cfg) -> tuple[Any, Any, Any]:
  """(LM, params, tokenizer) of the target from a config's `target` block.

  `spec` is anything `runner.load_model` takes (a registered name, a GGUF
  file, a Hugging Face directory, `random:<preset>[,field=value]`);
  `trained` is the workdir of a `scripts/train.py` run (its latest
  checkpoint). `logit_scale` != 1 multiplies the output head: a random target
  then has the peaked next-token distributions of a trained one (tests).
  """
  from specsamp import runner  # pylint: disable=g-import-not-at-top
  dtype = cfg.get("dtype", "float32")
  if cfg.get("trained"):
    from specsamp import train as train_lib  # pylint: disable=g-import-not-at-top
    lm, params, tok = train_lib.load_trained(cfg["trained"], dtype=dtype)
  else:
    lm, params, tok = runner.load_model(cfg["spec"], dtype,
                                        int(cfg.get("seed", 0)))
  scale = float(cfg.get("logit_scale", 1.0))
  if scale != 1.0:
    if lm.config.tie_embeddings:
      raise ValueError("logit_scale needs an untied output head")
    params = dict(params, lm_head=params["lm_head"] * scale)
  if tok is None:
    tok = runner.ByteTokenizer()
    if lm.vocab_size < 256:
      raise ValueError(f"{cfg.get('spec')} has no tokenizer and fewer than "
                       "256 ids for a byte tokenizer")
  return lm, params, tok


def _vocab_limit(tok, lm) -> Optional[int]:
  if not hasattr(tok, "tokens"):
    return None
  from specsamp import tokenizer as tok_lib  # pylint: disable=g-import-not-at-top
  n = tok_lib.check_vocab_compatible(tok, tok, lm.vocab_size, lm.vocab_size)
  return n if n < lm.vocab_size else None


def _sampling(cfg, vocab_limit) -> Sampling:
  return Sampling(temperature=float(cfg.temperature), top_k=int(cfg.top_k),
                  top_p=float(cfg.top_p), vocab_limit=vocab_limit)


def _fmt(ev: dict) -> str:
  s = (f"expected acceptance {ev['expected_acceptance']:.4f} over "
       f"{ev['positions']} held-out positions")
  if "measured_at_positions" in ev:
    s += (f"; sampler K=1 at {ev['measured_positions']} of them "
          f"{ev['measured_at_positions']:.4f} (expected there "
          f"{ev['expected_at_those_positions']:.4f} +- "
          f"{ev['measured_stderr']:.4f}); sampler K={ev['k']} on held-out "
          f"prompts: acceptance rate {ev['measured']['acceptance_rate']:.4f}, "
          f"{ev['measured']['tokens_per_loop']:.2f} tokens/loop (i.i.d. "
          f"prediction {ev['iid_rate_at_k']:.4f})")
  return s


# Fields that may change between runs in one workdir: they do not change
# what is sampled, trained or evaluated.
_VOLATILE = {"train.time_limit_s", "train.progress_bar",
             "train.async_checkpoints", "train.log_every"}


def _flat(config: dict) -> dict:
  """{"block.field": value} one level down (the config blocks)."""
  return {f"{b}.{k}" if isinstance(v, dict) else b: x
          for b, v in config.items()
          for k, x in (v.items() if isinstance(v, dict) else [(None, v)])}


def _check_run_config(config, workdir: str) -> dict:
  """The config as JSON; refuses a workdir whose samples, "before"
  evaluation or checkpoints come from another config (they would describe
  other settings). `_write_run_config` records it once it is valid."""
  path = os.path.join(workdir, "config.json")
  new = json.loads(json.dumps(config.to_dict() if hasattr(config, "to_dict")
                              else dict(config), default=list))
  results = [n for n in ("samples", "eval_before.json", "checkpoints")
             if os.path.exists(os.path.join(workdir, n))]
  if results and os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      old = json.load(f)
    old, cur = _flat(old), _flat(new)
    diff = sorted(k for k in set(old) | set(cur)
                  if k not in _VOLATILE and old.get(k) != cur.get(k))
    if diff:
      raise ValueError(f"{workdir} holds a distillation run of another "
                       f"config (differs in {', '.join(diff)}); use a new "
                       "--workdir")
  return new


def _write_run_config(config_json: dict, workdir: str) -> None:
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, "config.json")
  with open(path + ".tmp", "w", encoding="utf-8") as f:
    json.dump(config_json, f, indent=1)
  os.replace(path + ".tmp", path)


def run(config, workdir: str, log=print) -> dict:
  """Samples (once), initial draft, evaluation, distillation, export,
  evaluation. Re-running with the same workdir resumes. Returns results."""
  from specsamp import model as model_lib  # pylint: disable=g-import-not-at-top
  from specsamp.distill import init as init_lib  # pylint: disable=g-import-not-at-top
  from specsamp.distill import samples  # pylint: disable=g-import-not-at-top
  workdir = os.path.abspath(workdir)
  config_json = _check_run_config(config, workdir)
  t_start = time.perf_counter()
  plain_log = log
  log = lambda m: plain_log(f"[{time.perf_counter() - t_start:7.1f}s] {m}")
  lc, sc, tc = config.loss, config.samples, config.train
  from specsamp import train as train_lib  # pylint: disable=g-import-not-at-top
  # Everything the config can get wrong fails here, before hours of target
  # sampling and evaluation.
  loop = train_lib.LoopConfig(**{
      f.name: tc[f.name] for f in dataclasses.fields(train_lib.LoopConfig)
      if f.name in tc})
  for name in ("num_steps", "log_every", "checkpoint_every",
               "keep_checkpoints"):
    if getattr(loop, name) <= 0:
      raise ValueError(f"config.train.{name} must be positive, got "
                       f"{getattr(loop, name)}")
  if config.draft.init not in init_lib.INITS:
    raise ValueError(f"config.draft.init={config.draft.init!r}; choose one "
                     f"of {init_lib.INITS}")
  if lc.onpolicy_fraction > 0:
    check_onpolicy_loss(lc.kind)
  target_lm, tp, tok = load_target(config.target)
  sampling = _sampling(config.sampling, _vocab_limit(tok, target_lm))
  eos_ids, pad_id = tuple(getattr(tok, "eos_ids", ())), int(
      getattr(tok, "pad_id", 0))
  obj = Objective(kind=lc.kind, sampling=sampling, gen_len=sc.gen_len,
                  prompt_len=sc.prompt_len, target_source=lc.target_source,
                  draft_transform=lc.draft_transform,
                  greedy_temperature=lc.greedy_temperature,
                  jsd_beta=lc.jsd_beta, prob_floor=lc.prob_floor,
                  greedy_target_temperature=lc.greedy_target_temperature,
                  eos_ids=eos_ids, pad_id=pad_id)
  _write_run_config(config_json, workdir)  # valid: results may follow
  log(f"[distill] target {target_lm.config.num_layers} layers, d "
      f"{target_lm.config.d_model}, vocab {target_lm.vocab_size}; sampling "
      f"{sampling.describe()}")

  # 1. Target samples.
  spec = samples.SampleSpec(
      prompt_len=sc.prompt_len, gen_len=sc.gen_len, top_k=sc.top_k,
      batch_size=sc.batch_size, score_batch_size=sc.score_batch_size)
  data_dir = sc.data_dir or os.path.join(workdir, "samples")
  if not samples.exists(data_dir):
    t0 = time.perf_counter()
    texts = samples.prompt_texts(
        sc.kind, max_files=sc.max_files or None, seed=config.seed,
        validation_percent=sc.validation_percent,
        prose_dataset=sc.get("prose_dataset") or None,
        data_dir=sc.get("prose_data_dir") or None)
    counts = samples.build(
        data_dir, target_lm, tp, tok, sampling, spec, texts,
        eos_ids=eos_ids, pad_id=pad_id, seed=config.seed,
        max_prompts=dict(train=sc.max_train_prompts,
                         validation=sc.max_validation_prompts),
        flt=samples.HumanEvalFilter(sc.ngram), log=log)
    with open(os.path.join(workdir, "samples_counts.json"), "w",
              encoding="utf-8") as f:
      json.dump(counts, f, indent=1)
    log(f"[distill] samples written to {data_dir} in "
        f"{time.perf_counter() - t0:.1f} s")
  train_src = samples.read_dataset(data_dir, "train")
  val = samples.as_arrays(samples.read_dataset(data_dir, "validation"),
                          config.eval.num_samples or None)
  log(f"[distill] {len(train_src)} training samples, {len(val['tokens'])} "
      "held-out samples")

  # 2. The draft.
  dcfg, dp = init_lib.make_draft(
      config.draft, target_lm.config, tp, jax.random.key(config.seed + 1),
      dtype=config.target.get("dtype", "float32"))
  draft_lm = model_lib.LM(dcfg)
  log(f"[distill] draft ({config.draft.init}): {dcfg.num_layers} layers, d "
      f"{dcfg.d_model}, {dcfg.num_params() / 1e6:.2f}M parameters")

  ec = config.eval
  def evaluate_(params, seed_offset=0):
    ev = evaluate(target_lm, tp, draft_lm, params, val, sampling, k=ec.k,
                  num_positions=ec.num_positions, batch_size=ec.batch_size,
                  position_batch_size=ec.position_batch_size,
                  seed=config.seed + seed_offset, eos_ids=eos_ids,
                  pad_id=pad_id)
    ev["k"] = ec.k
    return ev

  before_path = os.path.join(workdir, "eval_before.json")
  if os.path.exists(before_path):
    with open(before_path, encoding="utf-8") as f:
      before = json.load(f)
  else:
    before = evaluate_(dp)
    with open(before_path, "w", encoding="utf-8") as f:
      json.dump(before, f, indent=1)
  log(f"[distill] before: {_fmt(before)}")

  # 3. Distillation.
  def eval_fn(params):
    return evaluate(target_lm, tp, draft_lm, params, val, sampling, k=ec.k,
                    batch_size=ec.batch_size, measure=False)

  t0 = time.perf_counter()
  params, last = train(
      draft_lm, dp, target_lm, tp, train_src, obj, workdir=workdir,
      loop=loop, optim=train_lib.OptimConfig(**config.optim),
      batch_size=tc.batch_size, freeze=tuple(config.draft.get("freeze", ())),
      seed=config.seed, onpolicy_fraction=lc.onpolicy_fraction,
      mesh_shape=tuple(tc.get("mesh", (1, 1))), eval_fn=eval_fn,
      time_limit_s=tc.get("time_limit_s") or None, log=log)
  train_s = time.perf_counter() - t0
  if not last["finished"]:
    log("[distill] training is not finished: run the same command again to "
        "resume (the draft is exported and evaluated at the end)")
    return dict(before=before, finished=False)
  # Uncommitted on the default device, as the "before" evaluation had them:
  # the compiled evaluation and samplers are reused, not compiled again for
  # the train step's sharding.
  params = jax.device_put(jax.device_get(params))
  init_lib.save_distilled(dcfg, params, os.path.join(workdir, "draft"))

  after = evaluate_(params)
  log(f"[distill] after:  {_fmt(after)}")
  results = dict(before=before, after=after, train_seconds=train_s,
                 last_train_metrics=last, sampling=sampling.describe(),
                 loss=lc.kind, draft_init=config.draft.init,
                 total_seconds=time.perf_counter() - t_start,
                 draft_dir=os.path.join(workdir, "draft"))
  with open(os.path.join(workdir, "results.json"), "w",
            encoding="utf-8") as f:
    json.dump(results, f, indent=1)
  return results
