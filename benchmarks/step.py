"""Train-step throughput of the ASFT step (JAX) vs a transformers/PyTorch training step.

  python -m benchmarks.step [--model=bench100m|qwen2_5_vl_3b] [--batch=2] [--seq=256] [--image=224]
                            [--steps=5] [--dtype=float32|bfloat16] [--mesh=-1,1,1] [--torch/--no-torch]

JAX: model params created directly on the mesh (jit with out_shardings), AdamW from make_optimizer,
sharded with guilibra_jax.sharding, the step jitted with donation and AOT-compiled. The loss is
made plain masked token-mean CE (alpha_action = alpha_grounding = 1, normalize="token") so that the
torch step (same weights via save_hf -> from_pretrained, same batch, CE on loss_segments > 0, grad
clip 1.0, AdamW) computes the same thing; first-step losses are compared.

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
import os
import resource
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from guilibra_jax import sharding as S
from guilibra_jax.models import ModelConfig, QwenVL, TextConfig, VisionConfig, named_config, save_hf
from guilibra_jax.train.fake_batch import fake_sft_batch
from guilibra_jax.train.loop import put_batch, stack_micro_batches
from guilibra_jax.train.optimizer import make_optimizer
from guilibra_jax.train.sft_step import init_state, make_sft_step

NOMINAL_PEAK = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "B200": 2250e12}  # dense bf16 FLOP/s


def bench100m_config() -> ModelConfig:
    """Same ~100M Qwen2.5-VL shape as benchmarks/model_forward.py."""
    return ModelConfig(
        family="qwen2_5_vl",
        text=TextConfig(vocab_size=151936, hidden_size=512, intermediate_size=1536, num_layers=8, num_heads=8,
                        num_kv_heads=2, head_dim=64, mrope_section=(8, 12, 12)),
        vision=VisionConfig(depth=4, hidden_size=384, intermediate_size=1024, num_heads=6, out_hidden_size=512,
                            window_size=112, fullatt_block_indexes=(3,)),
        tie_word_embeddings=True)


def rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def measure_peak(dtype) -> float:
    on_gpu = jax.default_backend() == "gpu"
    n = 8192 if on_gpu else 2048
    dt = jnp.bfloat16 if on_gpu else jnp.float32
    del dtype
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
    out = {}
    for k in dir(ma):
        if k.startswith("_"):
            continue
        v = getattr(ma, k, None)
        if isinstance(v, (int, float)):
            out[k] = v
    return out


def run_jax(args, config: ModelConfig, host: dict, export_dir: str | None) -> dict:
    nnx.use_eager_sharding(False)
    sizes = [int(s) for s in args.mesh.split(",")]
    mesh = S.make_mesh(sizes)
    cdtype = jnp.bfloat16 if args.dtype == "bfloat16" else jnp.float32

    def build():
        return QwenVL(config, dtype=cdtype, param_dtype=jnp.float32, rngs=nnx.Rngs(0))

    abstract = nnx.eval_shape(build)
    graphdef, abs_state, rest = nnx.split(abstract, nnx.Param, ...)
    param_sh = S.param_shardings(abs_state, mesh, log=False)
    t0 = time.perf_counter()
    params = jax.jit(lambda: nnx.to_pure_dict(nnx.state(build(), nnx.Param)), out_shardings=param_sh)()
    jax.block_until_ready(params)
    init_s = time.perf_counter() - t0
    groups = param_groups(params, config)
    print(f"[jax] params {groups} init {init_s:.1f}s mesh {dict(mesh.shape)}", flush=True)

    if export_dir is not None:  # before the donated step deletes these buffers
        model = build()  # concrete host model (small models only), then overwritten with the jitted params
        pstate = nnx.state(model, nnx.Param)
        nnx.replace_by_pure_dict(pstate, jax.device_get(params))
        nnx.update(model, pstate)
        save_hf(model, config, export_dir)
        del model, pstate

    tx, schedule = make_optimizer(params, lr=1e-5, total_steps=1000, schedule="constant", weight_decay=0.0,
                                  clip_norm=1.0)
    opt_sh = S.opt_state_shardings(tx, params, param_sh, mesh)
    rep = S.replicated(mesh)
    state_sh = {"step": rep, "params": param_sh, "opt_state": opt_sh, "skipped": rep}
    state = jax.jit(lambda p: init_state(p, tx), out_shardings=state_sh, donate_argnums=0)(params)
    del params
    step_fn = make_sft_step(graphdef, tx, alpha_action=1.0, alpha_grounding=1.0, normalize="token")
    jit_step = jax.jit(step_fn, in_shardings=(state_sh, None), out_shardings=(state_sh, None), donate_argnums=0)
    batch = put_batch(stack_micro_batches([host]), mesh)

    t0 = time.perf_counter()
    compiled = jit_step.lower(state, batch).compile()
    compile_s = time.perf_counter() - t0
    mem = memory_fields(compiled)
    print(f"[jax] compile {compile_s:.1f}s memory_analysis {mem}", flush=True)

    state, metrics = compiled(state, batch)  # warm-up = first step on the initial weights
    loss_first = float(jax.device_get(metrics["loss"]))
    times = []
    for _ in range(args.steps):
        t = time.perf_counter()
        state, metrics = compiled(state, batch)
        jax.block_until_ready((state, metrics))
        times.append(time.perf_counter() - t)
    step_s = float(np.median(times))
    dev_mem = None
    try:
        st = jax.devices()[0].memory_stats()
        if st:
            dev_mem = {k: st[k] for k in ("peak_bytes_in_use", "bytes_in_use", "bytes_limit") if k in st}
    except Exception:  # noqa: BLE001
        pass

    real_tokens = int(np.sum(host["segment_ids"] > 0))
    b, t = host["input_ids"].shape
    patches = int(host["pixel_values"].shape[0]) if "pixel_values" in host else 0
    flops = model_flops(groups, config, b, t, patches)
    ndev = mesh.size
    measured = measure_peak(cdtype)
    nominal = nominal_peak()
    out = {
        "backend": jax.default_backend(), "devices": ndev, "device_kind": jax.devices()[0].device_kind,
        "params": groups, "compile_s": round(compile_s, 2), "step_s": round(step_s, 4),
        "step_times_s": [round(x, 4) for x in times],
        "tokens_per_s": round(real_tokens / step_s, 1), "tokens_per_s_per_device": round(real_tokens / step_s / ndev, 1),
        "model_flops_per_step": flops, "achieved_flops": flops / step_s,
        "measured_peak_flops": measured, "mfu_vs_measured": round(flops / (step_s * measured * ndev), 4),
        "loss_last": float(jax.device_get(metrics["loss"])), "skipped": int(jax.device_get(metrics["skipped"])),
        "memory_analysis": mem, "device_memory": dev_mem, "host_maxrss_bytes": rss_bytes(),
    }
    if nominal:
        out["nominal_peak_flops"] = nominal
        out["mfu_vs_nominal"] = round(flops / (step_s * nominal * ndev), 4)
    out["loss_first"] = loss_first
    out["_flops"] = flops
    return out


def run_torch(args, config: ModelConfig, host: dict, export_dir: str, flops: float) -> dict:
    import torch
    from transformers import AutoModelForImageTextToText

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    rss0 = rss_bytes()
    model = AutoModelForImageTextToText.from_pretrained(export_dir, dtype=torch.float32).to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    ids = host["input_ids"].astype(np.int64)
    vc = config.vision
    b = ids.shape[0]
    gh = gw = args.image // vc.patch_size
    inputs = dict(
        input_ids=torch.tensor(ids, device=dev),
        attention_mask=torch.tensor((host["segment_ids"] > 0).astype(np.int64), device=dev),
        mm_token_type_ids=torch.tensor((ids == config.image_token_id).astype(np.int64), device=dev),
        image_grid_thw=torch.tensor(np.array([(1, gh, gw)] * b, np.int64), device=dev),
        pixel_values=torch.tensor(host["pixel_values"], device=dev))
    targets = torch.tensor(host["targets"].astype(np.int64), device=dev)
    mask = torch.tensor((host["loss_segments"] > 0).astype(np.float32), device=dev)
    use_bf16 = args.dtype == "bfloat16"
    params = [p for p in model.parameters() if p.requires_grad]

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=dev, dtype=torch.bfloat16, enabled=use_bf16):
            logits = model(**inputs).logits
        nll = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                                reduction="none").reshape(targets.shape)
        loss = (nll * mask).sum() / mask.sum().clamp_min(1e-9)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        return loss.detach()

    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    loss_first = float(step())
    sync()
    times = []
    for _ in range(args.steps):
        t = time.perf_counter()
        loss = step()
        sync()
        times.append(time.perf_counter() - t)
    step_s = float(np.median(times))
    real_tokens = int(np.sum(host["segment_ids"] > 0))
    out = {"device": dev, "threads": torch.get_num_threads(), "step_s": round(step_s, 4),
           "step_times_s": [round(x, 4) for x in times], "tokens_per_s": round(real_tokens / step_s, 1),
           "achieved_flops": flops / step_s, "loss_last": float(loss), "loss_first": loss_first,
           "host_maxrss_bytes": rss_bytes(), "host_maxrss_delta_bytes": rss_bytes() - rss0}
    if dev == "cuda":
        out["max_memory_allocated_bytes"] = int(torch.cuda.max_memory_allocated())
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="bench100m")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--image", type=int, default=224)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--mesh", default="-1,1,1", help="data,fsdp,tensor sizes; one may be -1")
    p.add_argument("--torch", dest="torch", action=argparse.BooleanOptionalAction, default=None)
    args = p.parse_args()

    config = bench100m_config() if args.model == "bench100m" else named_config(args.model)
    want_torch = args.torch
    if want_torch is None:
        try:
            import torch  # noqa: F401
            import transformers  # noqa: F401
            want_torch = args.model == "bench100m"
        except ImportError:
            want_torch = False

    host = fake_sft_batch(config, batch=args.batch, seq_len=args.seq, image_hw=(args.image, args.image), seed=0)
    with tempfile.TemporaryDirectory() as d:
        jres = run_jax(args, config, host, d if want_torch else None)
        flops = jres.pop("_flops")
        tres = run_torch(args, config, host, d, flops) if want_torch else None

    result = {"benchmark": "train_step", "model": args.model, "batch": args.batch, "seq": args.seq,
              "image": args.image, "steps": args.steps, "dtype": args.dtype, "jax": jres, "torch": tres,
              "ratio_torch_over_jax_step_time": round(tres["step_s"] / jres["step_s"], 3) if tres else None,
              "loss_jax_first": jres["loss_first"], "loss_torch_first": tres["loss_first"] if tres else None}
    if tres:
        diff = abs(tres["loss_first"] - jres["loss_first"])
        result["loss_first_abs_diff"] = diff
        result["loss_first_agree_1e-3"] = bool(diff < 1e-3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
