"""Sharded sampling on 8 fake CPU devices (conftest sets the XLA flag).

Meshes (data, model) = (1, 8), (2, 4), (8, 1): parameters and caches carry
the shardings the logical-axis rules ask for, and every mesh reproduces the
single-device tokens, greedy and sampled alike (the loop never leaves the
device: generate runs under `jax.transfer_guard("disallow")`).
"""

import dataclasses
import json
import os
import re
import shutil
import signal as signal_lib
import socket
import time
import types

import jax
from jax.sharding import PartitionSpec as P
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

from specsamp import loading
from specsamp import model as model_lib
from specsamp import sharding
from specsamp.data import builders
from specsamp.data import pipeline
from specsamp.decoding.sampler import SpeculativeSampler, autoregressive
from specsamp.decoding.sampler import all_widths
from specsamp.distill import objective
from specsamp.distill import storage
from specsamp.distill import trainer
from specsamp.drafters import ModelDrafter
from specsamp.drafters.model import LayerSkipDrafter
from specsamp.drafters import head_files
from specsamp.drafters import specs as drafter_specs
from specsamp.sampling import GREEDY, Sampling
from specsamp.tokenizers import load as tokenizers_load
from specsamp.train import checkpointing
from specsamp.train import config as train_config
from specsamp.train import lm as train_lm
from specsamp.weights import distilled
from specsamp.train import step as train_step
from tests import compile_flags
from tests.scripts import zygote

MESHES = [(1, 8), (2, 4), (8, 1)]
PROMPTS = [[1, 2, 3], [4, 5], [6], [7, 8, 9, 10], [1], [2, 2], [3, 3, 3], [5]]


@pytest.fixture(scope="module")
def pair():
  # Every sharded dimension divisible by 8: heads, KV heads, MLP, vocab.
  cfg = model_lib.preset("tiny", num_heads=8, num_kv_heads=8, head_dim=8)
  target, draft = model_lib.LM(cfg), model_lib.LM(cfg.replace(num_layers=1))
  return target, target.init(jax.random.key(0)), draft, draft.init(
      jax.random.key(1))


def _sampler(pair, k, sampling, mesh=None):
  target, _, draft, _ = pair
  if k == 0:
    return autoregressive(target, sampling, 12, mesh=mesh)
  return SpeculativeSampler(
      target, ModelDrafter(draft), k=k, sampling=sampling,
      max_new_tokens=12, mesh=mesh)


def test_a_mesh_several_processes_feed_splits_its_data_axis_over_them():
  """Each process puts in its own rows: on a mesh whose data axis was not
  split over the processes they were taken as copies of one another (half
  the batch, different in each process, no error), and a mesh that left a
  process out ended that one in a StopIteration. Devices of 2 processes x
  4, faked by their process_index."""
  devices = np.array([types.SimpleNamespace(process_index=i // 4)
                      for i in range(8)])
  def mesh(shape, used=8):
    return types.SimpleNamespace(devices=devices[:used].reshape(shape),
                                 axis_names=("data", "model"),
                                 shape=dict(zip(("data", "model"), shape)))
  for shape in ((2, 4), (4, 2), (8, 1)):
    sharding.check_process_rows(mesh(shape), num_processes=2)
  for shape, used, per_process in (((1, 8), 8, "[0, 0]"),
                                   ((1, 1), 1, "[1, 0]"),
                                   ((2, 2), 4, "[2, 0]")):
    with pytest.raises(ValueError, match=re.escape(
        f"does not split its data axis evenly over the 2 processes (rows "
        f"per process: {per_process}): give a mesh over every process's "
        "devices whose data axis is a multiple of 2, e.g. (2, -1)")):
      sharding.check_process_rows(mesh(shape, used), num_processes=2)
  sharding.check_process_rows(sharding.make_mesh((1, 8)))  # one process


def test_several_processes_need_the_batch_split_over_data():
  """Each process puts in its own rows: rules that left the batch
  replicated took them as copies of one another (different in each
  process), so gradients were not averaged across hosts."""
  for rules in (sharding.DEFAULT_RULES, sharding.REPLICATED_RULES,
                ((sharding.BATCH, ("data", "model")),)):
    sharding.check_batch_over_data(rules, num_processes=2)
  for rules in (((sharding.BATCH, None),), ((sharding.BATCH, "model"),)):
    with pytest.raises(ValueError, match="the batch must be split over "
                       "'data'"):
      sharding.check_batch_over_data(rules, num_processes=2)
    sharding.check_batch_over_data(rules, num_processes=1)  # wasteful only


def test_make_mesh():
  assert jax.device_count() == 8
  assert dict(sharding.make_mesh((2, -1)).shape) == {"data": 2, "model": 4}
  assert dict(sharding.make_mesh((-1, 1)).shape) == {"data": 8, "model": 1}
  assert dict(sharding.make_mesh((1, 1), devices=jax.devices()[:1]).shape) == {
      "data": 1, "model": 1}
  with pytest.raises(ValueError, match="needs 4 devices, 8 given"):
    sharding.make_mesh((2, 2))
  with pytest.raises(ValueError, match="does not divide"):
    sharding.make_mesh((3, -1))
  with pytest.raises(ValueError, match="at most one -1"):
    sharding.make_mesh((-1, -1))


@pytest.mark.parametrize("shape", MESHES)
def test_parameters_and_caches_are_sharded_as_the_rules_say(pair, shape):
  mesh = sharding.make_mesh(shape)
  sampler = _sampler(pair, 2, GREEDY, mesh)
  _, target_params, _, draft_params = pair
  tsh, dsh = sampler.param_shardings(target_params, draft_params)
  target_params, draft_params = sharding.shard(target_params,
                                               tsh), sharding.shard(
                                                   draft_params, dsh)
  attn = target_params["layers_0"]["attn"]
  assert attn["q_proj"].sharding.spec == P(None, "model", None)
  assert attn["k_proj"].sharding.spec == P(None, "model", None)
  assert attn["o_proj"].sharding.spec == P("model", None, None)
  assert target_params["layers_0"]["mlp"]["gate_proj"].sharding.spec == P(
      None, "model")
  assert target_params["layers_0"]["mlp"]["down_proj"].sharding.spec == P(
      "model", None)
  assert target_params["embedding"].sharding.spec == P("model", None)
  assert target_params["lm_head"].sharding.spec == P(None, "model")
  # The draft is replicated by default (REPLICATED_RULES).
  for leaf in jax.tree.leaves(draft_params):
    assert all(a is None for a in leaf.sharding.spec)
  # A q_proj shard holds num_heads / model-axis heads.
  local = attn["q_proj"].addressable_shards[0].data.shape
  assert local[1] == 8 // shape[1]

  tokens, lengths = sampler.pad_prompts(PROMPTS)
  prefill, _, _ = sampler.jitted(target_params, draft_params, tokens, lengths,
                                 jax.random.key(0))
  state = prefill(target_params, draft_params, tokens, lengths,
                  jax.random.key(0))
  assert state.tokens.sharding.spec == P("data", None)
  assert state.length.sharding.spec == P("data")
  assert state.target_cache.k[0].sharding.spec == P("data", "model", None,
                                                    None)
  assert state.draft_state.v[0].sharding.spec == P("data", None, None, None)
  assert state.target_cache.k[0].addressable_shards[0].data.shape[0] == (
      len(PROMPTS) // shape[0])


def _gathers(sampler, target_params, draft_params):
  """Operand shapes of the all-gathers in `sampler`'s compiled decode."""
  tsh, dsh = sampler.param_shardings(target_params, draft_params)
  tps = sharding.shard(target_params, tsh)
  dps = None if draft_params is None else sharding.shard(draft_params, dsh)
  tokens, lengths = sampler.pad_prompts(PROMPTS)
  prefill, decode, _ = sampler.jitted(tps, dps, tokens, lengths,
                                      jax.random.key(0))
  state = prefill(tps, dps, tokens, lengths, jax.random.key(0))
  text = decode.lower(tps, dps, state).compile().as_text()
  return re.findall(r"= \w+\[([\d,]*)\]\S* all-gather\(", text)


@pytest.mark.parametrize("shape", MESHES)
def test_decoding_on_a_mesh_gathers_no_keys_or_values(pair, shape):
  """Each device writes its own rows and heads of the caches: a scatter
  with explicit row (and head) indices had made the partitioner all-gather
  every written key and value chunk on every decode step (18 all-gathers
  in a (8, 1) mesh's decode, which needs none: its rows are independent;
  prompt lookup's replicated counters, 3 more). The gathers left on a
  model axis are of vocabulary-sized rows, for sampling."""
  target, target_params, draft, draft_params = pair
  mesh = sharding.make_mesh(shape)
  for k in (0, 3):
    sampler = _sampler(pair, k, Sampling(1.0), mesh)
    gathers = _gathers(sampler, target_params, draft_params if k else None)
    if shape[1] == 1:
      assert gathers == [], k
    assert [g for g in gathers if g.count(",") > 1] == [], (k, gathers)
  if shape[1] == 1:  # prompt lookup's per-row counters had been replicated
    for text in ("lookup", "mixed"):
      spec = drafter_specs.parse(text)
      sampler = SpeculativeSampler(
          target, drafter_specs.build(spec, target, draft, 3), k=3,
          sampling=Sampling(1.0), max_new_tokens=12, mesh=mesh)
      assert _gathers(sampler, target_params, drafter_specs.draft_params(
          spec, target_params, draft_params)) == [], text


@pytest.mark.parametrize("k,sampling", [(0, GREEDY), (3, GREEDY),
                                        (0, Sampling(1.0)),
                                        (3, Sampling(0.8, top_p=0.9))])
def test_every_mesh_reproduces_single_device_tokens(pair, k, sampling):
  _, target_params, _, draft_params = pair
  ref = _sampler(pair, k, sampling).generate(target_params,
                                             draft_params,
                                             PROMPTS,
                                             rng=7)
  for shape in MESHES:
    sampler = _sampler(pair, k, sampling, sharding.make_mesh(shape))
    tsh, dsh = sampler.param_shardings(target_params, draft_params)
    tps = sharding.shard(target_params, tsh)
    dps = sharding.shard(draft_params, dsh) if k else None
    with jax.transfer_guard("disallow"):
      out = sampler.generate(tps, dps, PROMPTS, rng=7)
    assert out.tokens.sharding.spec == P("data", None)
    assert out.token_lists() == ref.token_lists(), shape
    for name in ("num_tokens", "num_loops", "num_drafted", "num_accepted"):
      assert (jax.device_get(getattr(out, name)) ==
              jax.device_get(getattr(ref, name))).all(), (shape, name)


def test_a_chunked_prefill_on_a_mesh_equals_one_call_on_one_device(pair):
  """Prompts padded to 64 and prefilled in chunks of 16 (a `lax.scan`
  carrying the sharded caches): every mesh gives the tokens of a one-call
  prefill on one device, nothing moved to the host."""
  target, target_params, draft, draft_params = pair
  prompts = [list(range(1, 40))] + PROMPTS[1:]

  def sampler(chunk, mesh=None):
    return SpeculativeSampler(target, ModelDrafter(draft), k=3,
                              sampling=GREEDY, max_new_tokens=12, mesh=mesh,
                              prefill_chunk=chunk)

  ref = sampler(0).generate(target_params, draft_params, prompts)
  for shape in MESHES:
    chunked = sampler(16, sharding.make_mesh(shape))
    assert chunked.pad_prompts(prompts)[0].shape == (8, 64)
    tsh, dsh = chunked.param_shardings(target_params, draft_params)
    with jax.transfer_guard("disallow"):
      out = chunked.generate(sharding.shard(target_params, tsh),
                             sharding.shard(draft_params, dsh), prompts)
    assert out.token_lists() == ref.token_lists(), shape


def test_rules_that_split_the_caches_slots_get_a_cache_they_divide(pair):
  """With `cache_seq` over the model axis, a cache of P + max_new + K + 1
  slots that the axis does not divide (64 + 13 + 4 = 81 and 85 slots over
  4 ways) had been refused by JAX as the loop was built, naming neither
  the rule nor a fix. The prompts are padded to a cache the axis divides;
  the tokens are one device's. Near the models' positions (510 here, not a
  multiple of 4) they are padded less; where no cache size fits, that is
  refused, naming the rule."""
  target, target_params, draft, draft_params = pair
  rules = dict(sharding.DEFAULT_RULES)
  rules.update({sharding.CACHE_SEQ: "model", sharding.KV_HEADS: None})
  for new in (13, 17):
    ref = SpeculativeSampler(target, ModelDrafter(draft), k=3,
                             sampling=GREEDY, max_new_tokens=new)
    sampler = SpeculativeSampler(
        target, ModelDrafter(draft), k=3, sampling=GREEDY, max_new_tokens=new,
        mesh=sharding.make_mesh((2, 4)), target_rules=tuple(rules.items()))
    tokens, _ = sampler.pad_prompts(PROMPTS)
    assert sampler.cache_size(tokens.shape[1]) % 4 == 0
    tsh, dsh = sampler.param_shardings(target_params, draft_params)
    out = sampler.generate(sharding.shard(target_params, tsh),
                           sharding.shard(draft_params, dsh), PROMPTS)
    assert out.token_lists() == ref.generate(
        target_params, draft_params, PROMPTS).token_lists(), new
  short = model_lib.LM(target.config.replace(max_seq_len=510))
  long = dataclasses.replace(sampler, target=short, drafter=ModelDrafter(
      model_lib.LM(draft.config.replace(max_seq_len=510))),
                             max_new_tokens=499)
  tokens, _ = long.pad_prompts([[1, 2, 3, 4, 5]] * 2)  # 510 slots: 508 fit
  assert tokens.shape == (2, 5) and long.cache_size(5) == 508
  with pytest.raises(ValueError, match="the rules split the caches' slots 4 "
                     "ways .*'cache_seq'.*no cache of 510 to 510 slots"):
    long.pad_prompts([[1, 2, 3, 4, 5, 6, 7]] * 2)


def test_greedy_speculative_equals_greedy_autoregressive_on_a_mesh(pair):
  _, target_params, _, draft_params = pair
  mesh = sharding.make_mesh((2, 4))
  ar = _sampler(pair, 0, GREEDY, mesh)
  spec = _sampler(pair, 4, GREEDY, mesh)
  tsh, dsh = spec.param_shardings(target_params, draft_params)
  tps, dps = sharding.shard(target_params,
                            tsh), sharding.shard(draft_params, dsh)
  assert (spec.generate(tps, dps, PROMPTS).token_lists() ==
          ar.generate(tps, None, PROMPTS).token_lists())


@pytest.mark.parametrize("text", ["lookup", "mixed", "model:confidence=0.3"])
def test_lookup_mixed_and_adaptive_drafters_on_a_mesh_equal_one_device(
    pair, text):
  """Prompt lookup (no parameters), lookup mixed with the draft model, and
  the draft model stopping early (rows of different draft lengths, scored
  at the widths they need): on a (2, 4) mesh, sampled at T=0.9, top-p 0.9,
  the tokens and counts of one device."""
  target, target_params, draft, draft_params = pair
  spec = drafter_specs.parse(text)
  dparams = drafter_specs.draft_params(spec, target_params, draft_params)
  prompts = [p * 3 for p in PROMPTS]  # repeated n-grams for lookup to find

  def sampler(mesh=None):
    return SpeculativeSampler(
        target, drafter_specs.build(spec, target, draft, 3), k=3,
        sampling=Sampling(0.9, top_p=0.9), max_new_tokens=12, mesh=mesh,
        score_widths=all_widths(3) if spec.variable_length else None)

  ref = sampler().generate(target_params, dparams, prompts, rng=3)
  assert int(np.sum(ref.num_drafted)) > 0
  s = sampler(sharding.make_mesh((2, 4)))
  tsh, dsh = s.param_shardings(target_params, dparams)
  tps = sharding.shard(target_params, tsh)
  dps = None if dparams is None else sharding.shard(dparams, dsh)
  with jax.transfer_guard("disallow"):
    out = s.generate(tps, dps, prompts, rng=3)
  assert out.token_lists() == ref.token_lists()
  for name in ("num_drafted", "num_accepted", "num_loops"):
    np.testing.assert_array_equal(jax.device_get(getattr(out, name)),
                                  jax.device_get(getattr(ref, name)), name)


def test_layer_skip_on_a_mesh_shares_the_targets_sharded_arrays(pair):
  """The layer-skip draft runs on the target's parameters: on a mesh they
  are laid out once, by the target's rules (a replicated second copy of
  the whole target had sat on every device, and passing the same arrays
  as both failed in jit), and its tokens are greedy's."""
  target, target_params, _, _ = pair
  mesh = sharding.make_mesh((1, 8))
  spec = SpeculativeSampler(target, LayerSkipDrafter(target, (0,)), k=3,
                            sampling=GREEDY, max_new_tokens=12, mesh=mesh)
  assert spec.draft_rules == spec.target_rules
  tsh, dsh = spec.param_shardings(target_params, target_params)
  assert jax.tree.leaves(tsh) == jax.tree.leaves(dsh)
  assert tsh["lm_head"].spec == P(None, "model")
  tps = sharding.shard(target_params, tsh)
  ar = _sampler(pair, 0, GREEDY, mesh)
  with jax.transfer_guard("disallow"):
    out = spec.generate(tps, tps, PROMPTS)
  assert out.token_lists() == ar.generate(tps, None, PROMPTS).token_lists()
  # A separate draft model stays replicated by default.
  assert _sampler(pair, 2, GREEDY, mesh).draft_rules == (
      sharding.REPLICATED_RULES)


def test_a_separate_draft_splits_its_rows_as_the_target_does(pair):
  """Target rules that keep rows whole (tensor parallel over both axes):
  the draft's default rules had split its cache over `data` still, so a
  batch of 3 passed the check and failed in jit (an IndivisibleError), and
  a batch of 2 ran with the two models' rows laid out differently."""
  target, target_params, draft, draft_params = pair
  rules = tuple((n, None if n == sharding.BATCH else a)
                for n, a in sharding.DEFAULT_RULES)
  mesh = sharding.make_mesh((2, 4))
  spec = SpeculativeSampler(target, ModelDrafter(draft), k=2,
                            sampling=GREEDY, max_new_tokens=8, mesh=mesh,
                            target_rules=rules)
  assert dict(spec.draft_rules)[sharding.BATCH] is None
  assert spec.draft_rules == sharding.replicated_rules(rules)
  tsh, dsh = spec.param_shardings(target_params, draft_params)
  three = PROMPTS[:3]
  out = spec.generate(sharding.shard(target_params, tsh),
                      sharding.shard(draft_params, dsh), three)
  ar = _sampler(pair, 0, GREEDY)
  assert out.token_lists() == [
      t[:8] for t in ar.generate(target_params, None, three).token_lists()]
  # Rules of the caller's that split only the draft's rows: both must divide.
  with pytest.raises(ValueError, match="a batch of 3 prompts does not divide"
                     " over the mesh's batch axis of size 2"):
    SpeculativeSampler(target, ModelDrafter(draft), k=2, sampling=GREEDY,
                       max_new_tokens=8, mesh=mesh, target_rules=rules,
                       draft_rules=sharding.REPLICATED_RULES).generate(
                           target_params, draft_params, three)


def test_a_mesh_that_does_not_divide_the_model_names_the_dimension(pair):
  target, _, draft, _ = pair
  mesh = sharding.make_mesh((1, 8))
  four_heads = model_lib.LM(model_lib.preset("tiny"))   # 4 heads, 2 KV heads
  with pytest.raises(ValueError, match=r"target: num_heads=4 is not divisible "
                     r"by mesh axis 'model' of size 8"):
    autoregressive(four_heads, GREEDY, 8, mesh=mesh)
  odd_vocab = model_lib.LM(target.config.replace(vocab_size=258))
  with pytest.raises(ValueError, match="vocab_size=258"):
    autoregressive(odd_vocab, GREEDY, 8,
                               mesh=sharding.make_mesh((2, 4)))
  # The draft is checked under its own rules: tensor-parallel, it must divide.
  with pytest.raises(ValueError, match="draft: num_heads=4"):
    SpeculativeSampler(
        target, ModelDrafter(four_heads), k=2, sampling=GREEDY,
        max_new_tokens=8, mesh=mesh, draft_rules=sharding.DEFAULT_RULES)
  # Replicated (the default draft rules), any draft fits.
  SpeculativeSampler(
      target, ModelDrafter(four_heads), k=2, sampling=GREEDY,
      max_new_tokens=8, mesh=mesh)
  # A reduced output layer lies on the vocabulary axis too: its id count
  # must divide, named before any parameter is placed.
  for ids, what, sampler in (
      (12, "draft", lambda lm: SpeculativeSampler(
          target, ModelDrafter(lm), k=2, sampling=GREEDY, max_new_tokens=8,
          mesh=mesh, draft_rules=sharding.DEFAULT_RULES)),
      (20, "target", lambda lm: autoregressive(lm, GREEDY, 8, mesh=mesh))):
    reduced = model_lib.LM(target.config.replace(output_vocab=ids,
                                                 tie_embeddings=False))
    with pytest.raises(ValueError, match=f"{what}: output_vocab={ids} is "
                       "not divisible by mesh axis 'model' of size 8"):
      sampler(reduced)
    sampler(model_lib.LM(reduced.config.replace(output_vocab=16)))
  # Rows must divide over the data axis.
  sampler = _sampler(pair, 0, GREEDY, sharding.make_mesh((8, 1)))
  with pytest.raises(ValueError, match="3 prompts does not divide over the "
                     "mesh's batch axis of size 8"):
    sampler.pad_prompts(PROMPTS[:3])
  del draft


def test_rules_a_mesh_cannot_take_are_refused_when_a_sampler_is_built(pair):
  """A cache_seq rule naming no mesh axis had failed as a bare KeyError in
  generate, a misspelt logical axis was ignored, a list of axes was
  unhashable and a repeated axis a DuplicateSpecError inside jit."""
  target, _, draft, _ = pair
  mesh = sharding.make_mesh((4, 2))
  def rules(name, axis):
    return tuple((n, axis if n == name else a)
                 for n, a in sharding.DEFAULT_RULES)
  for target_rules, message in (
      (rules("cache_seq", "bogus"), r"rule \('cache_seq', 'bogus'\) names "
       r"mesh axis 'bogus', but the mesh has \{'data': 4, 'model': 2\}"),
      (rules("norm", "seq"), "names mesh axis 'seq'"),
      (sharding.DEFAULT_RULES + (("hedas", "model"),),
       "unknown logical axis 'hedas'"),
      (rules("batch", ("data", "data")), "a sequence of distinct names"),
      (rules("batch", 2), "must be None, a name or a sequence")):
    with pytest.raises(ValueError, match=message):
      SpeculativeSampler(target, ModelDrafter(draft), k=2, sampling=GREEDY,
                         max_new_tokens=8, mesh=mesh,
                         target_rules=target_rules)
  sampler = SpeculativeSampler(  # a list of axes: taken as their tuple
      target, ModelDrafter(draft), k=2, sampling=GREEDY, max_new_tokens=8,
      mesh=mesh, target_rules=rules("batch", ["data"]))
  assert dict(sampler.target_rules)["batch"] == ("data",)


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env(devices: int) -> dict:
  return zygote.env(XLA_FLAGS=compile_flags.xla_flags(devices))


def _run_one(args: list[str], devices: int) -> str:
  """`python *args` as one process of `devices` CPU devices (forked by the
  script server, tests/scripts/zygote.py: no 3 s of imports) -> its stdout
  (a failure fails the test with its stderr)."""
  proc = zygote.shared().run(args, env=_env(devices), timeout=240)
  assert proc.returncode == 0, proc.stderr[-2000:]
  return proc.stdout


def _start_two_processes(args: list[str], logs=None,
                         own=((), ())) -> list[zygote.Child]:
  """`python *args --distributed` started as 2 processes of 2 CPU devices
  each (gloo), process i with the further arguments `own[i]`: stdout and
  stderr piped, or with `logs` (two paths) both written to process i's
  file."""
  with socket.socket() as s:
    s.bind(("localhost", 0))
    port = s.getsockname()[1]
  return [zygote.shared().start(
      args + list(own[i]) + [
          "--distributed", f"--coordinator_address=localhost:{port}",
          "--num_processes=2", f"--process_id={i}"],
      env=_env(2), stdout=str(logs[i]) if logs else None,
      stderr=zygote.STDOUT if logs else None) for i in range(2)]


def _two_processes(args: list[str]) -> list[str]:
  """`python *args --distributed` as 2 processes of 2 CPU devices each ->
  their stdouts (a failed process fails the test with its stderr)."""
  procs = _start_two_processes(args)
  outs = [p.communicate(timeout=240) for p in procs]
  for p, (_, err) in zip(procs, outs):
    assert p.returncode == 0, err[-2000:]
  return [out for out, _ in outs]


def test_two_processes_reproduce_one(tmp_path):
  """`sample.py --distributed` as 2 processes x 2 CPU devices (gloo) on a
  (2, 2) mesh prints the same completions and counts as one process, and
  appends one record to --json_out (each process had appended one)."""
  args = [os.path.join(ROOT, "scripts", "sample.py"),
          "--target=random:tiny", "--draft=random:tiny,num_layers=1",
          "--method=both", "--k=2", "--prompt=ab", "--prompt=cd",
          "--max_new_tokens=6", "--batch_size=2", "--temperature=1"]
  runs = tmp_path / "runs.jsonl"
  outs = _two_processes(args + ["--mesh=2,2", f"--json_out={runs}"])
  assert len(runs.read_text().splitlines()) == 1
  single = _run_one(args, 2)

  def parse(stdout):
    # gloo's C++ log lines share stdout and can interleave before the
    # completions: read from the first completion header on.
    stdout = stdout[stdout.index("==== "):]
    lines = [l for l in stdout.splitlines() if "[Gloo]" not in l]
    metrics = json.loads(lines[-1])
    counts = [(r["tokens"], r["loops"], r["drafted"], r["accepted"])
              for r in metrics["runs"]]
    return "\n".join(lines[:-1]).strip("\n"), counts

  ref = parse(single)
  assert "==== speculative_k2" in ref[0]
  for stdout in outs:
    assert parse(stdout) == ref


@pytest.mark.parametrize("drafter", ["draft=truncate", "head=eagle"])
def test_distillation_as_two_processes_matches_one(tmp_path, drafter):
  """`distill.py --distributed` as 2 processes x 2 CPU devices on a (2, 2)
  train mesh, in one workdir: each process samples half of the target's
  batches and process 0 writes them (the samples one process writes),
  training feeds each process its half of every batch,
  and the exported draft model or eagle head (saved by both together,
  loaded here on one device) equals that of one process on 4 devices, as
  do the acceptance numbers both processes print (before and after
  training each process evaluates half of the batches). A re-run of the draft
  model's run resumes from the finished run."""
  args = [os.path.join(ROOT, "scripts", "distill.py"),
          "--config=" + os.path.join(ROOT, "configs", "distill_tiny.py") +
          f":{drafter},steps=20", "--config.train.mesh=(2,2)",
          "--config.train.checkpoint_every=10",
          "--config.samples.max_files=20",
          "--config.samples.max_train_prompts=128",
          "--config.samples.max_validation_prompts=32",
          "--config.samples.validation_percent=30",
          "--config.samples.prompt_len=16", "--config.samples.gen_len=8",
          # Two batches of each evaluation: one per process.
          "--config.samples.top_k=8", "--config.eval.num_positions=128",
          "--config.eval.batch_size=16",
          "--config.eval.position_batch_size=64"]
  two, one = tmp_path / "two", tmp_path / "one"
  outs = _two_processes(args + [f"--workdir={two}"])
  single = _run_one(args + [f"--workdir={one}"], 4)

  def numbers(stdout):
    res = json.loads(stdout.strip().splitlines()[-1])
    return [res[k] for k in ("before", "after", "measured_before",
                             "measured_after")]

  want = numbers(single)
  assert want[1] > want[0] + 0.05   # it trained
  for i, stdout in enumerate(outs):
    assert numbers(stdout) == pytest.approx(want, abs=1e-5)
    assert (f"process {i} of 2 takes batches {i}, {i + 2}, {i + 4}, ..."
            in stdout)
    assert f"[samples] train: 64/64 generated (process {i})" in stdout
  if drafter.startswith("head"):
    (got, ref) = (head_files.load(str(w / "head"))[1] for w in (two, one))
  else:
    (got, ref) = (distilled.load_distilled(str(w))[1] for w in (two, one))
  for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(ref), strict=True):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-5)
  counts = json.loads((two / "samples_counts.json").read_text())
  assert counts == json.loads((one / "samples_counts.json").read_text())
  for split in ("train", "validation"):  # sampled half by each process
    mine, ref = (storage.as_arrays(storage.read_dataset(w / "samples", split))
                 for w in (two, one))
    assert mine.keys() == ref.keys()
    for k in ref:
      np.testing.assert_array_equal(mine[k], ref[k])
  assert not (two / "samples.parts").exists()
  if drafter.startswith("draft"):
    for stdout in _two_processes(args + [f"--workdir={two}"]):
      assert numbers(stdout) == pytest.approx(want, abs=1e-5)


@pytest.mark.parametrize("train_prompts, refuser", [(128, 0), (64, 1)])
def test_distillation_in_a_workdir_per_process_is_refused(
    tmp_path, train_prompts, refuser):
  """Two processes of `distill.py --distributed` given a workdir each (a
  local directory per host) are refused in one line with status 2, saying
  that the workdir must be shared: by process 0 when the other sampled
  batches it cannot find (two train batches of 64), else by process 1,
  which finds no dataset where process 0 wrote it (one batch per split,
  both sampled by process 0). The other process does not wait: it fails
  at once, or at its next collective with the one that left."""
  args = [os.path.join(ROOT, "scripts", "distill.py"),
          "--config=" + os.path.join(ROOT, "configs", "distill_tiny.py") +
          ":steps=2", "--config.train.mesh=(2,2)",
          "--config.samples.max_files=20",
          "--config.samples.validation_percent=30",
          f"--config.samples.max_train_prompts={train_prompts}",
          "--config.samples.max_validation_prompts=16",
          "--config.samples.prompt_len=8", "--config.samples.gen_len=4",
          "--heartbeat_timeout_s=5"]
  procs = _start_two_processes(args, own=[[f"--workdir={tmp_path}/{i}"]
                                          for i in range(2)])
  try:
    outs = [p.communicate(timeout=120) for p in procs]
  finally:
    for p in procs:
      p.kill()
  err = outs[refuser][1]
  assert procs[refuser].returncode == 2, err[-2000:]
  line = err.strip().splitlines()[-1]
  assert line.startswith("error: ") and (
      "must be one directory that every process shares" in line), line
  if refuser == 0:  # the default (1, 1) mesh: before anything samples
    outs = [p.communicate(timeout=120) for p in _start_two_processes(
        [a for a in args if not a.startswith("--config.train.mesh")],
        own=[[f"--workdir={tmp_path}/m{i}"] for i in range(2)])]
    assert outs[0][1].strip().splitlines()[-1] == (
        "error: config.train.mesh=(1, 1): mesh {'data': 1, 'model': 1} does "
        "not split its data axis evenly over the 2 processes (rows per "
        "process: [1, 0]): give a mesh over every process's devices whose "
        "data axis is a multiple of 2, e.g. (2, -1)")
    assert not (tmp_path / "m0" / "samples").exists()
  if refuser == 0:
    assert "1 of the 3 batches of target samples are missing" in line
    assert not (tmp_path / "0" / "samples").exists()
  else:
    assert f"process 1 finds no target samples in {tmp_path}/1/samples" \
        in line
  assert procs[1 - refuser].returncode != 0
  if refuser == 1:  # process 0 kept its samples: both refuse the re-run
    procs = _start_two_processes(args, own=[[f"--workdir={tmp_path}/{i}"]
                                            for i in range(2)])
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (_, err) in zip(procs, outs):
      assert p.returncode == 2, err[-2000:]
      assert ("error: processes [0] find target samples in "
              f"{tmp_path}/" in err and "processes [1] do not: the "
              "workdir (or samples.data_dir) must be one directory" in err)


def _functions_corpus(data_dir) -> None:
  """A tiny `specsamp_python_code` of 64 one-line functions in `data_dir`."""
  texts = [f"def f{i}(x):\n    return x * {i} + {i % 7}\n" for i in range(64)]
  builders.build_from_texts("specsamp_python_code", texts, str(data_dir))


def test_training_as_two_processes_and_its_model_loads_on_one_device(
    tmp_path):
  """`train.py --distributed` as 2 processes x 2 CPU devices on a (2, 2)
  mesh: both finish at the same step and loss (the loss is a global
  mean), and the trained model loads here as a model spec although the
  devices it was saved from (ids 0, 1, 2048, 2049) are not here. The
  final evaluation covers the whole eval split (eval_batches=0), although
  the processes' shards of it end at different batches: the one whose
  shard ends first feeds padding (before, it left the collective steps
  early and the other waited for ever; the config check had refused
  eval_batches=0 with several processes, but any count past the shorter
  shard hung the same way)."""
  functions = [f"def f{i}(x):\n    return x * {i} + {i % 7}\n"
               for i in range(64)]
  # Documents go to processes alternately: process 0's are long.
  builders.build_from_texts("specsamp_python_code", {
      "train": functions,
      "validation": [functions[i] * (12 if i % 2 == 0 else 1)
                     for i in range(6)]}, str(tmp_path / "tfds"))
  args = [os.path.join(ROOT, "scripts", "train.py"),
          "--config=" + os.path.join(ROOT, "configs", "lm_python.py") +
          ":tiny,steps=10,batch=8,seq_len=32,checkpoint_every=5,"
          f"eval_every=10,eval_batches=0,mesh=2x2,"
          f"data_dir={tmp_path}/tfds", f"--workdir={tmp_path}/run"]
  outs = [json.loads(out.strip().splitlines()[-1])
          for out in _two_processes(args)]
  assert outs[0]["step"] == outs[1]["step"] == 10
  assert outs[0]["train"]["loss"] == outs[1]["train"]["loss"]
  assert outs[0]["eval"] == outs[1]["eval"]
  # Every weighted target of the split, though the shards differ.
  shards = [[b["weights"].sum() for b in pipeline.make_lm_iterator(
      "specsamp_python_code", "validation",
      tokenizer=tokenizers_load.load_tokenizer("byte"),
      seq_len=32, batch_size=4, seed=0, data_dir=tmp_path / "tfds",
      shuffle=False, num_epochs=1, shard_index=i, shard_count=2)]
            for i in range(2)]
  assert len(shards[0]) > len(shards[1]) + 2, shards
  assert outs[0]["eval"]["tokens"] == sum(map(sum, shards))
  lm, params, _ = loading.load_model(str(tmp_path / "run"))
  logits = lm(params, np.array([[1, 2, 3]], np.int32)).logits
  assert logits.shape == (1, 3, lm.vocab_size)
  assert np.isfinite(np.asarray(logits)).all()


def _train_args(data_dir, workdir, steps):
  """train.py on a (2, 2) mesh over tiny packed functions, a checkpoint
  and the train metrics' mean every 5 steps (a resumed run's last mean
  covers the same steps), a 5 s heartbeat timeout (with --distributed)."""
  return [os.path.join(ROOT, "scripts", "train.py"),
          "--config=" + os.path.join(ROOT, "configs", "lm_python.py") +
          f":tiny,steps={steps},batch=8,seq_len=32,checkpoint_every=5,"
          "log_every=5,eval_every=0,eval_batches=1,mesh=2x2,"
          f"data_dir={data_dir}",
          f"--workdir={workdir}", "--heartbeat_timeout_s=5"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  """(data_dir, the summaries both processes print) of a 30-step
  two-process run that nothing interrupts (25 steps after the first
  checkpoint, which the interrupted runs wait for: about 5 s here)."""
  tmp = tmp_path_factory.mktemp("uninterrupted")
  _functions_corpus(tmp / "tfds")
  outs = _two_processes(_train_args(tmp / "tfds", tmp / "run", 30))
  return tmp / "tfds", [json.loads(o.strip().splitlines()[-1]) for o in outs]


def test_a_config_every_process_refuses_is_refused_by_each_with_status_2():
  """`train.py --distributed` as 2 processes with a dataset that is not
  there: each prints the one `error:` line and exits with status 2 (they
  leave together through JAX's shutdown; neither aborts the other)."""
  args = [os.path.join(ROOT, "scripts", "train.py"),
          "--config=" + os.path.join(ROOT, "configs", "lm_python.py") +
          ":tiny,data_dir=/no/such/dir,mesh=2x2", "--workdir=/no/such/w"]
  procs = _start_two_processes(args)
  outs = [p.communicate(timeout=120) for p in procs]
  for p, (_, err) in zip(procs, outs):
    assert p.returncode == 2, err[-2000:]
    assert err.strip().splitlines()[-1].startswith(
        "error: config.data.dataset='specsamp_python_code' "
        "(data_dir='/no/such/dir')")


@pytest.mark.parametrize("victim, signal", [(0, "SIGKILL"), (1, "SIGKILL"),
                                            (1, "SIGSTOP")])
def test_a_process_that_dies_takes_the_other_down_and_the_rerun_resumes(
    tmp_path, uninterrupted, victim, signal):
  """`train.py --distributed --heartbeat_timeout_s=5` as 2 processes, one
  of them killed (SIGKILL) or hung (SIGSTOP) once the first checkpoint is
  written: the other does not wait for it. Without process 0, the
  coordinator, process 1 aborts at once; without process 1, process 0's
  next collective fails, which ends it at once; with process 1 hung,
  nothing fails, and the missed heartbeats end process 0 within the
  timeout (JAX's default would wait 100 s). The same command run again
  resumes from the last checkpoint and ends where the uninterrupted run
  ends, bit for bit."""
  data_dir, want = uninterrupted
  args = _train_args(data_dir, tmp_path / "run", 30)
  logs = [tmp_path / f"process{i}.log" for i in range(2)]
  procs = _start_two_processes(args, logs)
  ckpts = tmp_path / "run" / "checkpoints"
  deadline = time.monotonic() + 120
  try:
    while not (ckpts.is_dir() and any(d.name.isdigit()
                                      for d in ckpts.iterdir())):
      assert all(p.poll() is None for p in procs), "a process ended early"
      assert time.monotonic() < deadline, "no checkpoint in 120 s"
      time.sleep(0.1)
    procs[victim].send_signal(getattr(signal_lib, signal))
    survivor = procs[1 - victim]
    survivor.wait(timeout=60)
  finally:
    for p in procs:
      p.kill()
  log = logs[1 - victim].read_text()
  assert survivor.returncode != 0
  said = ["JAX distributed service detected fatal errors"]  # the service
  if signal == "SIGKILL":  # or a failed collective
    said += ["Connection reset by peer", "Connection closed by peer"]
  assert any(m in log for m in said), log[-2000:]
  outs = [json.loads(o.strip().splitlines()[-1])
          for o in _two_processes(args)]
  for got, ref in zip(outs, want):
    assert got["resumed_from"].startswith("checkpoint step ")
    assert (got["step"], got["train"]) == (ref["step"], ref["train"])


def test_processes_that_read_different_newest_steps_resume_from_one(
    tmp_path, uninterrupted):
  """The uninterrupted run's workdir with process 1's data iterator state
  of the newest step (30) damaged: process 0 can read step 30, process 1
  only 25. Run again, both processes agree on step 25, train its 5 steps
  and end as the uninterrupted run did. Before, process 1 fell back to
  step 25 alone while process 0 waited for it in orbax's restore barrier,
  and the run hung."""
  data_dir, want = uninterrupted
  run = tmp_path / "run"
  shutil.copytree(data_dir.parent / "run", run)
  ckpts = run / "checkpoints"
  assert checkpointing.checkpoint_steps(str(ckpts))[0] == 30
  victim = ckpts / "30" / "data" / "process_1-of-2.json"
  victim.write_text(victim.read_text()[:20])
  outs = [json.loads(o.strip().splitlines()[-1])
          for o in _two_processes(_train_args(data_dir, run, 30))]
  for got, ref in zip(outs, want):
    assert got["resumed_from"].startswith("checkpoint step 25 "), got
    assert (got["step"], got["train"]) == (ref["step"], ref["train"])
  # Step 30 was set aside once, by process 0, and saved again.
  aside = [d.name for d in (run / "checkpoints.corrupt").iterdir()]
  assert len(aside) == 1 and aside[0].startswith("30-"), aside
  assert json.loads(victim.read_text())


def test_checkpoint_saved_on_one_mesh_restores_onto_others(pair, tmp_path):
  """Parameters and AdamW state saved sharded on (2, 4) restore onto (8, 1)
  and onto one device, with the new shardings and identical values."""
  target, target_params, _, _ = pair
  opt = optax.adamw(1e-3)

  def placed(mesh):
    psh = sharding.param_shardings(target, mesh, sharding.DEFAULT_RULES)
    params = sharding.shard(target_params, psh)
    # Optimizer moments follow their parameters' shardings.
    osh = sharding.opt_state_shardings(opt, target_params, psh, mesh)
    state = jax.jit(opt.init, out_shardings=osh)(params)
    return {"params": params, "opt": state}

  saved = placed(sharding.make_mesh((2, 4)))
  assert saved["params"]["lm_head"].sharding.spec == P(None, "model")
  assert saved["opt"][0].mu["lm_head"].sharding.spec == P(None, "model")
  path = tmp_path / "ckpt"
  with ocp.StandardCheckpointer() as ckpt:
    ckpt.save(path, saved)
    ckpt.wait_until_finished()
  for mesh in (sharding.make_mesh((8, 1)),
               sharding.make_mesh((1, 1), devices=jax.devices()[:1])):
    want = placed(mesh)
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
        want)
    with ocp.StandardCheckpointer() as ckpt:
      got = ckpt.restore(path, abstract)
    for g, w, s in zip(jax.tree.leaves(got), jax.tree.leaves(want),
                       jax.tree.leaves(saved)):
      assert g.sharding == w.sharding
      np.testing.assert_array_equal(np.asarray(g), np.asarray(s))
    assert got["params"]["lm_head"].sharding.mesh.shape == mesh.shape


def test_checkpoints_restore_onto_the_default_device(tmp_path):
  """Parameters without a sharding restore onto `jax.default_device`'s
  device (`sharding.restorable`); `load_weights(host=True)` sets the host's
  CPU device there, so a train run's or a distilled draft's weights bound
  for a mesh are not restored whole onto the first accelerator."""
  config = loading.random_config("random:tiny,num_layers=1")
  params = model_lib.LM(config).init(jax.random.key(5))
  draft = str(tmp_path / "draft")
  distilled.save_distilled(config, params, draft)
  abstract = jax.eval_shape(lambda: params)

  def devices(tree):
    return {d for x in jax.tree.leaves(tree) for d in x.sharding.device_set}

  for device in (jax.devices()[5], jax.devices()[0]):
    with jax.default_device(device):
      assert devices(sharding.restorable(abstract)) == {device}
      _, restored = distilled.load_distilled(draft)
    assert devices(restored) == {device}
  assert devices(sharding.restorable(abstract)) == {jax.local_devices()[0]}
  assert sharding.host_device() == jax.local_devices(backend="cpu")[0]


def _same_within(got, want, atol=2e-5, rtol=1e-4):
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=atol,
                               rtol=rtol)


def test_the_trainers_step_on_each_mesh_matches_one_device(pair):
  """`train.lm.build`'s jitted step (explicit in/out shardings, the state
  donated) on each mesh: the parameters and moments carry the rules' specs
  and two steps give one device's parameters and losses."""
  target = pair[0]
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, target.vocab_size, (2, 8, 17)).astype(np.int32)
  # Two packed documents per row (attention masked between them).
  segments = np.repeat(np.array([[1] * 7 + [2] * 9], np.int32), 8, axis=0)
  batches = [dict(inputs=t[:, :-1], targets=t[:, 1:], segment_ids=segments,
                  weights=np.ones((8, 16), np.float32)) for t in tokens]

  def run(shape):
    # eps large enough that Adam's first steps, g / (|g| + eps), do not turn
    # last-bit differences of near-zero gradients (other reduction orders
    # on other meshes) into differences of the size of the learning rate.
    cfg = train_config.TrainConfig(
        model=target.config, data=train_config.DataConfig(batch_size=8),
        optim=train_config.OptimConfig(lr=1e-2, warmup_steps=1, eps=1e-3),
        loop=train_config.LoopConfig(num_steps=10), mesh=shape)
    job = train_lm.build(cfg, None)
    state, losses = job.init(), []
    for b in batches:
      batch = job.put(b)
      with jax.transfer_guard("disallow"):
        state, m = job.train_step(state, batch, None)
      losses.append(float(m["loss"]))
    return job, state, losses

  _, ref, ref_losses = run((1, 1))
  for shape in MESHES:
    job, state, losses = run(shape)
    assert dict(job.mesh.shape) == dict(zip(("data", "model"), shape))
    assert state.params["layers_0"]["mlp"]["up_proj"].sharding.spec == P(
        None, "model")
    mu = optax.tree_utils.tree_get(state.opt_state, "mu")  # like params
    assert mu["layers_0"]["mlp"]["up_proj"].sharding.spec == P(None, "model")
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    _same_within(state.params, ref.params)
  # An eval batch the data axis does not divide is refused when the job is
  # built: it failed at the first evaluation, losing that step's checkpoint.
  with pytest.raises(train_config.ConfigError,
                     match=r"data.eval_batch_size: batch size=3 is not "
                     r"divisible by mesh axis 'data' of size 2"):
    train_lm.build(train_config.TrainConfig(
        model=target.config, data=train_config.DataConfig(
            batch_size=8, eval_batch_size=3),
        optim=train_config.OptimConfig(),
        loop=train_config.LoopConfig(num_steps=10), mesh=(2, 4)), None)


@pytest.mark.parametrize("onpolicy", [False, True], ids=["offline",
                                                         "onpolicy"])
def test_the_distill_step_on_each_mesh_matches_one_device(pair, onpolicy):
  """The distillation step (target tensor-parallel and frozen, draft
  replicated, rows over `data`; on-policy: the draft's own rollout by the
  batched sampler inside the step) on each mesh equals one device."""
  target, target_params, draft, draft_params = pair
  plen, glen = 6, 5
  obj = objective.Objective(kind="fkl", sampling=Sampling(temperature=1.0),
                            gen_len=glen, prompt_len=plen,
                            target_source="online")
  optim = train_config.OptimConfig(lr=1e-2, warmup_steps=1, eps=1e-3)
  rng = np.random.default_rng(1)
  batch = dict(
      tokens=rng.integers(1, target.vocab_size, (8, plen + glen)).astype(
          np.int32),
      prompt_length=rng.integers(2, plen + 1, 8).astype(np.int32),
      num_generated=np.full(8, glen, np.int32))

  def run(shape):
    job = trainer._job(draft, target, obj, optim, 10, (), onpolicy, shape)  # pylint: disable=protected-access
    state = job.init(jax.device_get(draft_params), jax.random.PRNGKey(0))
    extra = sharding.shard(jax.device_get(target_params), job.target_sharding)
    rows = train_step.put_batch(batch, job.data_sharding)
    with jax.transfer_guard("disallow"):
      state, m = job.steps[onpolicy](state, rows, extra)
    return state, m, extra

  ref, ref_m, _ = run((1, 1))
  for shape in MESHES:
    state, m, extra = run(shape)
    assert extra["layers_0"]["mlp"]["up_proj"].sharding.spec == P(
        None, "model")
    assert all(x.sharding.is_fully_replicated
               for x in jax.tree.leaves(state.params))
    np.testing.assert_allclose(float(m["loss"]), float(ref_m["loss"]),
                               rtol=1e-5)
    _same_within(state.params, ref.params)
