"""Throughput of the jitted sampler (prefill with an image + KV-cache decode loop) vs transformers'
``generate`` (KV cache, PyTorch CPU) on the same weights and prompts, side by side in one run.

Random-init weights; ``--states`` random prompts of about ``--prompt_len`` tokens (left padded to
it), each holding one image of ``--image_hw`` pixels and repeated ``--group`` times (an RL step's
rows: states x G); image sides round down to whole merge cells (28 px; Qwen3: 32 px). No stop
tokens: every row decodes ``--max_new_tokens`` tokens on both sides.

JAX: params created on the mesh, guilibra_jax.generate.prepare_prompts + generate (greedy by
  default: temperature 0).
transformers: the JAX params written with save_hf to a temp folder, loaded with
  AutoModelForImageTextToText (Qwen2_5_VL / Qwen3VL ForConditionalGeneration) in the same dtype with
  attn_implementation="sdpa" and --threads intra-op threads (default: all cores, as XLA's CPU
  backend), ``generate(do_sample=False, max_new_tokens=N)`` with eos disabled (no early stop) on the
  same left-padded ids, mask, images; transformers derives its own M-RoPE positions.
  --torch_compile adds generate with a static cache and its compiled forward (transformers'
  compile_config), reported beside eager.
Timing: a call starts from the list of prompts (token ids, image grids, pixel rows) and ends with the
  tokens on the host, so host preparation is timed on both sides: JAX pads, computes M-RoPE positions
  and vision metadata (prepare_prompts) and places the arrays; transformers pads and builds tensors,
  then computes positions and vision metadata inside generate. Round 0 runs each side once (JAX
  compiles; reported apart); then ``--iters`` rounds run each side once in an order that rotates,
  so that a change in the machine's load hits all sides, and each side reports its median.
Outputs: the "jax" and "jax_prefill" sides return what generate returns, the tokens
  (SamplingConfig(logprobs=False), as evaluation asks); "jax_shared" also the sampled tokens'
  log-probs (the RL sampler's call: its old-policy log-probs).
Shared prefill: "jax_shared" (with --group > 1) is the call the RL sampler makes (rl.share_prefill):
  one row per distinct prompt and generate(copies=G), so the vision tower and the prefill run once
  per prompt and its KV cache is repeated for its G rows (transformers' generate, with 64 rows or
  with num_return_sequences=G, prefills every row). Reported beside the like-for-like "jax" side,
  with whether its tokens equal the "jax" side's.
Decode: "jax_prefill" is the same call with max_new_tokens=1 (prefill + first token), timed in the
  same rounds; decode time = generate - prefill. FLOPs (forward, 2 per parameter per token):
  prefill = 2 * decoder body params * rows * T + 4 * layers * heads * head_dim * T^2 * rows
            + 2 * head params * rows + 2 * vision params * patches;
  decode  = per step and row 2 * (decoder body + head params) + 4 * layers * heads * head_dim * context.
  decode_flops_utilisation = decode FLOPs / (decode time * measured matmul peak). Every decode step
  reads all decoder and head weights once for all rows: decode_flops_per_weight_byte (~2 * rows /
  bytes per parameter) against the machine's measured FLOP/s per byte/s of memory bandwidth says
  whether the decode is compute- or memory-bound.
Agreement (greedy only): the fraction of equal tokens, of rows equal throughout, and the mean
  fraction of each row before its first mismatch (after one, a row's continuations differ). In
  float32 the two agree until a near-tie of the top two logits.

Writes benchmarks/results/sampler-<model>-<dtype>[-t<temperature>]-<machine>.json (see --out_dir) and prints it.

  python -m benchmarks.sampler --model=tiny                       # CPU smoke run, < 1 minute
  python -m benchmarks.sampler                                    # bench100m, 8 states x G=8
  python -m benchmarks.sampler --model=qwen2_5_vl_3b --states=4 --group=8 --dtype=bfloat16 \\
      --prompt_len=1024 --image_hw=448,672 --max_new_tokens=256 --mesh=1,-1,1 --no-torch
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
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

from benchmarks import _common as C  # noqa: E402
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


def make_prompts(cfg: M.ModelConfig, states: int, group: int, prompt_len: int, image_hw, seed: int = 0) -> list:
    """``states`` random prompts of about ``prompt_len`` tokens, each repeated ``group`` times
    (group-major), as (ids, image_grid_thw, pixel rows): what a rollout hands the sampler."""
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
    return prompts


def left_pad(prompts: list, length: int, pad_id: int = 0):
    """(ids [B, length], mask [B, length], grids [n, 3], pixels [P, D]) of left-padded prompts:
    the transformers side's host preparation (what a tokenizer with padding_side="left" gives)."""
    ids = np.full((len(prompts), length), pad_id, np.int64)
    mask = np.zeros((len(prompts), length), np.int64)
    for r, (seq, _, _) in enumerate(prompts):
        ids[r, length - len(seq):] = seq
        mask[r, length - len(seq):] = 1
    grids = np.concatenate([np.asarray(g, np.int64).reshape(-1, 3) for _, g, _ in prompts])
    return ids, mask, grids, np.concatenate([p for _, _, p in prompts])


def jax_sampler(graphdef, params, prompts, cfg, prompt_len, mesh, config: G.SamplingConfig, copies: int = 1):
    """A call that prepares the prompts (M-RoPE positions, vision metadata: prepare_prompts), places
    them, runs one generate and returns (tokens [B, N], generated count, host preparation seconds).
    ``copies`` > 1: ``prompts`` holds runs of ``copies`` equal prompts (group-major); the call passes
    one of each and ``generate(copies=...)`` prefills it once for its rows (as rl.share_prefill)."""
    if copies > 1:
        prompts = prompts[::copies]
    rows_n = len(prompts)
    batch_axis = mesh.shape["data"] * mesh.shape["fsdp"]
    split = rows_n % batch_axis == 0
    rows = S.batch_sharding(mesh) if split else S.replicated(mesh)
    pos_sh = S.batch_sharding(mesh, 3, 1) if split else S.replicated(mesh)
    calls = itertools.count()

    def run():
        t0 = time.perf_counter()
        p = G.prepare_prompts(prompts, cfg, pad_id=0, bucket_len=prompt_len)
        inputs = [jax.device_put(p["prompt_ids"], rows), jax.device_put(p["prompt_mask"], rows),
                  jax.device_put(p["positions"], pos_sh), jax.device_put(p["rope_deltas"], S.replicated(mesh)),
                  *jax.device_put([p["pixel_values"], p["vision"]], S.replicated(mesh))]
        prep = time.perf_counter() - t0
        out = jax.block_until_ready(G.generate(graphdef, params, *inputs, jax.random.key(next(calls)), config,
                                               copies=copies))
        return np.asarray(out.tokens), int(np.asarray(out.lengths).sum()), prep

    return run


def torch_sampler(folder: str, prompts, prompt_len, cfg: M.ModelConfig, config: G.SamplingConfig, dtype: str,
                  compile_: bool = False):
    """The same call for transformers' generate on the checkpoint in ``folder`` (loaded in ``dtype``,
    attn_implementation="sdpa"); left padding and tensor creation are timed, transformers derives
    its M-RoPE positions and vision metadata inside generate. ``compile_``: a static KV cache and
    the forward compiled by generate (transformers' compile_config; CPU needs _compile_all_devices)."""
    import torch
    from transformers import AutoModelForImageTextToText, GenerationConfig
    from transformers.generation.configuration_utils import CompileConfig

    hf = AutoModelForImageTextToText.from_pretrained(folder, dtype=getattr(torch, dtype),
                                                     attn_implementation="sdpa").eval()
    hf.generation_config.eos_token_id = None  # no early stop, as the JAX side (no stop tokens)
    extra = {}
    if compile_:
        compile_config = CompileConfig()
        compile_config._compile_all_devices = True
        extra = dict(cache_implementation="static", compile_config=compile_config)
    gen = GenerationConfig(max_new_tokens=config.max_new_tokens, min_new_tokens=config.max_new_tokens,
                           do_sample=config.temperature > 0, temperature=config.temperature or None,
                           top_p=config.top_p, top_k=config.top_k or None, eos_token_id=None,
                           pad_token_id=config.pad_token_id, use_cache=True, **extra)

    def run():
        t0 = time.perf_counter()
        ids, mask, grids, pixels = left_pad(prompts, prompt_len, config.pad_token_id)
        targs = torch_inputs(ids, mask, grids, pixels, cfg)
        if dtype != "float32":
            targs["pixel_values"] = targs["pixel_values"].to(getattr(torch, dtype))
        prep = time.perf_counter() - t0
        with torch.inference_mode():
            tokens = hf.generate(**targs, generation_config=gen)[:, ids.shape[1]:].numpy()
        return tokens, int(tokens.size), prep

    return run, hf.config._attn_implementation


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


def sampler_flops(groups: dict, cfg: M.ModelConfig, rows: int, prompt_len: int, new: int, patches: int) -> dict:
    """Forward FLOPs of one generate (see the module docstring)."""
    t = cfg.text
    attn = 4.0 * t.num_layers * t.num_heads * t.head_dim
    prefill = (2.0 * groups["decoder_body"] * rows * prompt_len + attn * prompt_len ** 2 * rows
               + 2.0 * groups["head"] * rows + 2.0 * groups["vision"] * patches)
    steps = new - 1  # token 0 comes from the prefill's logits
    ctx = sum(prompt_len + i for i in range(1, new))  # keys each decode step attends to
    decode = 2.0 * (groups["decoder_body"] + groups["head"]) * rows * steps + attn * ctx * rows
    return {"prefill_flops": prefill, "decode_flops": decode, "decode_steps": steps}


def main(argv=None) -> dict:
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
    ap.add_argument("--iters", type=int, default=3, help="timed rounds")
    ap.add_argument("--torch", action=argparse.BooleanOptionalAction, default=True,
                    help="also run transformers' generate (CPU) on the same weights and prompts")
    ap.add_argument("--torch_compile", action=argparse.BooleanOptionalAction, default=False,
                    help="also generate with a static cache and a compiled forward (compiles for minutes on a CPU)")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="torch intra-op threads")
    C.add_result_args(ap)
    args = ap.parse_args(argv)
    if args.iters < 1:
        raise SystemExit(f"--iters={args.iters}: expected at least 1 timed call per side")
    start = C.run_start()

    nnx.use_eager_sharding(False)
    cfg = model_config(args.model)
    mesh = S.make_mesh([int(x) for x in args.mesh.split(",")])
    graphdef, params = init_params(cfg, DTYPES[args.dtype], DTYPES[args.param_dtype or args.dtype], mesh)
    prompts = make_prompts(cfg, args.states, args.group, args.prompt_len,
                           tuple(int(x) for x in args.image_hw.split(",")))
    config = G.SamplingConfig(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                              max_new_tokens=args.max_new_tokens, pad_token_id=0)
    tokens_only = dataclasses.replace(config, logprobs=False)   # like for like: what generate returns
    prefill_only = dataclasses.replace(tokens_only, max_new_tokens=1)
    samplers = {"jax": jax_sampler(graphdef, params, prompts, cfg, args.prompt_len, mesh, tokens_only),
                "jax_prefill": jax_sampler(graphdef, params, prompts, cfg, args.prompt_len, mesh, prefill_only)}
    if args.group > 1:   # what the RL sampler runs: each prompt prefilled once for its G rows
        samplers["jax_shared"] = jax_sampler(graphdef, params, prompts, cfg, args.prompt_len, mesh, config,
                                             copies=args.group)
    attn = {}
    if args.torch:
        import torch

        torch.set_num_threads(args.threads)
        with tempfile.TemporaryDirectory() as d:
            export_hf(graphdef, params, cfg, d)
            samplers["torch_eager"], attn["torch_eager"] = torch_sampler(d, prompts, args.prompt_len, cfg, config,
                                                                         args.dtype)
            if args.torch_compile:
                samplers["torch_compile"], attn["torch_compile"] = torch_sampler(
                    d, prompts, args.prompt_len, cfg, config, args.dtype, compile_=True)
    names = list(samplers)
    first, times, preps, result = {}, {n: [] for n in names}, {n: [] for n in names}, {}
    for r in range(args.iters + 1):  # round 0 compiles; then interleaved, in an order that rotates
        for name in names[r % len(names):] + names[:r % len(names)]:
            (tokens, count, prep), dt = timed(samplers[name])
            result[name] = (tokens, count)
            if r == 0:
                first[name] = dt
            else:
                times[name].append(dt)
                preps[name].append(prep)
        print(f"[sampler] round {r}: " + ", ".join(f"{n} {(times[n][-1] if r else first[n]):.3f}s" for n in names),
              flush=True)
    step_s = {n: float(np.median(v)) for n, v in times.items()}
    groups = {"decoder_body": 0, "head": cfg.text.vocab_size * cfg.text.hidden_size, "vision": 0}
    state = nnx.to_pure_dict(nnx.eval_shape(lambda: nnx.state(M.QwenVL(cfg, rngs=nnx.Rngs(0)), nnx.Param)))
    count = lambda tree: int(sum(x.size for x in jax.tree.leaves(tree)))
    groups["vision"] = count(state.get("visual", {}))
    groups["decoder_body"] = (count(state) - groups["vision"] - count(state["language_model"]["embed_tokens"])
                              - (0 if cfg.tie_word_embeddings else groups["head"]))
    patches = sum(int(np.prod(g)) for _, g, _ in prompts)
    fl = sampler_flops(groups, cfg, len(prompts), args.prompt_len, args.max_new_tokens, patches)
    peak = C.measure_matmul_peak(dtype=args.dtype)
    bandwidth = C.measure_memory_bandwidth()
    decode_s = step_s["jax"] - step_s["jax_prefill"]
    weight_bytes = (groups["decoder_body"] + groups["head"]) * jnp.dtype(DTYPES[args.param_dtype or args.dtype]).itemsize
    intensity = fl["decode_flops"] / max(fl["decode_steps"] * weight_bytes, 1)  # FLOPs per weight byte read
    row = {
        "benchmark": "sampler", "model": args.model, "params": M.param_count(cfg), "param_groups": groups,
        "backend": jax.default_backend(), "devices": jax.device_count(), "mesh": dict(mesh.shape),
        "rows": len(prompts), "states": args.states, "group": args.group, "prompt_len": args.prompt_len,
        "image_hw": args.image_hw, "max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
        "logprobs": {"jax": False, "jax_shared": True},
        "dtype": args.dtype, "timing": "interleaved rounds (rotating order); each call from the prompt list to "
        "the tokens on the host: host preparation (padding, positions, vision metadata) timed on both sides",
        "jax_first_call_s": round(first["jax"], 3), "jax_generate_s": round(step_s["jax"], 4),
        "jax_host_prep_s": round(float(np.median(preps["jax"])), 5),
        "jax_tokens_per_s": round(result["jax"][1] / step_s["jax"], 1),
        "jax_calls_s": [round(t, 3) for t in times["jax"]],
        "jax_prefill_s": round(step_s["jax_prefill"], 4), "jax_decode_s": round(decode_s, 4),
        **fl, "measured_peak_flops": peak, "measured_memory_bandwidth_bytes_per_s": bandwidth,
        "decode_flops_utilisation": round(fl["decode_flops"] / (max(decode_s, 1e-9) * peak), 4),
        "decode_weight_bytes_per_step": weight_bytes,
        "decode_flops_per_weight_byte": round(intensity, 2),
        "machine_flops_per_byte": round(peak / bandwidth, 2),
        "decode_bound": "compute" if intensity > peak / bandwidth else "memory (weights re-read every token)",
    }
    if "jax_shared" in step_s:
        row.update({"jax_shared_generate_s": round(step_s["jax_shared"], 4),
                    "jax_shared_host_prep_s": round(float(np.median(preps["jax_shared"])), 5),
                    "jax_shared_tokens_per_s": round(result["jax_shared"][1] / step_s["jax_shared"], 1),
                    "jax_shared_calls_s": [round(t, 3) for t in times["jax_shared"]],
                    "jax_shared_over_jax": round(step_s["jax"] / step_s["jax_shared"], 3),
                    "jax_shared_identical_tokens": bool(np.array_equal(result["jax_shared"][0], result["jax"][0]))})
    if args.torch:
        import torch

        row.update({"torch_device": "cpu", "torch_threads": torch.get_num_threads(),
                    "torch_interop_threads": torch.get_num_interop_threads(), "attn_implementation": attn})
        for n in names:
            if not n.startswith("torch"):
                continue
            if "jax_shared" in step_s:
                row[f"jax_shared_over_{n}_tokens_per_s"] = round(step_s[n] / step_s["jax_shared"]
                                                                 * result["jax_shared"][1] / result[n][1], 3)
            row.update({f"{n}_first_call_s": round(first[n], 3), f"{n}_generate_s": round(step_s[n], 4),
                        f"{n}_host_prep_s": round(float(np.median(preps[n])), 5),
                        f"{n}_tokens_per_s": round(result[n][1] / step_s[n], 1),
                        f"{n}_calls_s": [round(t, 3) for t in times[n]],
                        f"jax_over_{n}_tokens_per_s": round(step_s[n] / step_s["jax"] * result["jax"][1]
                                                            / result[n][1], 3)})
            if args.temperature == 0:
                row[f"{n}_agreement"] = agreement(result["jax"][0], result[n][0])
    sampled = f"-t{args.temperature:g}" if args.temperature else ""   # greedy runs keep the plain name
    return C.report("sampler", f"sampler-{args.model}-{args.dtype}{sampled}", row, args, start)


if __name__ == "__main__":
    from benchmarks._common import launcher_malloc
    launcher_malloc()
    main()
