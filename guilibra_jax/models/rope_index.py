"""Host-side 3-D (temporal, height, width) M-RoPE positions, as transformers computes them.

Pure numpy: the data pipeline calls this in its collate step, outside jit.
"""
from __future__ import annotations

import numpy as np

from guilibra_jax.models.config import ModelConfig


def get_rope_index(input_ids, attention_mask, image_grid_thw, config: ModelConfig):
  """M-RoPE positions equal to transformers' `model.model.get_rope_index`.

  Args:
    input_ids: [B, T] ints.
    attention_mask: [B, T] (1 = real token, 0 = padding, left or right) or None.
    image_grid_thw: [n_images, 3] (t, h, w) in patches, images in order across the batch
      (row 0's images first), or None for text only.
    config: the model's ModelConfig (image token id, spatial merge size).

  Returns:
    positions: [3, B, T] int32; padding positions are 0.
    rope_deltas: [B] int32, max position + 1 - number of real tokens; the position of the
      next generated token is its text index + delta on all three axes.
  """
  input_ids = np.asarray(input_ids)
  if input_ids.ndim != 2:
    raise ValueError(f"input_ids must be [B, T], got shape {input_ids.shape}")
  b, t = input_ids.shape
  mask = np.ones((b, t), bool) if attention_mask is None else np.asarray(attention_mask).astype(bool)
  grids = np.zeros((0, 3), np.int64) if image_grid_thw is None else np.asarray(image_grid_thw, np.int64)
  grids = grids.reshape(-1, 3)
  merge = config.vision.spatial_merge_size
  positions = np.zeros((3, b, t), np.int64)
  deltas = np.zeros((b,), np.int64)
  next_image = 0
  for row in range(b):
    ids = input_ids[row][mask[row]]
    is_image = ids == config.image_token_id
    n = len(ids)
    pos = np.zeros((3, n), np.int64)
    cur, i = 0, 0
    while i < n:
      if not is_image[i]:
        j = i
        while j < n and not is_image[j]:
          j += 1
        pos[:, i:j] = np.arange(j - i) + cur
        cur += j - i
        i = j
        continue
      # A run of image tokens: consume grids in order until the run is covered.
      j = i
      while j < n and is_image[j]:
        j += 1
      while i < j:
        if next_image >= len(grids):
          raise ValueError(f"row {row}: more image placeholder runs than image_grid_thw entries ({len(grids)})")
        gt, gh, gw = (int(x) for x in grids[next_image])
        next_image += 1
        lh, lw = gh // merge, gw // merge
        count = gt * lh * lw
        if i + count > j:
          raise ValueError(f"row {row}: image {next_image - 1} with grid {(gt, gh, gw)} needs {count} "
                           f"<|image_pad|> tokens, found {j - i}")
        tt, hh, ww = np.meshgrid(np.arange(gt), np.arange(lh), np.arange(lw), indexing="ij")
        pos[:, i:i + count] = np.stack([tt.ravel(), hh.ravel(), ww.ravel()]) + cur
        cur += max(gh, gw) // merge
        i += count
    positions[:, row, mask[row]] = pos
    deltas[row] = (pos.max() + 1 - n) if n else 0
  if next_image != len(grids):
    raise ValueError(f"image_grid_thw has {len(grids)} entries but the input_ids hold {next_image} images")
  return positions.astype(np.int32), deltas.astype(np.int32)


def text_positions(attention_mask) -> np.ndarray:
  """[3, B, T] positions for text-only rows: index among real tokens, 0 on padding."""
  m = np.asarray(attention_mask).astype(np.int64)
  pos = np.where(m > 0, np.cumsum(m, -1) - 1, 0)
  return np.broadcast_to(pos[None], (3,) + pos.shape).astype(np.int32)
