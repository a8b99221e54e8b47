"""Forward time of a ~100M-parameter Qwen2.5-VL-shaped model: JAX (jit) vs transformers (PyTorch).

Same random weights (exported from the JAX model with save_hf, loaded by transformers) and the
same inputs: a batch of 2 x 256 tokens, one 224x224 image per row. Prints one JSON line.

  python -m benchmarks.model_forward [--repeats 5] [--model bench100m|tiny]
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

from benchmarks._common import BENCH_CONFIGS, bench_config, torch_inputs
from guilibra_jax.models import ModelConfig, QwenVL, get_rope_index, param_count, prepare_vision_inputs, save_hf


def make_inputs(config: ModelConfig, batch: int = 2, seq: int = 256, image_px: int = 224):
  rng = np.random.default_rng(0)
  grid = (1, image_px // config.vision.patch_size, image_px // config.vision.patch_size)
  n_img = grid[1] * grid[2] // config.vision.merge_unit
  special = min(config.image_token_id, config.video_token_id, config.vision_start_token_id, config.vision_end_token_id)
  ids = rng.integers(0, special, size=(batch, seq))
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
  parser.add_argument("--model", default="bench100m", choices=sorted(BENCH_CONFIGS))
  args = parser.parse_args()
  import torch
  from transformers import AutoModelForImageTextToText

  config = bench_config(args.model)
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
  targs = torch_inputs(ids, mask, grids, pixels, config)
  with torch.no_grad():
    torch_s = timeit(lambda: hf(**targs), args.repeats)
    ref = hf(**targs).logits.numpy()
  got = np.asarray(fwd(model, *jargs))
  print(json.dumps({
      "benchmark": "model_forward", "model": args.model, "params": param_count(config), "batch": list(ids.shape),
      "image_px": 224, "backend": jax.default_backend(), "torch_threads": torch.get_num_threads(),
      "jax_s": round(jax_s, 4), "jax_compile_s": round(compile_s, 2), "torch_s": round(torch_s, 4),
      "torch_over_jax": round(torch_s / jax_s, 3),
      "max_abs_logit_diff": float(np.abs(got - ref).max()), "max_abs_logit": float(np.abs(ref).max()),
  }))


if __name__ == "__main__":
  from benchmarks._common import launcher_malloc
  launcher_malloc()
  main()
