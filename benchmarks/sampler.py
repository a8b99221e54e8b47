"""Throughput of the jitted sampler (prefill with an image + KV-cache decode loop).

Random-init weights, random prompts of ``--prompt_len`` tokens each holding one image of
``--image_hw`` pixels; no stop tokens, so every row decodes ``--max_new_tokens`` tokens.
Prints one JSON line: compile seconds, seconds per generate call, generated tokens/s.

  python benchmarks/sampler.py --model=tiny_qwen2_5_vl --batch=4          # CPU smoke run
  python benchmarks/sampler.py --model=qwen2_5_vl_3b --batch=32 --dtype=bfloat16 \\
      --prompt_len=1024 --image_hw=448,672 --max_new_tokens=256 --mesh=1,-1,1
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from guilibra_jax import generate as G  # noqa: E402
from guilibra_jax import models as M  # noqa: E402
from guilibra_jax import sharding as S  # noqa: E402
from guilibra_jax.train import fake_batch as F  # noqa: E402

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def model_config(name: str) -> M.ModelConfig:
    if name.startswith("tiny_"):
        return F.tiny_config(name[len("tiny_"):])
    return M.named_config(name)


def init_params(cfg: M.ModelConfig, dtype, param_dtype, mesh):
    """(graphdef, params) with params created directly in their mesh shardings."""
    kw = dict(dtype=dtype, param_dtype=param_dtype)
    abstract = nnx.eval_shape(lambda: M.QwenVL(cfg, rngs=nnx.Rngs(0), **kw))
    graphdef, astate, _ = nnx.split(abstract, nnx.Param, ...)
    shardings = S.param_shardings(astate, mesh, log=False)

    @functools.partial(jax.jit, out_shardings=shardings)
    def init():
        return nnx.to_pure_dict(nnx.state(M.QwenVL(cfg, rngs=nnx.Rngs(0), **kw), nnx.Param))

    return graphdef, init()


def make_prompts(cfg: M.ModelConfig, batch: int, prompt_len: int, image_hw, seed: int = 0):
    rng = np.random.default_rng(seed)
    vc = cfg.vision
    gh, gw = image_hw[0] // vc.patch_size, image_hw[1] // vc.patch_size
    n_img = gh * gw // vc.merge_unit
    image = [cfg.vision_start_token_id] + [cfg.image_token_id] * n_img + [cfg.vision_end_token_id]
    if prompt_len < len(image) + 2:
        raise SystemExit(f"--prompt_len={prompt_len} is too short for an image of {n_img} tokens")
    special = min(cfg.image_token_id, cfg.video_token_id, cfg.vision_start_token_id, cfg.vision_end_token_id)
    prompts = []
    for b in range(batch):
        n = prompt_len - (b % 4)  # a little left padding
        text = rng.integers(0, special, n - len(image)).tolist()
        k = len(text) // 4
        ids = text[:k] + image + text[k:]
        pix = rng.standard_normal((gh * gw, vc.patch_dim)).astype(np.float32)
        prompts.append((ids, [(1, gh, gw)], pix))
    return G.prepare_prompts(prompts, cfg, pad_id=0, bucket_len=prompt_len)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny_qwen2_5_vl", help="tiny_<family> or a named_config name")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--prompt_len", type=int, default=64)
    ap.add_argument("--image_hw", default="56,84", help="height,width in pixels")
    ap.add_argument("--max_new_tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top_p", type=float, default=1.0)
    ap.add_argument("--top_k", type=int, default=0)
    ap.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    ap.add_argument("--param_dtype", default=None, choices=sorted(DTYPES), help="default: --dtype")
    ap.add_argument("--mesh", default="1,-1,1", help="data,fsdp,tensor (-1: the rest)")
    ap.add_argument("--iters", type=int, default=3)
    args = ap.parse_args()

    nnx.use_eager_sharding(False)
    cfg = model_config(args.model)
    dtype = DTYPES[args.dtype]
    mesh = S.make_mesh([int(x) for x in args.mesh.split(",")])
    graphdef, params = init_params(cfg, dtype, DTYPES[args.param_dtype or args.dtype], mesh)
    p = make_prompts(cfg, args.batch, args.prompt_len, tuple(int(x) for x in args.image_hw.split(",")))
    batch_axis = mesh.shape["data"] * mesh.shape["fsdp"]
    rows = S.batch_sharding(mesh) if args.batch % batch_axis == 0 else S.replicated(mesh)
    pos_sh = S.batch_sharding(mesh, 3, 1) if args.batch % batch_axis == 0 else S.replicated(mesh)
    inputs = [jax.device_put(p["prompt_ids"], rows), jax.device_put(p["prompt_mask"], rows),
              jax.device_put(p["positions"], pos_sh), jax.device_put(p["rope_deltas"], S.replicated(mesh)),
              *jax.device_put([p["pixel_values"], p["vision"]], S.replicated(mesh))]
    config = G.SamplingConfig(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                              max_new_tokens=args.max_new_tokens, pad_token_id=0)

    t0 = time.perf_counter()
    out = jax.block_until_ready(G.generate(graphdef, params, *inputs, jax.random.key(0), config))
    compile_s = time.perf_counter() - t0
    times = []
    for i in range(args.iters):
        t0 = time.perf_counter()
        out = jax.block_until_ready(G.generate(graphdef, params, *inputs, jax.random.key(i + 1), config))
        times.append(time.perf_counter() - t0)
    step_s = float(np.median(times))
    generated = int(np.asarray(out.lengths).sum())
    print(json.dumps({
        "model": args.model, "devices": jax.device_count(), "backend": jax.default_backend(),
        "mesh": dict(mesh.shape), "batch": args.batch, "prompt_len": args.prompt_len, "image_hw": args.image_hw,
        "max_new_tokens": args.max_new_tokens, "dtype": args.dtype,
        "first_call_s": round(compile_s, 3), "generate_s": round(step_s, 4),
        "tokens_per_s": round(generated / step_s, 1), "decode_steps": int(out.steps),
    }))


if __name__ == "__main__":
    main()
