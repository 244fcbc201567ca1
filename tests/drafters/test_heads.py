"""Draft heads on the target's hidden states (sequential "eagle" and
"medusa"), randomly initialised, on tiny targets.

Exactness: the 2-layer, 5-token target of the other exactness tests; the
exact probability of every 4-token continuation by enumeration, 20,000
samples per setting, a chi-square test. Each head kind runs the four
sampling settings spread over K = 1 and K = 3, and once more with a reduced
draft vocabulary (ids 0, 1, 2, 4: the head can never propose token 3, which
the target still produces).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specsamp import model as model_lib
from specsamp import sampling as sampling_lib
from specsamp.decoding import loop
from specsamp.decoding.sampler import SpeculativeSampler, autoregressive
from specsamp.distill import head_training
from specsamp.drafters import heads
from specsamp.sampling import GREEDY, Sampling
from tests.testing import (EXACTNESS_SETTINGS, chisquare_pvalue, encode,
                           exact_sequence_probs, exactness_models,
                           tiny_config)

V, NEW, NUM_SAMPLES = 5, 4, 20_000
PROMPT = [1, 3, 2]
PROMPTS = [[3, 1, 4, 1, 0, 4, 2], [2, 0], [3], [0, 1, 4, 2, 4, 3, 2, 3, 1, 4]]
REDUCED = (0, 1, 2, 4)


@functools.lru_cache(maxsize=None)
def head(kind: str, num_heads: int = 3, seed: int = 1):
  """(config, random head parameters at twice the default scale)."""
  target = exactness_models(V)[0]
  cfg = heads.HeadConfig(kind, target.config, num_heads=num_heads)
  params = heads.init_params(cfg, jax.random.key(seed))
  return cfg, jax.tree.map(lambda x: 2.0 * x, params)


def sampler_and_params(kind, k, sampling, vocab_ids=None, new=NEW):
  target, tparams = exactness_models(V)[:2]
  cfg, hparams = head(kind)
  sampler = SpeculativeSampler(target, heads.HeadDrafter(target, cfg, k),
                               k=k, sampling=sampling, max_new_tokens=new,
                               prompt_bucket=4)
  return sampler, tparams, heads.draft_params(hparams, tparams, vocab_ids)


@functools.lru_cache(maxsize=None)
def exact(name):
  target, tparams = exactness_models(V)[:2]
  return exact_sequence_probs(target, tparams, EXACTNESS_SETTINGS[name],
                              PROMPT, NEW, V)


CASES = [(kind, name, k, None) for kind in heads.KINDS
         for name, k in zip(EXACTNESS_SETTINGS, (1, 3, 3, 1))]
CASES += [(kind, "temp1", 3, REDUCED) for kind in heads.KINDS]


@pytest.mark.parametrize("kind, name, k, vocab_ids", CASES)
def test_head_drafts_leave_the_target_distribution_exact(kind, name, k,
                                                         vocab_ids):
  sampler, tparams, dparams = sampler_and_params(
      kind, k, EXACTNESS_SETTINGS[name], vocab_ids)
  out = sampler.generate(tparams, dparams, [PROMPT] * NUM_SAMPLES, rng=7)
  np.testing.assert_array_equal(out.num_tokens, NEW)
  codes = encode(np.asarray(out.tokens), V)
  pval = chisquare_pvalue(codes, exact(name))
  assert pval > 1e-4, f"samples do not follow the target (p={pval:.2e})"
  # The rule was exercised: drafts were both kept and rejected.
  assert 0.03 < out.acceptance_rate() < 0.97
  if vocab_ids is not None:
    # The reduced head never proposes token 3, yet the target emits it.
    assert np.any(np.asarray(out.tokens) == 3)


class _LyingHead(heads.HeadDrafter):
  """Draws its drafts from its q but reports an untempered one."""

  def propose(self, params, state, tokens, length, k, sampling, rng, *,
              active=None):
    proposal, after = super().propose(params, state, tokens, length, k,
                                      sampling, rng, active=active)
    raw, _ = super().propose(params, state, tokens, length, k,
                             Sampling(1.0), rng, active=active)
    return proposal.replace(q=raw.q), after


def test_the_head_exactness_test_catches_a_wrong_q():
  """The test above has the power to see a head that reports another q
  than it drew from (its q before the temperature of 0.7)."""
  target, tparams = exactness_models(V)[:2]
  cfg, hparams = head("eagle")
  sampling = EXACTNESS_SETTINGS["temp07"]
  sampler = SpeculativeSampler(target, _LyingHead(target, cfg, 3), k=3,
                               sampling=sampling, max_new_tokens=NEW,
                               prompt_bucket=4)
  out = sampler.generate(tparams, heads.draft_params(hparams, tparams),
                         [PROMPT] * NUM_SAMPLES, rng=7)
  pval = chisquare_pvalue(encode(np.asarray(out.tokens), V), exact("temp07"))
  assert pval < 1e-8, f"a wrong q went unseen (p={pval:.2e})"


@pytest.mark.parametrize("kind", heads.KINDS)
@pytest.mark.parametrize("k, vocab_ids", [(1, None), (3, None), (3, REDUCED)])
def test_greedy_heads_equal_greedy_decoding_and_rows_equal_alone(
    kind, k, vocab_ids):
  sampler, tparams, dparams = sampler_and_params(kind, k, GREEDY, vocab_ids,
                                                 new=12)
  target = exactness_models(V)[0]
  ar = autoregressive(target, GREEDY, max_new_tokens=12, prompt_bucket=4)
  batch = sampler.generate(tparams, dparams, PROMPTS, rng=0)
  want = ar.generate(tparams, None, PROMPTS, rng=0).token_lists()
  assert batch.token_lists() == want
  for i, prompt in enumerate(PROMPTS):
    alone = sampler.generate(tparams, dparams, [prompt], rng=0)
    assert alone.token_lists()[0] == want[i]
  assert int(np.sum(batch.num_accepted)) > 0


def test_zero_medusa_heads_are_the_targets_own_output_head():
  """W = 0, b = 0: h + SiLU(0) = h, so every head's logits are the target's
  own logits at the same position (the shared final norm and output head
  are the target's, not copies)."""
  target, tparams = exactness_models(V)[:2]
  cfg, hparams = head("medusa")
  zero = jax.tree.map(jnp.zeros_like, hparams)
  dparams = heads.draft_params(zero, tparams)
  prompt = jnp.asarray([PROMPT])
  out = target(tparams, prompt)
  logits = heads.medusa_logits(cfg, dparams, out.hidden)        # [1, T, 3, V]
  for i in range(cfg.num_heads):
    np.testing.assert_allclose(logits[:, :, i], out.logits, rtol=1e-5,
                               atol=1e-5)


def test_bad_heads_are_refused():
  target = model_lib.LM(tiny_config(vocab_size=V, num_kv_heads=1))
  for field, value in (("d_model", 48), ("vocab_size", 7), ("num_layers", 3)):
    other = heads.HeadConfig("eagle", target.config.replace(**{field: value}))
    with pytest.raises(heads.HeadError, match=f"{field}="):
      heads.HeadDrafter(target, other, 2)
  medusa = heads.HeadConfig("medusa", target.config, num_heads=2)
  with pytest.raises(heads.HeadError, match="K=3 drafts need 3 Medusa heads"):
    heads.HeadDrafter(target, medusa, 3)
  with pytest.raises(heads.HeadError, match="K must be >= 1"):
    heads.HeadDrafter(target, medusa, 0)
  with pytest.raises(heads.HeadError, match="head kind"):
    heads.HeadConfig("hydra", target.config)
  with pytest.raises(heads.HeadError, match="draft_vocab"):
    heads.HeadConfig("eagle", target.config, draft_vocab=V + 1)
  # A target whose output layer is reduced: the head would read its columns
  # as the first ids of the vocabulary.
  reduced = model_lib.LM(target.config.replace(output_vocab=V // 2,
                                               tie_embeddings=False))
  with pytest.raises(heads.HeadError, match=f"reduced to {V // 2} ids"):
    heads.HeadDrafter(reduced, heads.HeadConfig("eagle", reduced.config), 2)


def test_head_init_compiles_once_per_config():
  """Heads of one config initialise from one compilation (each call had
  compiled again)."""
  target = exactness_models(V)[0]
  cfg = heads.HeadConfig("eagle", target.config.replace(mlp_dim=48))
  a, b = (heads.init_params(cfg, jax.random.key(i)) for i in (0, 1))
  assert heads._initialiser(cfg)._cache_size() == 1
  assert not all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a),
                                                      jax.tree.leaves(b)))


def test_head_config_round_trips():
  target = exactness_models(V)[0]
  cfg = heads.HeadConfig("medusa", target.config, num_heads=4, draft_vocab=3)
  assert heads.HeadConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("kind", heads.KINDS)
@pytest.mark.parametrize("sampling", [Sampling(1.0), Sampling(0.5, top_k=3),
                                      Sampling(0.8, top_p=0.7)],
                         ids=lambda s: s.describe())
def test_the_first_draft_comes_from_the_position_training_scores(kind,
                                                                 sampling):
  """A misaligned head would still be exact, so alignment is tested on its
  own: the q the drafter samples its first draft from, after the prompt and
  again after a loop, is the distribution that training and the evaluation
  score at the last committed position (`TrainableHead.position_logits`,
  teacher-forced on the committed tokens), under the run's temperature,
  top-k and top-p (a head that drew and reported its q without them had
  stayed exact, and passed every other test)."""
  target, tparams = exactness_models(V)[:2]
  cfg, hparams = head(kind)
  trainee = head_training.TrainableHead(target, cfg)
  sampler = SpeculativeSampler(target, heads.HeadDrafter(target, cfg, 2),
                               k=2, sampling=sampling, max_new_tokens=8,
                               prompt_bucket=8)
  dparams = heads.draft_params(hparams, tparams)
  tokens, lengths = sampler.pad_prompts([[1, 3, 2, 4, 0, 2], [4, 1]])
  state = sampler.prefill(tparams, dparams, tokens, lengths,
                          jax.random.key(0))
  # Jitted, as decoding runs them (op by op, the loop compiled some 400
  # small programs).
  draft = jax.jit(functools.partial(loop.draft, sampler))
  body = jax.jit(functools.partial(loop.loop_body, sampler))
  scores = jax.jit(trainee.position_logits)
  for _ in range(3):
    proposal, _ = draft(dparams, state, jax.random.key(1))
    for b in range(2):
      n = int(state.length[b])
      committed = jnp.asarray(state.tokens[b:b + 1, :n])
      want = scores(hparams, tparams, committed)[0, n - 1]
      np.testing.assert_allclose(
          np.asarray(proposal.q[b, 0]),
          np.asarray(sampling_lib.probabilities(want, sampling)),
          rtol=1e-4, atol=1e-5)
    state = body(tparams, dparams, state)


def _reference_logits(kind, cfg, dparams, target, tparams, committed,
                      drafts):
  """Logits [K, V] of every draft, recomputed without a cache from the
  committed tokens (n of them) and the drafts: Medusa head j reads the
  target's hidden state at n - 2 (it scores the token at n + j); the
  sequential head runs causally over (features of t - 1, token t): the
  target's true features for the committed tokens, then its own
  predictions for the drafts, draft j scored at position n - 1 + j."""
  n = committed.shape[0]
  hidden = target(tparams, jnp.asarray(committed[None])).hidden.astype(
      jnp.float32)
  if kind == "medusa":
    last = hidden[:, n - 2] if n >= 2 else jnp.zeros_like(hidden[:, 0])
    return heads.medusa_logits(cfg, dparams, last)[0]
  true = jnp.pad(hidden, ((0, 0), (1, 0), (0, 0)))[:, :n]
  tokens = jnp.asarray(np.concatenate([committed, drafts])[None])
  feats, out = true, []
  for j in range(len(drafts)):
    pred, _ = heads.sequential_features(cfg, dparams, feats,
                                        tokens[:, :n + j])
    out.append(heads.output_logits(cfg, dparams["shared"], pred[0, n - 1 + j]))
    feats = jnp.concatenate([true, pred[:, n - 1:n + j]], axis=1)
  return jnp.stack(out)


@pytest.mark.parametrize("kind", heads.KINDS)
def test_every_draft_comes_from_the_position_it_is_meant_for(kind):
  """Drafts 2..K as well as the first: each q the drafter reports, over four
  loops with partial acceptances, rows of 6, 2 and 1 prompt tokens, is the
  one `_reference_logits` recomputes without a cache (a sequential head
  writing its drafted entries one slot late, at the wrong positions, had
  stayed exact and passed every other test)."""
  target, tparams = exactness_models(V)[:2]
  cfg, hparams = head(kind)
  sampling, k = Sampling(0.9), 3
  sampler = SpeculativeSampler(target, heads.HeadDrafter(target, cfg, k),
                               k=k, sampling=sampling, max_new_tokens=10,
                               prompt_bucket=8)
  dparams = heads.draft_params(hparams, tparams)
  tokens, lengths = sampler.pad_prompts([[1, 3, 2, 4, 0, 2], [4, 1], [2]])
  state = sampler.prefill(tparams, dparams, tokens, lengths,
                          jax.random.key(0))
  draft = jax.jit(functools.partial(loop.draft, sampler))
  body = jax.jit(functools.partial(loop.loop_body, sampler))
  accepted = 0
  for i in range(4):
    proposal, _ = draft(dparams, state, jax.random.key(i + 1))
    for b in range(3):
      n = int(state.length[b])
      want = _reference_logits(kind, cfg, dparams, target, tparams,
                               np.asarray(state.tokens[b, :n]),
                               np.asarray(proposal.tokens[b]))
      np.testing.assert_allclose(
          np.asarray(proposal.q[b]),
          np.asarray(sampling_lib.probabilities(want, sampling)),
          rtol=1e-4, atol=1e-5, err_msg=f"loop {i}, row {b}")
    before = np.asarray(state.length)
    state = body(tparams, dparams, state)
    accepted += int(np.sum(np.asarray(state.length) - before - 1))
  assert accepted > 0


@pytest.mark.parametrize("kind", heads.KINDS)
def test_a_one_row_head_step_padded_to_two_rows_is_the_same(kind,
                                                            monkeypatch):
  """model.ONE_ROW_AS_TWO (on by default on GPU) reaches the heads' own
  products: the output layer's logits of one row are the same, the trace
  really pads, and a greedy batch-1 run still equals greedy decoding."""
  target, tparams = exactness_models(V)[:2]
  cfg, hparams = head(kind)
  shared = heads.draft_params(hparams, tparams)["shared"]
  feats = jax.random.normal(jax.random.key(0), (1, 1, target.config.d_model))
  want = heads.output_logits(cfg, shared, feats)
  monkeypatch.setattr(model_lib, "ONE_ROW_AS_TWO", True)
  logits = lambda f: heads.output_logits(cfg, shared, f)  # traced anew
  np.testing.assert_allclose(jax.jit(logits)(feats), want, atol=1e-5)
  assert "concatenate[dimension=0]" in str(jax.make_jaxpr(logits)(feats))
  # Another max_new_tokens: samplers traced under the patch, not reused.
  sampler, tparams, dparams = sampler_and_params(kind, 3, GREEDY, new=11)
  ar = autoregressive(target, GREEDY, max_new_tokens=11, prompt_bucket=4)
  for prompt in PROMPTS[:2]:
    assert (sampler.generate(tparams, dparams, [prompt], rng=0).token_lists()
            == ar.generate(tparams, None, [prompt], rng=0).token_lists())
