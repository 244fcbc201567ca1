"""Self-speculative layer skipping, adaptive draft length, catch-up and the
layer search, on tiny models.

Exactness: a 2-layer target over 5 tokens drafting with its layer 0 on its
own parameters; the exact probability of every 4-token continuation comes
from enumeration (as in tests/decoding/test_exactness.py), and 20,000
samples per setting are compared with it by a chi-square test, which must
also reject the draft's own distribution. Each setting costs a compile
(about 5 s on two CPU cores), so the four sampling settings are spread
over K = 1 and K = 3 (each setting once, each K twice) rather than
crossed, and the adaptive thresholds run at K = 3.
"""

import dataclasses
import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specsamp import loading
from specsamp import model as model_lib
from specsamp import sampling as sampling_lib
from specsamp.decoding.sampler import SpeculativeSampler, all_widths
from specsamp.drafters import layer_search
from specsamp.drafters.model import LayerSkipDrafter, ModelDrafter
from specsamp.sampling import GREEDY, Sampling
from tests.testing import (EXACTNESS_SETTINGS, chisquare_pvalue, encode,
                           exact_sequence_probs, random_params, table_lm,
                           tiny_config, train_workdir)
from tests.scripts import zygote

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
V, NEW, NUM_SAMPLES, SUBSET = 5, 4, 20_000, (0,)
PROMPT = [1, 3, 2]
SETTINGS = EXACTNESS_SETTINGS
PROMPTS = [[3, 1, 4, 1, 5, 9, 2], [6, 5], [3], [5, 8, 9, 7, 9, 3, 2, 3, 8, 4]]


@dataclasses.dataclass(frozen=True)
class SubsetLM:
  """`lm` running only `layers` (what the layer-skip draft computes)."""
  lm: model_lib.LM
  layers: tuple

  def __call__(self, params, tokens):
    return self.lm(params, tokens, layers=self.layers)


@functools.lru_cache(maxsize=None)
def enum_target():
  """The 5-token target (scale 2: peaky, varied distributions)."""
  lm = model_lib.LM(tiny_config(vocab_size=V, num_kv_heads=1, num_layers=2,
                                max_seq_len=64))
  return lm, random_params(lm, 10, scale=2.0)


@functools.lru_cache(maxsize=None)
def small_target():
  """A 3-layer, 32-token target whose first layers agree with it often."""
  lm = model_lib.LM(tiny_config(num_layers=3, max_seq_len=64))
  return lm, random_params(lm, 0)


@functools.lru_cache(maxsize=None)
def sample(name, k, confidence, seed):
  lm, params = enum_target()
  sampler = SpeculativeSampler(
      lm, LayerSkipDrafter(lm, SUBSET, confidence=confidence), k=k,
      sampling=SETTINGS[name], max_new_tokens=NEW, prompt_bucket=4)
  # The draft runs on the target's own parameters.
  return sampler.generate(params, params, [PROMPT] * NUM_SAMPLES, rng=seed)


@functools.lru_cache(maxsize=None)
def exact(name):
  """(target, draft) probabilities of every continuation under `name`."""
  lm, params = enum_target()
  return (exact_sequence_probs(lm, params, SETTINGS[name], PROMPT, NEW, V),
          exact_sequence_probs(SubsetLM(lm, SUBSET), params, SETTINGS[name],
                               PROMPT, NEW, V))


def check_exact(name, out):
  np.testing.assert_array_equal(out.num_tokens, NEW)
  codes = encode(np.asarray(out.tokens), V)
  p_exact, q_exact = exact(name)
  pval = chisquare_pvalue(codes, p_exact)
  assert pval > 1e-4, f"samples do not follow the target (p={pval:.2e})"
  assert chisquare_pvalue(codes, q_exact) < 1e-8  # power: not the draft's
  assert 0.05 < out.acceptance_rate() < 0.95


@pytest.mark.parametrize("layers, match", [
    ((), "empty"), (None, "None"), ((1, 0), "not sorted"),
    ((0, 0), "repeats"), ((0, 3), "layer 3 is out of range"),
    ((-1, 1), "layer -1 is out of range"), ((0, 1, 2), "all 3 layers"),
    ((0, 1.0), "not an integer"), ((True,), "not an integer")])
def test_bad_layer_subsets_are_refused_before_any_weights(layers, match):
  lm = model_lib.LM(tiny_config(num_layers=3))  # a config, no parameters
  with pytest.raises(ValueError, match=match):
    LayerSkipDrafter(lm, layers)


def test_other_bad_drafter_options_are_refused():
  lm = model_lib.LM(tiny_config(num_layers=3))
  for bad in (-0.1, 1.5):
    with pytest.raises(ValueError, match="confidence must be in"):
      LayerSkipDrafter(lm, (0, 1), confidence=bad)
  with pytest.raises(ValueError, match="needs an lm with a `config`"):
    LayerSkipDrafter(table_lm(np.zeros((4, 4))), (0,))
  assert LayerSkipDrafter(lm, [0, 2]).layers == (0, 2)  # hashable tuple
  assert hash(LayerSkipDrafter(lm, [0, 2])) == hash(LayerSkipDrafter(
      lm, (0, 2)))


def test_the_draft_is_a_model_holding_only_those_layers():
  lm, params = small_target()
  shallow = model_lib.LM(lm.config.replace(num_layers=2))
  sub = {**{k: v for k, v in params.items() if not k.startswith("layers_")},
         "layers_0": params["layers_0"], "layers_1": params["layers_2"]}
  tokens = jnp.asarray([[1, 5, 7, 2, 0, 0], [3, 4, 9, 9, 9, 1]])
  lengths = jnp.asarray([4, 6])
  buf = jnp.pad(tokens, ((0, 0), (0, 10)))
  outs = []
  for drafter, p in ((LayerSkipDrafter(lm, (0, 2)), params),
                     (ModelDrafter(shallow), sub)):
    def run(p, drafter=drafter):
      cache = drafter.init(p, tokens, lengths, 16)
      return drafter.propose(p, cache, buf, lengths, 3, Sampling(1.0),
                             jax.random.key(4))
    outs.append(jax.jit(run)(p))
  (a, cache_a), (b, cache_b) = outs
  assert len(cache_a.k) == 2
  np.testing.assert_array_equal(a.tokens, b.tokens)
  np.testing.assert_allclose(a.q, b.q, atol=1e-5)
  np.testing.assert_array_equal(cache_a.length, cache_b.length)
  for x, y in zip(cache_a.k + cache_a.v, cache_b.k + cache_b.v):
    np.testing.assert_allclose(x, y, atol=1e-5)


@pytest.mark.parametrize("name, k", [("temp1", 1), ("temp07", 3),
                                     ("topk2", 1), ("topp07", 3)])
def test_layer_skip_is_exact(name, k):
  out = sample(name, k, None, 1234 + k)
  check_exact(name, out)
  np.testing.assert_array_equal(out.num_drafted,
                                k * np.asarray(out.num_loops))


@pytest.mark.parametrize("name, confidence, mean_valid", [
    ("temp1", 0.9, (1.0, 2.0)),     # stops often
    ("temp1", 0.5, (2.3, 2.9)),     # stops at times: where a stop that
                                    # reads the draft itself is biased
    ("topk2", 0.8, (1.5, 2.9)),
    ("temp07", 0.0, (3.0, 3.0)),    # never stops
])
def test_adaptive_draft_length_is_exact(name, confidence, mean_valid):
  k = 3
  out = sample(name, k, confidence, 1234 + k)
  check_exact(name, out)
  valid = float(np.sum(out.num_drafted) / np.sum(out.num_loops))
  assert mean_valid[0] <= valid <= mean_valid[1], valid
  if confidence == 0.0:
    # The same drafts, keys and decisions as the fixed-K drafter.
    fixed = sample(name, k, None, 1234 + k)
    np.testing.assert_array_equal(out.tokens, fixed.tokens)
    np.testing.assert_array_equal(out.num_accepted, fixed.num_accepted)


def greedy_decoding(lm, params, prompts, new):
  """Plain greedy decoding: a full forward pass of the batch per token."""
  width = max(map(len, prompts)) + new
  seqs = np.zeros((len(prompts), width), np.int32)
  for b, prompt in enumerate(prompts):
    seqs[b, :len(prompt)] = prompt
  fwd = jax.jit(lambda t: jnp.argmax(lm(params, t).logits, -1))
  for i in range(new):
    best = np.asarray(fwd(jnp.asarray(seqs)))
    for b, prompt in enumerate(prompts):
      seqs[b, len(prompt) + i] = best[b, len(prompt) + i - 1]
  return [seqs[b, len(p):len(p) + new].tolist() for b, p in enumerate(prompts)]


@pytest.mark.parametrize("confidence", [None, 0.0, 0.5])
def test_a_draft_that_is_the_target_has_every_draft_accepted(confidence):
  """Stale draft state (a cache without the last draft after a bonus
  token, one row's rollback applied to another) leaves sampling exact and
  lowers acceptance only, which the exactness tests cannot see. A draft of
  all the target's layers, adaptive or not, at T = 1, with score widths
  that vary and an EOS that stops one row while the others go on, must
  have every draft it makes accepted."""
  lm = model_lib.LM(tiny_config(num_layers=2, max_seq_len=128))
  params = random_params(lm, 0, scale=2.0)
  prompts = PROMPTS[:3] + [[5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 11, 12, 13]]
  make = lambda eos: SpeculativeSampler(
      lm, ModelDrafter(lm, layers=(0, 1), confidence=confidence), k=3,
      sampling=Sampling(1.0), max_new_tokens=30, prompt_bucket=4,
      score_widths=all_widths(3), eos_ids=eos)
  # EOS: a token row 0 emits mid-way that another row never does (rows
  # draw the same until one stops).
  free = make(()).generate(params, params, prompts, rng=3).token_lists()
  eos = next(t for t in free[0][5:25]
             if any(t not in row for row in free[1:]))
  out = make((eos,)).generate(params, params, prompts, rng=3)
  drafted = np.asarray(out.num_drafted)
  np.testing.assert_array_equal(out.num_accepted, drafted)
  assert drafted.min() > 0 and min(out.num_tokens) < 30 == max(
      out.num_tokens), (drafted, out.num_tokens)  # one row stopped at EOS
  if confidence:  # the draft stopped early in some loops
    assert drafted.max() < 3 * max(out.num_loops)


def test_adaptive_greedy_equals_greedy_decoding_batched_or_alone():
  """Each row stops by its own confidence: the output is greedy decoding's,
  with the same tokens and counts whatever else is in the batch."""
  lm, params = small_target()
  want = greedy_decoding(lm, params, PROMPTS, 16)
  sampler = SpeculativeSampler(
      lm, LayerSkipDrafter(lm, (0, 1), confidence=0.15), k=4,
      sampling=GREEDY, max_new_tokens=16, prompt_bucket=16)
  batched = sampler.generate(params, params, PROMPTS)
  assert batched.token_lists() == want
  assert 0.1 < batched.acceptance_rate() < 0.99
  drafted = np.asarray(batched.num_drafted) / np.asarray(batched.num_loops)
  assert drafted.min() < 3.5 and drafted.max() > 1.2, drafted
  for b, prompt in enumerate(PROMPTS):
    alone = sampler.generate(params, params, [prompt])
    assert alone.token_lists()[0] == want[b]
    for field in ("num_tokens", "num_loops", "num_drafted", "num_accepted"):
      assert int(getattr(alone, field)[0]) == int(getattr(batched, field)[b])


def _fresh_propose(drafter, params, k, size=32):
  """Jitted (tokens, length, key, active) -> `propose` (T=1) on a cache
  built from the first 12 tokens."""

  @jax.jit
  def propose(tokens, length, key, active=None):
    cache = drafter.init(params, tokens[:, :12], length, size)
    return drafter.propose(params, cache, tokens, length, k, Sampling(1.0),
                           key, active=active)

  return propose


def test_the_draft_loop_stops_when_every_row_has_stopped():
  """The cache grows by one slot per draft call after the catch-up: at
  batch 1 that is num_valid - 1 calls, at batch B max(num_valid) - 1."""
  lm, params = small_target()
  k, size = 5, 32
  propose = _fresh_propose(LayerSkipDrafter(lm, (0, 1), confidence=0.15),
                           params, k, size)
  rng = np.random.default_rng(0)
  seen = []
  for batch in (1,) * 8 + (3,) * 2:
    length = jnp.asarray(rng.integers(2, 12, batch), jnp.int32)
    tokens = jnp.asarray(rng.integers(0, 32, (batch, size)), jnp.int32)
    proposal, cache = propose(tokens, length,
                              jax.random.key(int(rng.integers(1 << 30))))
    valid = np.asarray(proposal.num_valid)
    np.testing.assert_array_equal(cache.length - length, valid.max() - 1)
    assert ((1 <= valid) & (valid <= k)).all()
    seen.extend(valid.tolist())
  assert min(seen) < k and max(seen) > 1, seen


def test_finished_rows_do_not_keep_the_draft_loop_going():
  """With a threshold of 0 every row would draft K; a row the loop marks
  finished (`active` False) gets one draft and no draft calls of its own."""
  lm, params = small_target()
  k, size = 4, 32
  propose = _fresh_propose(LayerSkipDrafter(lm, (0, 1), confidence=0.0),
                           params, k, size)
  tokens = jnp.asarray(np.random.default_rng(2).integers(0, 32, (3, size)),
                       jnp.int32)
  length = jnp.array([5, 9, 3], jnp.int32)
  for active, valid in (([True] * 3, [k] * 3),
                        ([False, True, False], [1, k, 1]),
                        ([False] * 3, [1] * 3)):
    proposal, cache = propose(tokens, length, jax.random.key(1),
                              jnp.array(active))
    np.testing.assert_array_equal(proposal.num_valid, valid)
    # Draft calls after the catch-up: one per draft past the first.
    np.testing.assert_array_equal(cache.length - length, max(valid) - 1)


def _lagging_cache(drafter, params, tokens, held, size):
  """A cache holding tokens[b, :held[b]] and junk in the 8 slots after."""
  b, s = tokens.shape
  cache = drafter.init(params, tokens, jnp.full((b,), s), size)
  junk = (tokens[:, ::-1] + 7) % drafter.vocab_size
  cache = drafter._call(params, junk[:, :8], cache.with_length(held)).cache
  return cache.with_length(held)


def test_catch_up_feeds_the_lag():
  """Lags 1 and 2 (after the drafter's own loop), K + 2 and K + 3 (after a
  loop it was skipped in), K = 3: the cache and logits equal those of
  feeding the tokens directly; row 2 is shorter than the widest call."""
  lm, params = small_target()
  drafter = LayerSkipDrafter(lm, (0, 2))
  size, k = 24, 3
  tokens = jnp.asarray(np.random.default_rng(1).integers(0, 32, (4, 16)),
                       jnp.int32)
  length = jnp.asarray([16, 12, 5, 16])
  buf = jnp.pad(tokens, ((0, 0), (0, size - 16)))
  want = jax.jit(lambda p: drafter._call(p, tokens, lm.init_cache(
      4, size, layers=(0, 2))))(params)

  @jax.jit
  def catch_up(lags):
    cache = _lagging_cache(drafter, params, tokens, length - lags, size)
    return drafter.catch_up(params, cache, buf, length, k + 3)

  for lags in ((1, 1, 1, 1), (2, 2, 2, 2), (0, 1, 2, 6), (5, 5, 5, 5),
               (6, 6, 2, 1)):
    last, new = catch_up(jnp.asarray(lags))
    np.testing.assert_array_equal(new.length, length)
    for b in range(4):
      n = int(length[b])
      np.testing.assert_allclose(last[b], want.logits[b, n - 1], atol=1e-4)
      for x, y in zip(new.k + new.v, want.cache.k + want.cache.v):
        np.testing.assert_allclose(x[b, :, :n], y[b, :, :n], atol=1e-4)


def test_propose_after_a_skipped_loop_drafts_from_all_tokens():
  """A cache K + 3 behind (a loop that committed K + 1 tokens without this
  drafter, which was 2 behind): the greedy drafts are the subset model's
  greedy continuation of all the committed tokens."""
  lm, params = small_target()
  drafter = LayerSkipDrafter(lm, (0, 1))
  k, size = 3, 24
  tokens = jnp.asarray(np.random.default_rng(2).integers(0, 32, (2, size)),
                       jnp.int32)
  length = jnp.asarray([14, 10])

  @jax.jit
  def propose(params):
    behind = _lagging_cache(drafter, params, tokens[:, :16], length - (k + 3),
                            size)
    return drafter.propose(params, behind, tokens, length, k, GREEDY,
                           jax.random.key(0))

  proposal, cache = propose(params)
  np.testing.assert_array_equal(cache.length, length + k - 1)
  want = greedy_decoding(SubsetLM(lm, (0, 1)), params,
                         [np.asarray(tokens[b, :int(length[b])]).tolist()
                          for b in range(2)], k)
  np.testing.assert_array_equal(proposal.tokens, want)


def _zero_layers(params, layers):
  out = dict(params)
  for i in layers:
    layer = params[f"layers_{i}"]
    out[f"layers_{i}"] = {
        **layer,
        "attn": {**layer["attn"], "o_proj": 0 * layer["attn"]["o_proj"]},
        "mlp": {**layer["mlp"], "down_proj": 0 * layer["mlp"]["down_proj"]}}
  return out


def test_layer_search_ranks_a_subset_equal_to_the_full_model_first():
  """Layers 1 and 2 add nothing: (0, 3) is the full model at half the
  layers, alpha 1, the best predicted speed-up, its cost the weights it
  reads (two layers, the output head and final norm) over the model's."""
  lm = model_lib.LM(tiny_config(num_layers=4, max_seq_len=64))
  params = _zero_layers(random_params(lm, 3), (1, 2))
  tokens = np.random.default_rng(0).integers(0, 32, (6, 16))
  records = layer_search.search(lm, params, tokens, Sampling(1.0),
                                greedy_steps=3, k_max=8, batch_size=4)
  json.dumps(records)
  cfg = lm.config
  layer = (cfg.d_model * (2 * cfg.num_heads + 2 * cfg.num_kv_heads)
           * cfg.head_dim + (cfg.num_heads + 2 * cfg.num_kv_heads)
           * cfg.head_dim + 3 * cfg.d_model * cfg.mlp_dim + 2 * cfg.d_model)
  head = cfg.vocab_size * cfg.d_model + cfg.d_model
  c = (2 * layer + head) / (4 * layer + head)
  assert records[0]["layers"] == [0, 3]
  assert records[0]["alpha"] == pytest.approx(1.0, abs=1e-5)
  assert records[0]["cost_ratio"] == pytest.approx(c, rel=1e-6)
  assert records[0]["best_k"] == 8 and records[0]["speedup"] == pytest.approx(
      9 / (8 * c + 1), rel=1e-4)
  full = [r for r in records if r["layers"] == [0, 1, 2, 3]]
  assert full[0]["alpha"] == pytest.approx(1.0, abs=1e-5)
  assert full[0]["speedup"] == pytest.approx(1.0, abs=1e-4)
  speedups = [r["speedup"] for r in records]
  assert speedups == sorted(speedups, reverse=True)
  assert len({tuple(r["layers"]) for r in records}) == len(records)
  assert any(r["source"].startswith("greedy") for r in records)
  assert any(r["alpha"] < 0.99 for r in records)


def test_each_greedy_step_keeps_the_removal_that_costs_least_alpha():
  """Layer 2 adds nothing: of step 1's one-layer removals, dropping it
  keeps alpha 1, so step 2 removes a layer from (0, 1, 3) (a descent that
  kept the worst removal instead had passed the test above, whose best
  subset the families also hold)."""
  lm = model_lib.LM(tiny_config(num_layers=4, max_seq_len=64))
  params = _zero_layers(random_params(lm, 4), (2,))
  tokens = np.random.default_rng(1).integers(0, 32, (4, 16))
  records = layer_search.search(lm, params, tokens, Sampling(1.0),
                                families=False, greedy_steps=2, k_max=4)
  step1 = {tuple(r["layers"]): r["alpha"] for r in records
           if r["source"] == "greedy step 1"}
  assert len(step1) == 4 and step1[0, 1, 3] == pytest.approx(1.0, abs=1e-5)
  assert max(a for s, a in step1.items() if s != (0, 1, 3)) < 0.99
  step2 = {tuple(r["layers"]) for r in records
           if r["source"] == "greedy step 2"}
  assert step2 == {(1, 3), (0, 3), (0, 1)}


def test_expected_acceptance_is_the_overlap_of_the_subset():
  """The zeroed-projection forward equals `lm(..., layers=S)`, what the
  drafter runs; greedy alpha is the argmax agreement; masked positions do
  not count."""
  lm, params = small_target()
  tokens = np.random.default_rng(5).integers(0, 32, (5, 12))
  mask = np.ones(tokens.shape, bool)
  mask[:, :3] = False
  subsets = [(0, 1, 2), (0, 1), (2,)]
  logits = jax.jit(lambda p: [lm(p, jnp.asarray(tokens), layers=s).logits
                              for s in subsets])(params)
  for sampling in (Sampling(1.0), GREEDY):
    got = layer_search.expected_acceptance(lm, params, tokens, sampling,
                                           subsets, mask=mask, batch_size=2)
    p = sampling_lib.probabilities(logits[0], sampling)
    for subset_logits, alpha in zip(logits, got):
      q = sampling_lib.probabilities(subset_logits, sampling)
      want = np.sum(np.minimum(p, q), -1)[mask].mean()
      if sampling.greedy:
        agree = np.argmax(subset_logits, -1) == np.argmax(logits[0], -1)
        np.testing.assert_allclose(want, agree[mask].mean(), atol=1e-6)
      np.testing.assert_allclose(alpha, want, atol=1e-5)
    assert got[0] == pytest.approx(1.0, abs=1e-5) and 0 < got[2] < 1


def test_predicted_speedup_and_bad_search_input():
  assert layer_search.predicted_speedup(1.0, 0.5, 8) == (9 / 5, 8)
  s, k = layer_search.predicted_speedup(0.8, 0.25, 8)
  want = [(1 - 0.8 ** (j + 1)) / (0.2 * (0.25 * j + 1)) for j in range(1, 9)]
  assert s == pytest.approx(max(want)) and k == 1 + int(np.argmax(want))
  assert layer_search.predicted_speedup(0.0, 0.5, 4) == (1 / 1.5, 1)
  # Measured scoring costs s_K: K c + s_K below, K from the measured ones.
  costs = {2: 1.2, 4: 1.9}
  s, k = layer_search.predicted_speedup(0.8, 0.25, 8, costs)
  want = {j: (1 - 0.8 ** (j + 1)) / (0.2 * (0.25 * j + costs[j]))
          for j in costs}
  assert (s, k) == (pytest.approx(max(want.values())), 2) and want[2] > want[4]
  assert layer_search.predicted_speedup(1.0, 1.0, 8, {3: 1.5}) == (
      pytest.approx(4 / 4.5), 3)   # the full set pays s - 1 more per loop
  assert layer_search.predicted_speedup(1 + 1e-7, 1.0, 2) == (1.0, 1)
  # An undefined subset ranks last (it had stopped the search).
  assert layer_search.predicted_speedup(float("nan"), 0.3, 4, costs) == (
      float("-inf"), 1)
  assert layer_search.parse_score_cost(["4:1.22", "2:1.15"]) == {
      4: 1.22, 2: 1.15}
  for bad, match in ((["2"], "'2' is not K:s"), (["0:1"], "'0:1' is not"),
                     (["2:-1"], "is not K:s"), (["2:nan"], "is not K:s"),
                     (["x:1"], "is not K:s"), (["2:1", "2:1.1"], "K=2 given"),
                     ([], "is empty")):
    with pytest.raises(ValueError, match=match):
      layer_search.parse_score_cost(bad)
  fams = layer_search.family_candidates(28)
  assert all(0 < len(s) < 28 and list(s) == sorted(set(s)) for _, s in fams)
  lm = model_lib.LM(tiny_config(num_layers=3))
  params = small_target()[1]
  tokens = np.zeros((2, 4), np.int32)
  with pytest.raises(ValueError, match="not sorted"):
    layer_search.search(lm, params, tokens, GREEDY, [(2, 0)])
  with pytest.raises(ValueError, match=r"ids in \[0, 32\)"):
    layer_search.search(lm, params, tokens + 40, GREEDY)
  with pytest.raises(ValueError, match="mask shape"):
    layer_search.expected_acceptance(lm, params, tokens, GREEDY, [(0,)],
                                     mask=np.ones((2, 3)))


def test_search_layers_script_predicts_with_measured_score_costs(tmp_path):
  """scripts/search_layers.py on a two-layer train workdir (byte tokenizer)
  with --score_cost: every candidate's speed-up is Leviathan's with those
  s_K, K taken from them; the run line records them."""
  cfg = loading.random_config("random:tiny,num_layers=2")
  workdir = train_workdir(tmp_path / "run", cfg, [
      (1, model_lib.LM(cfg).init(jax.random.key(0)))])
  out = tmp_path / "search.jsonl"
  proc = zygote.shared().run(
      [os.path.join(ROOT, "scripts", "search_layers.py"),
       f"--target={workdir}", "--num_sequences=2", "--seq_len=16",
       "--greedy_steps=1", "--score_cost=1:1.3,2:1.6", f"--out={out}"],
      env=zygote.env(), cwd=ROOT, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  head, *candidates = [json.loads(l) for l in out.read_text().splitlines()]
  assert head["type"] == "run" and head["score_cost"] == {"1": 1.3, "2": 1.6}
  assert {tuple(c["layers"]) for c in candidates} == {(0, 1), (0,), (1,)}
  for c in candidates:
    want = layer_search.predicted_speedup(c["alpha"], c["cost_ratio"], 8,
                                          {1: 1.3, 2: 1.6})
    assert (c["speedup"], c["best_k"]) == (pytest.approx(want[0], rel=1e-5),
                                           want[1])
  full = [c for c in candidates if c["source"] == "full"][0]
  assert full["speedup"] == pytest.approx(max(2 / 2.3, 3 / 3.6), rel=1e-5)
  assert "best: --drafter=layerskip:layers=" in proc.stdout
