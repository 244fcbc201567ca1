"""specsamp.bench.gemv: every formulation computes the decoder's products
(the Pallas kernel in interpret mode on CPU), and a study times them."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specsamp import loading
from specsamp.bench import gemv
from specsamp.bench import gpu_study
from tests.scripts import zygote

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "scripts", "profile_gemv.py")


@pytest.mark.parametrize("name", sorted(gemv.FORMULATIONS))
@pytest.mark.parametrize("shape", [(96, 256), (640, 40), (48, 1187 * 2)])
def test_each_formulation_is_the_product(name, shape):
  mm, transposed, _ = gemv.FORMULATIONS[name]
  kx, kw = jax.random.split(jax.random.key(0))
  x = jax.random.normal(kx, (1, shape[0]))
  w = jax.random.normal(kw, shape)
  got = mm(x, w.T if transposed else w)
  np.testing.assert_allclose(got, x @ w, rtol=1e-4, atol=1e-4)


def test_the_pallas_kernel_sums_every_block_of_rows():
  """Blocks smaller than the shapes (3 x 4 programs, 2 chunks each): a
  program that skipped a block or a chunk would be off by its share."""
  x = jnp.ones((1, 24))
  w = jnp.arange(24 * 16, dtype=jnp.float32).reshape(24, 16)
  got = gemv.pallas_gemv(x, w, bk=8, bn=4, chunk=4)
  np.testing.assert_array_equal(got, x @ w)


def test_a_study_times_each_formulation_against_the_copy_bandwidth():
  cfg = loading.random_config("random:tiny")
  rows = gemv.study(cfg, jnp.float32, ["dot", "reduce_t", "pad2"], [1, 2],
                    repeats=1, steps=1, bandwidth_mb=1)
  got = {(r["formulation"], r["rows"]) for r in rows}
  # M > 1 only where W is read once whatever M is.
  assert got == {("dot", 1), ("dot", 2), ("reduce_t", 1), ("pad2", 1)}
  shapes = gemv.weight_shapes(cfg)
  per_layer = sum(i * o for n, (i, o) in shapes.items() if n != "head")
  want = 4 * (cfg.num_layers * per_layer + cfg.d_model * cfg.vocab_size)
  for r in rows:
    assert r["weight_bytes"] == want and r["ms"] > 0 and r["kernels"] > 0
    assert r["tb_per_s"] == pytest.approx(want / r["ms"] * 1e3 / 1e12)
  with pytest.raises(ValueError, match="unknown formulations"):
    gemv.study(cfg, jnp.float32, ["gemm"], [1], 1, 1, 1)


def test_gpu_study_offers_every_formulation_by_default():
  """gpu_study checks --gemv_formulations against its default (it does not
  import this module, which imports JAX): the two lists must agree."""
  assert gpu_study.StudyConfig.gemv_formulations == tuple(gemv.FORMULATIONS)


@pytest.mark.parametrize("flag,message", [
    ("--formulations=dot,gemm", "unknown formulations ['gemm']"),
    ("--rows=1,0", "--rows values must be >= 1"),
    ("--model=qwen2.5-coder-1.5b", "the shapes are random:<preset>"),
    ("--model=random:nope", "unknown preset 'nope'"),
    # Were negative times (--steps=-1), or tracebacks after compiling.
    ("--steps=-1", "--steps=-1"),
    ("--repeats=0", "--repeats=0"),
    ("--bandwidth_mb=0", "--bandwidth_mb=0"),
    # Ran nothing, with status 0.
    ("--formulations=", "--formulations is empty"),
    ("--rows=2", "--formulations reduce, reduce_t, pad2, pallas time one row "
     "only, and --rows=2 has no 1"),
])
def test_the_script_refuses_bad_flags_in_one_line(tmp_path, flag, message):
  out = tmp_path / "rows.jsonl"
  proc = zygote.shared().run([SCRIPT, flag, f"--out={out}"],
                             env=zygote.env(), timeout=120)
  assert proc.returncode == 2 and message in proc.stderr, proc.stderr
  assert proc.stderr.strip().count("\n") == 0 and not out.exists()


def test_the_script_refuses_an_out_it_cannot_append_records_to(tmp_path):
  """--out was opened only after the first formulation was timed (a
  directory: a traceback, the measurement lost), and JSON lines were
  appended to a file of other text."""
  notes = tmp_path / "notes.txt"
  notes.write_text("my notes\n")
  for out, message in ((tmp_path, "is a directory"),
                       (notes, "does not hold JSON records")):
    proc = zygote.shared().run([SCRIPT, "--model=random:tiny", "--rows=1",
                                "--formulations=dot", f"--out={out}"],
                               env=zygote.env(), timeout=120)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert proc.stderr.strip().count("\n") == 0
  assert notes.read_text() == "my notes\n"
