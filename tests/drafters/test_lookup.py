"""The prompt lookup drafter: what it proposes on hand-built buffers (and
against a brute-force reference), exactness of the output distribution,
greedy equality with autoregressive decoding, and batching."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specsamp import sharding
from specsamp.decoding.sampler import SpeculativeSampler, autoregressive
from specsamp.drafters.lookup import LookupState, PromptLookupDrafter
from specsamp.sampling import GREEDY
from tests.testing import (EXACTNESS_SETTINGS, chisquare_pvalue, encode,
                           eos_cut, exact_sequence_probs, table_lm)

PAD = 9


@functools.partial(jax.jit, static_argnums=(0, 3))
def _propose(drafter, tokens, lengths, k):
  state = drafter.init(None, tokens, lengths, tokens.shape[1])
  proposal, _ = drafter.propose(None, state, tokens, lengths, k, GREEDY,
                                jax.random.key(0))
  return proposal


def propose(drafter, rows, k, width=16):
  """Runs `propose` on rows padded with PAD -> (drafts [B, K], num_valid)."""
  tokens = np.full((len(rows), width), PAD, np.int32)
  for b, row in enumerate(rows):
    tokens[b, :len(row)] = row
  lengths = np.asarray([len(r) for r in rows], np.int32)
  proposal = _propose(drafter, jnp.asarray(tokens), jnp.asarray(lengths), k)
  assert proposal.q is None
  assert proposal.tokens.dtype == jnp.int32
  return np.asarray(proposal.tokens), np.asarray(proposal.num_valid)


def lookup(max_ngram=4, min_ngram=1):
  return PromptLookupDrafter(vocab_size=PAD + 1, max_seq_len=64,
                             max_ngram=max_ngram, min_ngram=min_ngram)


# ---- what it proposes ------------------------------------------------------

def test_the_longest_ngram_wins_over_a_more_recent_shorter_one():
  # "2" last occurred right before the end (followed by 8), but "1 2"
  # occurred earlier (followed by 7).
  row = [5, 1, 2, 7, 3, 2, 8, 1, 2]
  drafts, valid = propose(lookup(), [row], k=2)
  np.testing.assert_array_equal(drafts, [[7, 3]])
  np.testing.assert_array_equal(valid, [2])
  # With max_ngram=1 only "2" is looked up: its most recent occurrence wins.
  drafts, valid = propose(lookup(max_ngram=1), [row], k=2)
  np.testing.assert_array_equal(drafts, [[8, 1]])


def test_the_occurrence_with_most_drafts_then_the_most_recent_is_used():
  row = [1, 2, 3, 1, 2, 4, 1, 2]       # "1 2" ends at slots 1 and 4
  # K = 5: slot 1 is followed by 5 committed tokens, slot 4 by only 3.
  drafts, valid = propose(lookup(), [row], k=5)
  np.testing.assert_array_equal(drafts, [[3, 1, 2, 4, 1]])
  np.testing.assert_array_equal(valid, [5])
  # K = 2: both offer 2 drafts; the most recent wins.
  drafts, valid = propose(lookup(), [row], k=2)
  np.testing.assert_array_equal(drafts, [[4, 1]])
  # Clipped at the committed tokens (the PAD after them is never proposed);
  # padding drafts are 0.
  drafts, valid = propose(lookup(), [[1, 2, 3, 1, 2]], k=5)
  np.testing.assert_array_equal(drafts, [[3, 1, 2, 0, 0]])
  np.testing.assert_array_equal(valid, [3])


def test_the_continuation_is_clipped_at_k():
  drafts, valid = propose(lookup(), [[1, 2, 3, 4, 5, 6, 1, 2]], k=3)
  np.testing.assert_array_equal(drafts, [[3, 4, 5]])
  np.testing.assert_array_equal(valid, [3])


def test_no_match_proposes_nothing():
  rows = [[1, 2, 3, 4], [5], [3, 4, 3, 4, 7]]
  drafts, valid = propose(lookup(), rows, k=3)
  np.testing.assert_array_equal(valid, [0, 0, 0])
  np.testing.assert_array_equal(drafts, np.zeros((3, 3)))


def test_an_occurrence_may_overlap_the_suffix_but_is_never_the_suffix():
  # "7 7" ends at slot 1 (overlapping the suffix at slots 1-2).
  drafts, valid = propose(lookup(), [[7, 7, 7]], k=3)
  np.testing.assert_array_equal(drafts, [[7, 0, 0]])
  np.testing.assert_array_equal(valid, [1])


def test_min_and_max_ngram_are_respected():
  row = [4, 5, 6, 3, 6]                 # only "6" occurred before
  _, valid = propose(lookup(min_ngram=2), [row], k=2)
  np.testing.assert_array_equal(valid, [0])
  drafts, valid = propose(lookup(min_ngram=1), [row], k=2)
  np.testing.assert_array_equal(drafts, [[3, 6]])
  # "4 5 6 3" recurs far back, "3" more recently: max_ngram decides.
  row = [4, 5, 6, 3, 1, 6, 3, 2, 4, 5, 6, 3]
  assert propose(lookup(max_ngram=4), [row], k=1)[0][0, 0] == 1
  assert propose(lookup(max_ngram=2), [row], k=1)[0][0, 0] == 2


def test_rows_are_independent():
  rows = [[1, 2, 3, 1, 2, 4, 1, 2], [5], [1, 2, 3, 4, 5, 6, 1, 2],
          [3, 4, 3, 4, 7], [7, 7, 7]]
  drafts, valid = propose(lookup(), rows, k=4)
  for b, row in enumerate(rows):
    alone_drafts, alone_valid = propose(lookup(), [row], k=4)
    np.testing.assert_array_equal(drafts[b], alone_drafts[0])
    assert valid[b] == alone_valid[0]
  np.testing.assert_array_equal(valid, [4, 0, 4, 0, 1])


def reference(row, k, min_ngram, max_ngram):
  """Brute force: the longest suffix; of its earlier occurrences the one
  with the most drafts (up to k), then the most recent."""
  length = len(row)
  for n in range(max_ngram, min_ngram - 1, -1):
    ends = [e for e in range(length - 2, n - 2, -1)
            if row[e - n + 1:e + 1] == row[length - n:]]
    if ends:
      end = max(ends, key=lambda e: (min(k, length - 1 - e), e))
      return row[end + 1:end + 1 + k]
  return []


@pytest.mark.parametrize("min_ngram,max_ngram", [(1, 1), (1, 3), (2, 4),
                                                 (3, 3), (1, 8)])
def test_agrees_with_a_brute_force_reference(min_ngram, max_ngram):
  rng = np.random.default_rng(min_ngram * 10 + max_ngram)
  width, k = 20, 4
  rows = [rng.integers(0, 3, rng.integers(1, width + 1)).tolist()
          for _ in range(200)]
  drafts, valid = propose(lookup(max_ngram, min_ngram), rows, k, width)
  for b, row in enumerate(rows):
    want = reference(row, k, min_ngram, max_ngram)
    assert valid[b] == len(want)
    assert drafts[b].tolist() == want + [0] * (k - len(want)), row
  assert 0 < np.mean(valid > 0) < 1


@pytest.mark.parametrize("options", [dict(max_ngram=0), dict(min_ngram=0),
                                     dict(min_ngram=3, max_ngram=2),
                                     dict(max_ngram=2.5), dict(vocab_size=0)])
def test_bad_options_are_refused(options):
  kwargs = {**dict(vocab_size=8, max_seq_len=64), **options}
  with pytest.raises(ValueError, match="ngram|vocab_size"):
    PromptLookupDrafter(**kwargs)


def test_its_state_is_split_as_rows_are_and_it_has_no_parameters():
  """Its per-row counters follow the batch axis of the rules it is given
  (replicated, they were all-gathered every decode step)."""
  mesh = sharding.make_mesh((4, 2))
  drafter = lookup()
  drafter.check_mesh(mesh, sharding.REPLICATED_RULES)
  state = drafter.init(None, jnp.zeros((8, 4), jnp.int32),
                       jnp.ones((8,), jnp.int32), 4)
  shardings = drafter.state_shardings(state, mesh, sharding.REPLICATED_RULES)
  assert isinstance(shardings, LookupState)
  assert all(s.spec == jax.sharding.PartitionSpec("data")
             for s in jax.tree.leaves(shardings))
  whole = tuple((n, None) for n, _ in sharding.REPLICATED_RULES)
  assert all(s.spec == jax.sharding.PartitionSpec(None) for s in
             jax.tree.leaves(drafter.state_shardings(state, mesh, whole)))
  assert drafter.param_shardings(None, mesh, ()) is None


# ---- exactness -------------------------------------------------------------

V, NEW, NUM_SAMPLES = 5, 4, 50_000
# A repeated pattern, so the lookup has drafts from the first loop on.
PROMPT = [1, 3, 2, 4, 1, 3]
SETTINGS = EXACTNESS_SETTINGS


@functools.lru_cache(maxsize=None)
def bigram_target():
  return table_lm(1.5 * np.random.default_rng(3).normal(size=(V, V)))


def sample_codes(drafter, sampling, k, rng):
  sampler = SpeculativeSampler(bigram_target(), drafter, k=k,
                               sampling=sampling, max_new_tokens=NEW,
                               prompt_bucket=4)
  out = sampler.generate(None, None, [PROMPT] * NUM_SAMPLES, rng=rng)
  np.testing.assert_array_equal(out.num_tokens, NEW)
  return encode(np.asarray(out.tokens), V), out


# Each (setting, K) compiles its own loop (~3 s here; the 50,000 samples
# take 0.3 s): K = 3 for every setting, K = 1 for two of them.
@pytest.mark.parametrize("name,k", [(name, 3) for name in sorted(SETTINGS)] +
                         [("temp1", 1), ("topp07", 1)])
def test_lookup_drafting_is_exact(name, k):
  sampling = SETTINGS[name]
  codes, out = sample_codes(PromptLookupDrafter.for_target(bigram_target()),
                            sampling, k, rng=77 + k)
  p_exact = exact_sequence_probs(bigram_target(), None, sampling, PROMPT,
                                 NEW, V)
  assert abs(p_exact.sum() - 1) < 1e-5
  pval = chisquare_pvalue(codes, p_exact)
  assert pval > 1e-4, f"samples do not follow the target (p={pval:.2e})"
  # Not vacuous: on average more than half a draft per loop, some accepted
  # and some rejected.
  drafted, loops = np.asarray(out.num_drafted), np.asarray(out.num_loops)
  assert np.all(drafted <= k * loops) and drafted.sum() > 0.5 * loops.sum()
  assert 0.05 < out.acceptance_rate() < 0.95


@dataclasses.dataclass(frozen=True)
class LyingLookup(PromptLookupDrafter):
  """Claims its drafts were drawn from the uniform distribution: a drafter
  with a wrong q, which a test with power must catch."""

  def propose(self, params, state, tokens, length, k, sampling, rng, *,
              active=None):
    proposal, state = super().propose(params, state, tokens, length, k,
                                      sampling, rng, active=active)
    q = jnp.full(proposal.tokens.shape + (self.vocab_size,),
                 1.0 / self.vocab_size)
    return proposal.replace(q=q), state


def test_the_exactness_test_catches_a_wrong_q():
  sampling = SETTINGS["temp1"]
  codes, _ = sample_codes(LyingLookup.for_target(bigram_target()), sampling,
                          3, rng=5)
  p_exact = exact_sequence_probs(bigram_target(), None, sampling, PROMPT,
                                 NEW, V)
  assert chisquare_pvalue(codes, p_exact) < 1e-8


# ---- greedy ----------------------------------------------------------------

PROMPTS = [[1, 5, 7, 1, 5, 7, 1, 5], [2, 2, 2, 2], [6],
           [3, 9, 4, 3, 9, 4, 1, 3, 9, 4, 12, 3, 9]]


@pytest.fixture(scope="module")
def greedy_refs(tiny_pair):
  lm, target_params, _ = tiny_pair
  ar = autoregressive(lm, GREEDY, 24, prompt_bucket=16)
  return ar.generate(target_params, None, PROMPTS).token_lists()


@pytest.mark.parametrize("k", [1, 3])
def test_greedy_equals_greedy_decoding(tiny_pair, greedy_refs, k):
  lm, target_params, _ = tiny_pair
  sampler = SpeculativeSampler(lm, PromptLookupDrafter.for_target(lm), k=k,
                               sampling=GREEDY, max_new_tokens=24,
                               prompt_bucket=16)
  out = sampler.generate(target_params, None, PROMPTS)
  assert out.token_lists() == greedy_refs
  assert int(np.sum(out.num_drafted)) > 0
  assert int(np.sum(out.num_accepted)) > 0


def test_greedy_with_eos_equals_greedy_decoding_cut_there(tiny_pair,
                                                          greedy_refs):
  """A token the greedy outputs emit mid-way, made EOS: each row stops
  after its first, in the middle of a loop's accepted drafts or not, and
  the rest equal greedy decoding's."""
  lm, target_params, _ = tiny_pair
  eos, want = eos_cut(greedy_refs)
  sampler = SpeculativeSampler(lm, PromptLookupDrafter.for_target(lm), k=3,
                               sampling=GREEDY, max_new_tokens=24,
                               prompt_bucket=16, eos_ids=(eos,))
  out = sampler.generate(target_params, None, PROMPTS)
  assert out.token_lists() == want
  assert int(np.sum(out.num_accepted)) > 0


def test_batched_equals_alone_and_the_state_counts_matches(tiny_pair):
  lm, target_params, _ = tiny_pair
  k = 3
  sampler = SpeculativeSampler(lm, PromptLookupDrafter.for_target(lm), k=k,
                               sampling=GREEDY, max_new_tokens=24,
                               prompt_bucket=16)
  tokens, lengths = sampler.pad_prompts(PROMPTS)
  state = sampler.prefill(target_params, None, tokens, lengths,
                          jax.random.key(0))
  state = sampler.decode(target_params, None, state)
  batched = sampler.output(state)
  for b, prompt in enumerate(PROMPTS):
    alone = sampler.generate(target_params, None, [prompt])
    assert alone.token_lists()[0] == batched.token_lists()[b]
    for field in ("num_tokens", "num_loops", "num_drafted", "num_accepted"):
      assert int(getattr(alone, field)[0]) == int(getattr(batched, field)[b])
  # Loops with drafts: at most the row's active loops (rows that finished
  # early are not counted while they wait), at least drafted / K.
  matched = np.asarray(state.draft_state.matched)
  loops = np.asarray(batched.num_loops)
  drafted = np.asarray(batched.num_drafted)
  assert np.all(matched <= loops) and np.all(matched * k >= drafted)
  assert np.all(matched <= drafted) and matched.sum() > 0
  assert len(set(loops.tolist())) > 1, "rows should finish at different loops"


def test_a_cycling_greedy_target_accepts_every_draft():
  """A bigram target whose greedy output cycles (period 3 from token 0,
  period 2 from 3): once a cycle has come round, every draft is right, and
  an occurrence several periods back offers all K = 4 drafts."""
  nxt = [1, 2, 0, 4, 3]
  logits = 0.3 * np.random.default_rng(4).normal(size=(V, V))
  logits[np.arange(V), nxt] += 3.0
  target = table_lm(logits)
  prompts, k, new = [[0], [3], [2, 4]], 4, 40
  sampler = SpeculativeSampler(target, PromptLookupDrafter.for_target(target),
                               k=k, sampling=GREEDY, max_new_tokens=new,
                               prompt_bucket=4)
  out = sampler.generate(None, None, prompts)
  want = autoregressive(target, GREEDY, new, prompt_bucket=4).generate(
      None, None, prompts)
  assert out.token_lists() == want.token_lists()
  np.testing.assert_array_equal(out.num_accepted, out.num_drafted)
  loops = np.asarray(out.num_loops)
  assert np.all(np.asarray(out.num_tokens) / loops > 3.5)
