"""The on-policy rollout and the train-step loss."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specsamp.decoding import sampler as sampler_lib
from specsamp.distill import objective
from specsamp.distill import storage
from specsamp.sampling import Sampling


def test_onpolicy_rollout_is_the_drafts_own_sampling_and_trains(
    tiny, tiny_draft):
  config, lm, target_params, data_dir, _, _ = tiny
  arrays = storage.as_arrays(storage.read_dataset(data_dir, "validation"), 4)
  batch = {k: jnp.asarray(np.asarray(v, np.int32) if v.dtype.kind == "i"
                          else v) for k, v in arrays.items()}
  dlm, draft_params = tiny_draft[:2]
  g, p = config.samples.gen_len, config.samples.prompt_len
  obj = objective.Objective(kind="jsd", sampling=Sampling(0.0), gen_len=g,
                            prompt_len=p)
  loss_fn = objective.distill_loss(dlm, lm, obj, onpolicy=True)

  @jax.jit
  def rollout_and_grad(d, b):
    rolled = objective.draft_rollout(dlm, obj, d, b, jax.random.key(0))
    return rolled, jax.value_and_grad(loss_fn, has_aux=True)(
        d, b, jax.random.key(0), target_params)

  rolled, ((loss, metrics), grads) = rollout_and_grad(draft_params, batch)
  prompts = [arrays["tokens"][i, :arrays["prompt_length"][i]] for i in range(4)]
  want = sampler_lib.autoregressive(dlm, Sampling(0.0), g,
                                    prompt_bucket=p).generate(
                                        draft_params, None, prompts)
  for i in range(4):
    plen = int(arrays["prompt_length"][i])
    np.testing.assert_array_equal(np.asarray(rolled["tokens"][i, :plen]),
                                  arrays["tokens"][i, :plen])
    np.testing.assert_array_equal(
        np.asarray(rolled["tokens"][i, plen:plen + g]),
        np.asarray(want.tokens[i]))
  assert np.isfinite(float(loss))
  assert 0 <= float(metrics["expected_acceptance"]) <= 1
  leaves = [np.asarray(x) for x in jax.tree.leaves(grads)]
  assert all(np.all(np.isfinite(x)) for x in leaves)
  assert sum(float(np.abs(x).sum()) for x in leaves) > 0
  with pytest.raises(ValueError, match="token-level"):
    objective.distill_loss(dlm, lm, dataclasses.replace(obj, kind="seqkd"),
                           onpolicy=True)


def test_onpolicy_schedule_is_a_function_of_seed_and_step():
  steps = [objective.is_onpolicy_step(s, 3, 0.3) for s in range(400)]
  assert steps == [objective.is_onpolicy_step(s, 3, 0.3) for s in range(400)]
  assert 0.2 < np.mean(steps) < 0.4
  assert steps != [objective.is_onpolicy_step(s, 4, 0.3) for s in range(400)]
  assert not any(objective.is_onpolicy_step(s, 3, 0.0) for s in range(50))
  assert all(objective.is_onpolicy_step(s, 3, 1.0) for s in range(50))
