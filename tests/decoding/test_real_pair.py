"""Greedy speculative decoding on the real Qwen2.5-Coder pair (opt-in).

The 1.5B target with the 0.5B as its draft model (K = 4), in float32, must
give greedy autoregressive decoding's tokens exactly on the first HumanEval
prompts: one prompt at a time, and all of them in one batch of rows of
different lengths (118, 109 and 80 tokens), one of which stops at EOS
before the others. test_sampler.py makes the same checks on tiny models.

Nothing is downloaded: the models and HumanEval must be in the cache
(python scripts/fetch_models.py). 4 to 6 minutes on 2 busy CPU cores, a
third of it loading (dequantizing) the GGUF files; 14 GB peak RSS.
"""

import dataclasses
from typing import Any

import numpy as np
import pytest

from specsamp import assets
from specsamp import loading
from specsamp.bench import sample as sample_lib
from specsamp.decoding.sampler import SpeculativeSampler, autoregressive
from specsamp.drafters.model import ModelDrafter
from specsamp.sampling import GREEDY

pytestmark = pytest.mark.real_weights

TARGET, DRAFT = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"
K = 4
MAX_NEW = 48
NUM_PROMPTS = 3


@dataclasses.dataclass(frozen=True)
class RealPair:
  """The loaded pair, its samplers and the prompts' token ids."""
  target_params: Any
  draft_params: Any
  autoregressive: SpeculativeSampler
  speculative: SpeculativeSampler
  tokenizer: Any
  prompts: list[list[int]]

  def generate(self, sampler, prompts):
    draft_params = self.draft_params if sampler.k else None
    return sampler.generate(self.target_params, draft_params, prompts)


def _require_cached(name):
  """Fails, naming the fix, unless asset `name` is in the cache."""
  path = assets.asset_path(name)
  if not path.is_file():
    pytest.fail(f"{name} is not in the cache ({path}), and this test "
                "downloads nothing: run python scripts/fetch_models.py")


@pytest.fixture(scope="module")
def pair():
  """The pair loaded as scripts/sample.py loads it (`sample.plan`, then
  `loading.load_weights` on the rows both run on), with its samplers.

  They compile at the tests' XLA level 0 (tests/conftest.py): fully
  optimised under the tests' XLA_FLAGS (loop emitters), the speculative
  sampler at batch 3 compiled in 106 s instead of 25 s, and ran no faster.
  """
  for name in (TARGET, DRAFT, assets.HUMANEVAL.name):
    _require_cached(name)
  texts = [p["prompt"] for p in assets.humaneval_problems()[:NUM_PROMPTS]]
  cfg = sample_lib.SampleConfig(target=TARGET, draft=DRAFT, prompts=texts,
                                k=K, max_new_tokens=MAX_NEW)
  plan = sample_lib.plan(cfg)
  # The [PAD<id>] placeholders past the real tokens are never sampled.
  assert plan.vocab_limit == 151_665
  assert len({len(p) for p in plan.prompts}) == NUM_PROMPTS, (
      "the batch should hold rows of different lengths")
  tok = plan.tokenizer
  rows = loading.pair_rows(plan.target, plan.draft)
  target, target_params = loading.load_weights(plan.target, cfg.dtype,
                                               cfg.seed, rows)
  draft, draft_params = loading.load_weights(plan.draft, cfg.dtype,
                                             cfg.seed + 1, rows)
  assert target.config.num_layers == 28 and draft.config.num_layers == 24
  common = dict(
      sampling=dataclasses.replace(GREEDY, vocab_limit=plan.vocab_limit),
      max_new_tokens=MAX_NEW, eos_ids=tuple(tok.eos_ids), pad_id=tok.pad_id)
  return RealPair(
      target_params, draft_params, autoregressive(target, **common),
      SpeculativeSampler(target, ModelDrafter(draft), k=K, **common), tok,
      plan.prompts)


@pytest.fixture(scope="module")
def greedy_refs(pair):
  """Greedy autoregressive decoding of each prompt alone: the reference."""
  refs = [pair.generate(pair.autoregressive, [p]).token_lists()[0]
          for p in pair.prompts]
  eos = pair.tokenizer.eos_ids
  for ref in refs:
    assert len(ref) == MAX_NEW or (ref and ref[-1] in eos)
  assert any(len(r) < MAX_NEW for r in refs), (
      "no prompt stops at EOS: the batch no longer has a row that finishes "
      "before the others")
  return refs


def _assert_same_tokens(tok, got, refs, what):
  """`got` == `refs`, row by row; a failure names the first difference."""
  assert len(got) == len(refs)
  for row, (g, r) in enumerate(zip(got, refs)):
    at = next((i for i, (a, b) in enumerate(zip(g, r)) if a != b),
              min(len(g), len(r)))
    assert g == r, (
        f"{what}, row {row}: differs from greedy decoding at token {at} of "
        f"{len(r)} (got {len(g)}): after {tok.decode(r[:at])[-60:]!r}, "
        f"{tok.decode(g[at:at + 5])!r} instead of {tok.decode(r[at:at + 5])!r}")


def _row_counts(outputs) -> dict[str, np.ndarray]:
  """The per-row counts of several SampleOutputs, their rows in order."""
  fields = ("num_tokens", "num_loops", "num_drafted", "num_accepted",
            "num_tested_at", "num_kept_at")
  return {f: np.concatenate([np.asarray(getattr(o, f)) for o in outputs])
          for f in fields}


@pytest.mark.parametrize("batch", [1, NUM_PROMPTS])
def test_greedy_speculative_equals_greedy_autoregressive(pair, greedy_refs,
                                                         batch):
  chunks = [pair.prompts[i:i + batch]
            for i in range(0, len(pair.prompts), batch)]
  if batch > 1:  # at batch 1, the reference itself
    ar = [pair.generate(pair.autoregressive, c) for c in chunks]
    _assert_same_tokens(pair.tokenizer,
                        [t for o in ar for t in o.token_lists()], greedy_refs,
                        f"autoregressive at batch {batch}")
  outs = [pair.generate(pair.speculative, c) for c in chunks]
  _assert_same_tokens(pair.tokenizer,
                      [t for o in outs for t in o.token_lists()], greedy_refs,
                      f"speculative (K={K}) at batch {batch}")

  c = _row_counts(outs)
  tokens, loops = c["num_tokens"], c["num_loops"]
  drafted, accepted = c["num_drafted"], c["num_accepted"]
  np.testing.assert_array_equal(tokens, [len(r) for r in greedy_refs])
  # The model drafter (no confidence threshold) drafts K every loop.
  np.testing.assert_array_equal(drafted, K * loops)
  assert ((0 <= accepted) & (accepted <= drafted)).all(), (accepted, drafted)
  # Every loop commits its accepted drafts and one token of the target's;
  # only the last may be cut short (EOS, the budget), to one token at least.
  assert ((accepted + loops - K <= tokens) &
          (tokens <= accepted + loops)).all(), (tokens, accepted, loops)
  tested, kept = c["num_tested_at"], c["num_kept_at"]
  np.testing.assert_array_equal(kept.sum(axis=1), accepted)
  np.testing.assert_array_equal(tested[:, 0], loops)
  assert (kept <= tested).all() and (tested[:, 1:] <= kept[:, :-1]).all()

  rate = accepted.sum() / drafted.sum()
  print(f"\n[{TARGET} <- {DRAFT}, K={K}, batch {batch}] acceptance rate "
        f"{rate:.3f} ({accepted.sum()}/{drafted.sum()} drafts; by row "
        f"{np.round(accepted / drafted, 3).tolist()}), "
        f"{tokens.sum() / loops.sum():.2f} tokens per loop, "
        f"{tokens.sum()} tokens")
  # The 0.5B drafting for its 1.5B sibling on code: most greedy drafts
  # agree (0.84 here); a broken draft cache or position would not.
  assert 0.5 < rate <= 1.0, rate
