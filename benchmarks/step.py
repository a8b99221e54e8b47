"""Train-step throughput of the ASFT step (JAX) vs the same step in transformers + PyTorch,
eager and torch.compile'd, interleaved round by round on the same weights and batch.

  python -m benchmarks.step                          # bench100m, fp32, 2 x 256 tokens, 1/3 loss positions
  python -m benchmarks.step --model=tiny --steps=2 --no-torch_compile      # smoke run, seconds
  python -m benchmarks.step --config=configs/guilibra_sft.py:qwen3_vl_8b --seq=4096
      # a training recipe's model, dtype, remat, layer scan and mesh (no torch side): tokens/s per
      # device and MFU on whatever accelerators are present

Sides (each in its own spawned process, so peak memory is its own; all set up before the first
round, then driven one step at a time so that only one side computes at any moment):
  jax            params created on the mesh, make_optimizer, make_sft_step (LM head and cross-entropy
                 only at the loss positions, guilibra_jax/head_loss.py), jitted with donation and
                 AOT-compiled; the params are exported with save_hf before the first step.
  torch_eager    that export loaded with from_pretrained(attn_implementation="sdpa"), AdamW
                 (--torch_adamw: fused by default, else foreach), the loss written out below
                 (torch_asft_loss) from cross_entropy on the full logits, as transformers users do.
  torch_compile  the same with the forward + loss wrapped in torch.compile (inductor, default mode);
                 its compile time is reported apart (first_step_s).
Both torch sides run with --threads intra-op threads (default: all cores, which is what XLA's CPU
backend uses); the JSON records torch's thread counts and attention implementation.

Timing. Round 0 runs every side once untimed (compilation; "first_step_s"), then --steps rounds
run each side once, in an order that rotates every round. --steps_per_turn K > 1: each side runs
K consecutive steps per turn; the first of a turn (the side's step after the other sides ran: on
a 2-core VM ~0.9 s slower for either side, as after any idle time) is reported apart
("turn_first_step_s"), "step_s" is the median of the other K - 1 (back-to-back steps, as a
training run takes them). A timed step starts from the host batch
(numpy: token ids, attention segments, targets, loss segments, image grids, pixels) and ends when
the update is done, so host-side preparation is timed on both sides: JAX computes M-RoPE positions
(get_rope_index) and the vision tower's metadata (prepare_vision_inputs) and places the batch
(put_batch), as the data pipeline + trainer do; transformers computes its positions and vision
metadata inside forward. The JAX side also reports that preparation alone (host_prep_s).

Parity: every step's loss and gradient norm (before clipping) on all sides, and the relative
differences of each torch side from JAX ([parity] lines; see parity()). Step 1 is the shared
initial weights, step 2 follows one optimizer update. Relative tolerances: float32 loss 1e-5,
gradient norm 2e-4 (a sum of ~1e8 squares, reduced in another order); bfloat16 (JAX bf16 compute,
torch bf16 autocast, rounded at different places) loss 1e-3, gradient norm 3e-2.

FLOPs (per step; B rows, T positions, L_loss loss positions in all, L_exec positions where the
JAX side computes the head: the longest row's loss count rounded up by the chunk ladder, times B):
  backbone = 6 * decoder non-embedding params * B * T + 12 * layers * heads * head_dim * T^2 * B
             + 6 * vision params * patches        (vision attention scores are left out)
  model_flops        = backbone + 6 * head params * L_loss   (what the loss needs: MFU)
  executed flops     = backbone + 6 * head params * L_exec (JAX) or * B * T (transformers: full logits)
flops_utilisation = executed flops / (step time * peak), with peak this machine's measured JAX
matmul FLOP/s (2 n^3 / time, in the run's dtype on CPU) and, on a known accelerator, its nominal bf16 peak.

XLA flag sets (--xla_variants "name=FLAGS;name2=FLAGS2"): each becomes one more JAX side, "jax:name",
in its own process started with XLA_FLAGS=FLAGS (appended to the environment's), interleaved with
the others; the JSON gives each its ratio to the plain "jax" side (speedup "jax:name_vs_jax") and its
parity with it. The measured peak stays the plain side's (a flag that changes the dot emitter
changes its own matmul too). E.g. the CPU dot back ends (docs/benchmarks.md: YNNPACK, the default,
against Eigen and against YNN for every op; oneDNN's dot fusion dies with SIGILL on an AMD EPYC):
  python -m benchmarks.step --no-torch_compile --xla_variants \
      "eigen=--xla_cpu_experimental_ynn_fusion_type=;ynn_all=--xla_cpu_experimental_ynn_fusion_type=dot,eltwise,reduce"

Writes benchmarks/results/step-<model>-<dtype>-<machine>.json (see --out_dir) and prints it.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402

from benchmarks import _common as C  # noqa: E402

ASFT = dict(alpha_action=2.0, alpha_grounding=4.0, normalize="sample")
# The GUI-Libra recipe's AdamW (configs/guilibra_sft.py) at a constant lr: a warmup starting at 0
# would make the first update zero and the step-2 check vacuous.
OPTIM = dict(lr=1e-5, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0, clip_norm=1.0)
PARITY_RTOL = {"float32": {"loss": 1e-5, "grad_norm": 2e-4}, "bfloat16": {"loss": 1e-3, "grad_norm": 3e-2}}
TORCH_SIDES = ("torch_eager", "torch_compile")


def rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def host_batch(config, args) -> dict:
    """The benchmark batch as the data pipeline hands it over, before the JAX-side preparation:
    numpy ids, segments, targets, loss segments, image grids and pixels."""
    from guilibra_jax.train.fake_batch import fake_sft_batch

    b = fake_sft_batch(config, batch=args.batch, seq_len=args.seq, image_hw=(args.image, args.image), seed=0,
                       loss_fraction=args.loss_fraction)
    return {"input_ids": b["input_ids"], "segment_ids": b["segment_ids"], "targets": b["targets"],
            "loss_segments": b["loss_segments"], "pixel_values": b["pixel_values"],
            "image_grid_thw": C.square_image_grids(args.batch, args.image, config)}


def batch_stats(raw: dict, config, chunk: int) -> dict:
    from guilibra_jax.head_loss import positions_computed

    b, t = raw["input_ids"].shape
    loss = raw["loss_segments"] > 0
    real = int(np.sum(raw["segment_ids"] > 0))
    executed = b * positions_computed(int(loss.sum(-1).max()), t, chunk)
    return {"rows": b, "seq": t, "tokens": real, "loss_positions": int(loss.sum()),
            "loss_fraction": round(float(loss.sum()) / real, 4), "head_positions_jax": executed,
            "patches": int(raw["pixel_values"].shape[0])}


def param_groups(params: dict, config) -> dict:
    import jax

    total = sum(x.size for x in jax.tree.leaves(params))
    vision = sum(x.size for x in jax.tree.leaves(params.get("visual", {})))
    embed = sum(x.size for x in jax.tree.leaves(params["language_model"]["embed_tokens"]))
    head = config.text.vocab_size * config.text.hidden_size  # tied or not, the lm-head matmul
    untied_head = 0 if config.tie_word_embeddings else head
    return {"total": int(total), "vision": int(vision), "embedding": int(embed), "head": int(head),
            "decoder_body": int(total - vision - embed - untied_head)}


def flops(groups: dict, config, stats: dict) -> dict:
    t = config.text
    b, seq = stats["rows"], stats["seq"]
    backbone = (6.0 * groups["decoder_body"] * b * seq + 12.0 * t.num_layers * t.num_heads * t.head_dim * seq ** 2 * b
                + 6.0 * groups["vision"] * stats["patches"])
    head = 6.0 * groups["head"]
    return {"model_flops": backbone + head * stats["loss_positions"],
            "executed_flops_jax": backbone + head * stats["head_positions_jax"],
            "executed_flops_torch": backbone + head * b * seq}


# ----------------------------------------------------------------------------- the sides
class JaxSide:
    def __init__(self, args, config, raw, export_dir):
        import jax
        import jax.numpy as jnp
        from flax import nnx

        from guilibra_jax import sharding as S
        from guilibra_jax.models import QwenVL
        from guilibra_jax.train.optimizer import make_optimizer
        from guilibra_jax.train.sft.step import make_sft_step
        from guilibra_jax.train.step_core import init_state

        nnx.use_eager_sharding(False)
        self.args, self.config, self.raw = args, config, raw
        sizes = [int(s) for s in args.mesh.split(",")]
        # a mesh without -1 takes the first devices it needs (e.g. one GPU of eight)
        self.mesh = S.make_mesh(sizes, None if -1 in sizes else jax.devices()[:int(np.prod(sizes))])
        cdtype = jnp.bfloat16 if args.dtype == "bfloat16" else jnp.float32

        def build():
            return QwenVL(config, dtype=cdtype, param_dtype=jnp.float32, rngs=nnx.Rngs(0), remat=args.remat,
                          scan_layers=args.scan_layers)

        graphdef, abs_state, _ = nnx.split(nnx.eval_shape(build), nnx.Param, ...)
        param_sh = S.param_shardings(abs_state, self.mesh, log=False)
        params = jax.jit(lambda: nnx.to_pure_dict(nnx.state(build(), nnx.Param)), out_shardings=param_sh)()
        jax.block_until_ready(params)
        self.groups = param_groups(params, config)
        if export_dir is not None:  # before the donated step deletes these buffers
            C.export_hf(graphdef, params, config, export_dir)
        o = OPTIM
        tx, _ = make_optimizer(params, lr=o["lr"], total_steps=1000, schedule="constant", b1=o["b1"], b2=o["b2"],
                               eps=o["eps"], weight_decay=o["weight_decay"], clip_norm=o["clip_norm"])
        rep = S.replicated(self.mesh)
        state_sh = {"step": rep, "params": param_sh, "opt_state": S.opt_state_shardings(tx, params, param_sh,
                                                                                         self.mesh), "skipped": rep}
        self.state = jax.jit(lambda p: init_state(p, tx), out_shardings=state_sh, donate_argnums=0)(params)
        del params
        step_fn = make_sft_step(graphdef, tx, logits_chunk=args.logits_chunk, **ASFT)
        jit_step = jax.jit(step_fn, in_shardings=(state_sh, None), out_shardings=(state_sh, None), donate_argnums=0)
        t0 = time.perf_counter()
        self.compiled = jit_step.lower(self.state, self.prepare()[0]).compile()
        self.compile_s = time.perf_counter() - t0
        self.prep_times = []

    def prepare(self):
        """Host batch -> device batch, as the data pipeline and trainer do it (timed)."""
        from guilibra_jax.models import get_rope_index, prepare_vision_inputs
        from guilibra_jax.models.vision import device_vision_inputs
        from guilibra_jax.train.batching import put_batch, stack_micro_batches

        t0 = time.perf_counter()
        raw, cfg = self.raw, self.config
        positions, _ = get_rope_index(raw["input_ids"], raw["segment_ids"], raw["image_grid_thw"], cfg)
        host = {"input_ids": raw["input_ids"], "positions": positions.astype(np.int32),
                "segment_ids": raw["segment_ids"], "targets": raw["targets"], "loss_segments": raw["loss_segments"],
                "pixel_values": raw["pixel_values"],
                "vision": device_vision_inputs(prepare_vision_inputs(raw["image_grid_thw"], cfg))}
        batch = put_batch(stack_micro_batches([host]), self.mesh)
        return batch, time.perf_counter() - t0

    def step(self):
        import jax

        t0 = time.perf_counter()
        batch, prep = self.prepare()
        self.state, metrics = self.compiled(self.state, batch)
        jax.block_until_ready((self.state, metrics))
        dt = time.perf_counter() - t0
        self.prep_times.append(prep)
        return dt, float(metrics["loss"]), float(metrics["grad_norm"])

    def summary(self):
        import jax

        mem = {}
        try:
            ma = self.compiled.memory_analysis()
            mem = {k: getattr(ma, k) for k in dir(ma)
                   if not k.startswith("_") and isinstance(getattr(ma, k, None), (int, float))}
        except Exception as e:  # noqa: BLE001 - not every backend reports it
            mem = {"error": repr(e)}
        try:
            st = jax.devices()[0].memory_stats() or {}
        except Exception:  # noqa: BLE001
            st = {}
        return {"backend": jax.default_backend(), "devices": self.mesh.size, "mesh": dict(self.mesh.shape),
                "params": self.groups, "machine": C.machine_info(),
                "compile_s": round(self.compile_s, 2), "logits_chunk": self.args.logits_chunk,
                "host_prep_s": round(float(np.median(self.prep_times[1:] or self.prep_times)), 5),
                "memory_analysis": mem, "device_peak_bytes": st.get("peak_bytes_in_use"),
                "host_maxrss_bytes": rss_bytes(), "measured_peak_flops": C.measure_matmul_peak(dtype=self.args.dtype),
                "xla_flags": os.environ.get("XLA_FLAGS", "")}


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


def make_adamw(groups, kind: str):
    """torch AdamW: fused (one kernel per step; CPU since torch 2.4), foreach, or the for-loop
    default; falls back from fused to foreach where this torch build lacks it."""
    import torch

    o = OPTIM
    kw = dict(lr=o["lr"], betas=(o["b1"], o["b2"]), eps=o["eps"])
    if kind == "fused":
        try:
            return torch.optim.AdamW(groups, fused=True, **kw), "fused"
        except (RuntimeError, ValueError, TypeError):
            kind = "foreach"
    if kind == "foreach":
        return torch.optim.AdamW(groups, foreach=True, **kw), "foreach"
    return torch.optim.AdamW(groups, foreach=False, **kw), "for-loop"


class TorchSide:
    def __init__(self, args, config, raw, export_dir, compile_: bool):
        import torch
        from transformers import AutoModelForImageTextToText

        torch.set_num_threads(args.threads)
        self.dev = "cuda" if torch.cuda.is_available() else "cpu"
        self.raw, self.config, self.compile_ = raw, config, compile_
        self.model = AutoModelForImageTextToText.from_pretrained(
            export_dir, dtype=torch.float32, attn_implementation="sdpa").to(self.dev).train()
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.params = params
        # make_optimizer decays kernels and embeddings, not biases or norm scales: ndim > 1 here.
        groups = [{"params": [p for p in params if p.ndim > 1], "weight_decay": OPTIM["weight_decay"]},
                  {"params": [p for p in params if p.ndim <= 1], "weight_decay": 0.0}]
        self.opt, self.adamw = make_adamw(groups, args.torch_adamw)
        use_bf16 = args.dtype == "bfloat16"
        model = self.model

        def loss_fn(inputs, targets, segments):
            with torch.autocast(device_type=self.dev, dtype=torch.bfloat16, enabled=use_bf16):
                logits = model(**inputs).logits
            return torch_asft_loss(logits, targets, segments)

        self.loss_fn = torch.compile(loss_fn) if compile_ else loss_fn
        self.sync = torch.cuda.synchronize if self.dev == "cuda" else (lambda: None)

    def step(self):
        import torch

        t0 = time.perf_counter()
        raw = self.raw
        inputs = C.torch_inputs(raw["input_ids"], raw["segment_ids"] > 0, raw["image_grid_thw"], raw["pixel_values"],
                                self.config, self.dev)
        targets = torch.tensor(raw["targets"].astype(np.int64), device=self.dev)
        self.opt.zero_grad(set_to_none=True)
        loss = self.loss_fn(inputs, targets, raw["loss_segments"])
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, OPTIM["clip_norm"])  # before clipping
        self.opt.step()
        self.sync()
        return time.perf_counter() - t0, float(loss.detach()), float(grad_norm)

    def summary(self):
        import torch
        import transformers

        out = {"device": self.dev, "threads": torch.get_num_threads(), "interop_threads": torch.get_num_interop_threads(),
               "attn_implementation": self.model.config._attn_implementation, "adamw": self.adamw,
               "torch_compile": self.compile_, "transformers": transformers.__version__,
               "host_maxrss_bytes": rss_bytes(),
               "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "mkl_num_threads": os.environ.get("MKL_NUM_THREADS")}
        if self.compile_:
            from torch._dynamo.utils import counters

            out["graph_breaks"] = int(sum(counters["graph_break"].values()))
        if self.dev == "cuda":
            out["max_memory_allocated_bytes"] = int(torch.cuda.max_memory_allocated())
        return out


def serve(conn, side: str, args, config, raw, export_dir):
    """A side's process: build it, then answer "step" and "summary" until "summary"."""
    try:
        if side.startswith("jax"):
            obj = JaxSide(args, config, raw, export_dir)
        else:
            obj = TorchSide(args, config, raw, export_dir, compile_=side == "torch_compile")
        conn.send(("ready", None))
        # process CPU seconds (all threads) inside this side's steps and between them, after its
        # first step: CPU burnt while the other sides run (threads spinning idle) slows them
        cpu = {"in_steps": 0.0, "between_steps": 0.0, "between_wall": 0.0}
        last = None
        while True:
            cmd = conn.recv()
            if cmd == "step":
                c0, w0 = time.process_time(), time.perf_counter()
                if last is not None:
                    cpu["between_steps"] += c0 - last[0]
                    cpu["between_wall"] += w0 - last[1]
                out = obj.step()
                c1 = time.process_time()
                if last is not None:
                    cpu["in_steps"] += c1 - c0
                last = (c1, time.perf_counter())
                conn.send(("ok", out))
            else:
                summary = obj.summary()
                summary["process_cpu_s"] = {k: round(v, 3) for k, v in cpu.items()}
                conn.send(("ok", summary))
                return
    except BaseException as e:  # noqa: BLE001 - reported to the driver, which raises
        import traceback

        conn.send(("error", f"{side}: {e!r}\n{traceback.format_exc()}"))


class Remote:
    """One side in its own spawned process, driven over a pipe."""

    def __init__(self, side, *args, xla_flags: str = ""):
        ctx = multiprocessing.get_context("spawn")
        self.side = side
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=serve, args=(child, side, *args), daemon=True)
        before = os.environ.get("XLA_FLAGS")
        if xla_flags:   # the spawned child reads its environment at start
            os.environ["XLA_FLAGS"] = f"{before or ''} {xla_flags}".strip()
        try:
            self.proc.start()
        finally:
            if xla_flags:
                if before is None:
                    os.environ.pop("XLA_FLAGS", None)
                else:
                    os.environ["XLA_FLAGS"] = before

    def call(self, cmd=None):
        if cmd is not None:
            self.conn.send(cmd)
        try:
            status, value = self.conn.recv()
        except EOFError:   # the process died without a word (a crash in the compiler or a kernel)
            self.proc.join(timeout=10)
            raise RuntimeError(f"side {self.side!r} exited (code {self.proc.exitcode}) before answering "
                               f"{cmd or 'ready'!r}") from None
        if status == "error":
            raise RuntimeError(value)
        return value

    def close(self):
        self.proc.join(timeout=60)
        if self.proc.is_alive():
            self.proc.terminate()


# ----------------------------------------------------------------------------- report
def parity(hist: dict, dtype: str) -> dict:
    """Relative gaps of each other side's (torch, JAX under other XLA flags) losses and gradient norms
    (before clipping) from the plain JAX side's, step
    by step. Step 1 is the shared initial weights: model, inputs and loss. At random init every
    token's NLL is about log V, so the loss value barely depends on the ASFT weights or normalisation;
    the gradient norm does (sum_t (w_t / sum w)^2). Step 2 follows one update, which tests lr, eps and
    weight decay (Adam's first update is g / (|g| + eps) whatever b1, b2)."""
    rtol = PARITY_RTOL[dtype]
    rel = lambda j, t: abs(t - j) / max(abs(j), 1e-30)
    out = {"dtype": dtype, "rtol": rtol}
    j = hist["jax"]
    others = [s for s in hist if s != "jax"]
    for side in others:
        t = hist[side]
        rows = [{"loss_rel_diff": rel(lj, lt), "grad_norm_rel_diff": rel(gj, gt)}
                for lj, lt, gj, gt in zip(j["losses"], t["losses"], j["grad_norms"], t["grad_norms"])]
        ok = all(r["loss_rel_diff"] <= rtol["loss"] and r["grad_norm_rel_diff"] <= rtol["grad_norm"] for r in rows)
        out[side] = {"steps": rows, "max_loss_rel_diff": max(r["loss_rel_diff"] for r in rows),
                     "max_grad_norm_rel_diff": max(r["grad_norm_rel_diff"] for r in rows), "ok": ok}
        print(f"[parity] {side}: step1 loss jax {j['losses'][0]:.7f} {side} {t['losses'][0]:.7f}; over "
              f"{len(rows)} steps max rel diff loss {out[side]['max_loss_rel_diff']:.1e} grad norm "
              f"{out[side]['max_grad_norm_rel_diff']:.1e} (rtol {rtol['loss']:g} / {rtol['grad_norm']:g}, {dtype}): "
              f"{'OK' if ok else 'MISMATCH'}", flush=True)
    out["ok"] = all(out[s]["ok"] for s in others)
    return out


def load_recipe(spec: str):
    """The ConfigDict of ``configs/X.py[:arg]`` (as ``launch.train --config`` reads it)."""
    import importlib.util
    path, _, arg = spec.partition(":")
    module = importlib.util.spec_from_file_location("recipe", path)
    mod = importlib.util.module_from_spec(module)
    module.loader.exec_module(mod)
    return mod.get_config(arg) if arg else mod.get_config()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="bench100m", help=f"one of {sorted(C.BENCH_CONFIGS)} or a named_config")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--image", type=int, default=224)
    p.add_argument("--loss_fraction", type=float, default=1 / 3,
                   help="the responses' share of each row (the positions that carry loss)")
    p.add_argument("--steps", type=int, default=5, help="timed rounds after the untimed first (>= 1)")
    p.add_argument("--steps_per_turn", type=int, default=3,
                   help="consecutive steps per side per round; >1: step_s from all but each turn's first")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--mesh", default="-1,1,1", help="data,fsdp,tensor sizes; one may be -1")
    p.add_argument("--logits_chunk", type=int, default=128, help="JAX: head positions per row per chunk")
    p.add_argument("--torch", dest="torch", action=argparse.BooleanOptionalAction, default=None,
                   help="run the transformers sides (default: if torch is installed and --model is a bench size)")
    p.add_argument("--torch_compile", action=argparse.BooleanOptionalAction, default=True,
                   help="also the torch.compile side (its compile takes minutes on a CPU)")
    p.add_argument("--torch_adamw", default="fused", choices=("fused", "foreach", "for-loop"))
    p.add_argument("--xla_variants", default="",
                   help='more JAX sides, one per XLA flag set: "name=FLAGS;name2=FLAGS2" (side "jax:name")')
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch intra-op threads")
    p.add_argument("--config", default="", help="a training recipe, configs/X.py[:arg]: its model, dtype, remat, "
                                                "scan_layers and mesh (overrides --model/--dtype/--mesh; no torch)")
    C.add_result_args(p)
    args = p.parse_args(argv)
    args.remat, args.scan_layers = "none", False
    if args.config:
        recipe = load_recipe(args.config)
        args.model, args.dtype = recipe.model.name, recipe.model.dtype
        args.remat, args.scan_layers = recipe.model.remat, recipe.model.scan_layers
        args.mesh = ",".join(str(recipe.mesh[a]) for a in ("data", "fsdp", "tensor"))
        if args.torch is None:
            args.torch = False
    if args.steps < 1:
        p.error(f"--steps={args.steps}: need at least 1 timed round")
    if args.steps_per_turn < 1:
        p.error(f"--steps_per_turn={args.steps_per_turn}: need at least 1")
    args.variants = {}
    for part in filter(None, (x.strip() for x in args.xla_variants.split(";"))):
        name, sep, flags = part.partition("=")
        if not sep or not name.strip() or not flags.strip().startswith("--"):
            p.error(f"--xla_variants: {part!r} is not name=--flag[=value] ...")
        if f"jax:{name.strip()}" in args.variants:
            p.error(f"--xla_variants: the name {name.strip()!r} appears twice")
        args.variants[f"jax:{name.strip()}"] = flags.strip()
    if args.torch is None:
        try:
            import torch  # noqa: F401
            import transformers  # noqa: F401
            args.torch = args.model in C.BENCH_CONFIGS
        except ImportError:
            args.torch = False
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    start = C.run_start()
    config = C.bench_config(args.model)
    raw = host_batch(config, args)
    stats = batch_stats(raw, config, args.logits_chunk)
    sides = ["jax", *args.variants] + ([s for s in TORCH_SIDES if s != "torch_compile" or args.torch_compile]
                                       if args.torch else [])
    print(f"[step] {args.model} {args.dtype} batch {stats['rows']} x {stats['seq']}, loss positions "
          f"{stats['loss_positions']} ({stats['loss_fraction']:.0%} of tokens), sides {sides}", flush=True)

    remotes = {}
    with tempfile.TemporaryDirectory() as d:
        try:
            remotes["jax"] = Remote("jax", args, config, raw, d if args.torch else None)
            remotes["jax"].call()  # ready: the export is written
            for s in sides[1:]:
                remotes[s] = Remote(s, args, config, raw, d, xla_flags=args.variants.get(s, ""))
            for s in sides[1:]:
                remotes[s].call()
            show = lambda r, rows: print(f"[step] round {r}: " + ", ".join(
                f"{s} {rows[s][-1].out[0]:.3f}s" for s in sides), flush=True)
            rows = C.interleaved_steps(lambda s: remotes[s].call("step"), sides, args.steps,
                                       args.steps_per_turn, on_round=show)
            summaries = {s: remotes[s].call("summary") for s in sides}
        finally:
            for rem in remotes.values():
                rem.close()

    first = {s: rows[s][0].out[0] for s in sides}      # each out: (seconds, loss, grad norm)
    hist = {s: {"losses": [x.out[1] for x in rows[s]], "grad_norms": [x.out[2] for x in rows[s]],
                "times": [x.out[0] for x in rows[s] if x.round and not x.turn_first],
                "turn_first": [x.out[0] for x in rows[s] if x.turn_first]} for s in sides}
    # The driver never initialises an accelerator (a GPU backend would preallocate its memory): the JAX
    # side reports the machine, the parameter counts and the measured peak.
    machine = summaries["jax"].pop("machine")
    groups = summaries["jax"].pop("params")
    fl = flops(groups, config, stats)
    peak = summaries["jax"]["measured_peak_flops"]
    nominal = C.nominal_peak(machine["device_kind"]) if summaries["jax"]["backend"] != "cpu" else None
    ndev = summaries["jax"]["devices"]
    res = {}
    for s in sides:
        step_s = float(np.median(hist[s]["times"]))
        if s in args.variants:   # the plain side's peak (the machine's), this side's own beside it
            summaries[s]["own_measured_peak_flops"] = summaries[s].pop("measured_peak_flops")
            for k in ("machine", "params"):
                summaries[s].pop(k, None)
        executed = fl["executed_flops_jax" if s.startswith("jax") else "executed_flops_torch"]
        res[s] = {**summaries[s], "first_step_s": round(first[s], 3), "step_s": round(step_s, 4),
                  "step_times_s": [round(x, 4) for x in hist[s]["times"]],
                  **({"turn_first_step_s": round(float(np.median(hist[s]["turn_first"])), 4),
                      "turn_first_times_s": [round(x, 4) for x in hist[s]["turn_first"]]}
                     if hist[s]["turn_first"] else {}),
                  "tokens_per_s": round(stats["tokens"] / step_s, 1),
                  "tokens_per_s_per_device": round(stats["tokens"] / step_s / ndev, 1),
                  "executed_flops": executed,
                  "flops_utilisation": round(executed / (step_s * peak * ndev), 4),
                  "mfu_vs_measured": round(fl["model_flops"] / (step_s * peak * ndev), 4),
                  "losses": hist[s]["losses"], "grad_norms": hist[s]["grad_norms"]}
        if nominal and s.startswith("jax"):
            res[s]["nominal_peak_flops"] = nominal
            res[s]["mfu_vs_nominal"] = round(fl["model_flops"] / (step_s * nominal * ndev), 4)
    result = {"benchmark": "train_step", "model": args.model, "dtype": args.dtype, "batch": stats,
              "image": args.image, "rounds": args.steps, "steps_per_turn": args.steps_per_turn, "asft": ASFT,
              "optim": OPTIM, "params": groups, **fl,
              "measured_peak_flops": peak, "timing": "interleaved rounds (rotating order); each step from the host "
              "batch to the finished update: host preparation (positions, vision metadata) timed on both sides",
              "sides": res,
              # how many times faster: JAX than each torch side; each XLA flag set than plain JAX
              "speedup": {**{f"jax_vs_{s}": round(res[s]["step_s"] / res["jax"]["step_s"], 3)
                             for s in sides[1:] if s not in args.variants},
                          **{f"{s}_vs_jax": round(res["jax"]["step_s"] / res[s]["step_s"], 3) for s in args.variants}},
              "parity": parity(hist, args.dtype) if len(sides) > 1 else None}
    return C.report("step", f"step-{args.model}-{args.dtype}", result, args, start, machine)


if __name__ == "__main__":
    from benchmarks._common import launcher_malloc
    launcher_malloc()
    main()
