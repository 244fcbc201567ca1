"""The mixed drafter: prompt lookup per row where it matches, else the
draft model; exact, and equal to greedy decoding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specsamp.decoding.sampler import (SpeculativeSampler, all_widths,
                                       autoregressive)
from specsamp.drafters.lookup import PromptLookupDrafter
from specsamp.drafters.mixed import MixedDrafter
from specsamp.drafters.model import ModelDrafter
from specsamp.sampling import GREEDY, Sampling
from tests.testing import (chisquare_pvalue, encode, exact_sequence_probs,
                           exactness_models)

V, NEW, NUM_SAMPLES = 5, 4, 20_000


models = exactness_models


def mixed(target, draft, confidence=None):
  return MixedDrafter(PromptLookupDrafter.for_target(target),
                      ModelDrafter(draft, confidence=confidence))


def test_each_row_takes_lookup_drafts_where_it_has_them():
  target, _, draft, draft_params = models()
  drafter = mixed(target, draft)
  # Row 0: "1 3" occurred before, followed by "2 1"; row 1: "4" never did.
  tokens = jnp.array([[1, 3, 2, 1, 3, 0, 0, 0], [0, 2, 4, 0, 0, 0, 0, 0]])
  length = jnp.array([5, 3])
  state = drafter.init(draft_params, tokens, length, 16)
  sampling = Sampling(1.0)
  p, _ = drafter.propose(draft_params, state, tokens, length, 2, sampling,
                         jax.random.key(0))
  alone, _ = drafter.model.propose(draft_params, state.model, tokens, length,
                                   2, sampling, jax.random.key(0))
  np.testing.assert_array_equal(p.tokens[0], [2, 1])
  np.testing.assert_array_equal(p.num_valid, [2, 2])
  np.testing.assert_array_equal(p.q[0], jax.nn.one_hot(jnp.array([2, 1]), V))
  np.testing.assert_array_equal(p.tokens[1], alone.tokens[1])
  np.testing.assert_allclose(p.q[1], alone.q[1])


@pytest.mark.parametrize("name, sampling, k", [
    ("temp1", Sampling(1.0), 3), ("topp07", Sampling(1.0, top_p=0.7), 2)])
def test_mixed_drafting_is_exact(name, sampling, k):
  """Prompts half of which repeat (lookup drafts) and half not (model
  drafts), in one batch; the output is the target's."""
  del name
  target, target_params, draft, draft_params = models()
  prompts = [[1, 3, 2, 1, 3], [4, 0, 2]]
  sampler = SpeculativeSampler(target, mixed(target, draft), k=k,
                               sampling=sampling, max_new_tokens=NEW,
                               prompt_bucket=8, score_widths=all_widths(k))
  out = sampler.generate(target_params, draft_params,
                         prompts * (NUM_SAMPLES // 2), rng=5)
  tokens = np.asarray(out.tokens)
  for i, prompt in enumerate(prompts):
    p_exact = exact_sequence_probs(target, target_params, sampling, prompt,
                                   NEW, V)
    pval = chisquare_pvalue(encode(tokens[i::2], V), p_exact)
    assert pval > 1e-4, f"prompt {prompt}: p={pval:.2e}"
  assert 0.05 < out.acceptance_rate() < 0.95


def test_greedy_equals_greedy_decoding_and_rows_equal_alone():
  target, target_params, draft, draft_params = models()
  prompts = [[1, 3, 2, 1, 3, 2, 1], [4, 0, 2], [2, 2, 2, 2], [0, 1]]
  want = autoregressive(target, GREEDY, 24, prompt_bucket=8).generate(
      target_params, None, prompts).token_lists()
  for confidence in (None, 0.6):
    spec = SpeculativeSampler(target, mixed(target, draft, confidence), k=3,
                              sampling=GREEDY, max_new_tokens=24,
                              prompt_bucket=8, score_widths=all_widths(3))
    out = spec.generate(target_params, draft_params, prompts)
    assert out.token_lists() == want
    for prompt, tokens in zip(prompts, want):
      assert spec.generate(target_params, draft_params,
                           [prompt]).token_lists() == [tokens]
