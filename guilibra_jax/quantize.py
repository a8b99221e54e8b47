"""Blockwise quantization of frozen Linear kernels (QLoRA's base: ``model.quantize``).

A kernel W of shape [..., n] is cut into blocks of ``block`` consecutive entries along its
last axis (block = gcd(64, n)); each block keeps its absolute maximum s (float32) and codes:

    int8   q = round(127 * w / s) in [-127, 127]             w ~ s * q / 127
    nf4    q = the nearest of the 16 NormalFloat4 levels      w ~ s * NF4[q]
           (QLoRA, Dettmers et al. 2023, table of levels in [-1, 1]); two 4-bit codes
           per uint8, the even entry in the low nibble

The largest error per entry is s / 254 (int8) and s * half the widest gap between adjacent
NF4 levels, 0.152 s (nf4). No double quantization of the scales (QLoRA quantizes its
per-64 float32 scales again to save 0.37 bits per weight; here they stay float32: 0.5 bits
per weight). A :class:`QuantizedKernel` is a pytree (codes and scales are its leaves), so a
parameter tree holding some stays a valid jit argument with shardings
(:func:`shardings_like`); :func:`dequantize` gives the kernel back in its dtype.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from guilibra_jax import choices as CH

KINDS = CH.QUANTIZE
BLOCK = 64
NF4 = np.array([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
                -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
                0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                0.7229568362236023, 1.0], np.float32)
MAX_ERROR = {"int8": 1 / 254, "nf4": float(np.max(np.diff(NF4))) / 2}   # per entry, in units of its block's s


@jax.tree_util.register_pytree_node_class
class QuantizedKernel:
    """codes (int8 [..., n] or packed uint8 [..., n / 2]) and scales (float32 [..., n / block])
    of a kernel of ``shape`` and ``dtype``."""

    def __init__(self, codes, scales, kind: str, shape: tuple, dtype, block: int):
        self.codes, self.scales = codes, scales
        self.kind, self.shape, self.dtype, self.block = kind, tuple(shape), jnp.dtype(dtype), int(block)

    def tree_flatten(self):
        return (self.codes, self.scales), (self.kind, self.shape, self.dtype.name, self.block)

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children, *aux)

    @property
    def nbytes(self) -> int:
        return int(sum(math.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in (self.codes, self.scales)))

    def __repr__(self):
        return f"QuantizedKernel({self.kind}, shape={self.shape}, dtype={self.dtype.name}, block={self.block})"


def is_quantized(x) -> bool:
    return isinstance(x, QuantizedKernel)


def block_size(shape: tuple, kind: str, where: str = "kernel") -> int:
    """gcd(BLOCK, n) for a last axis of n; ValueError naming ``where`` when nf4 cannot pack it."""
    n = int(shape[-1])
    b = math.gcd(BLOCK, n)
    if kind == "nf4" and b % 2:
        raise ValueError(f"{where} of shape {tuple(shape)}: nf4 packs two codes per byte along the last axis, "
                         f"which has odd length {n}")
    return b


def quantize(w: jax.Array, kind: str, where: str = "kernel") -> QuantizedKernel:
    """``w`` as codes and per-block scales (see the module docstring). Jit-able."""
    if kind not in KINDS:
        raise ValueError(f"quantization {kind!r}: expected one of {KINDS}")
    shape, b = tuple(w.shape), block_size(w.shape, kind, where)
    x = w.astype(jnp.float32).reshape(*shape[:-1], shape[-1] // b, b)
    s = jnp.max(jnp.abs(x), axis=-1)
    u = x / jnp.where(s == 0, 1.0, s)[..., None]                # in [-1, 1]
    if kind == "int8":
        codes = jnp.clip(jnp.round(u * 127), -127, 127).astype(jnp.int8).reshape(shape)
    else:
        mid = jnp.asarray((NF4[1:] + NF4[:-1]) / 2)           # nearest level by its midpoints
        idx = jnp.searchsorted(mid, u.reshape(*shape[:-1], shape[-1] // 2, 2)).astype(jnp.uint8)
        codes = idx[..., 0] | (idx[..., 1] << 4)
    return QuantizedKernel(codes, s, kind, shape, w.dtype, b)


def dequantize(q: QuantizedKernel, dtype=None) -> jax.Array:
    """The kernel back from its codes, in ``dtype`` (default its own). Jit-able."""
    shape, b = q.shape, q.block
    if q.kind == "int8":
        u = q.codes.astype(jnp.float32) / 127
    else:
        lo, hi = q.codes & 0xF, q.codes >> 4
        u = jnp.asarray(NF4)[jnp.stack([lo, hi], axis=-1).astype(jnp.int32)]
    u = u.reshape(*shape[:-1], shape[-1] // b, b) * q.scales[..., None]
    return u.reshape(shape).astype(dtype or q.dtype)


def abstract_quantized(x: jax.ShapeDtypeStruct, kind: str, where: str = "kernel") -> QuantizedKernel:
    """The QuantizedKernel of ShapeDtypeStructs that :func:`quantize` returns for ``x``."""
    return jax.eval_shape(lambda w: quantize(w, kind, where), jax.ShapeDtypeStruct(x.shape, x.dtype))


def _fit(spec, shape: tuple, mesh) -> jax.sharding.NamedSharding:
    """``spec`` with every axis whose length its mesh axes do not divide left unsharded."""
    axes = []
    for dim, a in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        names = () if a is None else (a if isinstance(a, tuple) else (a,))
        size = math.prod(mesh.shape[n] for n in names)
        axes.append(a if size and dim % size == 0 else None)
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*axes))


def shardings_like(q: QuantizedKernel, sharding: jax.sharding.NamedSharding) -> QuantizedKernel:
    """Shardings for ``q``'s codes and scales from its kernel's: the kernel's partition spec
    where it divides their (shorter) last axis, unsharded there otherwise."""
    spec, mesh = sharding.spec, sharding.mesh
    return QuantizedKernel(_fit(spec, tuple(q.codes.shape), mesh), _fit(spec, tuple(q.scales.shape), mesh),
                           q.kind, q.shape, q.dtype, q.block)
