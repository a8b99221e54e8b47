"""What the JAX-vs-transformers benchmarks share: model configs, the export of JAX params to a
transformers checkpoint, and the transformers inputs of a batch."""
from __future__ import annotations

import numpy as np
from flax import nnx

from guilibra_jax.models import ModelConfig, TextConfig, VisionConfig, named_config, save_hf
from guilibra_jax.train.fake_batch import tiny_config


def bench100m_config() -> ModelConfig:
    """~113M params shaped like Qwen2.5-VL: text 512 x 8 layers, vision 384 x 4, Qwen's tied vocabulary."""
    return ModelConfig(
        family="qwen2_5_vl",
        text=TextConfig(vocab_size=151936, hidden_size=512, intermediate_size=1536, num_layers=8, num_heads=8,
                        num_kv_heads=2, head_dim=64, mrope_section=(8, 12, 12)),
        vision=VisionConfig(depth=4, hidden_size=384, intermediate_size=1024, num_heads=6, out_hidden_size=512,
                            window_size=112, fullatt_block_indexes=(3,)),
        tie_word_embeddings=True)


# Benchmark-only sizes; any other name goes to guilibra_jax.models.named_config.
BENCH_CONFIGS = {
    "bench100m": bench100m_config,
    # ~0.8M params, 4k vocabulary, windowed vision attention (window 56 px): a parity check in seconds.
    "tiny": lambda: tiny_config("qwen2_5_vl", vocab=4096, hidden=128, layers=2),
}


def bench_config(name: str) -> ModelConfig:
    return BENCH_CONFIGS[name]() if name in BENCH_CONFIGS else named_config(name)


def export_hf(graphdef: nnx.GraphDef, params, config: ModelConfig, path: str) -> None:
    """Write ``params`` (the model's pure dict, on device) as a transformers checkpoint in ``path``."""
    save_hf(nnx.merge(graphdef, params), config, path)


def square_image_grids(batch: int, image_px: int, config: ModelConfig) -> np.ndarray:
    """image_grid_thw [batch, 3] of one image_px x image_px image per row (fake_sft_batch's layout)."""
    g = image_px // config.vision.patch_size
    return np.array([(1, g, g)] * batch, np.int64)


def torch_inputs(input_ids, attention_mask, image_grid_thw, pixel_values, config: ModelConfig, device="cpu") -> dict:
    """transformers kwargs for Qwen*-VL. M-RoPE positions are left to transformers, which derives them
    from input_ids, mm_token_type_ids, image_grid_thw and attention_mask (without mm_token_type_ids,
    transformers 5 silently falls back to 1-D positions)."""
    import torch

    ids = np.asarray(input_ids, np.int64)
    t = lambda x: torch.tensor(np.asarray(x), device=device)
    return dict(input_ids=t(ids), attention_mask=t(np.asarray(attention_mask, np.int64)),
                mm_token_type_ids=t((ids == config.image_token_id).astype(np.int64)),
                image_grid_thw=t(np.asarray(image_grid_thw, np.int64)), pixel_values=t(pixel_values))
