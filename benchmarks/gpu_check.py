"""One-shot accelerator check (run it through benchmarks/gpu_check.sh): three phases, each in its
own process (so that JAX's and torch's memory pools never meet), one JSON.

1. parity: bf16 logits of the JAX model against transformers' on the same random weights and
   inputs (Qwen2.5-VL-7B widths, 2 decoder layers, 2 vision blocks, one image per row), both
   measured against the JAX float32 logits: JAX bf16 passes when its error is at most twice
   transformers' bf16 error (+1e-3 of the logit scale), and greedy tokens agree on >= 97% of
   positions. transformers runs on the GPU when torch sees one, else on the CPU.
2. asft_step: the ASFT train step (benchmarks/step.py's JAX side: bf16 compute, float32 params
   and AdamW, remat "dots_with_no_batch_dims_saveable", scanned layers, LM head only at the loss
   positions) on a Qwen2.5-VL-7B-shaped model with real widths and as many decoder layers (<= 28)
   as fit one device: the compiled step's memory is measured at 2 and 4 layers (compile only,
   nothing allocated), extrapolated linearly to --memory_fraction of the device's memory, and the
   chosen depth compiled again to confirm. Reports tokens/s and MFU = model FLOPs / (step time *
   the device's nominal dense bf16 peak; table in benchmarks/_common.py), and against the measured
   matmul peak.
3. sampler: tokens/s of guilibra_jax.generate at RL shapes (--states x --group rows, prompts of
   --prompt_len tokens with one --image_hw image, --max_new_tokens new tokens, greedy, no stop) on
   the 7B-shaped model with all 28 layers in bf16, its prefill/decode split and the decode's FLOP
   utilisation against the nominal peak.

--tiny runs the same phases on a tiny model at tiny shapes on any backend (a CPU in seconds; the
test suite runs it), writing gpu_check-tiny-<machine>.json.

  bash benchmarks/gpu_check.sh                 # on a GPU machine: benchmarks/results/gpu_check-<gpu>.json
  bash benchmarks/gpu_check.sh --tiny --out_dir=/tmp/check
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import sys
import tempfile
import time
import types
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402

from benchmarks import _common as C  # noqa: E402

FULL_LAYERS = 28  # Qwen2.5-VL-7B's decoder depth


def model_config(tiny: bool, layers: int, vision_depth: int | None = None):
    """Qwen2.5-VL-7B widths (or the tiny benchmark model) with ``layers`` decoder layers."""
    cfg = C.bench_config("tiny" if tiny else "qwen2_5_vl_7b")
    vision = cfg.vision
    if vision_depth is not None:
        vision = dataclasses.replace(vision, depth=vision_depth, fullatt_block_indexes=(vision_depth - 1,))
    return dataclasses.replace(cfg, text=dataclasses.replace(cfg.text, num_layers=layers), vision=vision)


def in_process(fn, *args):
    """fn(*args) in a fresh spawned process (its own accelerator context and memory pool)."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def _apply_gpu_flags():
    from guilibra_jax.train import distributed

    distributed.apply_gpu_xla_flags()  # before jax initialises its backends, as launch/train.py


# ----------------------------------------------------------------------------- 1. parity
def parity_phase(a) -> dict:
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # leave the GPU's memory to torch too
    _apply_gpu_flags()
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from guilibra_jax import models as M
    from guilibra_jax.train.fake_batch import fake_sft_batch

    nnx.use_eager_sharding(False)
    cfg = model_config(a.tiny, 2, None if a.tiny else 2)
    batch = fake_sft_batch(cfg, batch=2, seq_len=a.parity_seq, image_hw=(a.parity_image,) * 2, seed=0)
    logits = {}
    with tempfile.TemporaryDirectory() as d:
        for name, dt in (("jax_float32", jnp.float32), ("jax_bfloat16", jnp.bfloat16)):
            model = M.QwenVL(cfg, dtype=dt, param_dtype=jnp.float32, rngs=nnx.Rngs(0))
            if name == "jax_float32":
                M.save_hf(model, cfg, d)
            graphdef, params = nnx.split(model)
            fwd = jax.jit(lambda p, b: nnx.merge(graphdef, p)(b["input_ids"], b["positions"], b["segment_ids"],
                                                             b["pixel_values"], b["vision"]))
            logits[name] = np.asarray(fwd(params, batch), np.float32)
            del model, params
        torch_logits, torch_device = _torch_logits(d, cfg, batch)
    ref = logits["jax_float32"]
    scale = float(np.abs(ref).max())
    err = lambda x: float(np.abs(x - ref).max()) / scale
    jax_err, torch_err = err(logits["jax_bfloat16"]), err(torch_logits)
    agree = float(np.mean(logits["jax_bfloat16"].argmax(-1) == torch_logits.argmax(-1)))
    ok = jax_err <= 2 * torch_err + 1e-3 and agree >= 0.97
    return {"model": "tiny" if a.tiny else "qwen2_5_vl_7b widths, 2 layers, 2 vision blocks",
            "rows": 2, "seq": a.parity_seq, "image": a.parity_image, "torch_device": torch_device,
            "logit_scale": scale, "jax_bf16_max_rel_err_vs_fp32": jax_err, "torch_bf16_max_rel_err_vs_fp32": torch_err,
            "greedy_agreement_jax_bf16_vs_torch_bf16": agree, "criterion": "jax err <= 2 * torch err + 1e-3, "
            "agreement >= 0.97", "ok": bool(ok)}


def _torch_logits(folder, cfg, batch):
    import torch
    from transformers import AutoModelForImageTextToText

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    hf = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.bfloat16,
                                                     attn_implementation="sdpa").to(dev).eval()
    b = batch["input_ids"].shape[0]
    g = int(np.sqrt(batch["pixel_values"].shape[0] // b))
    inputs = C.torch_inputs(batch["input_ids"], batch["segment_ids"] > 0, np.array([(1, g, g)] * b),
                            batch["pixel_values"], cfg, dev)
    inputs["pixel_values"] = inputs["pixel_values"].to(torch.bfloat16)
    with torch.inference_mode():
        out = hf(**inputs).logits.float().cpu().numpy()
    return out, dev


# ----------------------------------------------------------------------------- 2. the ASFT step
def _step_args(a, layers):
    return types.SimpleNamespace(mesh="1,1,1", dtype="bfloat16", remat="dots_with_no_batch_dims_saveable",
                                 scan_layers=True, logits_chunk=a.logits_chunk, batch=a.batch, seq=a.seq,
                                 image=a.image, loss_fraction=a.loss_fraction, layers=layers)


def step_memory(a, layers: int) -> int:
    """Bytes the compiled ASFT step needs at ``layers`` decoder layers (compile only: arguments,
    outputs and temporaries from memory_analysis, aliased donations counted once)."""
    _apply_gpu_flags()
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from benchmarks.step import ASFT, OPTIM, host_batch
    from guilibra_jax.models import QwenVL, get_rope_index, prepare_vision_inputs
    from guilibra_jax.models.vision import device_vision_inputs
    from guilibra_jax.train.batching import stack_micro_batches
    from guilibra_jax.train.optimizer import make_optimizer
    from guilibra_jax.train.sft.step import make_sft_step
    from guilibra_jax.train.step_core import init_state

    nnx.use_eager_sharding(False)
    cfg = model_config(a.tiny, layers)
    args = _step_args(a, layers)
    build = lambda: QwenVL(cfg, dtype=jnp.bfloat16, param_dtype=jnp.float32, rngs=nnx.Rngs(0), remat=args.remat,
                           scan_layers=True)
    graphdef, abs_state, _ = nnx.split(nnx.eval_shape(build), nnx.Param, ...)
    params = nnx.to_pure_dict(abs_state)
    o = OPTIM
    tx, _ = make_optimizer(params, lr=o["lr"], total_steps=1000, schedule="constant", clip_norm=o["clip_norm"])
    state = jax.eval_shape(lambda p: init_state(p, tx), params)
    raw = host_batch(cfg, args)
    positions, _ = get_rope_index(raw["input_ids"], raw["segment_ids"], raw["image_grid_thw"], cfg)
    host = {k: raw[k] for k in ("input_ids", "segment_ids", "targets", "loss_segments", "pixel_values")}
    host.update(positions=positions.astype(np.int32),
                vision=device_vision_inputs(prepare_vision_inputs(raw["image_grid_thw"], cfg)))
    batch = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), jnp.asarray(x).dtype),
                         stack_micro_batches([host]))
    step = jax.jit(make_sft_step(graphdef, tx, logits_chunk=a.logits_chunk, **ASFT), donate_argnums=0)
    ma = step.lower(state, batch).compile().memory_analysis()
    return int(ma.argument_size_in_bytes + ma.output_size_in_bytes - ma.alias_size_in_bytes + ma.temp_size_in_bytes)


def fit_layers(a) -> dict:
    """The most decoder layers (<= FULL_LAYERS, or the tiny model's 4) whose step fits the device:
    the compiled step's bytes at 2 and 4 layers, extrapolated linearly to --memory_fraction of the
    device's memory limit (--memory_limit_gb, else what the device reports; CPUs report none)."""
    import jax

    top = 4 if a.tiny else FULL_LAYERS
    limit = int(a.memory_limit_gb * 2 ** 30) if a.memory_limit_gb else None
    if limit is None:
        try:
            limit = int((jax.devices()[0].memory_stats() or {}).get("bytes_limit", 0)) or None
        except Exception:  # noqa: BLE001 - CPUs keep no memory statistics
            limit = None
    m2, m4 = step_memory(a, 2), step_memory(a, 4)
    per_layer, fixed = (m4 - m2) / 2, m2 - (m4 - m2)
    if limit is None:
        return {"layers": top, "memory_limit_bytes": None, "bytes_at_2_layers": m2, "bytes_at_4_layers": m4}
    budget = a.memory_fraction * limit
    layers = int(max(1, min(top, (budget - fixed) // max(per_layer, 1))))
    return {"layers": layers, "memory_limit_bytes": limit, "memory_fraction": a.memory_fraction,
            "bytes_at_2_layers": m2, "bytes_at_4_layers": m4, "bytes_per_layer": per_layer,
            "bytes_predicted": fixed + per_layer * layers}


def step_phase(a) -> dict:
    """The layer fit (unless --layers), then the ASFT step at that depth."""
    _apply_gpu_flags()
    from benchmarks.step import JaxSide, batch_stats, flops, host_batch

    fit = {"layers": a.layers} if a.layers else fit_layers(a)
    layers = fit["layers"]
    cfg = model_config(a.tiny, layers)
    args = _step_args(a, layers)
    raw = host_batch(cfg, args)
    side = JaxSide(args, cfg, raw, None)
    first = side.step()
    times, losses = [], [first[1]]
    for _ in range(a.steps):
        dt, loss, _ = side.step()
        times.append(dt)
        losses.append(loss)
    summ = side.summary()
    stats = batch_stats(raw, cfg, a.logits_chunk)
    fl = flops(summ["params"], cfg, stats)
    step_s = float(np.median(times))
    nominal = C.nominal_peak(summ["machine"]["device_kind"])
    out = {"model": f"{'tiny' if a.tiny else 'qwen2_5_vl_7b'} widths, {layers} decoder layers", "fit": fit,
           "layers": layers,
           "batch": stats, "image": a.image, "dtype": "bfloat16 compute, float32 params", "remat": args.remat,
           "scan_layers": True, "params": summ["params"], "compile_s": summ["compile_s"],
           "first_step_s": round(first[0], 3), "step_s": round(step_s, 4), "step_times_s": [round(t, 4) for t in times],
           "tokens_per_s": round(stats["tokens"] / step_s, 1), "losses": losses, **fl,
           "measured_peak_flops": summ["measured_peak_flops"],
           "mfu_vs_measured": round(fl["model_flops"] / (step_s * summ["measured_peak_flops"]), 4),
           "executed_flops_utilisation_vs_measured": round(fl["executed_flops_jax"] / (step_s * summ["measured_peak_flops"]), 4),
           "device_peak_bytes": summ["device_peak_bytes"], "memory_analysis": summ["memory_analysis"],
           "machine": summ["machine"]}
    if nominal:
        out.update(nominal_peak_flops=nominal, mfu=round(fl["model_flops"] / (step_s * nominal), 4))
    return out


# ----------------------------------------------------------------------------- 3. sampler
def sampler_phase(a) -> dict:
    _apply_gpu_flags()
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from benchmarks import sampler as SB
    from guilibra_jax import generate as G
    from guilibra_jax import sharding as S

    nnx.use_eager_sharding(False)
    cfg = model_config(a.tiny, 2 if a.tiny else FULL_LAYERS)
    mesh = S.make_mesh([1, 1, 1], jax.devices()[:1])
    dt = jnp.bfloat16
    graphdef, params = SB.init_params(cfg, dt, dt, mesh)
    prompts = SB.make_prompts(cfg, a.states, a.group, a.prompt_len, tuple(int(x) for x in a.image_hw.split(",")))
    config = G.SamplingConfig(temperature=0.0, max_new_tokens=a.max_new_tokens, pad_token_id=0)
    runs = {"generate": SB.jax_sampler(graphdef, params, prompts, cfg, a.prompt_len, mesh, config),
            "prefill": SB.jax_sampler(graphdef, params, prompts, cfg, a.prompt_len, mesh,
                                      dataclasses.replace(config, max_new_tokens=1))}
    first = {k: SB.timed(r)[1] for k, r in runs.items()}
    times = {k: [] for k in runs}
    for _ in range(a.iters):
        for k, r in runs.items():
            (_, count, _), t = SB.timed(r)
            times[k].append(t)
            if k == "generate":
                generated = count
    med = {k: float(np.median(v)) for k, v in times.items()}
    state = nnx.to_pure_dict(nnx.eval_shape(lambda: nnx.state(SB.M.QwenVL(cfg, rngs=nnx.Rngs(0)), nnx.Param)))
    size = lambda tree: int(sum(x.size for x in jax.tree.leaves(tree)))
    head = cfg.text.vocab_size * cfg.text.hidden_size
    groups = {"vision": size(state.get("visual", {})), "head": head}
    groups["decoder_body"] = (size(state) - groups["vision"] - size(state["language_model"]["embed_tokens"])
                              - (0 if cfg.tie_word_embeddings else head))
    patches = sum(int(np.prod(g)) for _, g, _ in prompts)
    fl = SB.sampler_flops(groups, cfg, len(prompts), a.prompt_len, a.max_new_tokens, patches)
    decode_s = med["generate"] - med["prefill"]
    machine = C.machine_info()
    nominal = C.nominal_peak(machine["device_kind"])
    peak = C.measure_matmul_peak()
    out = {"model": f"{'tiny' if a.tiny else 'qwen2_5_vl_7b'}, {cfg.text.num_layers} layers, bf16",
           "rows": len(prompts), "states": a.states, "group": a.group, "prompt_len": a.prompt_len,
           "image_hw": a.image_hw, "max_new_tokens": a.max_new_tokens, "first_call_s": round(first["generate"], 2),
           "generate_s": round(med["generate"], 4), "prefill_s": round(med["prefill"], 4),
           "decode_s": round(decode_s, 4), "tokens_per_s": round(generated / med["generate"], 1),
           "decode_tokens_per_s": round(len(prompts) * fl["decode_steps"] / max(decode_s, 1e-9), 1), **fl,
           "measured_peak_flops": peak,
           "decode_flops_utilisation_vs_measured": round(fl["decode_flops"] / (max(decode_s, 1e-9) * peak), 4)}
    if nominal:
        out.update(nominal_peak_flops=nominal,
                   decode_flops_utilisation=round(fl["decode_flops"] / (max(decode_s, 1e-9) * nominal), 4))
    return out


# ----------------------------------------------------------------------------- main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="tiny model and shapes: the whole check in seconds on a CPU")
    p.add_argument("--phases", default="parity,asft_step,sampler")
    p.add_argument("--batch", type=int, default=None, help="ASFT rows (default 4; tiny 2)")
    p.add_argument("--seq", type=int, default=None, help="ASFT tokens per row (default 4096; tiny 128)")
    p.add_argument("--image", type=int, default=None, help="ASFT image side in px (default 672; tiny 56)")
    p.add_argument("--loss_fraction", type=float, default=1 / 3)
    p.add_argument("--logits_chunk", type=int, default=None, help="default 512 (tiny 16)")
    p.add_argument("--steps", type=int, default=None, help="timed ASFT steps (default 5; tiny 2)")
    p.add_argument("--layers", type=int, default=0, help="decoder layers of the ASFT model (0: as many as fit)")
    p.add_argument("--memory_fraction", type=float, default=0.85, help="of the device memory the fit may plan for")
    p.add_argument("--memory_limit_gb", type=float, default=0.0, help="override the device's memory limit")
    p.add_argument("--states", type=int, default=None, help="sampler prompts (default 8; tiny 2)")
    p.add_argument("--group", type=int, default=None, help="sampler G (default 8; tiny 2)")
    p.add_argument("--prompt_len", type=int, default=None, help="default 1024 (tiny 64)")
    p.add_argument("--image_hw", default=None, help="sampler image, default 448,672 (tiny 56,84)")
    p.add_argument("--max_new_tokens", type=int, default=None, help="default 256 (tiny 8)")
    p.add_argument("--iters", type=int, default=None, help="timed sampler calls (default 3; tiny 1)")
    p.add_argument("--parity_seq", type=int, default=None, help="default 512 (tiny 64)")
    p.add_argument("--parity_image", type=int, default=None, help="default 224 (tiny 56)")
    C.add_result_args(p)
    a = p.parse_args(argv)
    defaults = dict(batch=(2, 4), seq=(128, 4096), image=(56, 672), logits_chunk=(16, 512), steps=(2, 5),
                    states=(2, 8), group=(2, 8), prompt_len=(64, 1024), image_hw=("56,84", "448,672"),
                    max_new_tokens=(8, 256), iters=(1, 3), parity_seq=(64, 512), parity_image=(56, 224))
    for k, (tiny, full) in defaults.items():
        if getattr(a, k) is None:
            setattr(a, k, tiny if a.tiny else full)
    a.phases = [x for x in a.phases.split(",") if x]
    unknown = set(a.phases) - {"parity", "asft_step", "sampler"}
    if unknown:
        p.error(f"--phases: unknown {sorted(unknown)}; expected parity, asft_step, sampler")
    return a


def main(argv=None) -> dict:
    a = parse_args(argv)
    start = C.run_start()
    result = {"benchmark": "gpu_check", "tiny": a.tiny, "args": {k: v for k, v in vars(a).items()}}
    t0 = time.perf_counter()
    if "parity" in a.phases:
        result["parity"] = in_process(parity_phase, a)
        print(f"[gpu_check] parity: {json.dumps(result['parity'])}", flush=True)
    if "asft_step" in a.phases:
        result["asft_step"] = in_process(step_phase, a)
        print(f"[gpu_check] asft_step: {result['asft_step']['layers']} layers, {result['asft_step']['tokens_per_s']} tokens/s, "
              f"MFU {result['asft_step'].get('mfu')}", flush=True)
    if "sampler" in a.phases:
        result["sampler"] = in_process(sampler_phase, a)
        print(f"[gpu_check] sampler: {result['sampler']['tokens_per_s']} tokens/s", flush=True)
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    machine = result.get("asft_step", {}).pop("machine", None)
    return C.report("gpu_check", "gpu_check-tiny" if a.tiny else "gpu_check", result, a, start, machine)


if __name__ == "__main__":
    main()
