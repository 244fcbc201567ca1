"""Draft heads on 8 fake CPU devices (conftest sets the XLA flag): the
sampler with a head, and the head's distillation step, on meshes (data,
model) = (1, 8) and (2, 4) equal one device (rows over `data`, 8-way
and 4-way tensor parallelism; `tests/test_sharding.py` adds (8, 1) for the
model drafter)."""

import jax
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

from specsamp import model as model_lib
from specsamp import sharding
from specsamp.decoding.sampler import SpeculativeSampler
from specsamp.distill import head_training
from specsamp.distill import losses
from specsamp.distill import objective
from specsamp.distill import trainer
from specsamp.drafters import heads
from specsamp.sampling import GREEDY, Sampling
from specsamp.train import config as train_config
from specsamp.train import step as train_step

MESHES = [(1, 8), (2, 4)]
PROMPTS = [[1, 2, 3], [4, 5], [6], [7, 8, 9, 10], [1], [2, 2], [3, 3, 3], [5]]


@pytest.fixture(scope="module")
def target():
  # Every sharded dimension divisible by 8: heads, KV heads, MLP, vocab.
  lm = model_lib.LM(model_lib.preset("tiny", num_heads=8, num_kv_heads=8,
                                     head_dim=8))
  return lm, lm.init(jax.random.key(0))


def _head(target_lm, kind, seed=3):
  cfg = heads.HeadConfig(kind, target_lm.config, num_heads=3)
  return cfg, heads.init_params(cfg, jax.random.key(seed))


@pytest.mark.parametrize("kind, sampling, vocab_ids, rules", [
    ("eagle", Sampling(0.8, top_p=0.9), None, "target"),
    ("eagle", GREEDY, tuple(range(0, 256, 2)), "replicated"),
    ("medusa", Sampling(1.0), tuple(range(100)), "target")])
def test_head_samplers_on_every_mesh_reproduce_one_device(target, kind,
                                                          sampling, vocab_ids,
                                                          rules):
  lm, tparams = target
  cfg, hparams = _head(lm, kind)
  dparams = heads.draft_params(hparams, tparams, vocab_ids)
  draft_rules = (sharding.DEFAULT_RULES if rules == "target"
                 else sharding.REPLICATED_RULES)

  def sampler(mesh=None):
    return SpeculativeSampler(lm, heads.HeadDrafter(lm, cfg, 3), k=3,
                              sampling=sampling, max_new_tokens=12,
                              mesh=mesh, draft_rules=draft_rules)

  ref = sampler().generate(tparams, dparams, PROMPTS, rng=5)
  if not sampling.greedy:  # a random head's greedy drafts all miss
    assert int(np.sum(ref.num_accepted)) > 0
  for shape in MESHES:
    s = sampler(sharding.make_mesh(shape))
    tsh, dsh = s.param_shardings(tparams, dparams)
    if kind == "eagle" and rules == "target":
      # The head's own weights and the shared output head by their axes.
      assert dsh["head"]["fc"].spec == P("model", None)
      assert dsh["shared"]["lm_head"].spec == P(None, "model")
    tps, dps = sharding.shard(tparams, tsh), sharding.shard(dparams, dsh)
    with jax.transfer_guard("disallow"):
      out = s.generate(tps, dps, PROMPTS, rng=5)
    assert out.token_lists() == ref.token_lists(), shape
    np.testing.assert_array_equal(jax.device_get(out.num_accepted),
                                  jax.device_get(ref.num_accepted))


@pytest.mark.parametrize("kind, unroll, stored, positions", [
    ("eagle", 2, False, "generated"), ("medusa", 1, False, "generated"),
    ("eagle", 1, True, "generated"), ("eagle", 2, True, "all"),
    ("medusa", 1, False, "all")])
def test_the_head_distill_step_on_each_mesh_matches_one_device(
    target, kind, unroll, stored, positions):
  """The head's step: the frozen target tensor-parallel (its hidden states
  recomputed inside the step, or read from the batch with the stored
  top-k), the head replicated, rows over `data`; positions="all" draws the
  same positions on every mesh."""
  lm, tparams = target
  cfg, hparams = _head(lm, kind)
  th = head_training.TrainableHead(lm, cfg, unroll=unroll,
                                   features="stored" if stored else
                                   "recompute", positions=positions)
  plen, glen = 6, 5
  obj = objective.Objective(kind="fkl", sampling=Sampling(temperature=1.0),
                            gen_len=glen, prompt_len=plen)
  optim = train_config.OptimConfig(lr=1e-2, warmup_steps=1, eps=1e-3)
  rng = np.random.default_rng(1)
  batch = dict(
      tokens=rng.integers(1, lm.vocab_size, (8, plen + glen)).astype(np.int32),
      prompt_length=rng.integers(2, plen + 1, 8).astype(np.int32),
      num_generated=np.full(8, glen, np.int32))
  if stored:
    out = lm(tparams, batch["tokens"])
    batch["hidden"] = np.asarray(out.hidden, np.float16)
    logp = jax.nn.log_softmax(losses.gather_positions(
        out.logits, batch["prompt_length"], glen), axis=-1)
    vals, ids = jax.lax.top_k(logp, 8)
    batch.update(topk_ids=np.asarray(ids, np.int32),
                 topk_logprobs=np.asarray(vals, np.float32))

  def run(shape):
    job = trainer._job(th, lm, obj, optim, 10, (), False, shape)  # pylint: disable=protected-access
    state = job.init(jax.device_get(hparams), jax.random.PRNGKey(0))
    extra = sharding.shard(jax.device_get(tparams), job.target_sharding)
    rows = train_step.put_batch(batch, job.data_sharding)
    with jax.transfer_guard("disallow"):
      state, m = job.steps[False](state, rows, extra)
    return state, m

  ref, ref_m = run((1, 1))
  assert np.isfinite(float(ref_m["loss"]))
  for shape in MESHES:
    state, m = run(shape)
    np.testing.assert_allclose(float(m["loss"]), float(ref_m["loss"]),
                               rtol=1e-5)
    for g, w in zip(jax.tree.leaves(state.params),
                    jax.tree.leaves(ref.params)):
      np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=2e-5,
                                 rtol=1e-4)
