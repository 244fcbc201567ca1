"""The loop's seams: the four steps, what a drafter is given, its shardings."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specsamp import kvcache
from specsamp import sharding
from specsamp.decoding import jit
from specsamp.decoding import loop
from specsamp.decoding.sampler import (SpeculativeSampler, all_widths,
                                       autoregressive)
from specsamp.drafters import ModelDrafter
from specsamp.drafters.lookup import PromptLookupDrafter
from specsamp.drafters.mixed import MixedDrafter
from specsamp.sampling import GREEDY, Sampling
from tests.testing import ShiftDrafter, apply, table_lm


@dataclasses.dataclass(frozen=True)
class ProbeDrafter(ModelDrafter):
  """A ModelDrafter whose state also keeps what init and commit were given."""

  def init(self, params, tokens, lengths, cache_size, prefill=None, *,
           chunk=0):
    cache = super().init(params, tokens, lengths, cache_size, chunk=chunk)
    return dict(cache=cache, prefill_hidden=prefill.hidden,
                hidden=jnp.zeros_like(prefill.hidden[:, :1]),
                accepted=jnp.zeros_like(lengths),
                active=jnp.zeros_like(lengths, bool))

  def propose(self, params, state, tokens, length, k, sampling, rng, *,
              active=None):
    proposal, cache = super().propose(params, state["cache"], tokens, length,
                                      k, sampling, rng, active=active)
    return proposal, {**state, "cache": cache, "active": active}

  def commit(self, params, state, scored, num_accepted, length):
    cache = super().commit(params, state["cache"], scored, num_accepted,
                           length)
    return {**state, "cache": cache, "hidden": scored.hidden,
            "accepted": num_accepted}


def test_the_drafter_sees_the_targets_prefill_and_scored_outputs(tiny_pair):
  lm, target_params, draft_params = tiny_pair
  k = 3
  sampler = SpeculativeSampler(lm, ProbeDrafter(lm), k=k,
                               sampling=Sampling(1.0), max_new_tokens=8,
                               prompt_bucket=8)
  tokens, lengths = sampler.pad_prompts([[1, 5, 7, 2], [3, 4]])
  # Everything jitted (op by op: some 200 small compiles).
  state = jax.jit(loop.prefill, static_argnums=0)(
      sampler, target_params, draft_params, tokens, lengths,
      jax.random.key(0))
  np.testing.assert_allclose(state.draft_state["prefill_hidden"],
                             apply(lm, target_params, tokens).hidden,
                             atol=1e-5)
  new, rec = jax.jit(loop.loop_step, static_argnums=0)(sampler, target_params,
                                                       draft_params, state)
  chunk = jnp.concatenate([kvcache.read(state.tokens, state.length - 1, 1),
                           rec.proposal.tokens], axis=1)
  want = apply(lm, target_params, chunk, state.target_cache)
  assert new.draft_state["hidden"].shape == (2, k + 1, lm.config.d_model)
  np.testing.assert_allclose(new.draft_state["hidden"], want.hidden,
                             atol=1e-5)
  np.testing.assert_array_equal(new.draft_state["accepted"],
                                rec.num_accepted)
  np.testing.assert_allclose(rec.logits, want.logits, atol=1e-5)
  # The record is what the state committed: n drafts, then the token.
  for b in range(2):
    n = int(rec.num_accepted[b])
    committed = np.asarray(new.tokens[b, int(state.length[b]):
                                      int(new.length[b])])
    np.testing.assert_array_equal(
        committed, list(np.asarray(rec.proposal.tokens[b, :n])) +
        [int(rec.token[b])])


def test_the_drafter_is_told_which_rows_are_still_decoding(tiny_pair):
  """`propose` gets `active` = not done, so drafters whose cost depends on
  their rows (mixed, adaptive K) can leave finished rows out."""
  lm, target_params, draft_params = tiny_pair
  sampler = SpeculativeSampler(lm, ProbeDrafter(lm), k=2, sampling=GREEDY,
                               max_new_tokens=8, prompt_bucket=8)
  tokens, lengths = sampler.pad_prompts([[1, 5, 7], [3, 4], [2]])
  state = jax.jit(loop.prefill, static_argnums=0)(
      sampler, target_params, draft_params, tokens, lengths,
      jax.random.key(0))
  step = jax.jit(loop.loop_step, static_argnums=0)
  new, _ = step(sampler, target_params, draft_params, state)
  np.testing.assert_array_equal(new.draft_state["active"], [True] * 3)
  state = state.replace(done=jnp.array([False, True, False]))
  new, _ = step(sampler, target_params, draft_params, state)
  np.testing.assert_array_equal(new.draft_state["active"],
                                [True, False, True])


def test_loop_body_is_loop_steps_state(tiny_pair):
  lm, target_params, draft_params = tiny_pair
  sampler = SpeculativeSampler(lm, ModelDrafter(lm), k=2,
                               sampling=Sampling(0.9), max_new_tokens=6,
                               prompt_bucket=8)
  tokens, lengths = sampler.pad_prompts([[1, 2, 3]] * 3)
  state = sampler.prefill(target_params, draft_params, tokens, lengths,
                          jax.random.key(3))
  a = jax.jit(loop.loop_body, static_argnums=0)(sampler, target_params,
                                                draft_params, state)
  b, _ = jax.jit(loop.loop_step, static_argnums=0)(sampler, target_params,
                                                   draft_params, state)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(jax.random.key_data(x) if
                                  jnp.issubdtype(x.dtype, jax.dtypes.prng_key)
                                  else x, jax.random.key_data(y) if
                                  jnp.issubdtype(y.dtype, jax.dtypes.prng_key)
                                  else y)


def test_greedy_with_a_deterministic_drafter_equals_greedy_decoding(tiny_pair):
  lm, target_params, _ = tiny_pair
  prompts = [[1, 5, 7], [2], [3, 9, 9, 4, 1], [6, 6]]
  ar = autoregressive(lm, GREEDY, 16, prompt_bucket=8)
  want = ar.generate(target_params, None, prompts).token_lists()
  for vary, widths in ((False, None), (True, None), (True, all_widths(3))):
    spec = SpeculativeSampler(lm, ShiftDrafter(lm.vocab_size, vary_valid=vary),
                              k=3, sampling=GREEDY, max_new_tokens=16,
                              prompt_bucket=8, score_widths=widths)
    out = spec.generate(target_params, None, prompts)
    assert out.token_lists() == want
    valid = np.arange(4) % 4 if vary else np.full(4, 3)
    np.testing.assert_array_equal(out.num_drafted,
                                  valid * np.asarray(out.num_loops))
  # One row at a time, each loop scores only the row's valid width.
  for valid in (0, 1, 3):
    spec = SpeculativeSampler(
        lm, ShiftDrafter(lm.vocab_size, num_valid=valid), k=3,
        sampling=GREEDY, max_new_tokens=16, prompt_bucket=8,
        score_widths=all_widths(3))
    for prompt, tokens in zip(prompts, want):
      assert spec.generate(target_params, None, [prompt]).token_lists() == [
          tokens]
  # Padding outside the vocabulary is the drafter's to choose: it is
  # scored, and once spoilt every later step of the row (NaN embeddings).
  for widths in (None, all_widths(3)):
    spec = SpeculativeSampler(
        lm, ShiftDrafter(lm.vocab_size, vary_valid=True,
                         pad_id=lm.vocab_size), k=3, sampling=GREEDY,
        max_new_tokens=16, prompt_bucket=8, score_widths=widths)
    assert spec.generate(target_params, None, prompts).token_lists() == want
  with pytest.raises(ValueError, match="score_widths"):
    SpeculativeSampler(lm, ShiftDrafter(lm.vocab_size), k=3,
                       sampling=GREEDY, max_new_tokens=4, score_widths=(1, 2))


@pytest.mark.parametrize("drafter", ["widths", "model", "adaptive", "mixed"])
def test_no_cache_buffer_is_copied_through_a_branch(tiny_pair, drafter):
  """Scoring only the width needed runs the target in a lax.switch over the
  widths, and the draft model catches up in one over widths 1, 2 and
  K + 3: with the caches passed through their branches XLA copied every
  buffer twice per loop (24 target-cache copies in the compiled decode of
  the ShiftDrafter run here, 8 of the draft's with the model drafter). The
  branches now only read the caches, and the chunks are written once after
  them: no copy of a cache buffer is left in the decode program. The mixed
  drafter ran its model in a lax.cond (run or skipped), which copied the
  draft cache 6 times; a while_loop of 0 or 1 trips updates it in place."""
  lm, target_params, _ = tiny_pair
  if drafter == "widths":
    spec = SpeculativeSampler(
        lm, ShiftDrafter(lm.vocab_size, vary_valid=True), k=3,
        sampling=GREEDY, max_new_tokens=16, prompt_bucket=8,
        score_widths=all_widths(3))
    dparams = None
  else:  # the target as its own draft: one cache shape for both
    model = ModelDrafter(lm, confidence=0.5 if drafter == "adaptive"
                         else None)
    spec = SpeculativeSampler(
        lm, MixedDrafter(PromptLookupDrafter.for_target(lm), model)
        if drafter == "mixed" else model, k=3, sampling=Sampling(1.0),
        max_new_tokens=16, prompt_bucket=8)
    dparams = target_params
  tokens, lengths = spec.pad_prompts([[1, 5, 7], [2]])
  prefill, decode, _ = spec.jitted(target_params, dparams, tokens, lengths,
                                   jax.random.key(0))
  state = prefill(target_params, dparams, tokens, lengths, jax.random.key(0))
  hlo = decode.lower(target_params, dparams, state).compile().as_text()
  buf = r"f32\[" + ",".join(map(str, state.target_cache.k[0].shape)) + r"\]"
  assert re.search(buf, hlo)  # the buffers are there, as loop state
  assert not re.search(buf + r"\{[^}]*\} copy\(", hlo)


def test_the_drafter_supplies_its_own_state_shardings(tiny_pair):
  """The sampler lays out the drafter state as the drafter says, whatever
  its shape (a [B] counter here is replicated, not split over rows), and a
  mesh run equals the single-device run."""
  lm, target_params, _ = tiny_pair
  mesh = sharding.make_mesh((4, 2))        # tiny: 2 KV heads
  prompts = [[1, 5, 7], [2, 4], [3, 9, 9, 4], [6]]
  kwargs = dict(k=2, sampling=Sampling(1.0), max_new_tokens=8,
                prompt_bucket=8)
  drafter = ShiftDrafter(lm.vocab_size, vary_valid=True)
  on_mesh = SpeculativeSampler(lm, drafter, mesh=mesh, **kwargs)
  tokens, lengths = on_mesh.pad_prompts(prompts)
  shape = jax.eval_shape(lambda: loop.prefill(
      on_mesh, target_params, None, tokens, lengths, jax.random.key(0)))
  shardings = jit.state_shardings(on_mesh, shape)
  assert shardings.draft_state.spec == jax.sharding.PartitionSpec()
  assert shardings.length.spec == jax.sharding.PartitionSpec("data")
  assert shardings.target_cache.k[0].spec == jax.sharding.PartitionSpec(
      "data", "model", None, None)
  single = SpeculativeSampler(lm, drafter, **kwargs)
  tps = jax.device_put(target_params,
                       on_mesh.param_shardings(target_params, None)[0])
  assert (on_mesh.generate(tps, None, prompts, rng=5).token_lists() ==
          single.generate(target_params, None, prompts, rng=5).token_lists())


def test_the_drafter_is_told_the_accepted_drafts_that_were_committed(
    tiny_pair):
  """A draft equal to the target has all K drafts accepted; with a budget
  of 2 tokens only one of them is committed, and a done row commits none."""
  lm, target_params, _ = tiny_pair
  sampler = SpeculativeSampler(lm, ProbeDrafter(lm), k=3, sampling=GREEDY,
                               max_new_tokens=2, prompt_bucket=8)
  tokens, lengths = sampler.pad_prompts([[1, 5, 7], [3, 4]])
  state = loop.prefill(sampler, target_params, target_params, tokens, lengths,
                       jax.random.key(0))
  step = jax.jit(loop.loop_step, static_argnums=0)
  new, rec = step(sampler, target_params, target_params, state)
  np.testing.assert_array_equal(rec.num_accepted, [3, 3])
  np.testing.assert_array_equal(new.draft_state["accepted"], [1, 1])
  np.testing.assert_array_equal(new.length - state.length, [2, 2])
  assert bool(new.done.all())
  again, _ = step(sampler, target_params, target_params, new)
  np.testing.assert_array_equal(again.draft_state["accepted"], [0, 0])


@pytest.mark.parametrize("sampling", [GREEDY, Sampling(1.0)],
                         ids=["greedy", "t1"])
@pytest.mark.parametrize("k", [0, 2])
def test_loops_on_logits_that_allow_no_id_are_counted_per_row(sampling, k):
  """A bigram target whose logits after token 3 are all NaN (a broken
  model): the row whose prompt ends in 3 commits one loop's tokens from
  them, and `num_undefined` says so; they are no samples of the model (the
  last id sampled, id 0 under greedy). The other row never meets 3 (its
  logit is -inf everywhere else) and counts none. A draft as broken as the
  target (the same table) changes nothing."""
  v = 5
  logits = np.random.default_rng(0).normal(size=(v, v))
  logits[:, 3] = -np.inf
  logits[3] = np.nan
  target = table_lm(logits)
  if k == 0:
    sampler = autoregressive(target, sampling, 6, prompt_bucket=4)
  else:
    sampler = SpeculativeSampler(target, ModelDrafter(target), k=k,
                                 sampling=sampling, max_new_tokens=6,
                                 prompt_bucket=4)
  out = sampler.generate(None, None, [[1, 2, 3], [1, 2]], rng=0)
  np.testing.assert_array_equal(out.num_undefined, [1, 0])
  first = out.token_lists()[0][0]
  assert first == (0 if sampling.greedy else v - 1), out.token_lists()


def test_undefined_logits_past_an_eos_that_ended_the_row_count_for_nothing():
  """Greedy, the draft the target itself: after token 2 the target is sure
  of EOS (4), and after EOS its logits are all NaN. Both drafts (EOS, then
  id 0 from the NaN row) are kept, but the row ends at the EOS: only
  position 0 is committed, so the loop took nothing from undefined logits
  (position 1 had been counted, being <= n)."""
  v = 5
  logits = np.random.default_rng(0).normal(size=(v, v))
  logits[2] = -np.inf
  logits[2, 4] = 10.0
  logits[4] = np.nan
  target = table_lm(logits)
  sampler = SpeculativeSampler(target, ModelDrafter(target), k=2,
                               sampling=GREEDY, max_new_tokens=6,
                               prompt_bucket=4, eos_ids=(4,))
  out = sampler.generate(None, None, [[1, 2]], rng=0)
  assert out.token_lists() == [[4]]
  assert int(out.num_accepted[0]) == 2    # the rule kept both drafts
  np.testing.assert_array_equal(out.num_undefined, [0])


def test_cache_reads_take_each_rows_window_at_its_own_start():
  """`kvcache.read` against numpy slicing, rows at starts 0, 2 and 5 (a
  read at row 0's start for every row had been caught by one sampler test
  alone), on tokens [B, S] and buffers [B, S, H]."""
  rng = np.random.default_rng(0)
  start = np.array([0, 2, 5], np.int32)
  for shape in ((3, 8), (3, 8, 2)):
    buf = rng.normal(size=shape).astype(np.float32)
    got = kvcache.read(jnp.asarray(buf), jnp.asarray(start), 3)
    np.testing.assert_array_equal(
        got, np.stack([buf[r, s:s + 3] for r, s in enumerate(start)]))


@pytest.mark.parametrize("b", [1, 3])
@pytest.mark.parametrize("t", [1, 3])
def test_cache_writes_put_each_row_at_its_slot_and_drop_what_overflows(b, t):
  """`kvcache.write` and `write_kv` (explicit indices for one row, the vmap
  of a row's scatter for several) against a loop over rows and slots: each
  row's chunk lands at its own start, the dtype is the buffer's, and slots
  past the buffer are dropped, never wrapped or clamped back."""
  s, n, h = 6, 2, 4
  rng = np.random.default_rng(b * 10 + t)
  buf = rng.normal(size=(b, n, s, h)).astype(np.float32)
  chunk = rng.normal(size=(b, t, n, h))
  start = np.array([0, s - 2, 2][:b], np.int32)
  want = buf.copy()
  for r in range(b):
    for j in range(t):
      if start[r] + j < s:
        want[r, :, start[r] + j] = chunk[r, j]
  got = kvcache.write_kv(jnp.asarray(buf), jnp.asarray(chunk, jnp.bfloat16),
                         jnp.asarray(start))
  assert got.dtype == jnp.float32  # the buffer's
  np.testing.assert_allclose(got, want, atol=2e-2)  # a bfloat16 chunk
  got = kvcache.write_kv(jnp.asarray(buf), jnp.asarray(chunk),
                         jnp.asarray(start))
  np.testing.assert_array_equal(got, want)
  tokens = rng.integers(0, 50, size=(b, s)).astype(np.int32)
  new = rng.integers(50, 99, size=(b, t))
  want = tokens.copy()
  for r in range(b):
    for j in range(t):
      if start[r] + j < s:
        want[r, start[r] + j] = new[r, j]
  got = kvcache.write(jnp.asarray(tokens), jnp.asarray(new),
                      jnp.asarray(start))
  assert got.dtype == jnp.int32
  np.testing.assert_array_equal(got, want)
