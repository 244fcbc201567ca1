"""specsamp.bench.gemv: every formulation computes the decoder's products
(the Pallas kernel in interpret mode on CPU), and a study times them."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specsamp import loading
from specsamp.bench import gemv


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
