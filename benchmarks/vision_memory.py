"""Per-device memory of the vision tower alone, from XLA's compile-time analysis (nothing runs).

Builds a model size's vision tower (abstract weights, sharded by the trainer's rules), lays
out ``--images`` landscape images of ``--pixels`` pixels each as the trainer does
(``prepare_vision_inputs``, ``batching.put_batch``'s placement: slot arrays over the batch
axes), and compiles the tower's forward pass (and with ``--backward`` the gradient of a
scalar of its features with respect to the weights) for ``--devices`` fake CPU devices.
Prints one JSON line: per-device temporaries and arguments in GiB, the layout and the compile
time. Run it against another checkout (PYTHONPATH) to compare layouts: a vision dict without
``patch_index`` (the former one flat patch sequence with a dense segment mask) is replicated.

  python -m benchmarks.vision_memory --model qwen2_5_vl_7b --devices 8 --images 8 --pixels 2508800
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time


def landscape_grid(model_config, pixels: int) -> tuple[int, int, int]:
  """(1, h, w) patches of an image of at most ``pixels`` pixels, h*w as large as the merge
  unit allows, the divisor of its merged units closest to 16:9."""
  vc = model_config.vision
  m = vc.spatial_merge_size
  units = pixels // (vc.patch_size ** 2) // (m * m)
  rows = min((d for d in range(1, units + 1) if units % d == 0), key=lambda d: abs(d - math.sqrt(units * 9 / 16)))
  return 1, rows * m, units // rows * m


def measure(model_config, mesh, images: int, pixels: int, *, dtype: str = "bfloat16", backward: bool = False,
            patch_bucket: int = 2048) -> dict:
  import jax
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx

  from guilibra_jax import sharding as S
  from guilibra_jax.models.vision import VisionTower, device_vision_inputs, prepare_vision_inputs

  grid = landscape_grid(model_config, pixels)
  per = grid[1] * grid[2]
  p = -(-images * per // patch_bucket) * patch_bucket
  grids = np.array([grid] * images)
  try:  # the per-image layout: slots rounded like collate rounds them
    vision = prepare_vision_inputs(grids, model_config, num_patches=p, num_slots=images, slot_bucket=patch_bucket)
  except TypeError:  # a checkout with the former flat layout
    vision = prepare_vision_inputs(grids, model_config, num_patches=p)
  vision = device_vision_inputs(vision)
  host = {"pixel_values": np.zeros((p, model_config.vision.patch_dim), np.float32), "vision": vision}
  try:
    from guilibra_jax.train.batching import pad_slots_to_mesh, placement
    host = pad_slots_to_mesh(host, mesh, False)
    where = lambda path, x: placement(path, x.ndim, mesh, False)
  except ImportError:
    where = lambda path, x: S.replicated(mesh)
  batch = jax.tree_util.tree_map_with_path(
      lambda path, x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype, sharding=where(path, x)), host)
  abstract = nnx.eval_shape(lambda: VisionTower(model_config, dtype=jnp.dtype(dtype), param_dtype=jnp.float32,
                                                rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(abstract)
  shardings = S.param_shardings(state, mesh, log=False)
  params = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), nnx.to_pure_dict(state),
                        shardings)

  def forward(params, pixel_values, vision):
    merged, _ = nnx.merge(graphdef, params)(pixel_values, vision)
    return merged

  def loss(params, pixel_values, vision):
    merged = forward(params, pixel_values, vision)
    return jnp.sum(merged.astype(jnp.float32) ** 2)

  fn = jax.jit(jax.grad(loss) if backward else forward)
  t0 = time.perf_counter()
  compiled = fn.lower(params, batch["pixel_values"], batch["vision"]).compile()
  seconds = time.perf_counter() - t0
  m = compiled.memory_analysis()
  gib = lambda b: round(int(b) / 2 ** 30, 3)
  layout = "slots" if "patch_index" in vision else "flat"
  shape = {"slots": int(np.shape(vision["patch_index"])[0]), "slot_len": int(np.shape(vision["patch_index"])[1])} \
      if layout == "slots" else {}
  return {"layout": layout, "devices": int(mesh.devices.size), "mesh": {k: int(v) for k, v in mesh.shape.items()},
          "images": images, "grid": list(grid), "patches": int(p), **shape, "dtype": dtype, "backward": backward,
          "temp_gib": gib(m.temp_size_in_bytes), "argument_gib": gib(m.argument_size_in_bytes),
          "output_gib": gib(m.output_size_in_bytes), "compile_s": round(seconds, 1)}


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--model", default="qwen2_5_vl_7b", help="a named size (models.named_config) or a benchmark size")
  ap.add_argument("--devices", type=int, default=8, help="fake CPU devices (mesh fsdp = devices)")
  ap.add_argument("--images", type=int, default=8)
  ap.add_argument("--pixels", type=int, default=2_508_800, help="pixels per image (GUI-Libra's RL max_pixels)")
  ap.add_argument("--dtype", default="bfloat16")
  ap.add_argument("--patch_bucket", type=int, default=2048)
  ap.add_argument("--backward", action="store_true", help="compile the weights' gradient too")
  args = ap.parse_args()
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             f" --xla_force_host_platform_device_count={args.devices}").strip()
  import jax

  from benchmarks._common import bench_config
  from guilibra_jax import sharding as S
  mesh = S.make_mesh({"data": 1, "fsdp": args.devices, "tensor": 1}, devices=jax.devices()[:args.devices])
  out = measure(bench_config(args.model), mesh, args.images, args.pixels, dtype=args.dtype, backward=args.backward,
                patch_bucket=args.patch_bucket)
  print(json.dumps({"model": args.model, **out}))


if __name__ == "__main__":
  main()
