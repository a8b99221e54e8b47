"""Vision towers of Qwen2.5-VL and Qwen3-VL, and their host-side input preparation.

Everything that depends on `image_grid_thw` is computed on the host by
`prepare_vision_inputs` (numpy), so the towers see only static shapes under jit.

Layout. `pixel_values` [P, C*t*p*p] holds the patches of all images of a batch concatenated
in image order (zero rows after them up to a bucket). Inside the tower every frame of every
image (an image is one frame) occupies one *slot* of L patch positions, so the tower works on
[S, L, D] activations: S slots (frames, then empty slots), each holding its frame's patches
first and padding after. Attention runs per slot with sequence lengths (no [P, P] mask):
cost O(sum of L^2) over slots instead of O(P^2), a call shape that fused kernels (cuDNN
flash attention) take, and the slot axis can be sharded over devices (one device, its
images). Qwen2.5-VL's windowed blocks view the same activations as [S * W, w, D] windows
of w = (window_size / patch_size)^2 patches (each window of a frame padded to w), with
their own lengths; full-attention blocks use the compact per-slot layout. After the
merger, the merged features are compacted back to image order: the k-th <|image_pad|>
token of the batch takes merged feature k, as before.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import jax
import jax.numpy as jnp
from flax import nnx

from guilibra_jax import sharding as S
from guilibra_jax.models.attention import BLOCK, varlen_attention
from guilibra_jax.models.config import ModelConfig, VisionConfig
from guilibra_jax.models.layers import (Embed, LayerNorm, Linear, RMSNorm, activation, apply_rope, position_wise,
                                        vision_rope)


# ----------------------------------------------------------------------------- host side
def _grids(image_grid_thw) -> np.ndarray:
  return np.asarray(image_grid_thw, np.int64).reshape(-1, 3)


def _frames(grids: np.ndarray) -> list[tuple[int, int]]:
  """(h, w) of every frame, in pixel-row order (an image's t frames one after another)."""
  return [(int(h), int(w)) for t, h, w in grids for _ in range(int(t))]


def _position_hw(h: int, w: int, merge: int) -> np.ndarray:
  """[h*w, 2] (row, col) per patch of one frame in spatial-merge-block order, like transformers."""
  hpos, wpos = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
  shape = (h // merge, merge, w // merge, merge)
  hpos = hpos.reshape(shape).transpose(0, 2, 1, 3).ravel()
  wpos = wpos.reshape(shape).transpose(0, 2, 1, 3).ravel()
  return np.stack([hpos, wpos], -1)


def _frame_windows(h: int, w: int, merge: int, vit_win: int) -> tuple[np.ndarray, np.ndarray]:
  """transformers' get_vision_window_index for one frame: the merged-unit permutation that
  makes windows contiguous, and the units of each non-empty window."""
  lh, lw = h // merge, w // merge
  index = np.arange(lh * lw).reshape(lh, lw)
  pad_h = vit_win - lh % vit_win
  pad_w = vit_win - lw % vit_win
  nh, nw = (lh + pad_h) // vit_win, (lw + pad_w) // vit_win
  padded = np.pad(index, ((0, pad_h), (0, pad_w)), constant_values=-100)
  padded = padded.reshape(nh, vit_win, nw, vit_win).transpose(0, 2, 1, 3).reshape(nh * nw, -1)
  lens = (padded != -100).sum(-1)
  flat = padded.ravel()
  return flat[flat != -100], lens[lens > 0]  # unique_consecutive drops empty windows


def _interpolation(h: int, w: int, side: int, merge: int) -> tuple[np.ndarray, np.ndarray]:
  """Bilinear (align_corners=True) taps into the side x side pos-embed table, per patch of
  one frame [h*w, 4] (merge-block order)."""
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
  return idx, wts


def window_patches(config: ModelConfig) -> int:
  """Patches of one attention window of Qwen2.5-VL's windowed blocks (64 for 112 px windows
  of 14 px patches)."""
  vc = config.vision
  vit_win = vc.window_size // vc.spatial_merge_size // vc.patch_size
  return vit_win * vit_win * vc.merge_unit


def slot_unit(config: ModelConfig) -> int:
  """Slot lengths are multiples of this: the window for Qwen2.5-VL, the merge unit for Qwen3-VL."""
  return window_patches(config) if config.family == "qwen2_5_vl" else config.vision.merge_unit


def slot_need(grid, config: ModelConfig) -> int:
  """Slot length one frame of a (t, h, w) grid needs (its windows, each padded, for Qwen2.5-VL)."""
  _, h, w = (int(x) for x in grid)
  vc = config.vision
  if config.family != "qwen2_5_vl":
    return h * w
  vit_win = vc.window_size // vc.spatial_merge_size // vc.patch_size
  return len(_frame_windows(h, w, vc.spatial_merge_size, vit_win)[1]) * window_patches(config)


def bucket_slot_len(need: int, unit: int, bucket: int | None) -> int:
  """The slot length of a batch whose largest frame needs ``need`` positions: ``unit`` times
  the smallest power of two that holds it while that stays under ``bucket``, else the next
  multiple of ``lcm(unit, bucket)``. Few distinct lengths (few compiles) without padding
  small frames to a whole bucket: 8 demo frames of <= 64 patches in 512-patch slots ran the
  tower on 8x the positions (the demo step 1.7x slower, measured)."""
  step = math.lcm(unit, int(bucket or unit))
  n = unit
  while n < need and n * 2 < step:
    n *= 2
  return n if n >= need else -(-need // step) * step


def prepare_vision_inputs(image_grid_thw, config: ModelConfig, num_patches: int | None = None, *,
                          num_slots: int | None = None, slot_len: int | None = None,
                          slot_bucket: int | None = None) -> dict:
  """Host-side (numpy) layout tensors for the vision tower of `config.family` (see the module doc).

  Args:
    image_grid_thw: [n_images, 3] (t, h, w) in patches, in the order of the pixel rows (may be empty).
    config: ModelConfig.
    num_patches: P, the rows of `pixel_values` (a static bucket; a multiple of
      spatial_merge_size**2 and at least the real count; default the real count). Rows after
      the real patches are never read.
    num_slots: S, slots of the tower (>= the number of frames; default that number, at least 1).
    slot_len: L, patch positions per slot (a multiple of `slot_unit(config)`, at least what the
      largest frame needs); default :func:`bucket_slot_len` of that need and `slot_bucket`.

  Returns a dict of numpy arrays:
    patch_index [S, L] int32     pixel row of each slot position (-1: padding)
    slot_lengths [S] int32       real patches per slot (0: empty slot)
    pos_hw [S, L, 2] int32       rotary (row, col) of each slot position
    token_slot [P/m^2] int32     slot of the k-th merged token of the batch (image order; -1: padding)
    token_unit [P/m^2] int32     its merged unit in that slot (-1: padding)
    Qwen2.5 only (slot positions are in window order: windows are contiguous):
      window_lengths [S, L/w] int32  real patches of each window of w positions (0: empty)
      window_index [S, L] int32      slot position of each window-layout position (-1: padding)
      full_index [S, L] int32        window-layout position of each slot position (-1: padding)
    Qwen3 only:
      interp_indices [S, L, 4] int32, interp_weights [S, L, 4] float32  bilinear pos-embed taps
  """
  vc = config.vision
  grids = _grids(image_grid_thw)
  frames = _frames(grids)
  mu, merge = vc.merge_unit, vc.spatial_merge_size
  real = sum(h * w for h, w in frames)
  p = real if num_patches is None else int(num_patches)
  if p < real or p % mu:
    raise ValueError(f"num_patches={p} must be >= the real patch count {real} and a multiple of {mu}")
  unit = slot_unit(config)
  need = max([slot_need((1, h, w), config) for h, w in frames] + [unit])
  if slot_len is None:
    slot_len = bucket_slot_len(need, unit, slot_bucket)
  n_slots = max(1, len(frames)) if num_slots is None else int(num_slots)
  if slot_len < need or slot_len % unit:
    raise ValueError(f"slot_len={slot_len} must be >= {need} (the largest frame's need) and a multiple of {unit}")
  if n_slots < len(frames):
    raise ValueError(f"num_slots={n_slots} is fewer than the {len(frames)} image frames")
  S_, L = n_slots, int(slot_len)
  out = {"patch_index": np.full((S_, L), -1), "slot_lengths": np.zeros(S_), "pos_hw": np.zeros((S_, L, 2)),
         "token_slot": np.full(p // mu, -1), "token_unit": np.full(p // mu, -1)}
  qwen25 = config.family == "qwen2_5_vl"
  if qwen25:
    win = window_patches(config)
    vit_win = vc.window_size // merge // vc.patch_size
    out.update(window_lengths=np.zeros((S_, L // win)), window_index=np.full((S_, L), -1),
               full_index=np.full((S_, L), -1))
  else:
    side = int(vc.num_position_embeddings**0.5)
    out.update(interp_indices=np.zeros((S_, L, 4)), interp_weights=np.zeros((S_, L, 4)))
  row = unit_k = 0
  for s, (h, w) in enumerate(frames):
    n = h * w
    if qwen25:
      units, lens = _frame_windows(h, w, merge, vit_win)
      perm = (units[:, None] * mu + np.arange(mu)).ravel()
      order = np.argsort(units, kind="stable")
      plens = lens * mu
      starts = np.concatenate([[0], np.cumsum(plens)[:-1]])
      wpos = np.repeat(np.arange(len(plens)) * win - starts, plens) + np.arange(n)
      out["window_lengths"][s, :len(plens)] = plens
      out["full_index"][s, :n] = wpos
      out["window_index"][s, wpos] = np.arange(n)
    else:
      perm, order = np.arange(n), np.arange(n // mu)
      idx, wts = _interpolation(h, w, side, merge)
      out["interp_indices"][s, :n], out["interp_weights"][s, :n] = idx, wts
    out["patch_index"][s, :n] = row + perm
    out["pos_hw"][s, :n] = _position_hw(h, w, merge)[perm]
    out["slot_lengths"][s] = n
    out["token_slot"][unit_k:unit_k + n // mu] = s
    out["token_unit"][unit_k:unit_k + n // mu] = order
    row += n
    unit_k += n // mu
  return {k: v.astype(np.float32 if k == "interp_weights" else np.int32) for k, v in out.items()}


# Vision-dict entries by their leading axis: slots [S, ...] or merged tokens [P/m^2].
SLOT_KEYS = ("patch_index", "slot_lengths", "pos_hw", "window_lengths", "window_index", "full_index",
             "interp_indices", "interp_weights")
TOKEN_KEYS = ("token_slot", "token_unit")
VISION_ARRAY_KEYS = SLOT_KEYS + TOKEN_KEYS


def device_vision_inputs(vision: dict) -> dict:
  """The array entries of a prepare_vision_inputs dict (what jitted code takes)."""
  return {k: vision[k] for k in VISION_ARRAY_KEYS if k in vision}


def vision_shape(vision: dict) -> tuple[int, int, int]:
  """(merged tokens P / m^2, slots S, slot length L) of a vision dict (with or without a
  leading micro-batch axis)."""
  return (int(np.shape(vision["token_slot"])[-1]),) + tuple(int(x) for x in np.shape(vision["patch_index"])[-2:])


# ----------------------------------------------------------------------------- modules
class VisionAttention(nnx.Module):

  def __init__(self, vc: VisionConfig, *, dtype, param_dtype, rngs, attention_block: int = BLOCK):
    d, n, h = vc.hidden_size, vc.num_heads, vc.head_dim
    kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs, use_bias=True)
    self.qkv = Linear((d,), (3, n, h), ("vision_embed",), (None, "vision_heads", "head_dim"), **kw)
    self.proj = Linear((n, h), (d,), ("vision_heads", "head_dim"), ("vision_embed",), **kw)
    self.scale = h**-0.5
    self.block = attention_block

  def __call__(self, x, cos, sin, lengths):
    """x [B, T, D] (B sequences, each its first lengths[b] positions real), cos/sin [B, T, H]."""
    qkv = self.qkv(x)  # [B, T, 3, N, H]
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    dtype = q.dtype
    q = apply_rope(q.astype(jnp.float32), cos, sin).astype(dtype)
    k = apply_rope(k.astype(jnp.float32), cos, sin).astype(dtype)
    return self.proj(varlen_attention(q, k, v, lengths, scale=self.scale, block=self.block))


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

  def __init__(self, vc: VisionConfig, family: str, *, dtype, param_dtype, rngs, attention_block: int = BLOCK,
               mlp_chunk: int = 0):
    d = vc.hidden_size
    self.mlp_chunk = int(mlp_chunk)
    if family == "qwen2_5_vl":
      self.norm1 = RMSNorm(d, ("vision_embed",), eps=1e-6, dtype=dtype, param_dtype=param_dtype)
      self.norm2 = RMSNorm(d, ("vision_embed",), eps=1e-6, dtype=dtype, param_dtype=param_dtype)
      self.mlp = GatedMLP(d, vc.intermediate_size, vc.hidden_act, "vision_embed", "vision_mlp", use_bias=True,
                          dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    else:
      self.norm1 = LayerNorm(d, ("vision_embed",), eps=1e-6, dtype=dtype, param_dtype=param_dtype)
      self.norm2 = LayerNorm(d, ("vision_embed",), eps=1e-6, dtype=dtype, param_dtype=param_dtype)
      self.mlp = PlainMLP(d, vc.intermediate_size, vc.hidden_act, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.attn = VisionAttention(vc, dtype=dtype, param_dtype=param_dtype, rngs=rngs, attention_block=attention_block)

  def __call__(self, x, cos, sin, lengths, slots: int | None = None):
    """``slots``: the tower's slot count when x is a windowed view [S * W, w, D] (the MLP,
    position-wise, is chunked over each slot's positions: see layers.position_wise)."""
    x = x + self.attn(self.norm1(x), cos, sin, lengths)
    return x + position_wise(self.mlp, self.norm2(x), self.mlp_chunk, slots)


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
  """pixel_values [P, C*t*p*p] (patch rows, gathered into slots by the dict's patch_index) or
  [S, L, C*t*p*p] (already in slot layout: zeros at padding positions) + prepare_vision_inputs
  dict -> (merged [P/m^2, D_text], deepstack list),
  merged features in image order (the k-th <|image_pad|> token of the batch takes row k)."""

  def __init__(self, config: ModelConfig, *, dtype, param_dtype, remat=None, attention_block: int = BLOCK,
               scan_blocks: bool = False, mlp_chunk: int = 0, rngs: nnx.Rngs):
    """remat: None (off), "full", or a jax.checkpoint policy for each block; scan_blocks:
    run runs of consecutive blocks in a lax.scan (see _run_blocks)."""
    vc = config.vision
    self.family = config.family
    self.vc = vc
    self.remat = remat
    self.scan_blocks = scan_blocks
    self.window = window_patches(config)
    family = config.family
    kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.patch_embed = nnx.Dict({"proj": Linear((vc.patch_dim,), (vc.hidden_size,), (None,), ("vision_embed",),
                                                use_bias=family == "qwen3_vl", **kw)})
    if family == "qwen3_vl":
      self.pos_embed = Embed(vc.num_position_embeddings, vc.hidden_size, (None, "vision_embed"), **kw)
    self.blocks = nnx.List([VisionBlock(vc, family, attention_block=attention_block, mlp_chunk=mlp_chunk, **kw)
                            for _ in range(vc.depth)])
    self.merger = PatchMerger(vc, family, postshuffle_norm=False, **kw)
    if family == "qwen3_vl":
      self.deepstack_merger_list = nnx.List(
          [PatchMerger(vc, family, postshuffle_norm=True, **kw) for _ in vc.deepstack_visual_indexes])

  def _run_blocks(self, ids, x, inputs):
    """x [S, L, D] after the consecutive blocks ``ids``; ``inputs(x)`` gives a block's
    (input, cos, sin, lengths) and its output is reshaped back to x's shape.

    With scan_blocks (several ids) the blocks run in a lax.scan over a stacked copy of their
    parameters: a Python loop of rematerialised blocks lets XLA keep every block's
    backward-pass activations alive at once (measured on the CPU compiler: ~0.8 GiB more per
    text layer at 4,096 tokens, ~3 GiB more per vision block of a 29,184-patch image, with
    remat "full" as without), while a scanned stack frees them block by block."""
    shape = x.shape

    def call(gdef, state, x):
      inp, cos, sin, lengths = inputs(x)
      return _shard_slots(nnx.merge(gdef, state)(inp, cos, sin, lengths, shape[0]).reshape(shape))

    def remat(fn, scanned):
      if self.remat is None:
        return fn
      policy = None if self.remat == "full" else self.remat
      return jax.checkpoint(fn, policy=policy, prevent_cse=not scanned)

    splits = [nnx.split(self.blocks[i]) for i in ids]
    if not self.scan_blocks or len(ids) == 1:
      for gdef, state in splits:
        x = remat(functools.partial(call, gdef), False)(state, x)
      return x
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *[state for _, state in splits])
    step = remat(functools.partial(call, splits[0][0]), True)
    return jax.lax.scan(lambda x, state: (step(state, x), None), x, stacked)[0]

  def __call__(self, pixel_values, vision: dict, image_order: bool = True):
    """-> (merged, deepstack list): [P/m^2, D] in image order, or with ``image_order=False``
    [S, L/m^2, D] per slot (sharded like the slots: what a row-aligned layout gathers from
    without leaving the rows' devices, see QwenVL._embed)."""
    vc = self.vc
    arr = lambda k: jnp.asarray(vision[k])
    n_slots, slot_len = vision["patch_index"].shape
    if pixel_values.ndim == 3:  # already in slot layout (train/batching.slot_pixels), sharded like the slots
      if pixel_values.shape[:2] != (n_slots, slot_len):
        raise ValueError(f"pixel_values in slot layout {pixel_values.shape} does not match the vision dict's "
                         f"{n_slots} slots of {slot_len} positions")
      x = _shard_slots(pixel_values)
    else:  # each device gathers the patches of its own slots (the slot arrays are sharded over the batch axes)
      x = _shard_slots(pixel_values[jnp.maximum(arr("patch_index"), 0)])  # [S, L, C*t*p*p]
    x = _shard_slots(self.patch_embed["proj"](x))
    lengths = arr("slot_lengths")
    cos, sin = vision_rope(arr("pos_hw"), vc.head_dim, vc.rope_theta)  # [S, L, H]
    if self.family == "qwen2_5_vl":
      win, n_win = self.window, slot_len // self.window
      to_window = _slot_gather(arr("window_index"))
      to_full = _slot_gather(arr("full_index"))
      cos_w, sin_w = to_window(cos), to_window(sin)
      as_windows = lambda a: a.reshape((n_slots * n_win, win) + a.shape[2:])
      win_lengths = arr("window_lengths").reshape(-1)
      full, windowed = set(vc.fullatt_block_indexes), False
      cos_w, sin_w = as_windows(cos_w), as_windows(sin_w)
      i = 0
      while i < vc.depth:
        if i in full:
          if windowed:
            x, windowed = to_full(x), False
          x = self._run_blocks([i], x, lambda y: (y, cos, sin, lengths))
          i += 1
          continue
        run = [j for j in range(i, vc.depth) if all(k not in full for k in range(i, j + 1))]
        if not windowed:
          x, windowed = to_window(x), True
        x = self._run_blocks(run, x, lambda y: (as_windows(y), cos_w, sin_w, win_lengths))
        i = run[-1] + 1
      if windowed:
        x = to_full(x)
      return self._order(self.merger(x), vision, slot_len, image_order), []
    table = self.pos_embed.embedding[...].astype(x.dtype)
    w = arr("interp_weights").astype(x.dtype)
    x = x + (table[arr("interp_indices")] * w[..., None]).sum(-2)
    deepstack, start = [], 0
    for end in sorted({i for i in vc.deepstack_visual_indexes if i < vc.depth} | {vc.depth - 1}):
      x = self._run_blocks(list(range(start, end + 1)), x, lambda y: (y, cos, sin, lengths))
      start = end + 1
      if end in vc.deepstack_visual_indexes:
        merged = self.deepstack_merger_list[vc.deepstack_visual_indexes.index(end)](x)
        deepstack.append(self._order(merged, vision, slot_len, image_order))
    return self._order(self.merger(x), vision, slot_len, image_order), deepstack

  def _order(self, merged, vision: dict, slot_len: int, image_order: bool):
    if image_order:
      return self._image_order(merged, vision, slot_len)
    n_slots = vision["patch_index"].shape[0]
    return _shard_slots(merged.reshape(n_slots, slot_len // self.vc.merge_unit, merged.shape[-1]))

  def _image_order(self, merged, vision: dict, slot_len: int):
    """Merged features of the slots [S * L/m^2, D] -> [P/m^2, D] in image order (padding rows hold
    an arbitrary feature: no image token takes them)."""
    units = slot_len // self.vc.merge_unit
    flat = jnp.maximum(jnp.asarray(vision["token_slot"]), 0) * units + jnp.maximum(jnp.asarray(vision["token_unit"]), 0)
    return merged[flat]


def _slot_gather(index):
  """Per-slot reordering a [S, L, ...] -> a[s, index[s, j]] (index -1: padding, takes position 0)."""
  index = jnp.maximum(index, 0)
  return lambda a: _shard_slots(jnp.take_along_axis(a, index.reshape(index.shape + (1,) * (a.ndim - 2)), axis=1))


def _shard_slots(x):
  """Keep [S, ...] activations sharded over the batch mesh axes (see S.constrain_batch; the
  slot arrays are placed sharded over the batch axes by train/batching.put_batch)."""
  return S.constrain_batch(x, 0)
