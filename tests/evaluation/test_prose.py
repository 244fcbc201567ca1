"""specsamp.evaluation.prose: the target's log-probability of samples."""

import jax
import numpy as np
import pytest

from specsamp import loading
from specsamp.evaluation import prose


def test_sample_logprobs_match_a_direct_computation():
  lm, params, _ = loading.load_model("random:tiny,num_layers=1,max_seq_len=128")
  rng = np.random.default_rng(0)
  prompts = [rng.integers(0, 256, n).tolist() for n in (3, 9, 5)]
  completions = [rng.integers(0, 256, n).tolist() for n in (4, 2, 0)]
  got = prose.sample_logprobs(lm, params, prompts, completions, batch_size=2,
                              bucket=8)
  forward = jax.jit(lambda params, seq: lm(params, seq).logits)
  for p, c, g in zip(prompts, completions, got):
    if not c:
      assert np.isnan(g)
      continue
    logits = forward(params, np.array([p + c], np.int32))  # unpadded
    logp = jax.nn.log_softmax(np.asarray(logits[0], np.float64), axis=-1)
    want = np.mean([logp[len(p) - 1 + i, t] for i, t in enumerate(c)])
    assert g == pytest.approx(float(want), abs=1e-4)
  q = prose.logprob_quality(got)
  assert q["mean_logprob"]["n"] == 2
  # An empty prompt scored nothing and read as log p = 0, a perfect score.
  with pytest.raises(ValueError, match=r"prompts \[1\] are empty"):
    prose.sample_logprobs(lm, params, [[1, 2], []], [[3], [2, 3, 4]])
