"""Configs: HF config.json round trip, real-size parameter counts, logical sharding names."""
import jax
import pytest
import torch
from flax import nnx
from jax.sharding import PartitionSpec as P

from guilibra_jax.models import ModelConfig, QwenVL, named_config, param_count

# Published counts (model cards / safetensors metadata). Qwen3-VL-32B: the figure we were given,
# 33,417,379,840, is NOT reproduced: transformers on the meta device, built from our
# named_config("qwen3_vl_32b"), counts 33,357,390,064, and so do we; we check against transformers.
PUBLISHED = {
    "qwen2_5_vl_3b": 3_754_622_976,
    "qwen2_5_vl_7b": 8_292_166_656,
    "qwen3_vl_4b": 4_437_815_808,
    "qwen3_vl_8b": 8_767_123_696,
    "qwen3_vl_32b": None,
}


def _hf_meta_count(config: ModelConfig) -> int:
  from transformers import (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen3VLConfig,
                            Qwen3VLForConditionalGeneration)
  if config.family == "qwen2_5_vl":
    cls, cfg = Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLConfig(**config.to_hf())
  else:
    cls, cfg = Qwen3VLForConditionalGeneration, Qwen3VLConfig(**config.to_hf())
  with torch.device("meta"):
    model = cls(cfg)
  return sum(p.numel() for p in model.parameters())  # tied weights are counted once


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_param_count_equals_transformers_on_meta(name):
  config = named_config(name)
  n = param_count(config)
  assert n == _hf_meta_count(config)
  if PUBLISHED[name] is not None:
    assert n == PUBLISHED[name]


def test_hf_config_round_trip_through_transformers(tmp_path):
  from transformers import AutoConfig
  for name in ("qwen2_5_vl_7b", "qwen3_vl_4b"):
    config = named_config(name)
    hf = AutoConfig.for_model(**config.to_hf())
    assert ModelConfig.from_hf(hf.to_dict()) == config


def test_reads_old_flat_qwen2_5_vl_config_json():
  flat = {
      "architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl",
      "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
      "num_key_value_heads": 4, "vocab_size": 152064, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
      "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}, "tie_word_embeddings": False,
      "max_position_embeddings": 128000, "bos_token_id": 151643, "eos_token_id": 151645,
      "vision_config": {"depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420,
                        "num_heads": 16, "in_chans": 3, "out_hidden_size": 3584, "patch_size": 14,
                        "spatial_merge_size": 2, "spatial_patch_size": 14, "window_size": 112,
                        "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2, "temporal_patch_size": 2},
  }
  assert ModelConfig.from_hf(flat) == named_config("qwen2_5_vl_7b")


def test_params_carry_logical_axis_names(loaded):
  _, model, _, _ = loaded["qwen3_vl"]
  specs = nnx.get_partition_spec(nnx.state(model, nnx.Param))
  lm = specs["language_model"]
  assert lm["embed_tokens"]["embedding"] == P("vocab", "embed")
  assert lm["layers"][0]["self_attn"]["q_proj"]["kernel"] == P("embed", "heads", "head_dim")
  assert lm["layers"][0]["self_attn"]["k_proj"]["kernel"] == P("embed", "kv_heads", "head_dim")
  assert lm["layers"][0]["mlp"]["down_proj"]["kernel"] == P("mlp", "embed")
  assert specs["lm_head"]["kernel"] == P("embed", "vocab")
  assert specs["visual"]["blocks"][0]["mlp"]["linear_fc1"]["kernel"] == P("vision_embed", "vision_mlp")
  assert specs["visual"]["blocks"][0]["attn"]["qkv"]["kernel"] == P("vision_embed", None, "vision_heads",
                                                                          "head_dim")
  leaves = jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, P))
  assert all(isinstance(x, P) for x in leaves)


def test_scanned_params_get_a_layers_axis():
  config = named_config("qwen3_vl_4b")
  abstract = nnx.eval_shape(lambda: QwenVL(config, scan_layers=True))
  specs = nnx.get_partition_spec(nnx.state(abstract, nnx.Param))
  assert specs["language_model"]["layers"]["self_attn"]["q_proj"]["kernel"] == P(
      "layers", "embed", "heads", "head_dim")
