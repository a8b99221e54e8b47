"""Flax NNX port of Qwen2.5-VL and Qwen3-VL."""
from guilibra_jax.models.checkpoint import CheckpointError, load_hf, save_hf
from guilibra_jax.models.config import ModelConfig, TextConfig, VisionConfig, named_config
from guilibra_jax.models.model import QwenVL, param_count
from guilibra_jax.models.rope_index import get_rope_index
from guilibra_jax.models.vision import prepare_vision_inputs

__all__ = ["ModelConfig", "TextConfig", "VisionConfig", "named_config", "load_hf", "save_hf", "QwenVL",
           "get_rope_index", "prepare_vision_inputs", "param_count", "CheckpointError"]
