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


_SHARDED = r"""
import os, json
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from guilibra_jax import lora as L, quantize as Q
mesh = Mesh(np.array(jax.devices()).reshape(4), ("fsdp",))
k = jax.random.split(jax.random.key(0), 3)
params = {"a": {"kernel": jax.random.normal(k[0], (64, 256))},     # codes [64, 128], scales [64, 4]: both split 4 ways
          "b": {"kernel": jax.random.normal(k[1], (16, 2, 32))},   # sharded on the first axis: all alike
          "c": {"kernel": jax.random.normal(k[2], (8, 128))}}      # scales [8, 2]: 4 does not divide 2
sh = {"a": {"kernel": NamedSharding(mesh, P(None, "fsdp"))}, "b": {"kernel": NamedSharding(mesh, P("fsdp", None, None))},
      "c": {"kernel": NamedSharding(mesh, P(None, "fsdp"))}}
spec = L.LoraSpec(rank=2, alpha=2.0, targets=("kernel$",))
paths = L.adapted_paths(params, spec)
q_abs = L.quantize_base(jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params), paths, "nf4")
q_sh = jax.tree.map(lambda q, s: Q.shardings_like(q, s), q_abs, sh, is_leaf=Q.is_quantized)
base = jax.jit(lambda p: L.quantize_base(p, paths, "nf4"), out_shardings=q_sh)(jax.device_put(params, sh))
adapters = jax.tree.map(lambda x: x + 0.05, L.init_adapters(params, spec, jax.random.key(1)))
merged = jax.jit(lambda b, a: L.merge(b, a, spec), out_shardings=sh)(base, adapters)
want = L.merge(L.quantize_base(params, paths, "nf4"), adapters, spec)
err = max(float(np.abs(np.asarray(merged[n]["kernel"]) - np.asarray(want[n]["kernel"])).max()) for n in "abc")
specs = {n: [tuple(base[n]["kernel"].codes.sharding.spec), tuple(base[n]["kernel"].scales.sharding.spec)] for n in "abc"}
print(json.dumps({"err": err, "specs": specs}))
"""


def test_a_quantized_base_shards_like_its_kernels_on_a_mesh():
    """Codes and scales take their kernel's partition spec where it divides them (else that
    axis is unsharded); the merge on 4 devices equals the one-device merge."""
    import json
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", _SHARDED], cwd=root, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": root})
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["err"] <= 1e-5
    assert out["specs"]["a"] == [[None, "fsdp"], [None, "fsdp"]]
    assert out["specs"]["b"] == [["fsdp", None, None], ["fsdp", None, None]]
    assert out["specs"]["c"] == [[None, "fsdp"], [None, None]]
