"""Vision towers of Qwen2.5-VL and Qwen3-VL, and their host-side input preparation.

Everything that depends on `image_grid_thw` is computed on the host by
`prepare_vision_inputs` (numpy), so the towers see only static shapes under jit: all images
of a batch are concatenated into one patch sequence [P, C*t*p*p] (optionally padded to a
bucket), and attention is restricted to each image (frame) or window by segment ids.
"""
from __future__ import annotations

import numpy as np
import jax
import jax.numpy as jnp
from flax import nnx

from guilibra_jax.models.attention import attention_mask, dot_product_attention
from guilibra_jax.models.config import ModelConfig, VisionConfig
from guilibra_jax.models.layers import (Embed, LayerNorm, Linear, RMSNorm, activation, apply_rope, vision_rope)


# ----------------------------------------------------------------------------- host side
def _grids(image_grid_thw) -> np.ndarray:
  g = np.asarray(image_grid_thw, np.int64).reshape(-1, 3)
  return g


def _position_hw(grids: np.ndarray, merge: int) -> np.ndarray:
  """[P, 2] (row, col) per patch in spatial-merge-block order, like transformers."""
  out = []
  for t, h, w in grids:
    hpos, wpos = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    shape = (h // merge, merge, w // merge, merge)
    hpos = hpos.reshape(shape).transpose(0, 2, 1, 3).ravel()
    wpos = wpos.reshape(shape).transpose(0, 2, 1, 3).ravel()
    out.append(np.tile(np.stack([hpos, wpos], -1), (t, 1)))
  return np.concatenate(out, 0) if out else np.zeros((0, 2), np.int64)


def _frame_ids(grids: np.ndarray) -> np.ndarray:
  """[P] 1-based id of each patch's (image, frame): transformers attends within a frame."""
  sizes = np.repeat(grids[:, 1] * grids[:, 2], grids[:, 0])
  return np.repeat(np.arange(1, len(sizes) + 1), sizes)


def _window_index(grids: np.ndarray, merge: int, window_size: int, patch_size: int):
  """transformers' get_vision_window_index in numpy: merged-unit permutation and window lengths."""
  window_index, window_lens = [], []
  offset = 0
  vit_win = window_size // merge // patch_size
  for t, h, w in grids:
    lh, lw = h // merge, w // merge
    index = np.arange(t * lh * lw).reshape(t, lh, lw)
    pad_h = vit_win - lh % vit_win
    pad_w = vit_win - lw % vit_win
    nh, nw = (lh + pad_h) // vit_win, (lw + pad_w) // vit_win
    padded = np.pad(index, ((0, 0), (0, pad_h), (0, pad_w)), constant_values=-100)
    padded = padded.reshape(t, nh, vit_win, nw, vit_win).transpose(0, 1, 3, 2, 4).reshape(t, nh * nw, -1)
    lens = (padded != -100).sum(-1).ravel()
    flat = padded.ravel()
    window_index.append(flat[flat != -100] + offset)
    window_lens.extend(int(n) for n in lens if n > 0)  # unique_consecutive drops empty windows
    offset += t * lh * lw
  return np.concatenate(window_index) if window_index else np.zeros((0,), np.int64), np.asarray(window_lens)


def _interpolation(grids: np.ndarray, side: int, merge: int):
  """Bilinear (align_corners=True) taps into the side x side pos-embed table, per patch [P, 4]."""
  idx_all, w_all = [], []
  for t, h, w in grids:
    rows = np.arange(h)[:, None].repeat(w, 1)
    cols = np.arange(w)[None, :].repeat(h, 0)
    shape = (h // merge, merge, w // merge, merge)
    rows = rows.reshape(shape).transpose(0, 2, 1, 3).ravel()
    cols = cols.reshape(shape).transpose(0, 2, 1, 3).ravel()

    def axis(index, size):
      src = index.astype(np.float32) * np.float32(side - 1) / np.float32(max(size - 1, 1))
      floor = np.floor(src)
      taps = floor.astype(np.int64)[:, None] + np.arange(2)
      weights = np.clip(1 - np.abs(src[:, None] - floor[:, None] - np.arange(2)), 0, None)
      return np.clip(taps, 0, side - 1), weights.astype(np.float32)

    ht, hw_ = axis(rows, h)
    wt, ww = axis(cols, w)
    idx = (ht[:, :, None] * side + wt[:, None, :]).reshape(-1, 4)
    wts = (hw_[:, :, None] * ww[:, None, :]).reshape(-1, 4)
    idx_all.append(np.tile(idx, (t, 1)))
    w_all.append(np.tile(wts, (t, 1)))
  return np.concatenate(idx_all), np.concatenate(w_all)


def prepare_vision_inputs(image_grid_thw, config: ModelConfig, num_patches: int | None = None) -> dict:
  """Host-side (numpy) per-patch tensors for the vision tower of `config.family`.

  Args:
    image_grid_thw: [n_images, 3] (t, h, w) in patches, in the order of the pixel rows.
    config: ModelConfig.
    num_patches: pad the patch sequence to this many rows (a static bucket; a multiple of
      spatial_merge_size**2 and at least the real count). Padding patches form their own
      segment (id 0) and their merged features are never placed into the text.

  Returns a dict of numpy arrays (all with leading dim P or P / merge**2):
    pos_hw [P, 2] int32        rotary (row, col) of each patch, in the tower's patch order
    segment_ids [P] int32      1-based (image, frame) id per patch, 0 = padding
    Qwen2.5 only:
      window_segment_ids [P] int32  1-based window id per patch (0 = padding)
      window_perm [P] int32         patch gather that makes windows contiguous
      merge_inverse [P/m^2] int32   gather that restores merged tokens to image order
    Qwen3 only:
      interp_indices [P, 4] int32, interp_weights [P, 4] float32  bilinear pos-embed taps
  """
  vc = config.vision
  grids = _grids(image_grid_thw)
  mu = vc.merge_unit
  real = int((grids[:, 0] * grids[:, 1] * grids[:, 2]).sum())
  p = real if num_patches is None else int(num_patches)
  if p < real or p % mu:
    raise ValueError(f"num_patches={p} must be >= the real patch count {real} and a multiple of {mu}")
  pad = p - real

  pos_hw = _position_hw(grids, vc.spatial_merge_size)
  seg = _frame_ids(grids)
  out = {}
  if config.family == "qwen2_5_vl":
    win_index, win_lens = _window_index(grids, vc.spatial_merge_size, vc.window_size, vc.patch_size)
    n_units = p // mu
    win_index = np.concatenate([win_index, np.arange(real // mu, n_units)])  # padding: identity
    perm = (win_index[:, None] * mu + np.arange(mu)).ravel()
    win_seg = np.repeat(np.arange(1, len(win_lens) + 1), win_lens * mu)
    out.update(
        pos_hw=np.pad(pos_hw, ((0, pad), (0, 0)))[perm],
        segment_ids=np.pad(seg, (0, pad))[perm],
        window_segment_ids=np.pad(win_seg, (0, pad)),  # already in permuted order
        window_perm=perm,
        merge_inverse=np.argsort(win_index, kind="stable"),
    )
  else:
    side = int(vc.num_position_embeddings**0.5)
    idx, wts = _interpolation(grids, side, vc.spatial_merge_size) if real else (np.zeros((0, 4)), np.zeros((0, 4)))
    out.update(
        pos_hw=np.pad(pos_hw, ((0, pad), (0, 0))),
        segment_ids=np.pad(seg, (0, pad)),
        interp_indices=np.pad(idx, ((0, pad), (0, 0))),
        interp_weights=np.pad(wts, ((0, pad), (0, 0))),
    )
  return {k: v.astype(np.float32 if k == "interp_weights" else np.int32) for k, v in out.items()}


VISION_ARRAY_KEYS = ("pos_hw", "segment_ids", "window_segment_ids", "window_perm", "merge_inverse",
                     "interp_indices", "interp_weights")


def device_vision_inputs(vision: dict) -> dict:
  """The array entries of a prepare_vision_inputs dict (what jitted code takes)."""
  return {k: vision[k] for k in VISION_ARRAY_KEYS if k in vision}


# ----------------------------------------------------------------------------- modules
class VisionAttention(nnx.Module):

  def __init__(self, vc: VisionConfig, *, dtype, param_dtype, rngs):
    d, n, h = vc.hidden_size, vc.num_heads, vc.head_dim
    kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs, use_bias=True)
    self.qkv = Linear((d,), (3, n, h), ("vision_embed",), (None, "vision_heads", "head_dim"), **kw)
    self.proj = Linear((n, h), (d,), ("vision_heads", "head_dim"), ("vision_embed",), **kw)
    self.scale = h**-0.5

  def __call__(self, x, cos, sin, segment_ids):
    qkv = self.qkv(x[None])  # [1, P, 3, N, H]
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    dtype = q.dtype
    q = apply_rope(q.astype(jnp.float32), cos, sin).astype(dtype)
    k = apply_rope(k.astype(jnp.float32), cos, sin).astype(dtype)
    seg = segment_ids[None]
    out = dot_product_attention(q, k, v, attention_mask(seg, seg, causal=False), scale=self.scale)
    return self.proj(out)[0]


class GatedMLP(nnx.Module):
  """down(act(gate(x)) * up(x)); Qwen2.5 vision (bias) and text (no bias)."""

  def __init__(self, d, i, act, in_axis, mid_axis, *, use_bias, dtype, param_dtype, rngs):
    kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs, use_bias=use_bias)
    self.gate_proj = Linear((d,), (i,), (in_axis,), (mid_axis,), **kw)
    self.up_proj = Linear((d,), (i,), (in_axis,), (mid_axis,), **kw)
    self.down_proj = Linear((i,), (d,), (mid_axis,), (in_axis,), **kw)
    self.act = activation(act)

  def __call__(self, x):
    return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class PlainMLP(nnx.Module):
  """fc2(act(fc1(x))) with bias; Qwen3 vision blocks."""

  def __init__(self, d, i, act, *, dtype, param_dtype, rngs):
    kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs, use_bias=True)
    self.linear_fc1 = Linear((d,), (i,), ("vision_embed",), ("vision_mlp",), **kw)
    self.linear_fc2 = Linear((i,), (d,), ("vision_mlp",), ("vision_embed",), **kw)
    self.act = activation(act)

  def __call__(self, x):
    return self.linear_fc2(self.act(self.linear_fc1(x)))


class VisionBlock(nnx.Module):

  def __init__(self, vc: VisionConfig, family: str, *, dtype, param_dtype, rngs):
    d = vc.hidden_size
    if family == "qwen2_5_vl":
      self.norm1 = RMSNorm(d, ("vision_embed",), eps=1e-6, dtype=dtype, param_dtype=param_dtype)
      self.norm2 = RMSNorm(d, ("vision_embed",), eps=1e-6, dtype=dtype, param_dtype=param_dtype)
      self.mlp = GatedMLP(d, vc.intermediate_size, vc.hidden_act, "vision_embed", "vision_mlp", use_bias=True,
                          dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    else:
      self.norm1 = LayerNorm(d, ("vision_embed",), eps=1e-6, dtype=dtype, param_dtype=param_dtype)
      self.norm2 = LayerNorm(d, ("vision_embed",), eps=1e-6, dtype=dtype, param_dtype=param_dtype)
      self.mlp = PlainMLP(d, vc.intermediate_size, vc.hidden_act, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.attn = VisionAttention(vc, dtype=dtype, param_dtype=param_dtype, rngs=rngs)

  def __call__(self, x, cos, sin, segment_ids):
    x = x + self.attn(self.norm1(x), cos, sin, segment_ids)
    return x + self.mlp(self.norm2(x))


class PatchMerger(nnx.Module):
  """Norm, group merge**2 neighbouring patches, MLP to the text width.

  Qwen2.5: RMSNorm (`ln_q`) + `mlp.0` / `mlp.2`. Qwen3: LayerNorm (`norm`, after the grouping
  for deepstack mergers) + `linear_fc1` / `linear_fc2`.
  """

  def __init__(self, vc: VisionConfig, family: str, *, postshuffle_norm: bool, dtype, param_dtype, rngs):
    self.family = family
    self.group = vc.hidden_size * vc.merge_unit
    self.postshuffle_norm = postshuffle_norm
    kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs, use_bias=True)
    fc1 = Linear((self.group,), (self.group,), (None,), ("vision_mlp",), **kw)
    fc2 = Linear((self.group,), (vc.out_hidden_size,), ("vision_mlp",), ("embed",), **kw)
    if family == "qwen2_5_vl":
      self.ln_q = RMSNorm(vc.hidden_size, ("vision_embed",), eps=1e-6, dtype=dtype, param_dtype=param_dtype)
      self.mlp = nnx.Dict({"0": fc1, "2": fc2})
    else:
      norm_dim = self.group if postshuffle_norm else vc.hidden_size
      self.norm = LayerNorm(norm_dim, (None if postshuffle_norm else "vision_embed",), eps=1e-6, dtype=dtype,
                            param_dtype=param_dtype)
      self.linear_fc1, self.linear_fc2 = fc1, fc2

  def __call__(self, x):
    gelu = lambda y: jax.nn.gelu(y, approximate=False)
    if self.family == "qwen2_5_vl":
      x = self.ln_q(x).reshape(-1, self.group)
      return self.mlp["2"](gelu(self.mlp["0"](x)))
    x = self.norm(x.reshape(-1, self.group)) if self.postshuffle_norm else self.norm(x).reshape(-1, self.group)
    return self.linear_fc2(gelu(self.linear_fc1(x)))


class VisionTower(nnx.Module):
  """pixel_values [P, C*t*p*p] + prepare_vision_inputs dict -> (merged [P/m^2, D_text], deepstack list)."""

  def __init__(self, config: ModelConfig, *, dtype, param_dtype, remat=None, rngs: nnx.Rngs):
    """remat: None (off), "full", or a jax.checkpoint policy for each block."""
    vc = config.vision
    self.family = config.family
    self.vc = vc
    self.remat = remat
    family = config.family
    kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.patch_embed = nnx.Dict({"proj": Linear((vc.patch_dim,), (vc.hidden_size,), (None,), ("vision_embed",),
                                                use_bias=family == "qwen3_vl", **kw)})
    if family == "qwen3_vl":
      self.pos_embed = Embed(vc.num_position_embeddings, vc.hidden_size, (None, "vision_embed"), **kw)
    self.blocks = nnx.List([VisionBlock(vc, family, **kw) for _ in range(vc.depth)])
    self.merger = PatchMerger(vc, family, postshuffle_norm=False, **kw)
    if family == "qwen3_vl":
      self.deepstack_merger_list = nnx.List(
          [PatchMerger(vc, family, postshuffle_norm=True, **kw) for _ in vc.deepstack_visual_indexes])

  def _block(self, i, x, cos, sin, seg):
    blk = self.blocks[i]
    if self.remat is None:
      return blk(x, cos, sin, seg)
    policy = None if self.remat == "full" else self.remat
    gdef, state = nnx.split(blk)
    fn = jax.checkpoint(lambda st, *a: nnx.merge(gdef, st)(*a), policy=policy)
    return fn(state, x, cos, sin, seg)

  def __call__(self, pixel_values, vision: dict):
    vc = self.vc
    x = self.patch_embed["proj"](pixel_values)
    cos, sin = vision_rope(jnp.asarray(vision["pos_hw"]), vc.head_dim, vc.rope_theta)
    seg = jnp.asarray(vision["segment_ids"])
    if self.family == "qwen2_5_vl":
      x = x[jnp.asarray(vision["window_perm"])]
      win = jnp.asarray(vision["window_segment_ids"])
      full = set(vc.fullatt_block_indexes)
      for i in range(vc.depth):
        x = self._block(i, x, cos, sin, seg if i in full else win)
      merged = self.merger(x)[jnp.asarray(vision["merge_inverse"])]
      return merged, []
    table = self.pos_embed.embedding[...].astype(x.dtype)
    w = jnp.asarray(vision["interp_weights"]).astype(x.dtype)
    x = x + (table[jnp.asarray(vision["interp_indices"])] * w[..., None]).sum(1)
    deepstack = []
    for i in range(vc.depth):
      x = self._block(i, x, cos, sin, seg)
      if i in vc.deepstack_visual_indexes:
        deepstack.append(self.deepstack_merger_list[vc.deepstack_visual_indexes.index(i)](x))
    return self.merger(x), deepstack
