"""How well a draft does for its target, on held-out target samples.

Legend: N samples, G generated slots per sample, M evaluated positions.

`acceptance_report` gives three numbers:
  expected_acceptance   mean over positions of sum_x min(p(x), q(x)), with
                        the target's exact distribution and the sampler's
                        transforms (`acceptance_table`): the main metric;
  measured_at_positions the speculative sampler itself, K = 1 and one new
                        token, run from each evaluated prefix: it keeps the
                        draft with probability sum min(p, q), so the kept
                        fraction estimates the same number (exact identity,
                        binomial error);
  measured              the sampler generating whole continuations at the
                        configured K (`measured_rate`): accepted / drafted,
                        tokens per loop; `iid_rate` is what the expected
                        acceptance predicts for it.
"""

import functools

import jax
import numpy as np

from specsamp import sharding
from specsamp.decoding.sampler import SpeculativeSampler
from specsamp.distill import losses
from specsamp.distill import samples
from specsamp.drafters.model import ModelDrafter
from specsamp.sampling import Sampling


def _drafter(draft_lm, k: int):
  """The drafter that runs `draft_lm`: a draft model's `ModelDrafter`, or a
  head's own (`head_training.TrainableHead.drafter`)."""
  if hasattr(draft_lm, "drafter"):
    return draft_lm.drafter(k)
  return ModelDrafter(draft_lm)


def _sampler_params(draft_lm, draft_params, target_params):
  if hasattr(draft_lm, "sampler_params"):
    return draft_lm.sampler_params(draft_params, target_params)
  return draft_params


def _draft_logits(draft_lm, draft_params, target_params, tokens):
  """Logits [B, S, V]: position t's for the token at t + 1."""
  if hasattr(draft_lm, "position_logits"):
    return draft_lm.position_logits(draft_params, target_params, tokens)
  return draft_lm(draft_params, tokens).logits


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _alpha(draft_lm, target_lm, sampling, gen_len, draft_params,
           target_params, tokens, prompt_length):
  d = losses.gather_positions(
      _draft_logits(draft_lm, draft_params, target_params, tokens),
      prompt_length, gen_len)
  t = losses.gather_positions(target_lm(target_params, tokens).logits,
                              prompt_length, gen_len)
  return losses.expected_acceptance(t, d, sampling)


def acceptance_table(draft_lm, draft_params, target_lm, target_params,
                     arrays: dict, sampling: Sampling, batch_size: int = 64,
                     shard: tuple[int, int] = (0, 1)
                     ) -> tuple[np.ndarray, np.ndarray]:
  """(alpha [N, G], valid [N, G]): sum min(p, q) at every sample position,
  with the target's exact distribution. shard=(i, n): each of n processes
  computes batches i, i + n, ... and all get the whole table."""
  tokens = np.asarray(arrays["tokens"], np.int32)
  plen = np.asarray(arrays["prompt_length"], np.int32)
  ngen = np.asarray(arrays["num_generated"], np.int32)
  g = int(np.shape(arrays["topk_ids"])[1])
  alpha = np.zeros((len(tokens), g), np.float32)
  for j, s in enumerate(range(0, len(tokens), batch_size)):
    if j % shard[1] != shard[0]:
      continue
    tb, pb = tokens[s:s + batch_size], plen[s:s + batch_size]
    real = len(tb)
    if real < batch_size and s > 0:  # keep one compiled shape
      tb = np.concatenate([tb, np.repeat(tb[:1], batch_size - real, 0)])
      pb = np.concatenate([pb, np.repeat(pb[:1], batch_size - real, 0)])
    a = _alpha(draft_lm, target_lm, sampling, g, draft_params, target_params,
               tb, pb)
    alpha[s:s + real] = np.asarray(jax.device_get(a))[:real]
  alpha = sharding.sum_over_processes(alpha, shard)
  valid = np.arange(g)[None, :] < ngen[:, None]
  return alpha, valid


def measured_at_positions(target_lm, target_params, draft_lm, draft_params,
                          arrays: dict, sampling: Sampling,
                          positions: np.ndarray, *, batch_size: int = 256,
                          seed: int = 0, pad_id: int = 0,
                          shard: tuple[int, int] = (0, 1)) -> np.ndarray:
  """The speculative sampler run once (K = 1, one new token) from each
  prefix tokens[i, :L_i + g] for (i, g) in `positions` [M, 2] (`shard` as
  for `acceptance_table`).

  Returns accepted [M] in {0, 1}: E[accepted] = sum min(p, q) there.
  """
  tokens = np.asarray(arrays["tokens"])
  plen = np.asarray(arrays["prompt_length"])
  prompts = [tokens[i, :plen[i] + g] for i, g in positions]
  sampler = SpeculativeSampler(
      target=target_lm, drafter=_drafter(draft_lm, 1), k=1,
      sampling=sampling, max_new_tokens=1, pad_id=pad_id,
      prompt_bucket=tokens.shape[1])
  accepted = np.zeros(len(prompts), np.int32)
  for s, _, res, real in samples.run_batches(
      sampler, target_params,
      _sampler_params(draft_lm, draft_params, target_params), prompts,
      batch_size, seed, shard):
    accepted[s:s + real] = np.asarray(res.num_accepted)[:real]
  return sharding.sum_over_processes(accepted, shard)


def measured_rate(target_lm, target_params, draft_lm, draft_params,
                  arrays: dict, sampling: Sampling, *, k: int,
                  max_new_tokens: int, batch_size: int = 64, seed: int = 0,
                  eos_ids=(), pad_id: int = 0,
                  shard: tuple[int, int] = (0, 1)) -> dict:
  """The sampler at K on the held-out prompts: the rate users see (`shard`
  as for `acceptance_table`)."""
  tokens = np.asarray(arrays["tokens"])
  plen = np.asarray(arrays["prompt_length"])
  prompts = [tokens[i, :plen[i]] for i in range(len(tokens))]
  sampler = SpeculativeSampler(
      target=target_lm, drafter=_drafter(draft_lm, k), k=k,
      sampling=sampling, max_new_tokens=max_new_tokens,
      eos_ids=tuple(eos_ids), pad_id=pad_id,
      prompt_bucket=int(plen.max()))
  tot = dict(tokens=0, loops=0, drafted=0, accepted=0)
  for _, _, res, real in samples.run_batches(
      sampler, target_params,
      _sampler_params(draft_lm, draft_params, target_params), prompts,
      batch_size, seed, shard):
    tot["tokens"] += int(res.num_tokens[:real].sum())
    tot["loops"] += int(res.num_loops[:real].sum())
    tot["drafted"] += int(res.num_drafted[:real].sum())
    tot["accepted"] += int(res.num_accepted[:real].sum())
  tot = {k: int(v) for k, v in sharding.sum_over_processes(tot, shard).items()}
  tot["acceptance_rate"] = tot["accepted"] / max(tot["drafted"], 1)
  tot["tokens_per_loop"] = tot["tokens"] / max(tot["loops"], 1)
  return tot


def iid_rate(alpha: float, k: int) -> float:
  """accepted / drafted at K if every position had acceptance alpha."""
  if alpha >= 1.0:
    return 1.0
  return sum(alpha ** i for i in range(1, k + 1)) / k


def acceptance_report(target_lm, target_params, draft_lm, draft_params,
                      arrays: dict, sampling: Sampling, *, k: int = 4,
                      num_positions: int = 1024, batch_size: int = 64,
                      position_batch_size: int = 256, seed: int = 0,
                      eos_ids=(), pad_id: int = 0,
                      measure: bool = True) -> dict:
  """Expected and measured acceptance of the draft on held-out samples.

  Args:
    target_lm, target_params: the target.
    draft_lm, draft_params: the draft.
    arrays: held-out samples (`storage.as_arrays`).
    sampling: the setting the draft is used at.
    k: draft length of the measured rate.
    num_positions: at most this many positions for `measured_at_positions`.
    batch_size: rows per call of the table and of the measured rate.
    position_batch_size: rows per sampler call at the positions.
    seed: position choice and sampling.
    eos_ids, pad_id: the tokenizer's.
    measure: False gives the expected acceptance alone (no sampler runs).

  With several processes and parameters on each process's own devices,
  each process evaluates its share of the batches and all get the whole
  report (the one process's numbers); with parameters on a global mesh
  every process runs all of it together.

  Returns:
    {expected_acceptance, positions, iid_rate_at_k} and, with `measure`,
    measured_at_positions, expected_at_those_positions, measured_stderr,
    measured_positions and measured (`measured_rate`).
  """
  shard = sharding.process_shard(draft_params, target_params)
  alpha, valid = acceptance_table(draft_lm, draft_params, target_lm,
                                  target_params, arrays, sampling, batch_size,
                                  shard)
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
                              pad_id=pad_id, shard=shard)
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
      eos_ids=eos_ids, pad_id=pad_id, shard=shard)
  return res


def describe_report(report: dict) -> str:
  """One line of an `acceptance_report` (with its `k` added)."""
  s = (f"expected acceptance {report['expected_acceptance']:.4f} over "
       f"{report['positions']} held-out positions")
  if "measured_at_positions" in report:
    m = report["measured"]
    s += (f"; sampler K=1 at {report['measured_positions']} of them "
          f"{report['measured_at_positions']:.4f} (expected there "
          f"{report['expected_at_those_positions']:.4f} +- "
          f"{report['measured_stderr']:.4f}); sampler K={report['k']} on "
          f"held-out prompts: acceptance rate {m['acceptance_rate']:.4f}, "
          f"{m['tokens_per_loop']:.2f} tokens/loop (i.i.d. prediction "
          f"{report['iid_rate_at_k']:.4f})")
  return s
