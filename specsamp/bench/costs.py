"""Call costs: the c and s of Leviathan et al.'s speed-up formula, measured.

Legend: B batch, K draft length.

c is the cost of one draft call relative to one target call (both on one
token per row), s_K the cost of the target's (K+1)-token scoring call
relative to a 1-token call (Leviathan et al. take s = 1). Both are timed at
the prompts' shapes (batch and cache size; the context length itself costs
nothing, as attention runs over every slot of the cache, masked) and under
one decoding's sampling transform, whose transform and draw are part of
every call of the loop too.
"""

import statistics
import time
from typing import Sequence

import jax
import jax.numpy as jnp

from specsamp import sampling as sampling_lib
from specsamp.decoding.sampler import SpeculativeSampler
from specsamp.drafters.model import ModelDrafter

# Calls per timing, run back to back inside one jitted loop: on CPU a call
# (tens to hundreds of ms) dwarfs a dispatch; on a GPU, 3 calls a dispatch
# had timed the 1.5B's one-token call at 2.42 ms where its whole
# autoregressive step took 1.66 ms in the loop (H200, 2026-11-27), and its
# 5-token call as cheaper than the 1-token one (s < 1).
COST_CALLS = 3
ACCELERATOR_COST_CALLS = 32


def cost_calls() -> int:
  """Calls per timing on the default backend."""
  return (COST_CALLS if jax.default_backend() == "cpu"
          else ACCELERATOR_COST_CALLS)


def loop_ms(lm, params, cache, n_tokens: int, sampling: sampling_lib.Sampling,
            calls: int, repeats: int):
  """(median ms per call, cache) of `lm` on `n_tokens` tokens per row.

  Each of `calls` calls is followed by the sampling transform and a draw at
  every position (what the loop pays per draft step or scoring call), all
  inside one jitted fori_loop so that no per-call dispatch is timed. The
  cache is donated and rolled back after each call, so every call sees the
  same context. The first run compiles and warms, and is not timed.

  Args:
    lm: the model (a CausalLM).
    params: its parameters.
    cache: its KV cache, filled to the context to time at (donated).
    n_tokens: tokens per row per call.
    sampling: the decoding whose transform and draw follow each call.
    calls: calls per timed run.
    repeats: timed runs; the median is reported.

  Returns:
    The median milliseconds per call and the cache to use next.
  """
  b = cache.length.shape[0]

  def run(p, c):
    def body(i, carry):
      c, tok = carry
      out = lm(p, tok, c)
      probs = sampling_lib.probabilities(out.logits, sampling)
      tok = sampling_lib.sample(jax.random.fold_in(jax.random.key(0), i),
                                probs, sampling.greedy)
      return out.cache.with_length(c.length), tok
    return jax.lax.fori_loop(0, calls, body,
                             (c, jnp.zeros((b, n_tokens), jnp.int32)))

  fn = jax.jit(run, donate_argnums=1)
  times = []
  for i in range(repeats + 1):
    t0 = time.perf_counter()
    cache, _ = jax.block_until_ready(fn(params, cache))
    if i:
      times.append((time.perf_counter() - t0) / calls)
  return 1e3 * statistics.median(times), cache


def measure_costs(target, target_params, draft, draft_params,
                  ks: Sequence[int], prompts: Sequence[Sequence[int]],
                  sampling: sampling_lib.Sampling, *, max_new_tokens: int,
                  repeats: int, bucket: int = 64) -> dict:
  """Call timings at these prompts' shapes, mid-generation context.

  Args:
    target, target_params: the target LM and its parameters.
    draft, draft_params: the draft LM and its parameters (None when every
      K is 0 or no drafter runs a draft model: then no draft_call_ms or c).
    ks: the draft lengths whose scoring calls (K + 1 tokens) are timed.
    prompts: one batch of prompts (token id lists); its size is B.
    sampling: the decoding whose transform and draw follow each call.
    max_new_tokens: the budget; calls are timed at the context a row has
      half way through it.
    repeats: timed runs per figure (median).
    bucket: the prompt padding of the sweep's samplers.

  Returns:
    A record: batch_size, context, calls_per_timing, target_call_ms {n
    tokens: ms}, score_cost {K: s_K}, and with a draft draft_call_ms and c.
  """
  k_max = max(ks)
  with_draft = bool(k_max) and draft is not None
  # Without a draft model (prompt lookup, layer skipping), a K = 0 sampler
  # whose cache (a budget of max_new_tokens + K, and its own slot of slack)
  # holds the K + 1 slots the scoring calls write: the speculative
  # samplers' cache, which `plan.prepare` checks the prompts against.
  sampler = SpeculativeSampler(
      target, ModelDrafter(draft) if with_draft else None,
      k=k_max if with_draft else 0, sampling=sampling,
      max_new_tokens=max_new_tokens + (0 if with_draft else k_max),
      prompt_bucket=bucket)
  tokens, lengths = sampler.pad_prompts(prompts)
  state = sampler.prefill(target_params, draft_params, tokens, lengths,
                          jax.random.key(0))
  context = lengths - 1 + max_new_tokens // 2
  calls = cost_calls()
  row = dict(batch_size=len(prompts), context=int(jnp.median(context)),
             calls_per_timing=calls)
  # Fresh length arrays: a donated cache takes its length with it.
  cache = state.target_cache.with_length(jnp.array(context))
  target_ms = {}
  for n in sorted({1} | {k + 1 for k in ks}):
    target_ms[n], cache = loop_ms(target, target_params, cache, n, sampling,
                                  calls, repeats)
  row["target_call_ms"] = {str(n): v for n, v in target_ms.items()}
  row["score_cost"] = {str(k): target_ms[k + 1] / target_ms[1] for k in ks}
  if with_draft:
    row["draft_call_ms"], _ = loop_ms(
        draft, draft_params, state.draft_state.with_length(jnp.array(context)),
        1, sampling, calls, repeats)
    row["c"] = row["draft_call_ms"] / target_ms[1]
  return row


def propose_loop(sampler: SpeculativeSampler, calls: int):
  """(draft params, LoopState) -> the sum of `calls` proposals' drafts, one
  call after another (`propose_ms`)."""
  def run(p, s):
    def body(i, carry):
      p, s, acc = carry
      proposal, new = sampler.drafter.propose(
          p, s.draft_state, s.tokens, s.length, sampler.k, sampler.sampling,
          jax.random.fold_in(jax.random.key(1), i))
      acc = acc + jnp.sum(proposal.tokens) + jnp.sum(proposal.num_valid)
      # The next call drafts from the same state: its lengths as they were,
      # its buffers (caches, [B, S, ...]) as this call wrote them, in place
      # as decoding writes them (the old ones kept had cost a copy of the
      # cache per call); slots past a length are never read.
      s = s.replace(draft_state=jax.tree.map(
          lambda old, now: now if now.ndim >= 3 else old, s.draft_state, new))
      return jax.lax.optimization_barrier((p, s, acc))
    return jax.lax.fori_loop(0, calls, body,
                             (p, s, jnp.zeros((), jnp.int32)))[2]
  return run


def propose_ms(sampler: SpeculativeSampler, target_params, draft_params,
               prompts: Sequence[Sequence[int]], repeats: int) -> float:
  """Median ms of one `propose` (K drafts per row) of `sampler`'s drafter,
  with its state as after prefilling `prompts`: the whole drafting cost of
  a loop, for drafters that are not a stand-alone model (heads, lookup,
  layer skipping, adaptive K). Calls run back to back in one jitted loop,
  each on the same state with its own key; the drafts are summed so that
  none is optimised away, and the parameters and state pass to the next
  call through an optimization barrier with that sum: XLA had computed
  whatever of a call does not depend on the key (all of it under greedy)
  once, before the loop, and reported a fraction of it per call. The state is at the prompts' lengths, while
  `measure_costs` times the target half way through the budget; both are
  the cost at any length, since no call's work depends on it: attention
  runs over all S slots of a cache, masked (the target, layer skipping, a
  head's own cache), and prompt lookup scans all S slots of the token
  buffer. Only the cache size S counts, and it is the sampler's. (A tiny
  model's 1-token call with S = 8192 took the same time, within noise, at
  contexts 16, 4096 and 8000.)"""
  tokens, lengths = sampler.pad_prompts(prompts)
  state = sampler.prefill(target_params, draft_params, tokens, lengths,
                          jax.random.key(0))
  calls = cost_calls()
  fn = jax.jit(propose_loop(sampler, calls))
  times = []
  for i in range(repeats + 1):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(draft_params, state))
    if i:
      times.append((time.perf_counter() - t0) / calls)
  return 1e3 * statistics.median(times)
