"""Tiny random Hugging Face Qwen-VL models and inputs, shared by the model tests."""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import torch

IMAGE, VSTART, VEND = 290, 292, 293
VOCAB = 300


def build_hf(family: str, *, tie: bool = False, seed: int = 0, text: dict | None = None, vision: dict | None = None):
  """A tiny random model; ``text`` / ``vision`` override keys of its text / vision config."""
  from transformers import (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen3VLConfig,
                            Qwen3VLForConditionalGeneration)
  torch.manual_seed(seed)
  ids = dict(image_token_id=IMAGE, video_token_id=291, vision_start_token_id=VSTART, vision_end_token_id=VEND,
             tie_word_embeddings=tie)
  if family == "qwen2_5_vl":
    cfg = Qwen2_5_VLConfig(
        text_config=dict(dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
                         rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[2, 3, 3]),
                         bos_token_id=None, eos_token_id=None), **(text or {})),
        # window 56 px = 2x2 merged units: a 4x6-unit image has several (edge) windows.
        vision_config=dict(dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64,
                                patch_size=14, window_size=56, fullatt_block_indexes=[1]), **(vision or {})),
        **ids)
    model = Qwen2_5_VLForConditionalGeneration(cfg)
  else:
    cfg = Qwen3VLConfig(
        text_config=dict(dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, attention_bias=False,
                         rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[2, 3, 3])),
                         **(text or {})),
        vision_config=dict(dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64,
                                patch_size=14, num_position_embeddings=16, deepstack_visual_indexes=[0, 1]),
                           **(vision or {})),
        **ids)
    model = Qwen3VLForConditionalGeneration(cfg)
  # Random init leaves norms at 1 and biases at 0; perturb everything so the test sees them.
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("bias") or "norm" in name or "ln_q" in name:
        p.add_(0.1 * torch.randn_like(p))
  return model.eval()


def image_grid(h_px: int, w_px: int, patch: int = 14) -> tuple[int, int, int]:
  return (1, h_px // patch, w_px // patch)


def make_batch(rows: list[list], pad_to: int | None = None, seed: int = 0):
  """rows: list of token lists where an item ("img", (t, h, w)) expands to vstart + pads + vend.

  Left-pads to pad_to (or the longest row). Returns input_ids, attention_mask, mm_token_type_ids,
  image_grid_thw (or None), pixel_values (or None) as numpy.
  """
  rng = np.random.default_rng(seed)
  seqs, grids = [], []
  for row in rows:
    seq = []
    for item in row:
      if isinstance(item, tuple):
        grid = item[1]
        grids.append(grid)
        seq += [VSTART] + [IMAGE] * (grid[0] * grid[1] * grid[2] // 4) + [VEND]
      else:
        seq.append(int(item))
    seqs.append(seq)
  t = max(pad_to or 0, max(len(s) for s in seqs))
  ids = np.zeros((len(seqs), t), np.int64)
  mask = np.zeros((len(seqs), t), np.int64)
  for i, s in enumerate(seqs):
    ids[i, t - len(s):] = s
    mask[i, t - len(s):] = 1
  mm = (ids == IMAGE).astype(np.int64)
  if grids:
    g = np.asarray(grids, np.int64)
    n = int((g[:, 0] * g[:, 1] * g[:, 2]).sum())
    pixels = rng.standard_normal((n, 3 * 2 * 14 * 14)).astype(np.float32)
    return ids, mask, mm, g, pixels
  return ids, mask, mm, None, None


def text_tokens(n: int, seed: int) -> list[int]:
  return list(np.random.default_rng(seed).integers(1, 280, size=n))
