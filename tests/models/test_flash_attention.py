"""Blockwise (flash) attention: exact against dense softmax attention, against transformers
through the whole model, and O(T) memory.

References: a dense softmax attention written here from the definition (float64, so the
blockwise rescaling must agree to rounding: observed <= 3e-15), transformers' logits
(float32, the parity tolerance of test_parity), and XLA's own memory analysis of the
compiled program (no [T, T]-sized buffer).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from guilibra_jax.models import get_rope_index, load_hf, prepare_vision_inputs
from guilibra_jax.models.attention import SegmentMask, cached_attention, cascade_attention, flash_attention
from guilibra_jax.models.text import K_LAYOUT, V_LAYOUT
from hf_fixtures import make_batch
from test_parity import CASES, P_BUCKET, REL_TOL, T_BUCKET, _torch_logits


def _dense(q, k, v, mask: SegmentMask, scale):
  """softmax(q k^T * scale + mask) v from the definition (GQA by repeating k / v)."""
  g = q.shape[2] // k.shape[2]
  k, v = jnp.repeat(k, g, axis=2), jnp.repeat(v, g, axis=2)
  s = jnp.einsum("bqnh,bsnh->bnqs", q, k) * scale
  s = jnp.where(mask.dense(), s, -jnp.inf)
  return jnp.einsum("bnqs,bsnh->bqnh", jax.nn.softmax(s, -1), v)


def _segments(rng, b, s):
  """Left padding (0), then two packed samples (1, 2) per row, at random cuts."""
  seg = np.zeros((b, s), np.int32)
  for r in range(b):
    a = rng.integers(0, s // 3)
    c = rng.integers(a, s)
    seg[r, a:] = 1
    seg[r, c:] = 2
  return seg


CASES_F64 = {  # (B, T, S, N, K, H, block, causal, q_offset)
    "causal_gqa_partial_tiles": (2, 37, 37, 4, 2, 8, 8, True, 0),
    "bidirectional": (2, 37, 37, 4, 4, 8, 16, False, 0),
    "queries_at_an_offset": (1, 20, 50, 6, 2, 8, 8, True, 30),   # prefill into a longer cache
    "one_kv_head": (2, 64, 64, 4, 1, 8, 16, True, 0),
}


@pytest.mark.parametrize("case", sorted(CASES_F64))
def test_flash_equals_dense_attention_and_its_gradient(case):
  b, t, s, n, kh, h, block, causal, off = CASES_F64[case]
  rng = np.random.default_rng(0)
  with jax.enable_x64():
    q = jnp.asarray(rng.normal(size=(b, t, n, h)))
    k, v = (jnp.asarray(rng.normal(size=(b, s, kh, h))) for _ in range(2))
    kseg = _segments(rng, b, s)
    qseg = jnp.asarray(kseg[:, off:off + t])
    mask = SegmentMask(qseg, jnp.asarray(kseg), jnp.asarray(off, jnp.int32), causal, block)
    w = jnp.asarray(rng.normal(size=(b, t, n, h)))
    ours = lambda q, k, v: flash_attention(q, k, v, mask.q_segment_ids, mask.kv_segment_ids, off,
                                           scale=0.3, causal=causal, block=block)
    dense = lambda q, k, v: _dense(q, k, v, mask, 0.3)
    assert ours(q, k, v).dtype == jnp.float64
    np.testing.assert_allclose(ours(q, k, v), dense(q, k, v), rtol=0, atol=1e-13)
    loss = lambda f: lambda *a: jnp.sum(f(*a) * w)
    got = jax.grad(loss(ours), (0, 1, 2))(q, k, v)
    want = jax.grad(loss(dense), (0, 1, 2))(q, k, v)
    for name, g_, w_ in zip("qkv", got, want):
      np.testing.assert_allclose(g_, w_, rtol=0, atol=1e-12, err_msg=f"d{name}")


@pytest.mark.parametrize("t, off, per_head", [(1, 40, False), (1, 0, True), (5, 20, False), (5, 20, True)])
def test_cached_attention_equals_dense_attention(t, off, per_head):
  """The KV cache's layouts (keys [B, K, H, S], values [B, K, S, H]): a decode step (T = 1)
  or a few queries at an offset, a SegmentMask or a per-head boolean mask [B, N, T, S]."""
  b, s, n, kh, h = 3, 50, 6, 2, 8
  rng = np.random.default_rng(1)
  with jax.enable_x64():
    q = jnp.asarray(rng.normal(size=(b, t, n, h)))
    k, v = (jnp.asarray(rng.normal(size=(b, s, kh, h))) for _ in range(2))
    kseg = _segments(rng, b, s)
    mask = SegmentMask(jnp.asarray(kseg[:, off:off + t]), jnp.asarray(kseg), jnp.asarray(off, jnp.int32), True)
    keep = np.broadcast_to(np.asarray(mask.dense()), (b, n, t, s)).copy()
    if per_head:   # drop a random tenth of the allowed keys, never a row's last one
      keep &= (rng.random(keep.shape) > 0.1) | (np.cumsum(keep[..., ::-1], -1)[..., ::-1] == 1)
      mask = jnp.asarray(keep)
    scores = jnp.einsum("bqnh,bsnh->bnqs", q, jnp.repeat(k, n // kh, 2), precision="highest") * 0.3
    probs = jax.nn.softmax(jnp.where(jnp.asarray(keep), scores, -jnp.inf), -1)
    want = jnp.einsum("bnqs,bsnh->bqnh", probs, jnp.repeat(v, n // kh, 2), precision="highest")
    got = cached_attention(q, jnp.transpose(k, K_LAYOUT), jnp.transpose(v, V_LAYOUT), mask, scale=0.3)
    assert got.shape == (b, t, n, h) and got.dtype == jnp.float64
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-13)


@pytest.mark.parametrize("t, per_head", [(1, False), (1, True), (3, False)])
def test_cascade_attention_equals_dense_attention_over_prompt_and_own_slots(t, per_head):
  """Rows p * c + j continuing prompt p: [the prompt's keys / values held once (some slots
  masked out, as left padding) | each row's own cache] equals dense attention over every row's
  [prompt | own] keys, in float64 (the own part: a causal SegmentMask at a per-call offset, or a
  per-head boolean mask)."""
  p, c, sp, s, n, kh, h = 3, 4, 17, 9, 6, 2, 8
  b, off = p * c, 4
  rng = np.random.default_rng(2)
  with jax.enable_x64():
    q = jnp.asarray(rng.normal(size=(b, t, n, h)))
    pk, pv = (jnp.asarray(rng.normal(size=(p, sp, kh, h))) for _ in range(2))
    k, v = (jnp.asarray(rng.normal(size=(b, s, kh, h))) for _ in range(2))
    pmask = rng.random((p, sp)) > 0.3
    pmask[:, -1] = True
    own_seg = np.zeros((b, s), np.int32)
    own_seg[:, :off + t] = 1
    mask = SegmentMask(jnp.asarray(own_seg[:, off:off + t]), jnp.asarray(own_seg), jnp.asarray(off, jnp.int32), True)
    keep = np.broadcast_to(np.asarray(mask.dense()), (b, n, t, s)).copy()
    if per_head:   # drop a random tenth of the allowed own keys, never a row's first one
      keep &= (rng.random(keep.shape) > 0.1) | (np.arange(s) == 0)
      mask = jnp.asarray(keep)
    full_keep = np.concatenate([np.broadcast_to(np.repeat(pmask, c, 0)[:, None, None], (b, n, t, sp)), keep], -1)
    full_k = jnp.concatenate([jnp.repeat(pk, c, 0), k], 1)
    full_v = jnp.concatenate([jnp.repeat(pv, c, 0), v], 1)
    scores = jnp.einsum("bqnh,bsnh->bnqs", q, jnp.repeat(full_k, n // kh, 2), precision="highest") * 0.3
    probs = jax.nn.softmax(jnp.where(jnp.asarray(full_keep), scores, -jnp.inf), -1)
    want = jnp.einsum("bnqs,bsnh->bqnh", probs, jnp.repeat(full_v, n // kh, 2), precision="highest")
    got = cascade_attention(q, jnp.transpose(k, K_LAYOUT), jnp.transpose(v, V_LAYOUT), mask,
                            jnp.transpose(pk, K_LAYOUT), jnp.transpose(pv, V_LAYOUT), jnp.asarray(pmask), scale=0.3)
    assert got.shape == (b, t, n, h) and got.dtype == jnp.float64
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-13)
    # the prompt part matters: attending to the own cache alone is far from it
    alone = cached_attention(q, jnp.transpose(k, K_LAYOUT), jnp.transpose(v, V_LAYOUT), mask, scale=0.3)
    assert float(jnp.max(jnp.abs(alone - want))) > 1e-2
    with pytest.raises(ValueError, match="multiple"):
      cascade_attention(q[:-1], jnp.transpose(k[:-1], K_LAYOUT), jnp.transpose(v[:-1], V_LAYOUT), mask,
                        jnp.transpose(pk, K_LAYOUT), jnp.transpose(pv, V_LAYOUT), jnp.asarray(pmask), scale=0.3)


def test_flash_bfloat16_is_as_close_to_float64_as_dense_bfloat16():
  """bf16 inputs: probabilities cast to bf16 for the value product, as fused kernels do;
  the error against float64 stays that of XLA's dense bf16 attention (factor 2)."""
  b, t, n, kh, h = 2, 96, 4, 2, 16
  rng = np.random.default_rng(3)
  q64, k64, v64 = (rng.normal(size=(b, t, x, h)) for x in (n, kh, kh))
  seg = _segments(rng, b, t)
  mask = SegmentMask(jnp.asarray(seg), jnp.asarray(seg), jnp.asarray(0, jnp.int32), True, 32)
  with jax.enable_x64():
    ref = np.asarray(_dense(*(jnp.asarray(x) for x in (q64, k64, v64)), mask, 0.25))
  q, k, v = (jnp.asarray(x, jnp.bfloat16) for x in (q64, k64, v64))
  ours = flash_attention(q, k, v, mask.q_segment_ids, mask.kv_segment_ids, 0, scale=0.25, block=32)
  theirs = jax.nn.dot_product_attention(q, k, v, mask=mask.dense(), scale=0.25)
  assert ours.dtype == jnp.bfloat16
  err = lambda x: np.abs(np.asarray(x, np.float64) - ref).max()
  assert 0 < err(ours) <= 2 * err(theirs), (err(ours), err(theirs))


@pytest.fixture(scope="module")
def small_blocks(hf_dirs):
  """family -> our model loaded with 8-token attention tiles: every text sequence (32 tokens)
  and vision slot of these cases runs the blockwise path."""
  return {family: load_hf(path, attention_block=8)[0] for family, (_, path) in hf_dirs.items()}


@pytest.mark.parametrize("case", ["mixed_rows", "batch_left_padding", "text_batch_left_padding"])
@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_blockwise_model_logits_match_transformers(loaded, small_blocks, family, case):
  hf, _, config, _ = loaded[family]
  model = small_blocks[family]
  ids, mask, mm, grid, pix = make_batch(CASES[case], pad_to=T_BUCKET)
  positions, _ = get_rope_index(ids, mask, grid, config)
  ref = _torch_logits(hf, ids, mask, mm, grid, pix, positions)
  pixels, vision = None, None
  if grid is not None:
    pixels = jnp.asarray(np.pad(pix, ((0, P_BUCKET - pix.shape[0]), (0, 0))))
    vision = prepare_vision_inputs(grid, config, num_patches=P_BUCKET)
  got = np.asarray(nnx.jit(lambda m, *a: m(*a))(model, jnp.asarray(ids, jnp.int32), jnp.asarray(positions),
                                                 jnp.asarray(mask, jnp.int32), pixels, vision))
  real = mask.astype(bool)
  err = np.abs(got - ref)[real].max()
  assert err <= REL_TOL * np.abs(ref[real]).max(), (family, case, err)


def test_prefill_and_decode_with_tiles_equal_the_dense_ones(loaded, small_blocks):
  """Prefill of a 32-token prompt into a 40-slot cache (blockwise, 8-token tiles) and three
  greedy decode steps give the logits of the dense model."""
  _, dense_model, config, _ = loaded["qwen2_5_vl"]
  tiled = small_blocks["qwen2_5_vl"]
  ids, mask, _, _, _ = make_batch(CASES["text_batch_left_padding"], pad_to=T_BUCKET)
  positions, _ = get_rope_index(ids, mask, None, config)
  outs = []
  for model in (dense_model, tiled):     # a jitted function per model (each traces its own tiles)
    prefill = nnx.jit(lambda m, *a: m.prefill(*a, cache_size=40))
    decode = nnx.jit(lambda m, *a: m.decode_step(*a))
    logits, cache = prefill(model, jnp.asarray(ids, jnp.int32), jnp.asarray(positions), jnp.asarray(mask, jnp.int32))
    steps = [logits]
    pos = jnp.asarray(positions)[:, :, -1]
    for _ in range(3):
      pos = pos + 1
      logits, cache = decode(model, jnp.argmax(logits, -1).astype(jnp.int32), pos, cache)
      steps.append(logits)
    outs.append(np.stack(steps))
  np.testing.assert_allclose(outs[1], outs[0], rtol=0, atol=1e-5 * np.abs(outs[0]).max())


@pytest.mark.parametrize("layers", [1, 2])
def test_compiled_memory_is_linear_in_sequence_length(layers):
  """XLA's memory analysis of attention + its gradient at T = 4096: the blockwise program's
  temporaries are far below one [N, T, T] float32 score array (what the dense one needs).
  layers=2: attention in a scanned layer stack (as scan_layers runs it), where JAX once
  hoisted the tile masks, equal in every layer, out of the loop as [nq, nk] stacks of tiles
  (3.6 GB here before attention.py tied them to the activations)."""
  b, t, n, kh, h, block = 1, 4096, 4, 2, 32, 256
  x = jax.ShapeDtypeStruct((b, t, n, h), jnp.float32)
  kv = jax.ShapeDtypeStruct((b, t, kh, h), jnp.float32)
  seg = jax.ShapeDtypeStruct((b, t), jnp.int32)

  def grad_of(attend):
    def stack(q, k, v, s):
      one = lambda x, _: (attend(x, k, v, s), None)
      return jax.lax.scan(one, q, None, length=layers)[0]
    return jax.jit(jax.grad(lambda q, k, v, s: jnp.sum(stack(q, k, v, s) ** 2), (0, 1, 2)))

  flash = grad_of(lambda q, k, v, s: flash_attention(q, k, v, s, s, 0, block=block))
  dense = grad_of(lambda q, k, v, s: _dense(q, k, v, SegmentMask(s, s, jnp.zeros((), jnp.int32)), h ** -0.5))
  scores = b * n * t * t * 4
  temp = lambda f: f.lower(x, kv, kv, seg).compile().memory_analysis().temp_size_in_bytes
  assert temp(dense) >= scores                      # the dense program does hold [N, T, T]
  assert temp(flash) < scores / 8, (temp(flash), scores)
