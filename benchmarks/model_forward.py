"""Forward time of a ~100M-parameter Qwen2.5-VL-shaped model: JAX (jit) vs transformers (PyTorch).

Same random weights (exported from the JAX model with save_hf, loaded by transformers) and the
same inputs: a batch of 2 x 256 tokens, one 224x224 image per row. Prints one JSON line.

  python benchmarks/model_forward.py [--repeats 5]
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from guilibra_jax.models import (ModelConfig, QwenVL, get_rope_index, param_count, prepare_vision_inputs, save_hf)
from guilibra_jax.models.config import TextConfig, VisionConfig


def bench_config() -> ModelConfig:
  return ModelConfig(
      family="qwen2_5_vl",
      text=TextConfig(vocab_size=151936, hidden_size=512, intermediate_size=1536, num_layers=8, num_heads=8,
                      num_kv_heads=2, head_dim=64, mrope_section=(8, 12, 12)),
      vision=VisionConfig(depth=4, hidden_size=384, intermediate_size=1024, num_heads=6, out_hidden_size=512,
                          window_size=112, fullatt_block_indexes=(3,)),
      tie_word_embeddings=True)


def make_inputs(config: ModelConfig, batch: int = 2, seq: int = 256, image_px: int = 224):
  rng = np.random.default_rng(0)
  grid = (1, image_px // 14, image_px // 14)
  n_img = grid[1] * grid[2] // 4
  ids = rng.integers(0, 150000, size=(batch, seq))
  ids[:, 5] = config.vision_start_token_id
  ids[:, 6:6 + n_img] = config.image_token_id
  ids[:, 6 + n_img] = config.vision_end_token_id
  mask = np.ones_like(ids)
  grids = np.array([grid] * batch)
  pixels = rng.standard_normal((batch * grid[1] * grid[2], config.vision.patch_dim)).astype(np.float32)
  return ids, mask, grids, pixels


def timeit(fn, repeats):
  fn()  # warm-up / compile
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t)
  return float(np.median(times))


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--repeats", type=int, default=5)
  args = parser.parse_args()
  import torch
  from transformers import AutoModelForImageTextToText

  config = bench_config()
  model = QwenVL(config, rngs=nnx.Rngs(0))
  ids, mask, grids, pixels = make_inputs(config)
  positions, _ = get_rope_index(ids, mask, grids, config)
  vision = prepare_vision_inputs(grids, config)
  fwd = nnx.jit(lambda m, *a: m(*a))
  jargs = (jnp.asarray(ids, jnp.int32), jnp.asarray(positions), jnp.asarray(mask, jnp.int32), jnp.asarray(pixels),
           vision)
  t0 = time.perf_counter()
  jax.block_until_ready(fwd(model, *jargs))
  compile_s = time.perf_counter() - t0
  jax_s = timeit(lambda: jax.block_until_ready(fwd(model, *jargs)), args.repeats)

  with tempfile.TemporaryDirectory() as d:
    save_hf(model, config, d)
    hf = AutoModelForImageTextToText.from_pretrained(d).eval()
  targs = dict(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
               mm_token_type_ids=torch.tensor((ids == config.image_token_id).astype(np.int64)),
               image_grid_thw=torch.tensor(grids), pixel_values=torch.tensor(pixels))
  with torch.no_grad():
    torch_s = timeit(lambda: hf(**targs), args.repeats)
    ref = hf(**targs).logits.numpy()
  got = np.asarray(fwd(model, *jargs))
  print(json.dumps({
      "benchmark": "model_forward", "params": param_count(config), "batch": list(ids.shape),
      "image_px": 224, "backend": jax.default_backend(), "torch_threads": torch.get_num_threads(),
      "jax_s": round(jax_s, 4), "jax_compile_s": round(compile_s, 2), "torch_s": round(torch_s, 4),
      "torch_over_jax": round(torch_s / jax_s, 3),
      "max_abs_logit_diff": float(np.abs(got - ref).max()), "max_abs_logit": float(np.abs(ref).max()),
  }))


if __name__ == "__main__":
  main()
