"""Throughput of the jitted sampler (prefill with an image + KV-cache decode loop) vs transformers'
``generate`` (KV cache, PyTorch CPU) on the same weights and prompts, side by side in one run.

Random-init weights; ``--states`` random prompts of about ``--prompt_len`` tokens (left padded to
it), each holding one image of ``--image_hw`` pixels and repeated ``--group`` times (an RL step's
rows: states x G); image sides round down to whole merge cells (28 px; Qwen3: 32 px). No stop
tokens: every row decodes ``--max_new_tokens`` tokens on both sides.

JAX: params created on the mesh, guilibra_jax.generate.prepare_prompts + generate (greedy by
  default: temperature 0).
transformers: the JAX params written with save_hf to a temp folder, loaded with
  AutoModelForImageTextToText (Qwen2_5_VL / Qwen3VL ForConditionalGeneration) in the same dtype,
  ``generate(do_sample=False, max_new_tokens=N)`` with eos disabled (no early stop) on the same
  left-padded ids, mask, images; transformers derives its own M-RoPE positions.
Timing: each side's first call (JAX: compile + run) is reported apart; then ``--iters`` rounds
  alternate the two (JAX, torch, JAX, torch, ...) so that a change in the machine's load hits both,
  and each side reports its median.
Agreement (greedy only): the fraction of equal tokens, of rows equal throughout, and the mean
  fraction of each row before its first mismatch (after one, a row's continuations differ). In
  float32 the two agree until a near-tie of the top two logits.

Prints one JSON line.

  python -m benchmarks.sampler --model=tiny                       # CPU smoke run, < 1 minute
  python -m benchmarks.sampler                                    # bench100m, 8 states x G=8
  python -m benchmarks.sampler --model=qwen2_5_vl_3b --states=4 --group=8 --dtype=bfloat16 \\
      --prompt_len=1024 --image_hw=448,672 --max_new_tokens=256 --mesh=1,-1,1 --no-torch
"""
from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from benchmarks._common import bench_config, export_hf, torch_inputs  # noqa: E402
from guilibra_jax import generate as G  # noqa: E402
from guilibra_jax import models as M  # noqa: E402
from guilibra_jax import sharding as S  # noqa: E402
from guilibra_jax.train import fake_batch as F  # noqa: E402

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def model_config(name: str) -> M.ModelConfig:
    """bench100m | tiny (benchmarks/_common.py), tiny_<family> (_common's tiny in another family),
    or a named_config name."""
    if name.startswith("tiny_"):
        return F.tiny_config(name[len("tiny_"):], vocab=4096, hidden=128, layers=2)
    return bench_config(name)


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


def make_prompts(cfg: M.ModelConfig, states: int, group: int, prompt_len: int, image_hw, seed: int = 0):
    """prepare_prompts of ``states`` random prompts, each repeated ``group`` times (group-major)."""
    rng = np.random.default_rng(seed)
    vc = cfg.vision
    cell = vc.patch_size * vc.spatial_merge_size  # grids are whole merge cells (28 px / Qwen3's 32 px)
    gh, gw = (image_hw[0] // cell) * vc.spatial_merge_size, (image_hw[1] // cell) * vc.spatial_merge_size
    n_img = gh * gw // vc.merge_unit
    image = [cfg.vision_start_token_id] + [cfg.image_token_id] * n_img + [cfg.vision_end_token_id]
    if prompt_len < len(image) + 5:
        raise SystemExit(f"--prompt_len={prompt_len} is too short for an image of {n_img} tokens")
    special = min(cfg.image_token_id, cfg.video_token_id, cfg.vision_start_token_id, cfg.vision_end_token_id)
    prompts = []
    for s in range(states):
        n = prompt_len - (s % 4)  # a little left padding
        text = rng.integers(0, special, n - len(image)).tolist()
        k = len(text) // 4
        ids = text[:k] + image + text[k:]
        pix = rng.standard_normal((gh * gw, vc.patch_dim)).astype(np.float32)
        prompts += [(ids, [(1, gh, gw)], pix)] * group
    return G.prepare_prompts(prompts, cfg, pad_id=0, bucket_len=prompt_len)


def jax_sampler(graphdef, params, p, mesh, config: G.SamplingConfig):
    """A call that runs one generate on the prompts ``p`` and returns (tokens [B, N], generated count)."""
    rows_n = p["prompt_ids"].shape[0]
    batch_axis = mesh.shape["data"] * mesh.shape["fsdp"]
    split = rows_n % batch_axis == 0
    rows = S.batch_sharding(mesh) if split else S.replicated(mesh)
    pos_sh = S.batch_sharding(mesh, 3, 1) if split else S.replicated(mesh)
    inputs = [jax.device_put(p["prompt_ids"], rows), jax.device_put(p["prompt_mask"], rows),
              jax.device_put(p["positions"], pos_sh), jax.device_put(p["rope_deltas"], S.replicated(mesh)),
              *jax.device_put([p["pixel_values"], p["vision"]], S.replicated(mesh))]
    calls = itertools.count()

    def run():
        out = jax.block_until_ready(G.generate(graphdef, params, *inputs, jax.random.key(next(calls)), config))
        return np.asarray(out.tokens), int(np.asarray(out.lengths).sum())

    return run


def torch_sampler(folder: str, p, cfg: M.ModelConfig, config: G.SamplingConfig, dtype: str):
    """The same call for transformers' generate on the checkpoint in ``folder`` (loaded in ``dtype``)."""
    import torch
    from transformers import AutoModelForImageTextToText, GenerationConfig

    hf = AutoModelForImageTextToText.from_pretrained(folder, dtype=getattr(torch, dtype)).eval()
    hf.generation_config.eos_token_id = None  # no early stop, as the JAX side (no stop tokens)
    gen = GenerationConfig(max_new_tokens=config.max_new_tokens, min_new_tokens=config.max_new_tokens,
                           do_sample=config.temperature > 0, temperature=config.temperature or None,
                           top_p=config.top_p, top_k=config.top_k or None, eos_token_id=None,
                           pad_token_id=config.pad_token_id, use_cache=True)
    ids = p["prompt_ids"]
    targs = torch_inputs(ids, p["prompt_mask"], p["image_grid_thw"], p["pixel_values"], cfg)
    if dtype != "float32":
        targs["pixel_values"] = targs["pixel_values"].to(getattr(torch, dtype))

    def run():
        with torch.inference_mode():
            tokens = hf.generate(**targs, generation_config=gen)[:, ids.shape[1]:].numpy()
        return tokens, int(tokens.size)

    return run


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def agreement(a: np.ndarray, b: np.ndarray) -> dict:
    """Greedy-token agreement of two [B, N] arrays (see the module docstring)."""
    if a.shape != b.shape:
        return {"shape_mismatch": [list(a.shape), list(b.shape)]}
    eq = a == b
    first_miss = np.where(eq.all(1), a.shape[1], np.argmin(eq, axis=1))
    return {"token_agreement": round(float(eq.mean()), 4), "rows_identical": round(float(eq.all(1).mean()), 4),
            "prefix_agreement": round(float(first_miss.mean() / a.shape[1]), 4)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="bench100m", help="bench100m | tiny | tiny_<family> | a named_config name")
    ap.add_argument("--states", type=int, default=8, help="distinct prompts")
    ap.add_argument("--group", type=int, default=8, help="G: copies of each prompt (rows = states x G)")
    ap.add_argument("--prompt_len", type=int, default=64)
    ap.add_argument("--image_hw", default="56,84", help="height,width in pixels")
    ap.add_argument("--max_new_tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (token agreement is reported)")
    ap.add_argument("--top_p", type=float, default=1.0)
    ap.add_argument("--top_k", type=int, default=0)
    ap.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    ap.add_argument("--param_dtype", default=None, choices=sorted(DTYPES),
                    help="JAX master weights (default: --dtype); transformers loads the export in --dtype")
    ap.add_argument("--mesh", default="1,-1,1", help="data,fsdp,tensor (-1: the rest)")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--torch", action=argparse.BooleanOptionalAction, default=True,
                    help="also run transformers' generate (CPU) on the same weights and prompts")
    args = ap.parse_args()
    if args.iters < 1:
        raise SystemExit(f"--iters={args.iters}: expected at least 1 timed call per side")

    nnx.use_eager_sharding(False)
    cfg = model_config(args.model)
    mesh = S.make_mesh([int(x) for x in args.mesh.split(",")])
    graphdef, params = init_params(cfg, DTYPES[args.dtype], DTYPES[args.param_dtype or args.dtype], mesh)
    p = make_prompts(cfg, args.states, args.group, args.prompt_len, tuple(int(x) for x in args.image_hw.split(",")))
    config = G.SamplingConfig(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                              max_new_tokens=args.max_new_tokens, pad_token_id=0)
    samplers = {"jax": jax_sampler(graphdef, params, p, mesh, config)}
    first, times, result = {}, {}, {}
    result["jax"], first["jax"] = timed(samplers["jax"])
    if args.torch:
        with tempfile.TemporaryDirectory() as d:
            export_hf(graphdef, params, cfg, d)
            samplers["torch"] = torch_sampler(d, p, cfg, config, args.dtype)
        result["torch"], first["torch"] = timed(samplers["torch"])
    for _ in range(args.iters):  # interleaved, so a change in the machine's load hits both sides
        for name, run in samplers.items():
            result[name], dt = timed(run)
            times.setdefault(name, []).append(dt)
    step_s = {k: float(np.median(v)) for k, v in times.items()}
    tps = {k: result[k][1] / step_s[k] for k in samplers}
    row = {
        "benchmark": "sampler", "model": args.model, "params": M.param_count(cfg), "backend": jax.default_backend(),
        "devices": jax.device_count(), "mesh": dict(mesh.shape), "rows": int(p["prompt_ids"].shape[0]),
        "states": args.states, "group": args.group, "prompt_len": args.prompt_len, "image_hw": args.image_hw,
        "max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "dtype": args.dtype,
        "jax_first_call_s": round(first["jax"], 3), "jax_compile_s": round(first["jax"] - step_s["jax"], 3),
        "jax_generate_s": round(step_s["jax"], 4), "jax_tokens_per_s": round(tps["jax"], 1),
        "jax_calls_s": [round(t, 3) for t in times["jax"]],
    }
    if args.torch:
        import torch

        row.update({"torch_device": "cpu", "torch_threads": torch.get_num_threads(),
                    "torch_first_call_s": round(first["torch"], 3), "torch_generate_s": round(step_s["torch"], 4),
                    "torch_tokens_per_s": round(tps["torch"], 1),
                    "torch_calls_s": [round(t, 3) for t in times["torch"]],
                    "jax_over_torch_tokens_per_s": round(tps["jax"] / tps["torch"], 3)})
        if args.temperature == 0:
            row.update(agreement(result["jax"][0], result["torch"][0]))
    print(json.dumps(row))


if __name__ == "__main__":
    main()
