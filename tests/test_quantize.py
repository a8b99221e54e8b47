"""Blockwise int8 / nf4 quantization of frozen kernels (QLoRA's base, ``model.quantize``):

- the error of every entry is within the stated bound of its block's absolute maximum;
- nf4 picks the nearest of QLoRA's 16 levels (checked against a brute-force argmin over all
  16 distances, not the midpoint search the module uses), and values on a level come back
  exactly; int8 codes are round(127 w / s);
- the packing: two codes per byte, the even entry in the low nibble;
- merge over a quantized base equals merge over the dequantized base, and the adapters'
  gradient through it is the plain LoRA gradient on the dequantized base.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from guilibra_jax import lora as L
from guilibra_jax import quantize as Q


def _blocks(x, block):
    x = np.asarray(x, np.float64)
    return x.reshape(*x.shape[:-1], x.shape[-1] // block, block)


@pytest.mark.parametrize("kind", Q.KINDS)
@pytest.mark.parametrize("shape", [(3, 128), (2, 4, 32), (5, 96)])
def test_error_is_within_the_bound_of_each_blocks_absmax(kind, shape):
    w = jax.random.normal(jax.random.key(1), shape) * jnp.linspace(0.1, 3.0, shape[-1])
    q = Q.quantize(w, kind)
    assert q.block == np.gcd(64, shape[-1]) and q.scales.shape == shape[:-1] + (shape[-1] // q.block,)
    s = np.abs(_blocks(w, q.block)).max(-1, keepdims=True)
    err = np.abs(_blocks(Q.dequantize(q), q.block) - _blocks(w, q.block)) / s
    assert err.max() <= Q.MAX_ERROR[kind] + 1e-6
    assert Q.dequantize(q).dtype == w.dtype and Q.dequantize(q).shape == shape


def test_nf4_is_the_nearest_level_and_levels_come_back_exactly():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(6, 64)).astype(np.float32)
    q = Q.quantize(jnp.asarray(w), "nf4")
    u = w / np.abs(w).max(-1, keepdims=True)
    want = np.argmin(np.abs(u[..., None] - Q.NF4[None, None, :]), axis=-1)     # brute force over 16 levels
    codes = np.asarray(q.codes)
    got = np.stack([codes & 0xF, codes >> 4], -1).reshape(6, 64)
    np.testing.assert_array_equal(got, want)
    on_levels = (Q.NF4[rng.integers(0, 16, size=(4, 64))] * 2.5).astype(np.float32)
    on_levels[:, 0] = 2.5                                                    # the block's max is a level: s = 2.5
    np.testing.assert_array_equal(np.asarray(Q.dequantize(Q.quantize(jnp.asarray(on_levels), "nf4"))), on_levels)


def test_int8_codes_and_packing_layout():
    w = jnp.asarray([[1.0, -0.5, 0.25, 0.0] * 16], jnp.float32)
    q = Q.quantize(w, "int8")
    np.testing.assert_array_equal(np.asarray(q.codes)[0, :4], [127, -64, 32, 0])   # round(127 * w / 1); -63.5 -> -64
    q4 = Q.quantize(w, "nf4")
    assert q4.codes.shape == (1, 32) and q4.codes.dtype == jnp.uint8
    assert int(q4.codes[0, 0]) == 15 | (2 << 4)     # 1.0 -> level 15 (low nibble), -0.5 -> level 2 (-0.525)
    assert int(q4.codes[0, 1]) == 10 | (7 << 4)     # 0.25 -> level 10 (0.246), 0.0 -> level 7


def _params():
    k = jax.random.split(jax.random.key(0), 3)
    return {"language_model": {"layers": {"0": {"self_attn": {"q_proj": {"kernel": jax.random.normal(k[0], (32, 4, 16))},
                                                              "o_proj": {"kernel": jax.random.normal(k[1], (4, 16, 32))}},
                                              "input_layernorm": {"scale": jnp.ones(32)}}}},
            "embed": {"embedding": jax.random.normal(k[2], (50, 32))}}


@pytest.mark.parametrize("kind", Q.KINDS)
def test_merge_over_a_quantized_base_is_lora_on_the_dequantized_base(kind):
    params = _params()
    spec = L.LoraSpec(rank=2, alpha=4.0, targets=(r"self_attn/.*/kernel$",))
    paths = L.adapted_paths(params, spec)
    base = L.quantize_base(params, paths, kind)
    assert all(Q.is_quantized(base["language_model"]["layers"]["0"]["self_attn"][n]["kernel"]) for n in ("q_proj", "o_proj"))
    assert base["embed"]["embedding"] is params["embed"]["embedding"]       # only the adapted kernels
    plain = L.dequantize_base(base)
    adapters = L.init_adapters(params, spec, jax.random.key(3))
    adapters = jax.tree.map(lambda x: x + 0.1, adapters)                     # B != 0
    got, want = L.merge(base, adapters, spec), L.merge(plain, adapters, spec)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), got, want)
    loss = lambda merged: sum(jnp.sum(jnp.sin(x)) for x in jax.tree.leaves(merged))
    g_q = jax.grad(lambda a: loss(L.merge(base, a, spec)))(adapters)
    g_p = jax.grad(lambda a: loss(L.merge(plain, a, spec)))(adapters)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6), g_q, g_p)
    err = max(float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(params)))
    assert 0 < err    # the base is really quantized
    jitted = jax.jit(lambda b, a: L.merge(b, a, spec))(base, adapters)       # a pytree argument of jit
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6),
                 jitted, want)
