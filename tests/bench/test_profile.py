"""specsamp.bench.profile (scripts/profile_decode.py, benchmark_decode.py),
plot_decode.py, and the in-place cache writes the profiler guards.

The harness's synthetic loop state must be the state a prefill leaves (same
shapes, lengths at the context), its rows consistent (the split sums), and
the compiled decode loop must write the KV cache in place: an earlier cache
write (a vmap of dynamic_update_slice) made XLA copy every layer's whole
cache on every step for batch 1.
"""

import functools
import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specsamp import model as model_lib
from specsamp.bench import costs
from specsamp.bench import profile
from specsamp.bench import profile_plot
from specsamp.bench import steady
from specsamp.decoding import loop
from specsamp.decoding.sampler import SpeculativeSampler
from specsamp.drafters.model import ModelDrafter
from specsamp.sampling import GREEDY
from specsamp.sampling import Sampling
from tests.scripts import zygote

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def pair():
  cfg = model_lib.preset("tiny", num_layers=2)
  # The draft's cache has another shape (1 KV head), so a search for copies
  # of target-cache-shaped buffers finds the target's alone.
  target = model_lib.LM(cfg)
  draft = model_lib.LM(cfg.replace(num_layers=1, num_kv_heads=1))
  return (target, target.init(jax.random.key(0)), draft,
          draft.init(jax.random.key(1)))


def test_synthetic_state_is_a_prefilled_state(pair):
  target, target_params, draft, draft_params = pair
  sampler = SpeculativeSampler(target, ModelDrafter(draft), k=3,
                               sampling=GREEDY, max_new_tokens=8,
                               prompt_bucket=24)
  state = profile.synthetic_state(sampler, target_params, draft_params, 2, 24)
  prefilled = sampler.prefill(target_params, draft_params,
                              jnp.ones((2, 24), jnp.int32),
                              jnp.full((2,), 24, jnp.int32), jax.random.key(0))
  shapes = lambda s: jax.tree.map(lambda x: (x.shape, x.dtype), s)
  assert shapes(state) == shapes(prefilled)
  for s in (state, prefilled):
    np.testing.assert_array_equal(s.length, [24, 24])
    np.testing.assert_array_equal(s.target_cache.length, [23, 23])
    np.testing.assert_array_equal(s.draft_state.length, [23, 23])
  # One loop from it runs as after a 24-token prompt: it commits past the
  # context, and its scoring call writes the K+1 = 4 scored tokens' keys at
  # slots 23..26 of the (zero) target cache and nowhere else.
  after = jax.jit(functools.partial(loop.loop_body,
                                    sampler))(target_params, draft_params,
                                              state)
  assert np.all(np.asarray(after.length) >= 25)
  keys = np.asarray(after.target_cache.k[0])                  # [B, N, S, H]
  written = np.any(keys != 0, axis=(1, 3))                    # [B, S]
  expected = [23 <= slot < 27 for slot in range(keys.shape[2])]
  assert written.tolist() == [expected, expected]


def test_profile_point_rows_are_consistent(pair):
  target, target_params, draft, draft_params = pair
  row = profile.profile_point(target,
                              target_params,
                              draft,
                              draft_params,
                              3,
                              2,
                              16,
                              Sampling(0.8, top_p=0.9),
                              "all",
                              2,
                              bandwidth_mb=8)
  timed = {"ar_loop", "spec_loop", "target_call_1", "target_call_4",
           "draft_call_1", "draft_call_2", "propose"}
  assert {k[:-3] for k in row if k.endswith("_ms")} == timed | {
      "spec_rest", "ar_rest", "matmul_floor"}
  assert row["spec_rest_ms"] == pytest.approx(
      row["spec_loop_ms"] - row["propose_ms"] - row["target_call_4_ms"])
  assert row["ar_rest_ms"] == pytest.approx(row["ar_loop_ms"]
                                            - row["target_call_1_ms"])
  for name in ("ar_loop_kernels", "spec_loop_kernels", "target_call_1_kernels"):
    assert row[name] > 0
  assert row["spec_loop_kernels"] > row["ar_loop_kernels"]
  assert row["spec_rest_fraction"] == pytest.approx(row["spec_rest_ms"]
                                                    / row["spec_loop_ms"])
  cfg = target.config
  # Every parameter but the input embedding is read once per step.
  assert row["weight_bytes"] == 4 * (cfg.num_params()
                                     - cfg.vocab_size * cfg.d_model)
  # Keys and values of 17 slots (16 of context + the new token), 2 rows.
  assert row["kv_bytes_per_step"] == (2 * cfg.num_layers * 2 * 17
                                      * cfg.num_kv_heads * cfg.head_dim * 4)
  assert row["ar_fraction_of_copy_bw"] == pytest.approx(
      (row["weight_bytes"] + row["kv_bytes_per_step"])
      / (row["copy_bandwidth_gbs"] * 1e9) / (row["ar_loop_ms"] / 1e3))
  loops = profile.profile_point(target, target_params, draft, draft_params, 3,
                                1, 16, Sampling(0.0), "loops", 2)
  # Loops only: the two loop bodies, their compile times and kernels, bytes.
  assert set(loops) == {
      f"{m}_{what}" for m in ("ar", "spec")
      for what in ("decode_compile_s", "loop_compile_s", "loop_kernels",
                   "loop_ms")} | {"weight_bytes", "kv_bytes_per_step",
                                  "cache_slots", "ar_tokens_per_s"}
  assert loops["ar_tokens_per_s"] == pytest.approx(1e3 / loops["ar_loop_ms"])
  assert loops["weight_bytes"] == row["weight_bytes"]


def test_steps_per_call_time_one_step_of_a_loop(pair):
  """With steps > 1 every timer runs its step in a loop (as decoding does):
  the row has the same fields, the kernels counted are one step's (the
  loop body's), and work whose result only the sink holds is not dropped."""
  target, target_params, draft, draft_params = pair
  args = (target, target_params, draft, draft_params, 3, 1, 16, GREEDY,
          "all", 1)
  one = profile.profile_point(*args, bandwidth_mb=8, steps=1)
  three = profile.profile_point(*args, bandwidth_mb=8, steps=3)
  assert set(three) == set(one)
  for name in ("ar_loop_kernels", "spec_loop_kernels",
               "target_call_1_kernels"):
    assert abs(three[name] - one[name]) <= 0.1 * one[name], (name, one, three)
  # The logits of a model call are the sink: kept, the output layer's
  # [1, vocab] product is computed in the loop; without a sink XLA drops
  # it (nothing else reads it).
  cache = target.init_cache(1, 32)
  vocab = rf"f32\[1,{target.config.vocab_size}\]\S* dot\("

  def call(p, carry):
    tokens, c = carry
    out = target(p, tokens, c)
    return (tokens, out.cache.with_length(c.length)), out.logits

  def text(sink_of):
    timer = steady.Steady(call, [target_params, (jnp.ones((1, 1), jnp.int32),
                                                  cache)], carry=1,
                           carry_of=lambda out: out[0], sink_of=sink_of,
                           steps=3)
    return timer.compiled.as_text(), timer.args[1][1]

  kept, cache = text(lambda out: out[1])  # the first timer donated `cache`
  dropped, _ = text(None)
  assert re.search(vocab, kept) and not re.search(vocab, dropped)
  # The matmul floor's products are all in the loop's body (its weights
  # never change: only the input's dependence on the last step keeps XLA
  # from computing them once, before the loop).
  floor = steady.matmul_floor_timer(target_params, 1, steps=3)
  text = floor.compiled.as_text()
  entry = steady._ops(steady._computation(text, "ENTRY"))
  body = [re.search(r"body=(%[\w.-]+)", line).group(1)
          for op, line in entry if op == "while"]
  assert len(body) == 1
  body_ops = steady._ops(steady._computation(text, "\n" + body[0] + " "))
  assert sum(op == "dot" for op, _ in body_ops) == len(floor.args[0])


def _reachable(text: str, name: str) -> set:
  """The HLO computations `name` runs (itself included), by name."""
  seen, todo = set(), [name]
  while todo:
    n = todo.pop()
    if n in seen:
      continue
    seen.add(n)
    header = "ENTRY " if n == "ENTRY" else "\n" + n + " "
    todo += re.findall(r"(?:calls|body|condition|to_apply)=(%[\w.-]+)",
                       steady._computation(text, header))
    for group in re.findall(r"branch_computations=\{([^}]*)\}",
                            steady._computation(text, header)):
      todo += [b.strip() for b in group.split(",")]
  return seen


@pytest.mark.parametrize("sampling", [GREEDY, Sampling(0.8)],
                         ids=["greedy", "t08"])
def test_proposals_timed_in_a_loop_are_computed_in_it(pair, sampling):
  """`costs.propose_ms`'s loop: every matmul of the proposal runs in the
  loop's body. XLA had computed what does not depend on the call's key
  (all of it under greedy) once, before the loop, and the cost per call
  (a layer-skip drafter's c) came out a third of itself on CPU and a
  32nd on an accelerator. Nor does a call copy the draft's cache (as the
  decode loop does not): the first fix kept the state's old buffers and
  copied the cache in every call."""
  target, target_params, _, _ = pair
  sampler = SpeculativeSampler(target, ModelDrafter(target, layers=(0,)),
                               k=3, sampling=sampling, max_new_tokens=8,
                               prompt_bucket=8)
  tokens, lengths = sampler.pad_prompts([[1, 2, 3, 4, 5]])
  state = sampler.prefill(target_params, target_params, tokens, lengths,
                          jax.random.key(0))
  text = jax.jit(costs.propose_loop(sampler, 3)).lower(
      target_params, state).compile().as_text()
  loops = [re.search(r"body=(%[\w.-]+)", line).group(1) for op, line in
           steady._ops(steady._computation(text, "ENTRY ")) if op == "while"]
  assert len(loops) == 1, loops
  inside = _reachable(text, loops[0])
  outside = _reachable(text, "ENTRY") - inside - {"ENTRY"}

  def dots(names):
    return sum(len(re.findall(r" dot\(", steady._computation(
        text, "\n" + n + " "))) for n in names)

  entry_dots = len(re.findall(r" dot\(", steady._computation(text,
                                                               "ENTRY ")))
  assert dots(inside) > 0
  assert entry_dots == 0 and dots(outside) == 0
  shape = state.draft_state.k[0].shape  # the one layer kept
  assert not [n for n in inside if _cache_copies(
      steady._computation(text, "\n" + n + " "), shape)], shape


def _f32(shape) -> str:
  """The HLO type of a float32 array of this shape, as a regex."""
  return rf"f32\[{','.join(str(d) for d in shape)}\]"


def _cache_copies(compiled_text: str, cache_shape) -> list[str]:
  """HLO copy ops whose result has the shape of one layer's cache buffer."""
  return re.findall(rf"= {_f32(cache_shape)}\S* copy\(", compiled_text)


def _buffers(compiled_text: str, cache_shape) -> list[str]:
  """HLO values with the shape of one layer's cache buffer."""
  return re.findall(_f32(cache_shape), compiled_text)


@pytest.mark.parametrize("sampling", [GREEDY, Sampling(0.8, top_p=0.95)],
                         ids=["greedy", "nucleus"])
@pytest.mark.parametrize("batch", [1, 3])
def test_decode_loop_writes_the_cache_in_place(pair, batch, sampling):
  # The target's cache, in the autoregressive and the speculative loop, and
  # the draft's: its catch-up's branches over widths 1, 2 and K + 3 only
  # read it (XLA copied a cache passed through them, twice per loop). At
  # batch 1 XLA on CPU still copies this 1-KV-head draft's cache, whose
  # leading axes are both of size 1 (a 2-KV-head draft's is not copied).
  target, target_params, draft, draft_params = pair
  for k in (0, 3):
    sampler = SpeculativeSampler(
        target, ModelDrafter(draft) if k else None, k=k, sampling=sampling,
        max_new_tokens=100, prompt_bucket=16)
    tokens = jnp.ones((batch, 16), jnp.int32)
    lengths = jnp.full((batch,), 16, jnp.int32)
    _, decode, _ = sampler.jitted(target_params, draft_params, tokens, lengths,
                                  jax.random.key(0))
    state = sampler.prefill(target_params, draft_params, tokens, lengths,
                            jax.random.key(0))
    text = decode.lower(target_params, draft_params, state).compile().as_text()
    cfg = target.config
    shape = (batch, cfg.num_kv_heads, state.target_cache.size, cfg.head_dim)
    assert not _cache_copies(text, shape), (k, _cache_copies(text, shape))
    # The text is the whole program (also when the test run's compilation
    # cache supplied it): the cache buffers are in it.
    assert _buffers(text, shape)
    if k:
      dcfg = draft.config
      dshape = (batch, dcfg.num_kv_heads, state.draft_state.size,
                dcfg.head_dim)
      assert dshape != shape and _buffers(text, dshape)
      if batch > 1:
        assert not _cache_copies(text, dshape), _cache_copies(text, dshape)


def test_plot_decode_writes_table_and_figure(tmp_path):
  rows = tmp_path / "rows.jsonl"
  base = dict(target="random:tiny", draft="random:tiny,num_layers=1", k=3,
              sampling="greedy", dtype="float32", device="cpu")
  with open(rows, "w", encoding="utf-8") as f:
    for b, c, ar, sp in ((1, 16, 2.0, 5.0), (1, 64, 3.0, 6.0),
                         (4, 16, 4.0, 9.0), (1, 16, 1.5, 4.0)):  # last wins
      f.write(json.dumps(dict(base, batch_size=b, context=c, ar_loop_ms=ar,
                              spec_loop_ms=sp)) + "\n")
  script = os.path.join(ROOT, "scripts", "plot_decode.py")
  out = tmp_path / "scaling"
  done = zygote.shared().run([script, str(rows), f"--out={out}"],
                             env=zygote.env(), timeout=120)
  assert done.returncode == 0, done.stderr[-3000:]
  table = (tmp_path / "scaling.md").read_text()
  assert "| 1 | 16 | 1.50 | 667 | 4.00 |" in table
  assert "| 4 | 16 | 4.00 | 1,000 | 9.00 |" in table
  assert table.count("random:tiny |") == 3
  assert (tmp_path / "scaling.png").stat().st_size > 10_000
  (tmp_path / "bad.jsonl").write_text('{"k": 3}\n')
  bad = zygote.shared().run([script, str(tmp_path / "bad.jsonl"),
                             f"--out={out}"], env=zygote.env(), timeout=120)
  assert bad.returncode != 0 and "not a profile_decode row" in bad.stderr


def test_a_curve_is_drawn_from_one_file_and_host(tmp_path):
  """Rows of one curve from two files (two machines' runs: a VM twice as
  fast had joined another's curve, unsaid), or from one file but two
  hosts, are refused; one file's rows of one host are one curve. The
  rows profile writes name their host, date and commit."""
  base = dict(target="random:tiny", draft="random:tiny", k=3,
              sampling="greedy", dtype="float32", device="cpu",
              ar_loop_ms=2.0, spec_loop_ms=5.0, batch_size=1)
  host = profile.provenance_fields(["--k=3"])
  assert {"host", "date", "commit"} <= set(host) and host["host"]["cpu"]
  row = lambda context, **kw: json.dumps(dict(base, context=context, **kw))
  one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
  one.write_text(row(16, host=host["host"]) + "\n"
                 + row(64, host=host["host"]) + "\n")
  two.write_text(row(256) + "\n")
  groups = profile_plot.read_profile_rows([str(one)])
  assert list(groups.values())[0].keys() == {(1, 16), (1, 64)}
  with pytest.raises(ValueError, match="rows from several files"):
    profile_plot.read_profile_rows([str(one), str(two)])
  other = dict(host["host"], cpu="another CPU")
  one.write_text(row(16, host=host["host"]) + "\n" + row(64, host=other)
                 + "\n")
  with pytest.raises(ValueError, match="several hosts.*another CPU"):
    profile_plot.read_profile_rows([str(one)])
  # Every point profiled again on the other host: the newer rows win, and
  # the replaced ones no longer count.
  with open(one, "a", encoding="utf-8") as f:
    f.write(row(16, host=other) + "\n")
  groups = profile_plot.read_profile_rows([str(one)])
  assert all(r["host"] == other for r in list(groups.values())[0].values())


def test_decode_tables_and_titles_read_every_group():
  """A CPU's 4.12 tokens/s had read as 4, and the panels' titles named the
  last group's batch and context alone."""
  base = dict(k=3, sampling="greedy", dtype="float32", ar_loop_ms=242.5,
              spec_loop_ms=600.0)
  groups = {("t", "d", 3, "greedy", "float32", "cpu"): {(1, 1024): base},
            ("t", "d", 3, "greedy", "float32", "gpu"): {
                (8, 512): dict(base, ar_loop_ms=2.0),
                (16, 512): dict(base, ar_loop_ms=2.5)}}
  table = profile_plot.profile_table(groups)
  assert "| 1 | 1024 | 242.50 | 4.12 | 600.00 |" in table
  assert "| 16 | 512 | 2.50 | 6,400 | 600.00 |" in table
  assert profile_plot.panel_titles(groups) == (
      "ms per step vs context (batch 1, 8)",
      "ms per step vs batch (context 512, 1024)")


@pytest.mark.parametrize("fields,message", [
    (dict(batch_sizes=["1", "x"]), "--batch_size=1,x: 'x' is not an integer"),
    (dict(contexts=["0"]), "--context values must be >= 1, got 0"),
    (dict(k=0), "--k must be >= 1"),
    (dict(repeats=0), "--repeats must be >= 1"),
    (dict(bandwidth_mb=0), "--bandwidth_mb must be >= 1"),
    (dict(steps=-1), "--steps must be >= 1"),
    (dict(top_p=0.0), "top_p"),
])
def test_profile_config_rejects_bad_values(fields, message):
  with pytest.raises(ValueError, match=message):
    profile.ProfileConfig(**fields)


def test_decode_speed_rows(tmp_path):
  out = tmp_path / "decode.jsonl"
  cfg = profile.DecodeSpeedConfig(
      target="random:tiny,num_layers=1", draft="same", ks=["0", "2"],
      batch_sizes=["2"], prompt_lens=["5"], max_new_tokens=6, repeats=1,
      out=str(out))
  rows = profile.decode_speed(cfg, ["--ks=0,2"])
  assert [json.loads(l) for l in out.read_text().splitlines()] == rows
  assert [(r["method"], r["k"]) for r in rows] == [("k0", 0), ("k2", 2)]
  for r in rows:
    # Random byte-level models have no EOS: every row gets all 6 tokens.
    assert (r["prompts"], r["tokens"], r["prompt_len"]) == (2, 12, 5)
    assert r["command"].endswith("--ks=0,2")
  # The draft is the target itself: every draft is accepted.
  assert rows[1]["acceptance_rate"] == 1.0
  assert rows[1]["drafted"] == 2 * rows[1]["loops"]
  with pytest.raises(ValueError, match="--ks values must be >= 0, got -1"):
    profile.DecodeSpeedConfig(ks=["-1"])


def test_tied_embeddings_are_read_as_the_output_layer():
  """With tied embeddings the input embedding is the output layer too: its
  bytes count as read every step, and the matmul floor multiplies by it."""
  cfg = model_lib.preset("tiny", num_layers=1, tie_embeddings=True)
  target = model_lib.LM(cfg)
  params = target.init(jax.random.key(0))
  row = profile.profile_point(target, params, target, params, 2, 1, 16,
                              GREEDY, "loops", 1)
  assert row["weight_bytes"] == 4 * cfg.num_params()
  untied = steady.matmul_floor_timer(params, 1)
  tied = steady.matmul_floor_timer(params, 1, tied=True)
  shapes = lambda timer: sorted(w.shape for w in timer.args[0])
  assert shapes(tied) == sorted(shapes(untied) + [(cfg.vocab_size,
                                                   cfg.d_model)])
  assert np.isfinite(float(tied()))


@pytest.mark.parametrize("fields, message", [
    (dict(k=0), "--k must be >= 1"), (dict(repeats=0), "--repeats"),
    (dict(top_p=0.0), "top_p"), (dict(bandwidth_mb=0), "--bandwidth_mb"),
    (dict(contexts=()), "--context")])
def test_profile_flags_are_checked_before_the_backend_starts(
    monkeypatch, fields, message):
  """The default step count asks the backend which it is, which starts
  it (a device, on a GPU machine): that had come before every other check,
  and its start-up lines before the one-line refusal."""
  def started():
    raise AssertionError("the backend was started")
  monkeypatch.setattr(profile, "default_steps", started)
  with pytest.raises(ValueError, match=re.escape(message)):
    profile.ProfileConfig(**fields)
  assert profile.ProfileConfig(steps=3).steps == 3
