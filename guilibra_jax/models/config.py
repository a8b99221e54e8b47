"""Model configuration for the Qwen2.5-VL and Qwen3-VL families.

`ModelConfig.from_hf` reads a Hugging Face `config.json` (dict or folder/file path) in
either family's layout (old flat Qwen2.5-VL files, transformers 5 nested files);
`to_hf` writes a dict that transformers' `AutoConfig` loads back to the same model.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Literal

from guilibra_jax.choices import FAMILIES

Family = Literal["qwen2_5_vl", "qwen3_vl"]


@dataclasses.dataclass(frozen=True)
class TextConfig:
  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rms_norm_eps: float = 1e-6
  rope_theta: float = 1_000_000.0
  mrope_section: tuple[int, int, int] = (16, 24, 24)
  mrope_interleaved: bool = False  # Qwen3-VL: True
  qkv_bias: bool = True  # Qwen2.5: q/k/v bias; Qwen3: none
  qk_norm: bool = False  # Qwen3: RMSNorm on q and k per head
  max_position_embeddings: int = 128_000
  bos_token_id: int | None = 151643
  eos_token_id: int | list[int] | None = 151645
  pad_token_id: int | None = None


@dataclasses.dataclass(frozen=True)
class VisionConfig:
  depth: int
  hidden_size: int
  intermediate_size: int
  num_heads: int
  out_hidden_size: int
  patch_size: int = 14
  temporal_patch_size: int = 2
  spatial_merge_size: int = 2
  in_channels: int = 3
  hidden_act: str = "silu"
  rope_theta: float = 10000.0
  # Qwen2.5-VL only
  window_size: int = 112
  fullatt_block_indexes: tuple[int, ...] = ()
  tokens_per_second: int = 2
  # Qwen3-VL only
  num_position_embeddings: int = 0
  deepstack_visual_indexes: tuple[int, ...] = ()

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def patch_dim(self) -> int:
    return self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size

  @property
  def merge_unit(self) -> int:
    return self.spatial_merge_size**2


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  family: Family
  text: TextConfig
  vision: VisionConfig
  image_token_id: int = 151655
  video_token_id: int = 151656
  vision_start_token_id: int = 151652
  vision_end_token_id: int = 151653
  tie_word_embeddings: bool = False

  def __post_init__(self):
    if self.family not in FAMILIES:
      raise ValueError(f"family must be one of {FAMILIES}, got {self.family!r}")
    if sum(self.text.mrope_section) != self.text.head_dim // 2:
      raise ValueError(
          f"mrope_section {self.text.mrope_section} must sum to head_dim // 2 = {self.text.head_dim // 2}")

  def replace(self, **kw) -> "ModelConfig":
    return dataclasses.replace(self, **kw)

  # ------------------------------------------------------------------ HF I/O
  @classmethod
  def from_hf(cls, cfg: dict | str | os.PathLike) -> "ModelConfig":
    """Build from a HF config dict, a config.json path, or a checkpoint folder."""
    if not isinstance(cfg, dict):
      path = os.fspath(cfg)
      if os.path.isdir(path):
        path = os.path.join(path, "config.json")
      with open(path) as f:
        cfg = json.load(f)
    family = cfg.get("model_type")
    if family not in FAMILIES:
      raise ValueError(f"config.json model_type {family!r} is not one of {FAMILIES}")
    # Old Qwen2.5-VL files are flat: text keys at top level; new ones nest them.
    tc = dict(cfg)
    tc.update(cfg.get("text_config") or {})
    vc = dict(cfg.get("vision_config") or {})
    rope = dict(tc.get("rope_parameters") or tc.get("rope_scaling") or {})
    theta = rope.get("rope_theta", tc.get("rope_theta", 1_000_000.0 if family == "qwen2_5_vl" else 5_000_000.0))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", "mrope"):
      raise ValueError(f"text rope_type {rope_type!r} is not supported (only default M-RoPE)")
    heads = tc["num_attention_heads"]
    head_dim = tc.get("head_dim") or tc["hidden_size"] // heads
    default_section = (16, 24, 24) if family == "qwen2_5_vl" else (24, 20, 20)
    text = TextConfig(
        vocab_size=tc["vocab_size"],
        hidden_size=tc["hidden_size"],
        intermediate_size=tc["intermediate_size"],
        num_layers=tc["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=tc.get("num_key_value_heads") or heads,
        head_dim=head_dim if family == "qwen3_vl" else tc["hidden_size"] // heads,
        rms_norm_eps=tc.get("rms_norm_eps", 1e-6),
        rope_theta=float(theta),
        mrope_section=tuple(rope.get("mrope_section", default_section)),
        mrope_interleaved=family == "qwen3_vl",
        qkv_bias=True if family == "qwen2_5_vl" else bool(tc.get("attention_bias", False)),
        qk_norm=family == "qwen3_vl",
        max_position_embeddings=tc.get("max_position_embeddings", 128_000),
        bos_token_id=tc.get("bos_token_id"),
        eos_token_id=tc.get("eos_token_id"),
        pad_token_id=tc.get("pad_token_id"),
    )
    vrope = vc.get("rope_parameters") or {}
    vision = VisionConfig(
        depth=vc["depth"],
        hidden_size=vc.get("hidden_size", vc.get("embed_dim")),
        intermediate_size=vc["intermediate_size"],
        num_heads=vc["num_heads"],
        out_hidden_size=vc["out_hidden_size"],
        patch_size=vc.get("patch_size", 14),
        temporal_patch_size=vc.get("temporal_patch_size", 2),
        spatial_merge_size=vc.get("spatial_merge_size", 2),
        in_channels=vc.get("in_channels", vc.get("in_chans", 3)),
        hidden_act=vc.get("hidden_act", "silu" if family == "qwen2_5_vl" else "gelu_pytorch_tanh"),
        rope_theta=float(vrope.get("rope_theta", 10000.0)),
        window_size=vc.get("window_size", 112),
        fullatt_block_indexes=tuple(vc.get("fullatt_block_indexes", ())),
        tokens_per_second=vc.get("tokens_per_second", 2),
        num_position_embeddings=vc.get("num_position_embeddings", 0),
        deepstack_visual_indexes=tuple(vc.get("deepstack_visual_indexes", ())),
    )
    tie = tie_word_embeddings_of(cfg, family)
    return cls(
        family=family, text=text, vision=vision,
        image_token_id=cfg.get("image_token_id", 151655),
        video_token_id=cfg.get("video_token_id", 151656),
        vision_start_token_id=cfg.get("vision_start_token_id", 151652),
        vision_end_token_id=cfg.get("vision_end_token_id", 151653),
        tie_word_embeddings=tie,
    )

  def to_hf(self) -> dict[str, Any]:
    """A config.json dict in transformers 5's nested layout for this family."""
    t, v = self.text, self.vision
    rope = {"rope_type": "default", "rope_theta": t.rope_theta, "mrope_section": list(t.mrope_section)}
    text = {
        "vocab_size": t.vocab_size, "hidden_size": t.hidden_size,
        "intermediate_size": t.intermediate_size, "num_hidden_layers": t.num_layers,
        "num_attention_heads": t.num_heads, "num_key_value_heads": t.num_kv_heads,
        "hidden_act": "silu", "rms_norm_eps": t.rms_norm_eps, "rope_parameters": rope,
        "max_position_embeddings": t.max_position_embeddings,
        "bos_token_id": t.bos_token_id, "eos_token_id": t.eos_token_id, "pad_token_id": t.pad_token_id,
        "model_type": f"{self.family}_text", "attention_dropout": 0.0, "initializer_range": 0.02,
        "use_cache": True, "tie_word_embeddings": self.tie_word_embeddings,  # both flags agree
    }
    vision = {
        "depth": v.depth, "hidden_size": v.hidden_size, "intermediate_size": v.intermediate_size,
        "num_heads": v.num_heads, "out_hidden_size": v.out_hidden_size, "patch_size": v.patch_size,
        "temporal_patch_size": v.temporal_patch_size, "spatial_merge_size": v.spatial_merge_size,
        "in_channels": v.in_channels, "hidden_act": v.hidden_act, "initializer_range": 0.02,
        "rope_parameters": {"rope_type": "axial", "rope_theta": v.rope_theta},
        "model_type": f"{self.family}_vision",
    }
    if self.family == "qwen2_5_vl":
      text.update(use_sliding_window=False, sliding_window=None, max_window_layers=t.num_layers)
      vision.update(window_size=v.window_size, fullatt_block_indexes=list(v.fullatt_block_indexes),
                    tokens_per_second=v.tokens_per_second)
      arch = "Qwen2_5_VLForConditionalGeneration"
    else:
      text.update(head_dim=t.head_dim, attention_bias=t.qkv_bias)
      vision.update(num_position_embeddings=v.num_position_embeddings,
                    deepstack_visual_indexes=list(v.deepstack_visual_indexes))
      arch = "Qwen3VLForConditionalGeneration"
    return {
        "architectures": [arch], "model_type": self.family,
        "text_config": text, "vision_config": vision,
        "image_token_id": self.image_token_id, "video_token_id": self.video_token_id,
        "vision_start_token_id": self.vision_start_token_id,
        "vision_end_token_id": self.vision_end_token_id,
        "tie_word_embeddings": self.tie_word_embeddings,
    }


def tie_word_embeddings_of(cfg: dict, family: str) -> bool:
  """Whether transformers 5 ties lm_head to the input embeddings for this config.json dict.

  Qwen3-VL: the top-level flag alone decides (absent = untied); a ``text_config`` flag is
  ignored. Qwen2.5-VL: the top-level flag, or (pre-v5 files) ``text_config``'s when the
  top-level one is false, as ``Qwen2_5_VLConfig`` forwards it.
  """
  top = bool(cfg.get("tie_word_embeddings", False))
  if family == "qwen3_vl":
    return top
  return top or bool((cfg.get("text_config") or {}).get("tie_word_embeddings", False))


# ---------------------------------------------------------------- named configs
def _qwen25(hidden, inter, layers, heads, kv, vocab, tie) -> ModelConfig:
  return ModelConfig(
      family="qwen2_5_vl",
      text=TextConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_layers=layers,
                      num_heads=heads, num_kv_heads=kv, head_dim=hidden // heads, rope_theta=1_000_000.0,
                      mrope_section=(16, 24, 24), qkv_bias=True, max_position_embeddings=128_000),
      vision=VisionConfig(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16,
                          out_hidden_size=hidden, hidden_act="silu", window_size=112,
                          fullatt_block_indexes=(7, 15, 23, 31), tokens_per_second=2),
      tie_word_embeddings=tie)


def _qwen3(hidden, inter, layers, heads, kv, tie, vdepth, vhidden, vinter, deepstack) -> ModelConfig:
  return ModelConfig(
      family="qwen3_vl",
      text=TextConfig(vocab_size=151936, hidden_size=hidden, intermediate_size=inter, num_layers=layers,
                      num_heads=heads, num_kv_heads=kv, head_dim=128, rope_theta=5_000_000.0,
                      mrope_section=(24, 20, 20), mrope_interleaved=True, qkv_bias=False, qk_norm=True,
                      max_position_embeddings=262_144),
      vision=VisionConfig(depth=vdepth, hidden_size=vhidden, intermediate_size=vinter, num_heads=16,
                          out_hidden_size=hidden, patch_size=16, hidden_act="gelu_pytorch_tanh",
                          num_position_embeddings=2304, deepstack_visual_indexes=deepstack),
      tie_word_embeddings=tie)


_NAMED = {
    "qwen2_5_vl_3b": lambda: _qwen25(2048, 11008, 36, 16, 2, 151936, True),
    "qwen2_5_vl_7b": lambda: _qwen25(3584, 18944, 28, 28, 4, 152064, False),
    "qwen3_vl_2b": lambda: _qwen3(2048, 6144, 28, 16, 8, True, 24, 1024, 4096, (5, 11, 17)),
    "qwen3_vl_4b": lambda: _qwen3(2560, 9728, 36, 32, 8, True, 24, 1024, 4096, (5, 11, 17)),
    "qwen3_vl_8b": lambda: _qwen3(4096, 12288, 36, 32, 8, False, 27, 1152, 4304, (8, 16, 24)),
    "qwen3_vl_32b": lambda: _qwen3(5120, 25600, 64, 64, 8, False, 27, 1152, 4304, (8, 16, 24)),
}


def named_config(name: str) -> ModelConfig:
  """Real sizes of the public checkpoints (Qwen/Qwen2.5-VL-7B-Instruct, ...)."""
  key = name.lower().replace("-", "_").replace(".", "_")
  if key not in _NAMED:
    raise KeyError(f"unknown model name {name!r}; known: {sorted(_NAMED)}")
  return _NAMED[key]()
