"""Chunked position-wise MLPs (model.mlp_chunk, layers.position_wise): the same values and
gradients as the whole-row MLP, through the whole model (both families, scanned and
rematerialised as the recipes run it), and bounded memory at long rows (XLA's memory
analysis of the compiled program).

Tolerances: chunks sum the weight gradients over rows in another order (and XLA may pick
other kernels for other shapes), so the two differ by float32 rounding, whose size
follows from the number of terms summed and their magnitude (tests/float_tolerance.py),
not from one machine's run."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from guilibra_jax import models as M
from guilibra_jax.models.layers import position_wise
from guilibra_jax.train import fake_batch as F
from tests.float_tolerance import assert_f32_close


def _mlp(d, i, seed=0):
  k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
  w1 = jax.random.normal(k1, (d, i)) / np.sqrt(d)
  w2 = jax.random.normal(k2, (i, d)) / np.sqrt(i)
  return lambda w, x: jax.nn.silu(x @ w[0]) @ w[1], (w1, w2)


@pytest.mark.parametrize("shape,chunk,rows", [((2, 37, 8), 8, None),      # padding: 37 = 4 x 8 + 5
                                               ((3, 64, 8), 16, None),
                                               ((6, 16, 8), 24, 2)])      # a windowed view: 2 slots of 48
def test_chunks_equal_the_whole_rows_and_their_gradient(shape, chunk, rows):
  d, i = shape[-1], 32
  fn, w = _mlp(d, i)
  x = jax.random.normal(jax.random.PRNGKey(1), shape)
  whole = lambda w, x: jnp.sum(jnp.sin(fn(w, x)))
  parts = lambda w, x: jnp.sum(jnp.sin(position_wise(lambda y: fn(w, y), x, chunk, rows)))
  # a value sums d + i products; a weight gradient sums them over every row too
  assert_f32_close(position_wise(lambda y: fn(w, y), x, chunk, rows), fn(w, x), n_terms=d + i)
  n_rows = int(np.prod(shape[:-1]))
  (gw_parts, gx_parts), (gw_whole, gx_whole) = jax.grad(parts, (0, 1))(w, x), jax.grad(whole, (0, 1))(w, x)
  for u, v in zip(gw_parts, gw_whole):
    assert_f32_close(u, v, n_terms=n_rows + d + i, err_msg="weight gradient")
  assert_f32_close(gx_parts, gx_whole, n_terms=d + i, err_msg="input gradient")


def test_no_chunking_when_rows_are_short():
  fn, w = _mlp(8, 16)
  x = jnp.ones((2, 8, 8))
  jaxpr = str(jax.make_jaxpr(lambda x: position_wise(lambda y: fn(w, y), x, 8))(x))
  assert "scan" not in jaxpr and "while" not in jaxpr


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_model_with_chunked_mlps_equals_the_whole_row_model(family):
  cfg = F.tiny_config(family)
  hw = (56, 84) if family == "qwen2_5_vl" else (64, 96)
  b = F.fake_sft_batch(cfg, batch=2, seq_len=48, image_hw=hw, seed=4)
  kw = dict(remat="full", scan_layers=True)
  whole, chunked = M.QwenVL(cfg, rngs=nnx.Rngs(0), **kw), M.QwenVL(cfg, rngs=nnx.Rngs(0), mlp_chunk=16, **kw)
  args = [jnp.asarray(b[k]) for k in ("input_ids", "positions", "segment_ids", "pixel_values")] + [b["vision"]]

  def value_and_grad(model):
    gdef, params = nnx.split(model)
    loss = lambda p: jnp.mean(jax.nn.log_softmax(nnx.merge(gdef, p)(*args))[..., 3])
    return jax.jit(jax.value_and_grad(loss))(params)

  (l0, g0), (l1, g1) = value_and_grad(whole), value_and_grad(chunked)
  # every gradient sums over the 2 x 48 positions (and the image patches) after matmuls of
  # the hidden and intermediate widths
  n = 2 * 48 + int(np.asarray(b["pixel_values"]).shape[0]) + cfg.text.hidden_size + cfg.text.intermediate_size
  assert_f32_close(float(l1), float(l0), n_terms=n)
  for (path, a), c in zip(jax.tree_util.tree_leaves_with_path(g1), jax.tree.leaves(g0)):
    assert_f32_close(a, c, n_terms=n, err_msg=jax.tree_util.keystr(path))


def test_compiled_mlp_memory_is_bounded_by_the_chunk():
  """Value and gradient of a rematerialised MLP over one 8,192-position row with a 4,096-wide
  intermediate: whole rows hold several [T, I] float32 buffers (128 MB each); chunks of 512
  hold them per chunk."""
  t, d, i = 8192, 256, 4096
  fn, w = _mlp(d, i)
  x = jax.ShapeDtypeStruct((1, t, d), jnp.float32)

  def temp(chunk):
    loss = lambda w, x: jnp.sum(position_wise(lambda y: fn(w, y), x, chunk) ** 2)
    step = jax.jit(jax.grad(jax.checkpoint(loss), (0, 1)))
    return step.lower(w, x).compile().memory_analysis().temp_size_in_bytes

  row = t * i * 4
  whole, chunked = temp(0), temp(512)
  assert whole >= 2 * row                            # measured: 5.0 row-sized buffers
  assert chunked < row and chunked < whole / 4, (chunked, whole, row)   # measured: 0.51 of one
