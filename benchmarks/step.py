"""Train-step throughput of the ASFT step (JAX) vs the same step in transformers + PyTorch.

  python -m benchmarks.step [--model=bench100m|tiny|qwen2_5_vl_3b] [--batch=2] [--seq=256] [--image=224]
                            [--steps=5] [--dtype=float32|bfloat16] [--mesh=-1,1,1] [--torch/--no-torch]
  python -m benchmarks.step --config=configs/guilibra_sft.py:qwen3_vl_8b [--batch=...] [--seq=4096]
      # a training recipe's model, dtype, remat, layer scan and mesh (no torch side): tokens/s per
      # device and MFU on whatever accelerators are present (runs unchanged on an H100 / H200)

Both sides run one ASFT step (ASFT below: weighted token NLL, alpha_action=2, alpha_grounding=4,
per-sample normalisation, as in guilibra_jax.losses.asft_loss) with the same AdamW (OPTIM below:
constant lr, b1, b2, eps, weight decay, global-norm clipping) on the same weights and batch:
JAX: params created on the mesh (jit with out_shardings), make_optimizer, make_sft_step, jitted with
  donation and AOT-compiled; the params are exported with save_hf before the first step.
torch: that export loaded with from_pretrained, torch.optim.AdamW, the loss written out below
  (torch_asft_loss) from cross_entropy; transformers computes its own M-RoPE positions.
Each side runs in its own process, so peak memory is its own (and JAX's GPU preallocation cannot
starve torch).

Parity: every step's loss and gradient norm (before clipping) on both sides, and their relative
differences ([parity] line, "parity" in the JSON; see parity() for what each step tests). Step 1 is
the shared initial weights, step 2 follows one optimizer update. Relative tolerances: float32 (the
two agree to float32 rounding) loss 1e-5, gradient norm 2e-4 (a sum of ~1e8 squares, reduced in
another order). bfloat16 runs JAX with bf16 compute and torch under bf16 autocast, which round at
different places (bf16 keeps 8 significant bits, ~4e-3): loss 1e-3 (the NLL is formed in float32 and
averages the rounding out), gradient norm 3e-2.

MFU = model FLOPs per step / (step time * peak), with
  model FLOPs = 6 * (decoder non-embedding params + lm-head params) * B * T       (dense fwd+bwd)
              + 12 * layers * (heads * head_dim) * T^2 * B                           (decoder attention)
              + 6 * vision params * patches                                          (vision tower)
(vision attention scores are left out; T counts every position the model computes, B * T.)
Peak = this machine's measured matmul FLOP/s (2 n^3 / time) and, on a known GPU, its nominal peak.
Prints one JSON line at the end.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from benchmarks._common import BENCH_CONFIGS, bench_config, export_hf, square_image_grids, torch_inputs
from guilibra_jax import sharding as S
from guilibra_jax.models import ModelConfig, QwenVL
from guilibra_jax.train.fake_batch import fake_sft_batch
from guilibra_jax.train.loop import put_batch, stack_micro_batches
from guilibra_jax.train.optimizer import make_optimizer
from guilibra_jax.train.sft_step import make_sft_step
from guilibra_jax.train.step_core import init_state

NOMINAL_PEAK = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "B200": 2250e12}  # dense bf16 FLOP/s
ASFT = dict(alpha_action=2.0, alpha_grounding=4.0, normalize="sample")
# The GUI-Libra recipe's AdamW (configs/guilibra_sft.py) at a constant lr: a warmup starting at 0
# would make the first update zero and the step-2 check vacuous.
OPTIM = dict(lr=1e-5, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0, clip_norm=1.0)
# Relative tolerances. float32: losses agree to ~1e-7; gradient norms (sums over ~1e8 squares, reduced
# in another order) to ~6e-5 at bench100m. bfloat16: see the module docstring.
PARITY_RTOL = {"float32": {"loss": 1e-5, "grad_norm": 2e-4}, "bfloat16": {"loss": 1e-3, "grad_norm": 3e-2}}


def rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def measure_peak() -> float:
    on_gpu = jax.default_backend() == "gpu"
    n = 8192 if on_gpu else 2048
    dt = jnp.bfloat16 if on_gpu else jnp.float32
    a = jax.random.normal(jax.random.key(0), (n, n), dt)
    b = jax.random.normal(jax.random.key(1), (n, n), dt)
    f = jax.jit(lambda x, y: x @ y)
    f(a, b).block_until_ready()
    times = []
    for _ in range(3 if not on_gpu else 10):
        t = time.perf_counter()
        f(a, b).block_until_ready()
        times.append(time.perf_counter() - t)
    return 2 * n ** 3 / min(times)


def nominal_peak() -> float | None:
    kind = jax.devices()[0].device_kind
    for k, v in NOMINAL_PEAK.items():
        if k in kind:
            return v
    return None


def param_groups(params: dict, config: ModelConfig) -> dict:
    total = sum(x.size for x in jax.tree.leaves(params))
    vision = sum(x.size for x in jax.tree.leaves(params.get("visual", {})))
    embed = sum(x.size for x in jax.tree.leaves(params["language_model"]["embed_tokens"]))
    head = config.text.vocab_size * config.text.hidden_size  # tied or not, the lm-head matmul
    decoder_dense = total - vision - embed + (head if config.tie_word_embeddings else 0)
    return {"total": int(total), "vision": int(vision), "embedding": int(embed), "decoder_dense": int(decoder_dense)}


def model_flops(groups: dict, config: ModelConfig, batch: int, seq: int, patches: int) -> float:
    t = config.text
    dense = 6.0 * groups["decoder_dense"] * batch * seq
    attn = 12.0 * t.num_layers * (t.num_heads * t.head_dim) * seq ** 2 * batch
    vis = 6.0 * groups["vision"] * patches
    return dense + attn + vis


def memory_fields(compiled) -> dict:
    try:
        ma = compiled.memory_analysis()
    except Exception as e:  # noqa: BLE001
        return {"error": repr(e)}
    if ma is None:
        return {}
    return {k: getattr(ma, k) for k in dir(ma)
            if not k.startswith("_") and isinstance(getattr(ma, k, None), (int, float))}


def device_memory() -> dict | None:
    """Peak / current / limit bytes of the first device (None on CPU, which keeps no statistics)."""
    try:
        st = jax.devices()[0].memory_stats()
    except Exception:  # noqa: BLE001
        return None
    return {k: st[k] for k in ("peak_bytes_in_use", "bytes_in_use", "bytes_limit") if k in st} if st else None


def timed_steps(step, n: int) -> tuple[dict, list[float]]:
    """Run ``step() -> (loss, grad_norm)`` (device scalars) once untimed (warm-up) and n times timed.
    Returns ({"losses", "grad_norms"} of all n + 1 steps, the n step times)."""
    out, times = [step()], []
    for _ in range(n):
        t = time.perf_counter()
        out.append(step())
        times.append(time.perf_counter() - t)
    return {"losses": [float(x[0]) for x in out], "grad_norms": [float(x[1]) for x in out]}, times


def throughput(times: list[float], tokens: int, flops: float, peak: float, ndev: int = 1) -> dict:
    step_s = float(np.median(times))
    return {"step_s": round(step_s, 4), "step_times_s": [round(x, 4) for x in times],
            "tokens_per_s": round(tokens / step_s, 1), "tokens_per_s_per_device": round(tokens / step_s / ndev, 1),
            "achieved_flops": flops / step_s, "mfu_vs_measured": round(flops / (step_s * peak * ndev), 4)}


def run_jax(args, config: ModelConfig, host: dict, export_dir: str | None) -> dict:
    nnx.use_eager_sharding(False)
    mesh = S.make_mesh([int(s) for s in args.mesh.split(",")])
    cdtype = jnp.bfloat16 if args.dtype == "bfloat16" else jnp.float32

    def build():
        return QwenVL(config, dtype=cdtype, param_dtype=jnp.float32, rngs=nnx.Rngs(0), remat=args.remat,
                      scan_layers=args.scan_layers)

    graphdef, abs_state, _ = nnx.split(nnx.eval_shape(build), nnx.Param, ...)
    param_sh = S.param_shardings(abs_state, mesh, log=False)
    t0 = time.perf_counter()
    params = jax.jit(lambda: nnx.to_pure_dict(nnx.state(build(), nnx.Param)), out_shardings=param_sh)()
    jax.block_until_ready(params)
    init_s = time.perf_counter() - t0
    groups = param_groups(params, config)
    print(f"[jax] params {groups} init {init_s:.1f}s mesh {dict(mesh.shape)}", flush=True)
    if export_dir is not None:  # before the donated step deletes these buffers
        export_hf(graphdef, params, config, export_dir)

    o = OPTIM
    tx, _ = make_optimizer(params, lr=o["lr"], total_steps=1000, schedule="constant", b1=o["b1"], b2=o["b2"],
                           eps=o["eps"], weight_decay=o["weight_decay"], clip_norm=o["clip_norm"])
    rep = S.replicated(mesh)
    state_sh = {"step": rep, "params": param_sh, "opt_state": S.opt_state_shardings(tx, params, param_sh, mesh),
                "skipped": rep}
    state = jax.jit(lambda p: init_state(p, tx), out_shardings=state_sh, donate_argnums=0)(params)
    del params
    step_fn = make_sft_step(graphdef, tx, **ASFT)
    jit_step = jax.jit(step_fn, in_shardings=(state_sh, None), out_shardings=(state_sh, None), donate_argnums=0)
    batch = put_batch(stack_micro_batches([host]), mesh)
    t0 = time.perf_counter()
    compiled = jit_step.lower(state, batch).compile()
    compile_s = time.perf_counter() - t0
    mem = memory_fields(compiled)
    print(f"[jax] compile {compile_s:.1f}s memory_analysis {mem}", flush=True)

    box = {"state": state}
    del state

    def step():
        box["state"], box["metrics"] = compiled(box["state"], batch)
        jax.block_until_ready((box["state"], box["metrics"]))
        return box["metrics"]["loss"], box["metrics"]["grad_norm"]

    history, times = timed_steps(step, args.steps)
    dev_mem = device_memory()

    b, t = host["input_ids"].shape
    patches = int(host["pixel_values"].shape[0]) if "pixel_values" in host else 0
    flops = model_flops(groups, config, b, t, patches)
    measured = measure_peak()
    out = {"backend": jax.default_backend(), "devices": mesh.size, "device_kind": jax.devices()[0].device_kind,
           "params": groups, "compile_s": round(compile_s, 2),
           **throughput(times, int(np.sum(host["segment_ids"] > 0)), flops, measured, mesh.size),
           "model_flops_per_step": flops, "measured_peak_flops": measured,
           **history, "skipped": int(jax.device_get(box["metrics"]["skipped"])),
           "memory_analysis": mem, "device_memory": dev_mem, "host_maxrss_bytes": rss_bytes()}
    out["peak_memory_bytes"] = dev_mem["peak_bytes_in_use"] if dev_mem and "peak_bytes_in_use" in dev_mem \
        else out["host_maxrss_bytes"]
    nominal = nominal_peak()
    if nominal:
        out["nominal_peak_flops"] = nominal
        out["mfu_vs_nominal"] = round(flops / (float(np.median(times)) * nominal * mesh.size), 4)
    return out


def torch_asft_loss(logits, targets, segments: np.ndarray):
    """ASFT loss in torch, written from the definition (not from guilibra_jax.losses): per-token weights
    1 / alpha_action / alpha_grounding on segments 1 / 2 / 3, NLL in float32, normalised per sample
    (mean over samples carrying weight) or over all tokens."""
    import torch

    w_np = np.select([segments == 1, segments == 2, segments == 3],
                     [1.0, ASFT["alpha_action"], ASFT["alpha_grounding"]], 0.0).astype(np.float32)
    w = torch.tensor(w_np, device=logits.device)
    nll = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), targets.flatten(),
                                            reduction="none").view_as(targets)
    if ASFT["normalize"] == "token":
        return (w * nll).sum() / w.sum()
    den_b = w.sum(-1)  # [B]
    has = den_b > 0
    return ((w * nll).sum(-1)[has] / den_b[has]).sum() / has.sum()


def run_torch(args, config: ModelConfig, host: dict, export_dir: str, flops: float, peak: float) -> dict:
    """The same step in transformers + PyTorch (meant for its own process: see main)."""
    import torch
    from transformers import AutoModelForImageTextToText

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    rss0 = rss_bytes()
    model = AutoModelForImageTextToText.from_pretrained(export_dir, dtype=torch.float32).to(dev).train()
    params = [p for p in model.parameters() if p.requires_grad]
    o = OPTIM
    # make_optimizer decays JAX params of ndim > 1, which include the q/k/v biases ([heads, head_dim],
    # 1-D here): with weight_decay > 0 the sides would differ on those; at 0 the split is moot.
    groups = [{"params": [p for p in params if p.ndim > 1], "weight_decay": o["weight_decay"]},
              {"params": [p for p in params if p.ndim <= 1], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=o["lr"], betas=(o["b1"], o["b2"]), eps=o["eps"])
    b = host["input_ids"].shape[0]
    inputs = torch_inputs(host["input_ids"], host["segment_ids"] > 0, square_image_grids(b, args.image, config),
                          host["pixel_values"], config, dev)
    targets = torch.tensor(host["targets"].astype(np.int64), device=dev)
    use_bf16 = args.dtype == "bfloat16"
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=dev, dtype=torch.bfloat16, enabled=use_bf16):
            logits = model(**inputs).logits
        loss = torch_asft_loss(logits, targets, host["loss_segments"])
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, o["clip_norm"])  # before clipping
        opt.step()
        sync()
        return loss.detach(), grad_norm

    history, times = timed_steps(step, args.steps)
    out = {"device": dev, "threads": torch.get_num_threads(),
           **throughput(times, int(np.sum(host["segment_ids"] > 0)), flops, peak),
           **history, "host_maxrss_bytes": rss_bytes(), "host_maxrss_delta_bytes": rss_bytes() - rss0}
    if dev == "cuda":
        out["max_memory_allocated_bytes"] = int(torch.cuda.max_memory_allocated())
    out["peak_memory_bytes"] = out.get("max_memory_allocated_bytes", out["host_maxrss_bytes"])
    return out


def parity(jres: dict, tres: dict, dtype: str) -> dict:
    """Relative gaps between the two sides' losses and gradient norms (before clipping), step by step.

    Step 1 is the shared initial weights: model, inputs and loss. At random init every token's NLL is
    about log V, so the loss value barely depends on the ASFT weights or normalisation; the gradient
    norm does (sum_t (w_t / sum w)^2). Step 2 follows one update, which tests lr, eps and weight decay
    (Adam's first update is g / (|g| + eps) whatever b1, b2); b1 and b2 show only faintly in later steps
    of the same batch, whose gradients barely change.
    """
    rtol = PARITY_RTOL[dtype]
    rel = lambda j, t: abs(t - j) / max(abs(j), 1e-30)
    rows = [{"loss_jax": lj, "loss_torch": lt, "loss_rel_diff": rel(lj, lt),
             "grad_norm_jax": gj, "grad_norm_torch": gt, "grad_norm_rel_diff": rel(gj, gt)}
            for lj, lt, gj, gt in zip(jres["losses"], tres["losses"], jres["grad_norms"], tres["grad_norms"])]
    later = rows[2:]
    out = {"dtype": dtype, "rtol": rtol, "step1": rows[0], "step2": rows[1],
           "later_steps_max_loss_rel_diff": max((r["loss_rel_diff"] for r in later), default=None),
           "later_steps_max_grad_norm_rel_diff": max((r["grad_norm_rel_diff"] for r in later), default=None),
           "ok": all(r["loss_rel_diff"] <= rtol["loss"] and r["grad_norm_rel_diff"] <= rtol["grad_norm"]
                     for r in rows)}
    line = " | ".join(f"step{i + 1} loss jax {r['loss_jax']:.7f} torch {r['loss_torch']:.7f} rel "
                      f"{r['loss_rel_diff']:.1e}, grad norm rel {r['grad_norm_rel_diff']:.1e}"
                      for i, r in enumerate(rows[:2]))
    if len(rows) > 2:
        line += (f" | steps 3-{len(rows)} max rel loss {out['later_steps_max_loss_rel_diff']:.1e}, "
                 f"grad norm {out['later_steps_max_grad_norm_rel_diff']:.1e}")
    print(f"[parity] {line} | rtol loss {rtol['loss']:g}, grad norm {rtol['grad_norm']:g} ({dtype}): "
          f"{'OK' if out['ok'] else 'MISMATCH'}", flush=True)
    return out


def in_process(fn, *args):
    """fn(*args) in a fresh spawned process (own peak memory, own accelerator context)."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def load_recipe(spec: str):
    """The ConfigDict of ``configs/X.py[:arg]`` (as ``launch.train --config`` reads it)."""
    import importlib.util
    path, _, arg = spec.partition(":")
    module = importlib.util.spec_from_file_location("recipe", path)
    mod = importlib.util.module_from_spec(module)
    module.loader.exec_module(mod)
    return mod.get_config(arg) if arg else mod.get_config()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="bench100m", help=f"one of {sorted(BENCH_CONFIGS)} or a named_config")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--image", type=int, default=224)
    p.add_argument("--steps", type=int, default=5, help="timed steps after the first (>= 1: parity needs step 2)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--mesh", default="-1,1,1", help="data,fsdp,tensor sizes; one may be -1")
    p.add_argument("--torch", dest="torch", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--config", default="", help="a training recipe, configs/X.py[:arg]: its model, dtype, remat, "
                                                "scan_layers and mesh (overrides --model/--dtype/--mesh)")
    args = p.parse_args()
    args.remat, args.scan_layers = "none", False
    if args.config:
        recipe = load_recipe(args.config)
        args.model, args.dtype = recipe.model.name, recipe.model.dtype
        args.remat, args.scan_layers = recipe.model.remat, recipe.model.scan_layers
        args.mesh = ",".join(str(recipe.mesh[a]) for a in ("data", "fsdp", "tensor"))
        if args.torch is None:
            args.torch = False
    if args.steps < 1:
        p.error(f"--steps={args.steps}: need at least 1 timed step")

    config = bench_config(args.model)
    want_torch = args.torch
    if want_torch is None:
        try:
            import torch  # noqa: F401
            import transformers  # noqa: F401
            want_torch = args.model in BENCH_CONFIGS
        except ImportError:
            want_torch = False

    host = fake_sft_batch(config, batch=args.batch, seq_len=args.seq, image_hw=(args.image, args.image), seed=0)
    with tempfile.TemporaryDirectory() as d:
        jres = in_process(run_jax, args, config, host, d if want_torch else None)
        tres = in_process(run_torch, args, config, host, d, jres["model_flops_per_step"],
                          jres["measured_peak_flops"]) if want_torch else None

    result = {"benchmark": "train_step", "model": args.model, "batch": args.batch, "seq": args.seq,
              "image": args.image, "steps": args.steps, "dtype": args.dtype, "asft": ASFT, "optim": OPTIM,
              "jax": jres, "torch": tres,
              "ratio_torch_over_jax_step_time": round(tres["step_s"] / jres["step_s"], 3) if tres else None,
              "parity": parity(jres, tres, args.dtype) if tres else None}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
