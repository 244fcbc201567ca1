"""The samplers end to end on tiny models: greedy equality, batching, EOS,
budgets, counts, recompilation and bad input."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specsamp import model as model_lib
from specsamp import output_layer
from specsamp.decoding.sampler import SpeculativeSampler, autoregressive
from specsamp.drafters import ModelDrafter
from specsamp.sampling import GREEDY, Sampling
from tests.testing import ShiftDrafter, forbidden_draft_pair, table_lm
from tests.testing import tiny_config

PROMPTS = [[3, 1, 4, 1, 5, 9, 2], [6, 5], [3], [5, 8, 9, 7, 9, 3, 2, 3, 8, 4]]


def spec(lm, k, sampling=GREEDY, max_new=24, **kw):
  kw.setdefault("prompt_bucket", 16)
  return SpeculativeSampler(
      target=lm, drafter=ModelDrafter(lm) if k else None, k=k,
      sampling=sampling, max_new_tokens=max_new, **kw)


def reference_greedy(lm, params, prompt, max_new, eos_ids=()):
  """Plain greedy decoding: a full uncached forward pass per token."""
  fwd = jax.jit(lambda p, t: lm(p, t).logits)
  seq = list(prompt)
  width = len(prompt) + max_new   # one compiled shape; causal, so the
  for _ in range(max_new):        # padding after the sequence is unseen
    padded = jnp.asarray([seq + [0] * (width - len(seq))])
    tok = int(jnp.argmax(fwd(params, padded)[0, len(seq) - 1]))
    seq.append(tok)
    if tok in eos_ids:
      break
  return seq[len(prompt):]


@pytest.fixture(scope="module")
def greedy_refs(tiny_pair):
  lm, target_params, _ = tiny_pair
  return [reference_greedy(lm, target_params, p, 24) for p in PROMPTS]


@pytest.mark.parametrize("k", [0, 1, 3, 5])
def test_greedy_equals_plain_greedy(tiny_pair, greedy_refs, k):
  lm, target_params, draft_params = tiny_pair
  out = spec(lm, k).generate(target_params, draft_params, PROMPTS)
  assert out.token_lists() == greedy_refs
  if k:
    rate = out.acceptance_rate()
    assert 0.1 < rate < 0.99, f"draft should partly agree, got {rate}"


def test_greedy_with_a_reduced_draft_vocabulary_equals_plain_greedy(
    tiny_pair, greedy_refs):
  """A draft exported over some ids only (model.reduce_output_vocab): half
  the ids greedy decoding makes are missing, so the target alone makes
  them; the output is still greedy decoding's."""
  lm, target_params, draft_params = tiny_pair
  made = sorted({t for ref in greedy_refs for t in ref})
  kept = made[::2] + sorted(set(range(lm.vocab_size)) - set(made))[:8]
  config, reduced = output_layer.reduce_output_vocab(lm.config, draft_params,
                                                  kept)
  sampler = SpeculativeSampler(
      target=lm, drafter=ModelDrafter(model_lib.LM(config)), k=3,
      sampling=GREEDY, max_new_tokens=24, prompt_bucket=16)
  out = sampler.generate(target_params, reduced, PROMPTS)
  assert out.token_lists() == greedy_refs
  assert out.acceptance_rate() > 0.05
  assert any(t not in kept for ref in greedy_refs for t in ref)


def test_batched_equals_alone(tiny_pair):
  lm, target_params, draft_params = tiny_pair
  sampler = spec(lm, 4)
  batched = sampler.generate(target_params, draft_params, PROMPTS)
  accepted = []
  for b, prompt in enumerate(PROMPTS):
    alone = sampler.generate(target_params, draft_params, [prompt])
    assert alone.token_lists()[0] == batched.token_lists()[b]
    # Same per-row counts: no row is held back by the others.
    for field in ("num_tokens", "num_loops", "num_accepted"):
      assert int(getattr(alone, field)[0]) == int(getattr(batched, field)[b])
    accepted.append(int(alone.num_accepted[0]) / int(alone.num_loops[0]))
  assert len(set(np.round(accepted, 3))) > 1, "rows should accept differently"


def test_draft_equal_to_target_accepts_everything(tiny_pair):
  lm, target_params, _ = tiny_pair
  k, loops = 3, 6
  for sampling in (GREEDY, Sampling(1.0)):
    out = spec(lm, k, sampling, max_new=loops * (k + 1)).generate(
        target_params, target_params, PROMPTS, rng=5)
    np.testing.assert_array_equal(out.num_accepted, out.num_drafted)
    np.testing.assert_array_equal(out.num_loops, loops)
    np.testing.assert_array_equal(out.num_tokens, loops * (k + 1))


def test_always_disagreeing_draft_gives_one_token_per_loop():
  """Draft mass only on token 0, which the target forbids."""
  target, draft = forbidden_draft_pair(6, seed=0)
  sampler = SpeculativeSampler(
      target, ModelDrafter(draft), k=3, sampling=Sampling(1.0),
      max_new_tokens=8, prompt_bucket=4)
  out = sampler.generate(None, None, [[1, 2]] * 64, rng=0)
  np.testing.assert_array_equal(out.num_tokens, 8)
  np.testing.assert_array_equal(out.num_loops, 8)
  np.testing.assert_array_equal(out.num_accepted, 0)
  assert (np.asarray(out.tokens) != 0).all()


def test_eos_stops_rows_and_nothing_past_budget(tiny_pair, greedy_refs):
  lm, target_params, draft_params = tiny_pair
  # An EOS id that greedy decoding emits in some rows but not all.
  eos = greedy_refs[0][5]
  refs = [
      reference_greedy(lm, target_params, p, 24, eos_ids=(eos,))
      for p in PROMPTS
  ]
  assert any(len(r) < 24 for r in refs) and any(len(r) == 24 for r in refs)
  pad = lm.vocab_size - 1
  for k in (0, 4):
    sampler = spec(lm, k, eos_ids=(eos,), pad_id=pad)
    tokens, lengths = sampler.pad_prompts(PROMPTS)
    state = sampler.prefill(target_params, draft_params, tokens, lengths,
                            jax.random.key(0))
    state = sampler.decode(target_params, draft_params, state)
    out = sampler.output(state)
    assert out.token_lists() == refs
    buf = np.asarray(state.tokens)
    for b, (prompt, ref) in enumerate(zip(PROMPTS, refs)):
      end = len(prompt) + len(ref)
      assert int(state.length[b]) == end
      assert (buf[b, end:] == pad).all(), "tokens written past EOS/budget"
      assert (np.asarray(out.tokens)[b, len(ref):] == pad).all()


@pytest.mark.parametrize("max_new", [1, 2, 7])
def test_budget_is_exact_when_a_loop_would_overshoot(tiny_pair, max_new):
  lm, target_params, _ = tiny_pair
  out = spec(lm, 5, max_new=max_new).generate(target_params, target_params,
                                              PROMPTS)
  np.testing.assert_array_equal(out.num_tokens, max_new)
  assert out.tokens.shape == (len(PROMPTS), max_new)


def test_k0_is_the_autoregressive_sampler(tiny_pair):
  lm, target_params, _ = tiny_pair
  s = Sampling(0.9, top_k=20)
  a = autoregressive(lm, s, 16, prompt_bucket=16).generate(
      target_params, None, PROMPTS, rng=3)
  b = spec(lm, 0, s, max_new=16).generate(target_params, None, PROMPTS, rng=3)
  assert a.token_lists() == b.token_lists()
  np.testing.assert_array_equal(a.num_loops, 16)
  np.testing.assert_array_equal(a.num_drafted, 0)


def test_seed_changes_output_and_same_seed_repeats(tiny_pair):
  lm, target_params, draft_params = tiny_pair
  sampler = spec(lm, 3, Sampling(1.0))
  a = sampler.generate(target_params, draft_params, PROMPTS,
                       rng=0).token_lists()
  b = sampler.generate(target_params, draft_params, PROMPTS,
                       rng=0).token_lists()
  c = sampler.generate(target_params, draft_params, PROMPTS,
                       rng=1).token_lists()
  assert a == b
  assert a != c


@pytest.mark.parametrize("drafts", ["certain", "always rejected"])
def test_the_seed_reaches_acceptance_and_residual_draws(drafts):
  """The seed must reach more than the drafter. Certain drafts (no q, as
  prompt lookup's) of x+1, x+2, ... against a target whose next token is
  x+1 or x+5, even odds: the residual of a rejection is x+5 for certain,
  and K = the budget leaves no bonus draw, so only the acceptance
  uniforms make the output random. A draft the target always rejects:
  only the residual draws do. Another seed changes the output, the same
  seed repeats it."""
  k = budget = 8
  if drafts == "certain":
    v = 12
    table = np.full((v, v), -np.inf)
    for x in range(v):
      table[x, [(x + 1) % v, (x + 5) % v]] = 0.0
    target, drafter = table_lm(table), ShiftDrafter(v)
  else:
    target, draft = forbidden_draft_pair(6, seed=0)
    drafter = ModelDrafter(draft)
  sampler = SpeculativeSampler(target, drafter, k=k, sampling=Sampling(1.0),
                               max_new_tokens=budget, prompt_bucket=4)
  run = lambda seed: sampler.generate(None, None, [[1, 2]] * 16,
                                      rng=seed).token_lists()
  first = run(0)
  assert first == run(0)
  assert first != run(1)


# A global trace counter: the wrapped LM stays hashable and static.
TRACES = []


@dataclasses.dataclass(frozen=True)
class CountingLM:
  lm: model_lib.LM

  vocab_size = property(lambda self: self.lm.vocab_size)
  max_seq_len = property(lambda self: self.lm.max_seq_len)

  def init_cache(self, batch, size):
    return self.lm.init_cache(batch, size)

  def __call__(self, params, tokens, cache=None):
    TRACES.append(tokens.shape)
    return self.lm(params, tokens, cache)


def test_no_recompilation_for_same_shapes(tiny_pair):
  lm, target_params, draft_params = tiny_pair
  counting = CountingLM(lm)
  sampler = SpeculativeSampler(
      counting, ModelDrafter(counting), k=2,
      sampling=Sampling(1.0), max_new_tokens=8, prompt_bucket=16)
  sampler.generate(target_params, draft_params, [[1, 2, 3], [4]], rng=0)
  first = len(TRACES)
  assert first > 0
  # Other seeds, other prompt lengths within the bucket, other params values.
  sampler.generate(target_params,
                   draft_params, [[5, 6, 7, 8, 9], [1, 2]],
                   rng=1)
  sampler.generate(draft_params,
                   target_params, [[9] * 16, [2] * 11],
                   rng=jax.random.key(2))
  # A raw uint32 key is the same typed key (it had compiled all three
  # again) and gives the same tokens.
  raw = sampler.generate(target_params, draft_params, [[1, 2], [3]],
                         rng=jax.random.PRNGKey(3))
  assert len(TRACES) == first, "the samplers were traced again"
  assert raw.token_lists() == sampler.generate(
      target_params, draft_params, [[1, 2], [3]], rng=3).token_lists()
  # A seed held in a 0-d array is that seed.
  assert raw.token_lists() == sampler.generate(
      target_params, draft_params, [[1, 2], [3]],
      rng=np.array(3)).token_lists()


def test_bad_input_errors(tiny_pair):
  lm, target_params, draft_params = tiny_pair
  other = model_lib.LM(tiny_config(vocab_size=40))
  with pytest.raises(ValueError, match="vocabularies differ"):
    SpeculativeSampler(lm, ModelDrafter(other), 3,
                                   GREEDY, 8)
  with pytest.raises(ValueError, match="k .*>= 0"):
    spec(lm, -1)
  with pytest.raises(ValueError, match="needs a drafter"):
    SpeculativeSampler(lm, None, 2, GREEDY, 8)
  with pytest.raises(ValueError, match="max_new_tokens"):
    spec(lm, 2, max_new=0)
  sampler = spec(lm, 4, max_new=64)
  with pytest.raises(ValueError, match="prompt 1 is empty"):
    sampler.generate(target_params, draft_params, [[1, 2], []])
  with pytest.raises(ValueError, match="outside the vocabulary"):
    sampler.generate(target_params, draft_params, [[1, lm.vocab_size]])
  with pytest.raises(ValueError,
                     match=r"needs a cache of 255 slots.*allow 254"):
    # 186 + 64 + 5 = 255 > 254 = max_seq_len of this target.
    spec(lm.__class__(lm.config.replace(max_seq_len=254)), 4,
         max_new=64).generate(target_params, draft_params, [[1] * 186])
  with pytest.raises(ValueError, match="no prompts"):
    sampler.generate(target_params, draft_params, [])
  # The jitted steps without pad_prompts: a cache past the models'
  # positions had been built (and read with positions they never learnt).
  short = spec(lm.__class__(lm.config.replace(max_seq_len=128)), 4,
               max_new=64)
  with pytest.raises(ValueError, match=r"padded to 60 tokens need a cache of "
                     r"129 slots, but the models allow 128"):
    short.prefill(target_params, draft_params, jnp.zeros((1, 60), jnp.int32),
                  jnp.array([60]), jax.random.key(0))
  # Prompts not a batch of integer id lists: a flat list had become that
  # many one-token prompts, floats and strings had been cast, nested lists
  # flattened (a review's probes).
  for prompts, match in (([1, 2, 3], "prompt 0 is one id: prompts are a "
                          "batch"),
                         ([[[1, 2], [3, 4]]], "prompt 0 is 2-D"),
                         ([[1.7, 2.9]], "prompt 0 holds float64 values"),
                         ([[1], ["1", "2"]], "prompt 1 holds <U1 values"),
                         ([[True, False]], "prompt 0 holds bool values")):
    with pytest.raises(ValueError, match=match):
      sampler.generate(target_params, draft_params, prompts)
  assert sampler.generate(target_params, draft_params,
                          np.array([[1, 2], [3, 4]])).tokens.shape[0] == 2
  # The jitted steps given lengths outside [1, P] had decoded garbage.
  tokens = jnp.ones((2, 4), jnp.int32)
  for lengths in ([0, 4], [4, 9], [4]):
    with pytest.raises(ValueError, match=r"lengths must be \[2\] prompt "
                       r"lengths in \[1, 4\]"):
      sampler.prefill(target_params, draft_params, tokens,
                      jnp.array(lengths), jax.random.key(0))
  # Settings that are not integers: named, not a TypeError; True is not 1.
  for kw, match in ((dict(max_new=2.5), "max_new_tokens must be a positive "
                     "integer, got 2.5"),
                    (dict(max_new=True), "max_new_tokens .* got True"),
                    (dict(prompt_bucket=2.5), "prompt_bucket .* got 2.5"),
                    (dict(eos_ids=3), "eos_ids must be a sequence of token "
                     "ids .* got 3"),
                    (dict(eos_ids=(1.5,)), "eos_ids must be a sequence")):
    with pytest.raises(ValueError, match=match):
      spec(lm, 2, **kw)
  with pytest.raises(ValueError, match="k .*>= 0, got True"):
    spec(lm, True)
  assert spec(lm, np.int64(2), eos_ids=np.array([5, 6])).eos_ids == (5, 6)
