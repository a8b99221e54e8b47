"""Small NNX building blocks whose parameters carry logical axis names.

Kernels are stored [in..., out...] (HF stores Linear weights [out, in]); every parameter has
`out_sharding` metadata holding logical axis names, so
`nnx.get_partition_spec(nnx.state(model))` gives PartitionSpecs of logical names.
"""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

Axes = tuple[str | None, ...]


def _param(rngs: nnx.Rngs | None, shape, axes: Axes, dtype, init: str, std: float = 0.02) -> nnx.Param:
  if init == "ones":
    value = jnp.ones(shape, dtype)
  elif init == "zeros" or rngs is None:
    value = jnp.zeros(shape, dtype)
  else:
    value = (std * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype)
  # Logical names only: the trainer maps them to mesh axes (no eager sharding here).
  return nnx.Param(value, out_sharding=axes, eager_sharding=False)


class Linear(nnx.Module):
  """y = x @ kernel + bias with kernel [*in_shape, *out_shape]; contracts the last len(in_shape) dims."""

  def __init__(self, in_shape: Sequence[int], out_shape: Sequence[int], in_axes: Axes, out_axes: Axes, *,
               use_bias: bool, dtype, param_dtype, rngs: nnx.Rngs):
    self.in_shape = tuple(in_shape)
    self.out_shape = tuple(out_shape)
    self.dtype = dtype
    self.kernel = _param(rngs, self.in_shape + self.out_shape, tuple(in_axes) + tuple(out_axes), param_dtype, "normal")
    self.bias = _param(rngs, self.out_shape, tuple(out_axes), param_dtype, "zeros") if use_bias else None

  def __call__(self, x):
    n_in = len(self.in_shape)
    lead = x.shape[:x.ndim - n_in]
    ins = "ijkl"[:n_in]
    outs = "mnop"[: len(self.out_shape)]
    # The leading dims as one row dim: with two or more (rows, tokens), the weight gradient
    # contracts over both and XLA's CPU backend transposes an activation-sized operand for it
    # (the MLP's forward + backward 40% slower at 32 x 32 tokens, benchmarks in docs/benchmarks.md).
    rows = x.reshape((-1,) + x.shape[x.ndim - n_in:]).astype(self.dtype)
    y = jnp.einsum(f"a{ins},{ins}{outs}->a{outs}", rows, self.kernel[...].astype(self.dtype))
    y = y.reshape(lead + self.out_shape)
    if self.bias is not None:
      y = y + self.bias[...].astype(self.dtype)
    return y


class Embed(nnx.Module):

  def __init__(self, num: int, dim: int, axes: Axes, *, dtype, param_dtype, rngs: nnx.Rngs):
    self.dtype = dtype
    self.embedding = _param(rngs, (num, dim), axes, param_dtype, "normal")

  def __call__(self, ids):
    return jnp.take(self.embedding[...], ids, axis=0).astype(self.dtype)

  def attend(self, x):
    """Tied output projection: x [..., D] -> [..., V]."""
    return jnp.einsum("...d,vd->...v", x.astype(self.dtype), self.embedding[...].astype(self.dtype))


class RMSNorm(nnx.Module):
  """HF Qwen RMSNorm: normalise in float32, cast back, then scale."""

  def __init__(self, dim: int, axes: Axes, *, eps: float, dtype, param_dtype):
    self.eps = eps
    self.dtype = dtype
    self.scale = _param(None, (dim,), axes, param_dtype, "ones")

  def __call__(self, x):
    in_dtype = x.dtype
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return self.scale[...].astype(self.dtype) * y.astype(in_dtype).astype(self.dtype)


class LayerNorm(nnx.Module):

  def __init__(self, dim: int, axes: Axes, *, eps: float, dtype, param_dtype):
    self.eps = eps
    self.dtype = dtype
    self.scale = _param(None, (dim,), axes, param_dtype, "ones")
    self.bias = _param(None, (dim,), axes, param_dtype, "zeros")

  def __call__(self, x):
    x32 = x.astype(jnp.float32)
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
    y = (x32 - mean) * jax.lax.rsqrt(var + self.eps)
    y = y * self.scale[...].astype(jnp.float32) + self.bias[...].astype(jnp.float32)
    return y.astype(self.dtype)


def activation(name: str):
  if name == "silu":
    return jax.nn.silu
  if name in ("gelu_pytorch_tanh", "gelu_new", "gelu_fast"):
    return lambda x: jax.nn.gelu(x, approximate=True)
  if name == "gelu":
    return lambda x: jax.nn.gelu(x, approximate=False)
  if name == "quick_gelu":
    return lambda x: x * jax.nn.sigmoid(1.702 * x)
  raise ValueError(f"unsupported activation {name!r}")


def position_wise(fn, x, chunk: int, rows: int | None = None):
  """``fn(x)`` for a position-wise ``fn`` (an MLP), computed over chunks of ``chunk``
  positions of each of ``rows`` rows (default x.shape[0]) in a lax.map whose body is
  rematerialised: at most one chunk's intermediates ([rows, chunk, intermediate]) are alive,
  in the forward pass and in the backward one, instead of the whole sequence's (a 16,384-token
  row of a 32B model: 1.6 GB per [T, 25,600] float32 buffer, a dozen of them). The rows' axis
  stays whole (it is the sharded one); positions are padded to whole chunks and the padding
  sliced off. ``chunk`` <= 0, or rows no longer than it: ``fn(x)`` as is."""
  shape = x.shape
  r = shape[0] if rows is None else int(rows)
  y = x.reshape(r, -1, shape[-1])
  n = y.shape[1]
  if chunk <= 0 or n <= chunk:
    return fn(x)
  k = -(-n // chunk)
  y = jnp.pad(y, ((0, 0), (0, k * chunk - n), (0, 0))).reshape(r, k, chunk, shape[-1])
  out = jax.lax.map(jax.checkpoint(fn), jnp.moveaxis(y, 1, 0))        # [k, r, chunk, D']
  out = jnp.moveaxis(out, 0, 1).reshape(r, k * chunk, out.shape[-1])[:, :n]
  return out.reshape(shape[:-1] + out.shape[-1:])


# ----------------------------------------------------------------------------- RoPE
def rotate_half(x):
  h = x.shape[-1] // 2
  return jnp.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def apply_rope(x, cos, sin):
  """x [..., T, N, H]; cos/sin [..., T, H] broadcast over heads."""
  return x * cos[..., None, :] + rotate_half(x) * sin[..., None, :]


def mrope_axis_selector(head_dim: int, section: Sequence[int], interleaved: bool) -> np.ndarray:
  """For each of the head_dim // 2 frequencies, which position axis (0=t, 1=h, 2=w) drives it."""
  half = head_dim // 2
  if interleaved:  # Qwen3-VL: t h w t h w ... within 3 * section, then t
    sel = np.zeros(half, np.int32)
    for axis, offset in ((1, 1), (2, 2)):
      sel[offset:section[axis] * 3:3] = axis
    return sel
  return np.repeat(np.arange(3, dtype=np.int32), np.asarray(section))  # Qwen2.5-VL: contiguous


def text_rope(positions, head_dim: int, theta: float, section, interleaved: bool):
  """positions [3, B, T] -> cos, sin [B, T, head_dim] float32 (M-RoPE)."""
  inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
  freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq, jnp.float32)  # [3, B, T, H/2]
  sel = jnp.asarray(mrope_axis_selector(head_dim, section, interleaved))
  freqs = _select_axis(freqs, sel)  # [B, T, H/2]
  emb = jnp.concatenate([freqs, freqs], axis=-1)
  return jnp.cos(emb), jnp.sin(emb)


def _select_axis(freqs, sel):
  onehot = jax.nn.one_hot(sel, 3, dtype=freqs.dtype)  # [H/2, 3]
  return jnp.where(onehot.T[:, None, None, :] > 0, freqs, 0.0).sum(0)


def vision_rope(pos_hw, head_dim: int, theta: float):
  """pos_hw [..., 2] (row, col in patches) -> cos, sin [..., head_dim] float32 (2-D axial RoPE)."""
  spatial = head_dim // 2
  inv_freq = 1.0 / (theta ** (np.arange(0, spatial, 2, dtype=np.float32) / spatial))
  freqs = pos_hw.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)  # [..., 2, H/4]
  freqs = freqs.reshape(freqs.shape[:-2] + (-1,))  # [..., H/2] = cat(h, w)
  emb = jnp.concatenate([freqs, freqs], axis=-1)
  return jnp.cos(emb), jnp.sin(emb)
