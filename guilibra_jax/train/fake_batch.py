"""Random but well-formed ASFT batches (tokens, image pads, M-RoPE positions, vision
metadata, loss segments) for tests and throughput benchmarks."""

from __future__ import annotations

import numpy as np

from guilibra_jax import models as M
from guilibra_jax.models.vision import device_vision_inputs


def fake_sft_batch(model_config: M.ModelConfig, *, batch: int = 2, seq_len: int = 64,
                   image_hw: tuple[int, int] | None = (56, 84), seed: int = 0, left_pad: int = 0,
                   loss_fraction: float = 0.5) -> dict:
    """One batch in the train step's format (no micro axis). Each row gets one image of
    ``image_hw`` pixels (None: text only), then random text whose last ``loss_fraction``
    (the response; all but its last position) carries loss segments 1-3; the first
    ``left_pad`` positions of row 0 are padding."""
    if not 0.0 < loss_fraction < 1.0:
        raise ValueError(f"loss_fraction={loss_fraction}: expected a fraction in (0, 1)")
    rng = np.random.default_rng(seed)
    vc = model_config.vision
    vocab = model_config.text.vocab_size
    special = {model_config.image_token_id, model_config.vision_start_token_id, model_config.vision_end_token_id,
               model_config.video_token_id}
    ids = rng.integers(0, vocab, size=(batch, seq_len))
    while np.isin(ids, list(special)).any():
        bad = np.isin(ids, list(special))
        ids[bad] = rng.integers(0, vocab, size=int(bad.sum()))
    grids, pixels = [], []
    n_tokens = 0
    if image_hw is not None:
        gh, gw = image_hw[0] // vc.patch_size, image_hw[1] // vc.patch_size
        n_tokens = gh * gw // vc.merge_unit
        if 2 + n_tokens + left_pad + 4 > seq_len:
            raise ValueError(f"seq_len={seq_len} is too short for an image of {n_tokens} tokens")
    seg = np.ones((batch, seq_len), np.int32)
    for b in range(batch):
        start = left_pad if b == 0 else 0
        seg[b, :start] = 0
        if image_hw is not None:
            ids[b, start] = model_config.vision_start_token_id
            ids[b, start + 1:start + 1 + n_tokens] = model_config.image_token_id
            ids[b, start + 1 + n_tokens] = model_config.vision_end_token_id
            grids.append((1, gh, gw))
            pixels.append(rng.standard_normal((gh * gw, vc.patch_dim)).astype(np.float32))
    targets = np.concatenate([ids[:, 1:], ids[:, :1]], axis=1)
    loss_segments = np.zeros((batch, seq_len), np.int32)
    half = int(seq_len * (1.0 - loss_fraction))  # seq_len // 2 at 0.5
    loss_segments[:, half:-1] = rng.integers(1, 4, size=(batch, seq_len - half - 1))
    loss_segments[seg == 0] = 0
    grid_arr = np.asarray(grids, np.int64).reshape(-1, 3)
    positions, _ = M.get_rope_index(ids, seg, grid_arr if len(grids) else None, model_config)
    out = {"input_ids": ids.astype(np.int32), "positions": positions.astype(np.int32), "segment_ids": seg,
           "targets": targets.astype(np.int32), "loss_segments": loss_segments}
    if image_hw is not None:
        out["pixel_values"] = np.concatenate(pixels)
        out["vision"] = device_vision_inputs(M.prepare_vision_inputs(grid_arr, model_config))
    return out


def tiny_config(family: str = "qwen2_5_vl", vocab: int = 256, hidden: int = 64, layers: int = 2) -> M.ModelConfig:
    """A tiny random-init config (ids of the special tokens at the top of the vocabulary)."""
    heads, kv = 4, 2
    head_dim = hidden // heads
    half = head_dim // 2
    section = (half // 4, (half - half // 4) // 2, half - half // 4 - (half - half // 4) // 2)
    text = M.TextConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_layers=layers,
                        num_heads=heads, num_kv_heads=kv, head_dim=head_dim, rope_theta=10_000.0,
                        mrope_section=section, mrope_interleaved=family == "qwen3_vl",
                        qkv_bias=family == "qwen2_5_vl", qk_norm=family == "qwen3_vl", bos_token_id=None,
                        eos_token_id=vocab - 1)
    if family == "qwen2_5_vl":
        vision = M.VisionConfig(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=hidden,
                                patch_size=14, window_size=56, fullatt_block_indexes=(1,))
    else:
        vision = M.VisionConfig(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=hidden,
                                patch_size=16, hidden_act="gelu_pytorch_tanh", num_position_embeddings=16,
                                deepstack_visual_indexes=(0,))
    return M.ModelConfig(family=family, text=text, vision=vision, image_token_id=vocab - 2,
                         video_token_id=vocab - 3, vision_start_token_id=vocab - 4, vision_end_token_id=vocab - 5,
                         tie_word_embeddings=True)
