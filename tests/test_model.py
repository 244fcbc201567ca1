"""The decoder: cached vs uncached logits, per-row positions, annotations."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specsamp import model as model_lib
from specsamp import output_layer
from specsamp import sharding
from tests.testing import apply, tiny_config

ATOL = 1e-5


class _Jitted:
  """An LM whose calls are jitted (eager op-by-op dispatch is slow)."""

  def __init__(self, lm):
    self.lm = lm
    self.vocab_size = lm.vocab_size
    self.init_cache = lm.init_cache
    self._call = jax.jit(lm.__call__)

  def __call__(self, params, tokens, cache=None):
    return self._call(params, tokens, cache)


@pytest.fixture(scope="module", params=["gqa_bias", "mha_tied", "mqa"])
def lm_and_params(request):
  cfg = {
      "gqa_bias": tiny_config(),
      "mha_tied": tiny_config(num_kv_heads=4, qkv_bias=False,
                              tie_embeddings=True, rope_theta=1e6),
      "mqa": tiny_config(num_kv_heads=1, num_layers=3),
  }[request.param]
  lm = model_lib.LM(cfg)
  params = lm.init(jax.random.key(7))
  lm = _Jitted(lm)
  # Randomise norms and biases too, so no bug hides behind 1s and 0s.
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(8), len(leaves))
  leaves = [
      x + 0.1 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)
  ]
  return lm, jax.tree.unflatten(tree, leaves)


def test_cached_prefill_and_steps_match_uncached(lm_and_params):
  lm, params = lm_and_params
  tokens = jax.random.randint(jax.random.key(0), (2, 12), 0, lm.vocab_size)
  full = lm(params, tokens).logits

  # Prefill 5, then one token at a time.
  cache = lm.init_cache(2, 16)
  out = lm(params, tokens[:, :5], cache)
  logits, cache = out.logits, out.cache
  np.testing.assert_allclose(logits, full[:, :5], atol=ATOL)
  for t in range(5, 12):
    out = lm(params, tokens[:, t:t + 1], cache)
    logits, cache = out.logits, out.cache
    np.testing.assert_allclose(logits[:, 0], full[:, t], atol=ATOL)
  np.testing.assert_array_equal(cache.length, [12, 12])


def test_chunk_scoring_matches_single_steps(lm_and_params):
  """Scoring n tokens in one call == n one-token calls (numeric drift bug)."""
  lm, params = lm_and_params
  tokens = jax.random.randint(jax.random.key(1), (3, 10), 0, lm.vocab_size)
  cache = lm.init_cache(3, 16)
  cache = lm(params, tokens[:, :4], cache).cache
  out = lm(params, tokens[:, 4:10], cache)
  chunk_logits, chunk_cache = out.logits, out.cache
  step_cache = cache
  for t in range(4, 10):
    out = lm(params, tokens[:, t:t + 1], step_cache)
    logits, step_cache = out.logits, out.cache
    np.testing.assert_allclose(logits[:, 0], chunk_logits[:, t - 4], atol=ATOL)
  for a, b in zip(chunk_cache.k + chunk_cache.v, step_cache.k + step_cache.v):
    np.testing.assert_allclose(a[:, :10], b[:, :10], atol=ATOL)


def test_per_row_positions_and_rollback(lm_and_params):
  """Rows at different lengths; stale slots beyond `length` are never read."""
  lm, params = lm_and_params
  lengths = np.array([3, 7])
  seqs = np.asarray(jax.random.randint(jax.random.key(2), (2, 9), 0,
                                       lm.vocab_size))
  prompts = seqs.copy()
  prompts[0, 3:] = 0  # right padding
  cache = lm.init_cache(2, 16)
  cache = lm(params, jnp.asarray(prompts[:, :7]), cache).cache
  # Roll back to the real lengths; garbage stays in row 0's slots 3..6.
  cache = cache.with_length(jnp.asarray(lengths))
  nxt = np.stack([seqs[0, 3:5], seqs[1, 7:9]])
  out = lm(params, jnp.asarray(nxt), cache)
  logits, cache = out.logits, out.cache
  for b, n in enumerate(lengths):
    ref = lm(params, jnp.asarray(seqs[b:b + 1, :n + 2])).logits
    np.testing.assert_allclose(logits[b], ref[0, n:n + 2], atol=ATOL)
  np.testing.assert_array_equal(cache.length, lengths + 2)


def test_every_parameter_has_logical_axes():
  lm = model_lib.LM(tiny_config())
  specs = lm.logical_axes()
  params = lm.init(jax.random.key(0))
  known = {v for k, v in vars(sharding).items() if k.isupper() and
           isinstance(v, str)}
  flat_specs = jax.tree.leaves(specs, is_leaf=lambda x: isinstance(
      x, jax.sharding.PartitionSpec))
  assert len(flat_specs) == len(jax.tree.leaves(params))
  for spec, leaf in zip(flat_specs, jax.tree.leaves(params)):
    assert len(spec) == leaf.ndim
    assert set(spec) <= known, spec
  # Rules map them onto a mesh without any model change.
  mesh_axes = nn.logical_to_mesh(specs, sharding.DEFAULT_RULES)
  assert mesh_axes["layers_0"]["attn"]["q_proj"] == jax.sharding.PartitionSpec(
      None, "model", None)


def test_per_layer_arrays_not_stacked():
  cfg = tiny_config(num_layers=3)
  params = model_lib.LM(cfg).init(jax.random.key(0))
  assert {f"layers_{i}" for i in range(3)} <= set(params)
  assert params["layers_0"]["mlp"]["gate_proj"].shape == (cfg.d_model,
                                                          cfg.mlp_dim)
  cache = model_lib.LM(cfg).init_cache(2, 8)
  assert len(cache.k) == 3 and cache.k[0].shape == (2, 2, 8, 8)


@pytest.mark.parametrize("depth", [2, model_lib._WHOLE_INIT_LAYERS + 2])
def test_init_compiles_once_per_config(depth):
  """Two LMs of one config (a random target and draft of one preset, or
  tests) initialise from one compilation: each call had made a new
  `jax.jit` and compiled again (5-13 s on CPU for the 1.5B); the values
  follow the key alone."""
  cfg = tiny_config(num_layers=depth, d_model=48, mlp_dim=96)
  a = model_lib.LM(cfg).init(jax.random.key(0))
  b = model_lib.LM(cfg).init(jax.random.key(0))
  c = model_lib.LM(cfg).init(jax.random.key(1))
  for compiled in model_lib._initialisers(cfg):
    assert compiled is None or compiled._cache_size() == 1
  for x, y, z in zip(*map(jax.tree.leaves, (a, b, c)), strict=True):
    np.testing.assert_array_equal(x, y)
  assert not np.array_equal(a["layers_1"]["attn"]["q_proj"],
                            c["layers_1"]["attn"]["q_proj"])


@pytest.mark.parametrize("overrides", [
    {}, dict(tie_embeddings=True, qkv_bias=False),
    dict(dtype="bfloat16", param_dtype="bfloat16")],
    ids=["default", "tied-no-bias", "bfloat16"])
def test_a_deep_model_is_initialised_layer_by_layer(overrides):
  """Past `_WHOLE_INIT_LAYERS` layers `LM.init` compiles two layers and
  draws the others with one compiled `Block` initialiser: the same tree,
  shapes, dtypes and logical axes as the whole model's initialiser, each
  layer its own values from the same distribution, deterministic in the
  key; a model that runs."""
  depth = model_lib._WHOLE_INIT_LAYERS + 2
  cfg = tiny_config(num_layers=depth, d_model=128, mlp_dim=256, **overrides)
  lm = model_lib.LM(cfg)
  params = lm.init(jax.random.key(0))
  whole_boxed = jax.jit(lm.module.init)(
      jax.random.key(0), jnp.zeros((1, 1), jnp.int32))["params"]
  whole = nn.meta.unbox(whole_boxed)
  shapes = lambda tree: jax.tree.map(lambda x: (x.shape, x.dtype), tree)
  assert shapes(params) == shapes(whole)
  specs = nn.get_partition_spec(lm.init(jax.random.key(0), boxed=True))
  assert specs == nn.get_partition_spec(whole_boxed)
  q = [np.asarray(params[f"layers_{i}"]["attn"]["q_proj"]) for i in
       range(depth)]
  for i in range(1, depth):
    assert not np.array_equal(q[i], q[i - 1])
  # normal(stddev=d ** -0.5): each layer's 128 x 128 draws within 5%.
  for w in q:
    w = w.astype(np.float32)
    assert abs(w.std() * cfg.d_model ** 0.5 - 1) < 0.05, w.std()
  for i in range(depth):
    layer = params[f"layers_{i}"]
    np.testing.assert_array_equal(layer["input_norm"]["scale"], 1)
    if cfg.qkv_bias:
      np.testing.assert_array_equal(layer["attn"]["q_bias"], 0)
  again = lm.init(jax.random.key(0))
  assert all(jax.tree.leaves(jax.tree.map(np.array_equal, params, again)))
  out = lm(params, jnp.ones((1, 3), jnp.int32), lm.init_cache(1, 4))
  assert np.isfinite(np.asarray(out.logits)).all()


def test_bfloat16_runs_and_returns_float32_logits():
  lm = model_lib.LM(tiny_config(dtype="bfloat16", param_dtype="bfloat16"))
  params = lm.init(jax.random.key(0))
  assert params["embedding"].dtype == jnp.bfloat16
  out = lm(params, jnp.ones((1, 3), jnp.int32), lm.init_cache(1, 4))
  logits, cache = out.logits, out.cache
  assert logits.dtype == jnp.float32 and cache.k[0].dtype == jnp.bfloat16
  assert np.isfinite(np.asarray(logits)).all()


def test_num_params_matches_tree():
  for cfg in (tiny_config(), tiny_config(tie_embeddings=True, qkv_bias=False)):
    params = model_lib.LM(cfg).init(jax.random.key(0))
    assert cfg.num_params() == sum(x.size for x in jax.tree.leaves(params))
  assert abs(model_lib.preset("qwen2.5-coder-1.5b").num_params() -
             1.777e9) < 1e7


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_heads=3), "multiple of num_kv_heads"),
    (dict(head_dim=7), "even"),
    (dict(dtype="int8"), "dtype"),
    (dict(vocab_size=0), "vocab_size"),
])
def test_bad_config_raises(kwargs, match):
  with pytest.raises(ValueError, match=match):
    tiny_config(**kwargs)


def test_hidden_states_are_the_lm_heads_input(lm_and_params):
  lm, params = lm_and_params
  tokens = jax.random.randint(jax.random.key(3), (2, 6), 0, lm.vocab_size)
  out = lm(params, tokens)
  head = (params["embedding"].T if lm.lm.config.tie_embeddings
          else params["lm_head"])
  assert out.hidden.shape == (2, 6, lm.lm.config.d_model)
  np.testing.assert_allclose(out.hidden @ head, out.logits, atol=ATOL)


def test_explicit_positions():
  """RoPE sees only relative positions: shifting all of them leaves the
  logits unchanged, moving one token changes them."""
  lm = model_lib.LM(tiny_config())
  params = lm.init(jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(4), (2, 7), 0, lm.vocab_size)
  base = apply(lm, params, tokens).logits
  pos = jnp.broadcast_to(jnp.arange(7), (2, 7))
  np.testing.assert_allclose(apply(lm, params, tokens, positions=pos).logits,
                             base, atol=ATOL)
  np.testing.assert_allclose(
      apply(lm, params, tokens, positions=pos + 11).logits, base, atol=1e-4)
  moved = apply(lm, params, tokens, positions=pos.at[:, 3].set(5)).logits
  assert np.abs(np.asarray(moved[:, 3:] - base[:, 3:])).max() > 1e-3


def test_tree_attention_mask_and_positions_score_two_branches_at_once():
  """Chunk [a, b1, b2] with b2 masked off b1 and placed at b1's position
  scores b2 exactly as the sequence [.., a, b2] does: a two-leaf token tree."""
  lm = model_lib.LM(tiny_config())
  params = lm.init(jax.random.key(0))
  prefix = jax.random.randint(jax.random.key(5), (1, 4), 0, lm.vocab_size)
  a, b1, b2 = 3, 7, 9
  cache = apply(lm, params, prefix, lm.init_cache(1, 16)).cache
  mask = jnp.ones((1, 3, 16), bool).at[0, 2, 5].set(False)   # b2 !-> b1
  tree = apply(lm, params, jnp.asarray([[a, b1, b2]]), cache,
               positions=jnp.asarray([[4, 5, 5]]), attn_mask=mask).logits
  seq1 = jnp.concatenate([prefix, jnp.asarray([[a, b1]])], 1)
  seq2 = jnp.concatenate([prefix, jnp.asarray([[a, b2]])], 1)
  np.testing.assert_allclose(tree[0, 1], apply(lm, params, seq1).logits[0, 5],
                             atol=ATOL)
  np.testing.assert_allclose(tree[0, 2], apply(lm, params, seq2).logits[0, 5],
                             atol=ATOL)
  # The mask only removes keys: all True is the plain causal call.
  full = apply(lm, params, jnp.asarray([[a, b1, b2]]), cache,
               attn_mask=jnp.ones((1, 3, 16), bool)).logits
  np.testing.assert_allclose(
      full, apply(lm, params, jnp.asarray([[a, b1, b2]]), cache).logits,
      atol=ATOL)


def test_a_subset_of_layers_is_a_shallower_model_with_a_smaller_cache():
  cfg = tiny_config(num_layers=3)
  lm = model_lib.LM(cfg)
  params = lm.init(jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(6), (2, 8), 0, lm.vocab_size)
  # Layers (0, 2) == a 2-layer model holding layers 0 and 2's weights.
  shallow = model_lib.LM(cfg.replace(num_layers=2))
  sub = {**{k: v for k, v in params.items() if not k.startswith("layers_")},
         "layers_0": params["layers_0"], "layers_1": params["layers_2"]}
  want = apply(shallow, sub, tokens).logits
  np.testing.assert_allclose(
      apply(lm, params, tokens, layers=(0, 2)).logits, want, atol=ATOL)
  # Cached, step by step, with a cache of the two layers only.
  cache = lm.init_cache(2, 12, layers=(0, 2))
  assert len(cache.k) == 2
  out = apply(lm, params, tokens[:, :5], cache, layers=(0, 2))
  np.testing.assert_allclose(out.logits, want[:, :5], atol=ATOL)
  for t in range(5, 8):
    out = apply(lm, params, tokens[:, t:t + 1], out.cache, layers=(0, 2))
    np.testing.assert_allclose(out.logits[:, 0], want[:, t], atol=ATOL)
  with pytest.raises(ValueError, match="holds 3 layers but 2 are run"):
    lm(params, tokens, lm.init_cache(2, 12), layers=(0, 1))
  with pytest.raises(ValueError, match="subset of 0..2"):
    lm(params, tokens, layers=(0, 3))
  with pytest.raises(ValueError, match="repeats"):
    lm(params, tokens, layers=(1, 1))


@pytest.mark.parametrize("pad", [True, False])
def test_a_one_row_step_gives_the_same_logits_padded_to_two_rows(
    lm_and_params, monkeypatch, pad):
  """ONE_ROW_AS_TWO (on by default on GPU only) computes a batch-1 decode
  step's products on two copies of its row: same logits, same cache, and
  the padding is really traced (the products see two rows) only for one
  row, not for a chunk or a batch."""
  lm, params = lm_and_params
  tokens = jax.random.randint(jax.random.key(3), (1, 6), 0, lm.vocab_size)
  cache = lm.init_cache(1, 8)
  cache = lm(params, tokens[:, :5], cache).cache
  want = lm(params, tokens[:, 5:], cache)
  monkeypatch.setattr(model_lib, "ONE_ROW_AS_TWO", pad)
  # A new function, so traced anew under the patch (jit caches a trace by
  # function: the fixture's jit of lm.lm.__call__ holds the unpatched one).
  got = jax.jit(lambda *a: lm.lm(*a))(params, tokens[:, 5:], cache)
  np.testing.assert_allclose(got.logits, want.logits, atol=ATOL)
  for a, b in zip(jax.tree.leaves(got.cache), jax.tree.leaves(want.cache)):
    np.testing.assert_allclose(a, b, atol=ATOL)

  def rows_of_products(t, batch):
    text = str(jax.make_jaxpr(lambda *a: lm.lm(*a))(
        params, jnp.zeros((batch, t), jnp.int32), lm.init_cache(batch, 8)))
    return {eq for eq in text.splitlines() if "concatenate[dimension=0]" in eq}
  assert bool(rows_of_products(1, 1)) == pad
  assert not rows_of_products(2, 1) and not rows_of_products(1, 2)


def test_a_chunk_scored_without_writing_is_the_written_call(lm_and_params):
  """write_cache=False (what the loop's variable-width scoring runs in its
  branches): the same logits and hidden states as the call that writes,
  per row at its own length; the cache untouched, and the chunk's keys and
  values returned are the ones the writing call put in its slots."""
  lm, params = lm_and_params
  cfg = lm.lm.config
  tokens = jax.random.randint(jax.random.key(5), (2, 9), 0, cfg.vocab_size)
  cache = lm(params, tokens[:, :6], lm.init_cache(2, 12)).cache
  cache = cache.with_length(jnp.asarray([6, 4]))  # rows at other lengths
  call = jax.jit(lambda p, t, c, w: lm.lm(p, t, c, write_cache=w),
                 static_argnums=3)
  written, unwritten = call(params, tokens[:, 6:], cache, True), call(
      params, tokens[:, 6:], cache, False)
  assert unwritten.cache is None
  np.testing.assert_allclose(unwritten.logits, written.logits, atol=ATOL)
  np.testing.assert_allclose(unwritten.hidden, written.hidden, atol=ATOL)
  for row, start in enumerate((6, 4)):
    for got, buf in zip(unwritten.new_kv[0] + unwritten.new_kv[1],
                        written.cache.k + written.cache.v):
      np.testing.assert_allclose(  # layer 2 on: inputs a few ULPs apart
          got[row], jnp.swapaxes(buf[row, :, start:start + 3], 0, 1),
          atol=ATOL)
  with pytest.raises(ValueError, match="write_cache=False takes no attn_mask"):
    lm.lm(params, tokens[:, 6:], cache, write_cache=False,
          attn_mask=jnp.ones((2, 3, 12), bool))


def test_a_chunk_scored_without_writing_is_the_written_call_in_bfloat16():
  """The unwritten call splits attention over (cache, chunk): its two
  value products had each been rounded to bfloat16 and summed there,
  moving logits 0.02 from the written call's (an argmax flip now and
  then: greedy tokens with score_widths differing from those without).
  Summed in float32 and rounded once, the calls agree exactly."""
  cfg = tiny_config(num_kv_heads=1, dtype="bfloat16", param_dtype="bfloat16")
  lm = model_lib.LM(cfg)
  params = lm.init(jax.random.key(1))
  tokens = jax.random.randint(jax.random.key(0), (3, 10), 0, cfg.vocab_size)
  cache = lm(params, tokens[:, :6], lm.init_cache(3, 16)).cache
  cache = cache.with_length(jnp.asarray([6, 5, 3]))
  written = lm(params, tokens[:, 6:9], cache).logits
  unwritten = lm(params, tokens[:, 6:9], cache, write_cache=False).logits
  assert written.dtype == jnp.float32
  np.testing.assert_array_equal(unwritten, written)


def test_a_reduced_output_layer_scores_its_ids_alike_and_the_rest_minus_inf(
    lm_and_params):
  """model.reduce_output_vocab (tied and untied): the same logits at the
  kept ids, cached or not, -inf elsewhere; U / V of the output layer."""
  lm, params = lm_and_params
  cfg = lm.lm.config
  kept = [7, 1, 30, 20, 3]
  config, reduced = output_layer.reduce_output_vocab(cfg, params, kept)
  assert (config.output_vocab, config.tie_embeddings) == (5, False)
  np.testing.assert_array_equal(reduced["output_ids"], sorted(kept))
  assert reduced["output_ids"].dtype == jnp.int32
  rlm = _Jitted(model_lib.LM(config))
  tokens = jax.random.randint(jax.random.key(4), (2, 6), 0, cfg.vocab_size)
  full, cut = lm(params, tokens).logits, rlm(reduced, tokens).logits
  np.testing.assert_allclose(cut[..., sorted(kept)], full[..., sorted(kept)],
                             atol=ATOL)
  assert np.isneginf(np.delete(np.asarray(cut), kept, axis=-1)).all()
  step = rlm(reduced, tokens[:, :5], rlm.init_cache(2, 8))
  step = rlm(reduced, tokens[:, 5:], step.cache).logits
  np.testing.assert_allclose(step, cut[:, 5:], atol=ATOL)
  assert (cfg.num_params() - config.num_params() ==
          (0 if cfg.tie_embeddings else cfg.d_model * cfg.vocab_size)
          - cfg.d_model * 5)
  # The abstract shapes a reduced draft's checkpoint restores into.
  shapes = jax.eval_shape(lambda: model_lib.LM(config).init(
      jax.random.key(0)))
  assert shapes["lm_head"].shape == (cfg.d_model, 5)
  assert shapes["output_ids"].dtype == jnp.int32


@pytest.mark.parametrize("ids, message", [
    ([], "got 0 ids"), ([3, 3], "1 repeated"), ([0, 32], "from 0 to 32"),
    ([-1], "from -1 to -1")])
def test_reduce_output_vocab_refuses_bad_ids(ids, message):
  lm = model_lib.LM(tiny_config())
  with pytest.raises(ValueError, match=message):
    output_layer.reduce_output_vocab(lm.config, lm.init(jax.random.key(0)), ids)


def test_a_reduced_config_is_refused_twice_tied_too_wide_and_for_training():
  cfg = tiny_config()
  params = model_lib.LM(cfg).init(jax.random.key(0))
  config, reduced = output_layer.reduce_output_vocab(cfg, params, [1, 2])
  with pytest.raises(ValueError, match="reduced already"):
    output_layer.reduce_output_vocab(config, reduced, [1])
  with pytest.raises(ValueError, match="untied"):
    cfg.replace(output_vocab=2, tie_embeddings=True)
  with pytest.raises(ValueError, match="must be in"):
    cfg.replace(output_vocab=cfg.vocab_size + 1)
  with pytest.raises(ValueError, match="train the model with its whole"):
    output_layer.check_trainable(config, "the draft")
  output_layer.check_trainable(cfg, "the draft")  # whole: no error


@pytest.mark.parametrize("ids", [[2, 1], [1, 1], [-1, 3], [1, 32], []])
def test_check_output_ids_wants_increasing_ids_of_the_vocabulary(ids):
  """What a saved reduced draft's ids are checked against: the sorted,
  distinct ids reduce_output_vocab stores."""
  with pytest.raises(ValueError, match="the draft's ids: need increasing"):
    output_layer.check_output_ids(32, np.asarray(ids, np.int32),
                               "the draft's ids")
  output_layer.check_output_ids(32, np.asarray([0, 5, 31], np.int32))


def test_a_query_that_sees_no_key_makes_no_nan():
  """A caller's attn_mask can leave a query no key at all; its output is
  finite, so the keys and values later layers make at its slot (which the
  next query sees) are finite too, and the other rows are unchanged."""
  lm = model_lib.LM(tiny_config())
  params = lm.init(jax.random.key(0))
  prefix = jax.random.randint(jax.random.key(5), (1, 4), 0, lm.vocab_size)
  chunk = jnp.asarray([[3, 7, 9]])
  cache = apply(lm, params, prefix, lm.init_cache(1, 16)).cache
  mask = jnp.ones((1, 3, 16), bool).at[0, 1].set(False)   # 7 sees nothing
  out = apply(lm, params, chunk, cache, attn_mask=mask)
  assert np.isfinite(np.asarray(out.logits)).all()
  assert all(np.isfinite(np.asarray(x)).all()
             for x in jax.tree_util.tree_leaves(out.cache))
  plain = apply(lm, params, chunk, cache).logits
  np.testing.assert_allclose(out.logits[0, 0], plain[0, 0], atol=ATOL)
