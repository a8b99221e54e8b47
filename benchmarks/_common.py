"""What the JAX-vs-transformers benchmarks share: model configs, the export of JAX params to a
transformers checkpoint, and the transformers inputs of a batch."""
from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import re
import subprocess
import time
from typing import Any, NamedTuple

import numpy as np
from flax import nnx

from guilibra_jax.models import ModelConfig, TextConfig, VisionConfig, named_config, save_hf
from guilibra_jax.train.fake_batch import tiny_config


def bench100m_config() -> ModelConfig:
    """~113M params shaped like Qwen2.5-VL: text 512 x 8 layers, vision 384 x 4, Qwen's tied vocabulary."""
    return ModelConfig(
        family="qwen2_5_vl",
        text=TextConfig(vocab_size=151936, hidden_size=512, intermediate_size=1536, num_layers=8, num_heads=8,
                        num_kv_heads=2, head_dim=64, mrope_section=(8, 12, 12)),
        vision=VisionConfig(depth=4, hidden_size=384, intermediate_size=1024, num_heads=6, out_hidden_size=512,
                            window_size=112, fullatt_block_indexes=(3,)),
        tie_word_embeddings=True)


# Benchmark-only sizes; any other name goes to guilibra_jax.models.named_config.
BENCH_CONFIGS = {
    "bench100m": bench100m_config,
    # ~0.8M params, 4k vocabulary, windowed vision attention (window 56 px): a parity check in seconds.
    "tiny": lambda: tiny_config("qwen2_5_vl", vocab=4096, hidden=128, layers=2),
}


def bench_config(name: str) -> ModelConfig:
    return BENCH_CONFIGS[name]() if name in BENCH_CONFIGS else named_config(name)


def export_hf(graphdef: nnx.GraphDef, params, config: ModelConfig, path: str) -> None:
    """Write ``params`` (the model's pure dict, on device) as a transformers checkpoint in ``path``."""
    save_hf(nnx.merge(graphdef, params), config, path)


def square_image_grids(batch: int, image_px: int, config: ModelConfig) -> np.ndarray:
    """image_grid_thw [batch, 3] of one image_px x image_px image per row (fake_sft_batch's layout)."""
    g = image_px // config.vision.patch_size
    return np.array([(1, g, g)] * batch, np.int64)


def torch_inputs(input_ids, attention_mask, image_grid_thw, pixel_values, config: ModelConfig, device="cpu") -> dict:
    """transformers kwargs for Qwen*-VL. M-RoPE positions are left to transformers, which derives them
    from input_ids, mm_token_type_ids, image_grid_thw and attention_mask (without mm_token_type_ids,
    transformers 5 silently falls back to 1-D positions)."""
    import torch

    ids = np.asarray(input_ids, np.int64)
    t = lambda x: torch.tensor(np.asarray(x), device=device)
    return dict(input_ids=t(ids), attention_mask=t(np.asarray(attention_mask, np.int64)),
                mm_token_type_ids=t((ids == config.image_token_id).astype(np.int64)),
                image_grid_thw=t(np.asarray(image_grid_thw, np.int64)), pixel_values=t(pixel_values))


# ----------------------------------------------------------------------------- results files
RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_identity() -> dict:
    """What tells apart CPUs that report one model name (two Intel VMs both read "Intel(R)
    Xeon(R) Processor" and measured matmul peaks 286-320 against 347-379 GFLOP/s): the x86
    family / model / stepping from /proc/cpuinfo and the cache sizes per level from sysfs
    ({"L1d": "48K", "L2": "2048K", "L3": "491520K"}); keys absent where the system has none."""
    out = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("cpu family", "model", "stepping") and key.replace(" ", "_") not in out:
                    out[key.replace(" ", "_")] = value.strip()
                if not line.strip():      # the first processor's block is enough
                    break
    except OSError:
        pass
    caches = {}
    for d in sorted(glob.glob("/sys/devices/system/cpu/cpu0/cache/index*")):
        try:
            level, kind, size = (open(os.path.join(d, n)).read().strip() for n in ("level", "type", "size"))
        except OSError:
            continue
        if kind != "Instruction":
            caches[f"L{level}" + ("d" if kind == "Data" else "")] = size
    if caches:
        out["caches"] = caches
    return out


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def machine_info() -> dict:
    """CPU model, cores, memory, accelerators (as JAX sees them) and a file-name slug."""
    import jax

    devices = jax.devices()
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        mem = None
    kind = devices[0].device_kind
    backend = jax.default_backend()
    cores = os.cpu_count()
    slug = (f"{backend}{len(devices)}-{kind}" if backend != "cpu" else f"cpu{cores}-{cpu_model()}").lower()
    return {"cpu_model": cpu_model(), "cpu": cpu_identity(), "cpu_cores": cores, "memory_bytes": mem,
            "hostname": platform.node(),
            "jax_backend": backend, "devices": len(devices), "device_kind": kind,
            "slug": re.sub(r"[^a-z0-9]+", "-", slug).strip("-")[:60]}


def versions() -> dict:
    from importlib import metadata

    out = {"python": platform.python_version()}
    for name in ("jax", "jaxlib", "flax", "optax", "numpy", "torch", "transformers"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:  # an optional side that is not installed
            out[name] = None
    return out


def git_commit() -> dict:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def git(*args):
        try:
            return subprocess.run(["git", "-C", root, *args], capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    commit = git("rev-parse", "HEAD")
    return {"commit": commit or None, "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))
            if commit else None}


def is_loaded(load_before: list[float] | None, cores: int) -> bool | None:
    """A machine counts as loaded when, before the benchmark started, its 1-minute load
    average was above a quarter of its cores (other work competing for them)."""
    return None if not load_before else load_before[0] > 0.25 * cores


def run_start() -> dict:
    """What a benchmark records as it starts: the load average, the git commit, the time."""
    return {"load_average_before": load_average(), "git": git_commit(),
            "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def launcher_malloc() -> None:
    """Run this benchmark as the launchers run training: re-execute it with their malloc
    tunables (``guilibra_jax.train.distributed.reexec_with_hugepages``: huge pages for malloc's
    large buffers; GUILIBRA_NO_HUGEPAGES=1 measures without). A peer's side in a child process
    inherits the environment, one in this process shares it: both sides run alike. Called
    first thing under ``__main__``; write_result records GLIBC_TUNABLES."""
    from guilibra_jax.train import distributed
    distributed.reexec_with_hugepages()


class TimedStep(NamedTuple):
    """One step of :func:`interleaved_steps`: its round (0: untimed), whether it is its turn's
    first, and what the side's step returned."""
    round: int
    turn_first: bool
    out: Any


def interleaved_steps(step, sides: list[str], timed: int, per_turn: int = 1,
                      on_round=None) -> dict[str, list[TimedStep]]:
    """One untimed step per side (round 0), then ``timed`` rounds of ``per_turn`` consecutive
    steps per side, the order rotating every round (two sides: reversed every other round).
    Returns {side: [TimedStep(round, turn_first, step(side)) ...]}; ``turn_first`` marks each timed
    turn's first step when per_turn > 1 (a side's step after the others ran: on a VM that takes
    back the memory a process freed, it pays to fault it in again; docs/benchmarks.md).
    ``on_round(r, rows)`` is called after each round."""
    rows = {s: [] for s in sides}
    for r in range(timed + 1):
        for s in sides[r % len(sides):] + sides[:r % len(sides)]:
            for k in range(per_turn if r else 1):
                rows[s].append(TimedStep(r, bool(r and k == 0 and per_turn > 1), step(s)))
        if on_round is not None:
            on_round(r, rows)
    return rows


def write_result(name: str, result: dict, out_dir: str | None, loaded: bool | None, start: dict,
                 machine: dict | None = None) -> str | None:
    """Add machine (``machine_info()`` unless given), versions, ``start`` (run_start()), the
    load average now and the ``loaded`` label to ``result`` and write it as
    ``<out_dir>/<name>-<machine slug>.json`` (out_dir "" = write nothing). Returns the path."""
    machine = machine or machine_info()
    auto = is_loaded(start["load_average_before"], machine["cpu_cores"] or 1)
    result.update({"machine": machine, "versions": versions(), **start, "load_average_after": load_average(),
                   "loaded": auto if loaded is None else loaded,
                   "glibc_tunables": os.environ.get("GLIBC_TUNABLES", "")})
    if out_dir == "":
        return None
    out_dir = out_dir or RESULTS_DIR
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{name}-{machine['slug']}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1, default=float)
        f.write("\n")
    return path


def report(tag: str, name: str, result: dict, args, start: dict, machine: dict | None = None) -> dict:
    """write_result with the benchmark's --out_dir / --loaded, then print the JSON and the path."""
    path = write_result(name, result, args.out_dir, args.loaded, start, machine)
    print(json.dumps(result))
    if path:
        print(f"[{tag}] wrote {path}", flush=True)
    return result


def add_result_args(p) -> None:
    """--out_dir and --loaded, the flags every benchmark that writes a results file takes."""
    p.add_argument("--out_dir", default=None, help="where the JSON goes (default benchmarks/results; '' = nowhere)")
    p.add_argument("--loaded", action=argparse.BooleanOptionalAction, default=None,
                   help="label the run as taken on a loaded machine (default: from the load average before "
                        "the run: above a quarter of the cores)")


def measure_matmul_peak(n: int | None = None, repeats: int = 3, dtype: str | None = None) -> float:
    """This machine's JAX matmul FLOP/s: the best of ``repeats`` n x n products (2 n^3 FLOPs)
    after a warm-up; in ``dtype`` (default: float32 on CPU, n = 2048; bfloat16 on accelerators,
    n = 8192). A CPU run in bfloat16 passes dtype="bfloat16": its peak (AMX / AVX512-BF16 where
    the CPU has them) is not float32's."""
    import jax
    import jax.numpy as jnp

    on_acc = jax.default_backend() != "cpu"
    n = n or (8192 if on_acc else 2048)
    dt = jnp.dtype(dtype) if dtype else (jnp.bfloat16 if on_acc else jnp.float32)
    a = jax.random.normal(jax.random.key(0), (n, n), dt)
    b = jax.random.normal(jax.random.key(1), (n, n), dt)
    f = jax.jit(lambda x, y: x @ y)
    f(a, b).block_until_ready()
    best = float("inf")
    for _ in range(repeats if not on_acc else 10):
        t = time.perf_counter()
        f(a, b).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return 2 * n ** 3 / best


# Dense bf16 FLOP/s (no sparsity) from the vendors' datasheets, matched against device_kind.
NOMINAL_BF16_PEAK = {"H200": 989e12, "H100": 989e12, "H100 PCIe": 756e12, "H800": 989e12, "B200": 2250e12, "GB200": 2500e12,
                     "A100": 312e12, "A800": 312e12, "L40S": 362e12, "L40": 181e12, "L4": 121e12, "A10G": 70e12,
                     "RTX 4090": 165e12, "TPU v5p": 459e12, "TPU v5 lite": 197e12, "TPU v4": 275e12,
                     "TPU v6": 918e12}


def nominal_peak(device_kind: str) -> float | None:
    """The device's nominal dense bf16 FLOP/s (NOMINAL_BF16_PEAK; longest name that matches)."""
    hits = [k for k in NOMINAL_BF16_PEAK if k.lower() in device_kind.lower()]
    return NOMINAL_BF16_PEAK[max(hits, key=len)] if hits else None


def measure_memory_bandwidth(mbytes: int | None = None, repeats: int = 5) -> float:
    """This machine's JAX memory bandwidth in bytes/s: the best of ``repeats`` in-place passes
    of x * 0.5 over a float32 array (one read and one write of it); 256 MB on CPU, 2 GB on
    accelerators (far beyond any cache)."""
    import jax
    import jax.numpy as jnp

    on_acc = jax.default_backend() != "cpu"
    n = (mbytes or (2048 if on_acc else 256)) * 2 ** 20 // 4
    f = jax.jit(lambda a: a * 0.5, donate_argnums=0)  # in place: no fresh pages to fault in
    x = f(jnp.ones((n,), jnp.float32)).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        x = f(x).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return 2 * 4 * n / best
