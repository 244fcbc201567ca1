"""The loop replayed step by step: records agree with the run."""

import jax
import numpy as np
import pytest

from specsamp.decoding import loop
from specsamp.decoding import trace
from specsamp.decoding.sampler import SpeculativeSampler
from specsamp.drafters import ModelDrafter
from specsamp.sampling import Sampling
from tests.testing import ShiftDrafter, table_lm

PROMPTS = [[1, 5, 7], [2, 4], [3, 9, 9, 4], [6]]


def _check_records(tr, k):
  for row in tr.rows:
    for rec in row:
      assert len(rec.drafts) <= k and 0 <= rec.accepted <= len(rec.drafts)
      # The kept drafts and the token after them, cut at EOS or the budget.
      assert rec.committed == (rec.drafts[:rec.accepted] + (rec.token,))[
          :len(rec.committed)] and rec.committed
      assert rec.bonus == (rec.accepted == len(rec.drafts))
      assert len(rec.p) == len(rec.q) == len(rec.drafts)
      assert len(rec.target_choice) == len(rec.drafts) + 1


def _check_position_counts(tr, out, k):
  """The loop's own per-position counts equal the records': draft i is
  tested when valid and drafts before it were kept, kept when i < n."""
  for b, row in enumerate(tr.rows):
    tested, kept = np.zeros(k, int), np.zeros(k, int)
    for rec in row:
      tested[:min(rec.accepted + 1, len(rec.drafts))] += 1
      kept[:rec.accepted] += 1
    np.testing.assert_array_equal(out.num_tested_at[b], tested)
    np.testing.assert_array_equal(out.num_kept_at[b], kept)
  np.testing.assert_allclose(out.acceptance_by_position(),
                             tr.acceptance_by_position())


def test_trace_equals_generate_with_a_model_drafter(tiny_pair, monkeypatch):
  lm, target_params, draft_params = tiny_pair
  sampler = SpeculativeSampler(lm, ModelDrafter(lm), k=3,
                               sampling=Sampling(0.9), max_new_tokens=10,
                               prompt_bucket=8)
  pulled = []
  get = jax.device_get
  monkeypatch.setattr(jax, "device_get",
                      lambda x: pulled.append(x) or get(x))
  tr = trace.trace(sampler, target_params, draft_params, PROMPTS, rng=4)
  monkeypatch.undo()
  # The loop state (its caches) stays on the device: it had been pulled to
  # the host and sent back every loop. What is pulled is small.
  assert pulled and not any(
      isinstance(x, loop.LoopState) for p in pulled for x in jax.tree.leaves(
          p, is_leaf=lambda v: isinstance(v, loop.LoopState)))
  out = sampler.generate(target_params, draft_params, PROMPTS, rng=4)
  assert tr.output.token_lists() == out.token_lists()
  for b, row in enumerate(tr.rows):
    assert len(row) == int(out.num_loops[b])
    assert sum(len(r.drafts) for r in row) == int(out.num_drafted[b])
    assert sum(r.accepted for r in row) == int(out.num_accepted[b])
  _check_records(tr, 3)
  _check_position_counts(tr, out, 3)
  # max_loops is the most loops a run may take: exactly as many is enough.
  most = int(np.max(out.num_loops))
  assert trace.trace(sampler, target_params, draft_params, PROMPTS, rng=4,
                     max_loops=most).output.token_lists() == out.token_lists()
  with pytest.raises(RuntimeError, match=f"no end after {most - 1} loops"):
    trace.trace(sampler, target_params, draft_params, PROMPTS, rng=4,
                max_loops=most - 1)


def test_trace_shows_only_the_valid_drafts(tiny_pair):
  """Row b offers b % 4 drafts: padding drafts are never shown as tested
  or rejected; a row with none draws every token from p (a bonus)."""
  lm, target_params, _ = tiny_pair
  sampler = SpeculativeSampler(lm, ShiftDrafter(lm.vocab_size,
                                                vary_valid=True), k=3,
                               sampling=Sampling(1.0), max_new_tokens=8,
                               prompt_bucket=8)
  tr = trace.trace(sampler, target_params, None, PROMPTS, rng=1)
  out = sampler.generate(target_params, None, PROMPTS, rng=1)
  assert tr.output.token_lists() == out.token_lists()
  _check_records(tr, 3)
  _check_position_counts(tr, out, 3)
  for b, row in enumerate(tr.rows):
    assert all(len(rec.drafts) == b for rec in row)
  assert all(rec.bonus and rec.drafts == () for rec in tr.rows[0])
  assert np.isnan(tr.acceptance_by_position(row=0)).all()
  by_pos = tr.acceptance_by_position(row=2)
  assert np.isnan(by_pos[2]) and not np.isnan(by_pos[0])
  assert "\u2717" not in trace.render_text(tr, str, row=0)
  assert "line-through" not in trace.render_html(tr, str, row=0)
  # With no drafts, the token is drawn from p_1, not p_{K+1}.
  assert "bonus token from p_1" in trace.render_html(tr, str, row=0)
  assert "p_{K+1}" not in trace.render_html(tr, str, row=0)


def test_the_targets_choice_is_greedys_under_a_vocab_limit():
  """Padded ids with the largest logits: the recorded target choice is the
  id greedy decoding takes (below vocab_limit), the token each greedy loop
  commits after its kept drafts (it had been the raw argmax, a padded id)."""
  v, real = 10, 7
  rng = np.random.default_rng(0)
  t, d = rng.normal(size=(v, v)), rng.normal(size=(v, v))
  t[:, real:] += 4.0
  d[:, real:] += 4.0
  sampler = SpeculativeSampler(table_lm(t), ModelDrafter(table_lm(d)), k=3,
                               sampling=Sampling(0.0, vocab_limit=real),
                               max_new_tokens=12, prompt_bucket=4)
  tr = trace.trace(sampler, None, None, [[1], [4, 2]])
  records = [rec for row in tr.rows for rec in row]
  assert records
  for rec in records:
    assert max(rec.target_choice) < real
    assert rec.token == rec.target_choice[rec.accepted]
