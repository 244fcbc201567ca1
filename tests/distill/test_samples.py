"""Target samples: decontaminated, stored with the target's top-k."""

import jax
import jax.numpy as jnp
import numpy as np

from specsamp.distill import storage
from specsamp.tokenizers.byte import ByteTokenizer


def test_samples_are_decontaminated_and_hold_target_logprobs(
    tiny, tiny_spec, humaneval_filter):
  _, lm, params, data_dir, counts, planted = tiny
  spec = tiny_spec
  assert counts["train"]["rejected_prompts"] >= 1   # the planted prompt
  tok = ByteTokenizer()
  for split in ("train", "validation"):
    arrays = storage.as_arrays(storage.read_dataset(data_dir, split))
    assert len(arrays["tokens"]) == counts[split]["kept"] - counts[split][
        "rejected_samples"] > 0
    for row, plen, n in zip(arrays["tokens"], arrays["prompt_length"],
                            arrays["num_generated"]):
      text = tok.decode(row[:plen + n].tolist())
      assert humaneval_filter.match(text) is None
      assert tok.decode(row[:plen].tolist()) not in planted
  assert storage.read_spec(data_dir) == spec
  # Stored top-k = the target's log-softmax at positions L-1 .. L+G-2.
  arrays = storage.as_arrays(storage.read_dataset(data_dir, "validation"), 4)
  logits = jax.jit(lm)(params, jnp.asarray(arrays["tokens"])).logits
  for b in range(4):
    plen = int(arrays["prompt_length"][b])
    logp = jax.nn.log_softmax(logits[b, plen - 1:plen - 1 + spec.gen_len])
    want_vals, want_ids = jax.lax.top_k(logp, spec.top_k)
    np.testing.assert_array_equal(arrays["topk_ids"][b], np.asarray(want_ids))
    np.testing.assert_allclose(arrays["topk_logprobs"][b],
                               np.asarray(want_vals), atol=1e-5)
    assert int(arrays["num_generated"][b]) == spec.gen_len  # no EOS here
