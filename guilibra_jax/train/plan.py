"""Compile-time memory plans: will a recipe fit its devices, before the job starts?

This module compiles and measures; the trainers' plans are ``sft/plan.py`` and
``rl/plan.py``, and ``recipe_plan.py`` plans a recipe (``launch.plan``, ``--dry_run``).

The recipe's own jitted programs (the ASFT step; for stage 2 the update step, the sampler
and every scoring pass) are lowered and compiled ahead of time at the recipe's largest
shapes on its mesh, from abstract arrays (nothing is allocated). Per device:

* parameters, optimizer state and frozen models: from the arrays' shardings (exact);
* temporaries of each program (activations, gradients inside the update, the sampler's KV
  cache and logits): XLA's ``memory_analysis()`` of the compiled per-device program;
* peak = what stays resident (policy, optimizer state, frozen models) + the largest
  program's temporaries and inputs (programs run one after another).

Compiled for the CPU (``launch.plan`` with fake devices), temporaries approximate a GPU's:
XLA's CPU and GPU backends fuse and schedule differently, and the CPU may compute bf16 in
f32. The trainer writes the same report for its real devices as ``memory_plan.json``.

Shapes: micro-batch rows over all processes; prompts of ``max(data.seq_buckets)`` (or
``data.max_length``) tokens with one landscape image of ``max_pixels`` each (one vision
tower slot per row, sharded over the batch devices like the rows); ``rl.max_new_tokens``
response slots.
"""

from __future__ import annotations

import math
import re
from types import SimpleNamespace
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from guilibra_jax.data import images as I
from guilibra_jax.models.vision import device_vision_inputs, prepare_vision_inputs
from guilibra_jax.train.batching import pad_slots_to_mesh, placement, slot_pixels_shape

GIB = 2 ** 30
HEADROOM = 0.9   # XLA and the runtime keep some memory for themselves (e.g. the GPU allocator's reserve)


# ----------------------------------------------------------------------------- bytes
def per_device_bytes(tree) -> int:
    """Bytes one device holds of a tree of (abstract) arrays with shardings (the most
    loaded device when shards differ)."""
    total = 0
    for x in jax.tree.leaves(tree):
        sh = getattr(x, "sharding", None)
        shape = sh.shard_shape(x.shape) if sh is not None else x.shape
        total += math.prod(shape) * jnp.dtype(x.dtype).itemsize
    return int(total)


def abstract(tree, shardings=None):
    """ShapeDtypeStructs (with shardings) of a tree of arrays."""
    if shardings is None:
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
                            tree)
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def compiled_stats(compiled) -> dict[str, int]:
    """Per-device bytes of a compiled program (XLA's memory analysis)."""
    m = compiled.memory_analysis()
    if m is None:
        return {}
    keys = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes", "temp_size_in_bytes",
            "generated_code_size_in_bytes")
    out = {k.replace("_size_in_bytes", ""): int(getattr(m, k, 0) or 0) for k in keys}
    out.update(compiled_cost(compiled))
    if isinstance(compiled, _Refused):
        out["refused_by_compiler"] = compiled.message
    return out


_OOM = re.compile(r"RESOURCE_EXHAUSTED: Ran out of memory[^\n]*?required for ([^(]+?) \(([\d.]+)([KMGT])\) exceeds "
                  r"available HBM \(([\d.]+)([KMGT])\)")


class _Refused(NamedTuple):
    """A program the TPU compiler refused for lack of memory (it checks HBM at compile time):
    its memory analysis is the compiler's own requirement, as temporaries."""
    what: str
    required: int
    available: int
    message: str
    arguments: int = 0     # per-device bytes of its inputs (from their shardings)

    def memory_analysis(self):
        return SimpleNamespace(temp_size_in_bytes=self.required, argument_size_in_bytes=self.arguments)

    def cost_analysis(self):
        return {}


def compile_program(lowered, args=()):
    """``lowered.compile()``; a program that the TPU compiler refuses for lack of HBM comes
    back as a stand-in whose memory analysis is the requirement the compiler reported (and
    ``args``' per-device bytes as its inputs)."""
    try:
        return lowered.compile()
    except Exception as e:  # noqa: BLE001  (jax's XlaRuntimeError; anything else re-raised)
        m = _OOM.search(str(e))
        if not m:
            raise
        unit = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}
        return _Refused(m.group(1).strip(), int(float(m.group(2)) * unit[m.group(3)]),
                        int(float(m.group(4)) * unit[m.group(5)]), str(e).splitlines()[0][:300],
                        per_device_bytes(args))


def compiled_cost(compiled) -> dict[str, int]:
    """Per-device FLOPs and HBM bytes of a compiled program (XLA's cost analysis; a while
    loop's body, e.g. the sampler's decode step, counts once)."""
    try:
        c = compiled.cost_analysis()
    except Exception:  # noqa: BLE001  (backends without a cost model)
        return {}
    c = c[0] if isinstance(c, (list, tuple)) else c
    if not c:
        return {}
    return {"flops": int(c.get("flops", 0) or 0), "bytes_accessed": int(c.get("bytes accessed", 0) or 0)}


# ----------------------------------------------------------------------------- shapes
def prompt_length(config) -> int:
    d = config.data
    return int(max(d.seq_buckets) if d.seq_buckets else d.max_length)


def patches_per_image(config, model_config) -> int:
    """Patch rows of one image at the run's largest pixel budget (any platform's), capped by
    what a sequence of ``data.max_length`` tokens can hold (one token per ``merge_unit``
    patches): a larger image makes its record overlong, and overlong records are dropped."""
    d = config.data
    budgets = [d.max_pixels or I.processor_config(model_config.family, model_config=model_config).max_pixels]
    budgets += [int(v[1]) for v in dict(d.pixels).values() if v and v[1]]
    p = model_config.vision.patch_size
    mu = model_config.vision.merge_unit
    n = min(max(budgets) // (p * p), int(d.max_length) * mu)
    return max(mu, n // mu * mu)


def largest_grid(config, model_config) -> tuple[int, int, int]:
    """(t, h, w) of a landscape image of exactly :func:`patches_per_image` patches (the
    divisor of its merged units closest to a 16:9 aspect)."""
    m = model_config.vision.spatial_merge_size
    units = patches_per_image(config, model_config) // (m * m)
    rows = min((d for d in range(1, units + 1) if units % d == 0), key=lambda d: abs(d - math.sqrt(units * 9 / 16)))
    return 1, rows * m, units // rows * m


def batch_struct(mesh, host: dict, micro_axis: bool) -> dict:
    """Abstract global batch of host-shaped arrays placed like ``batching.put_batch``:
    rows, vision slots and slot-layout pixels over (data, fsdp), per-token vision entries
    replicated."""
    host = pad_slots_to_mesh(host, mesh, micro_axis)

    def one(path, x):
        x = np.asarray(x)
        shape = x.shape
        if str(getattr(path[0], "key", path[0])) == "pixel_values" and host.get("vision"):
            shape = slot_pixels_shape(shape, np.shape(host["vision"]["patch_index"]))
        return jax.ShapeDtypeStruct(shape, x.dtype, sharding=placement(path, len(shape), mesh, micro_axis))

    return jax.tree_util.tree_map_with_path(one, host)


def image_inputs(config, model_config, rows: int, processes: int = 1) -> tuple[np.ndarray, dict]:
    """Host-shaped (zeros) pixel_values [P, D] and vision arrays for ``rows`` images of the
    largest size, laid out as the trainer lays them out (per process, then joined)."""
    vc = model_config.vision
    grid = largest_grid(config, model_config)
    per = grid[1] * grid[2]
    bucket = config.data.patch_bucket
    local_rows = max(1, rows // processes)
    local = -(-local_rows * per // bucket) * bucket
    total = max(local, bucket) * processes
    images = local_rows * processes
    vision = device_vision_inputs(prepare_vision_inputs(np.array([grid] * images), model_config, num_patches=total,
                                                        num_slots=images, slot_bucket=bucket))
    if images == rows:   # one image per row, slot b = row b: put_batch marks the layout row-aligned
        vision["row_slots"] = np.arange(rows, dtype=np.int32)[:, None]
    dim = vc.in_channels * vc.temporal_patch_size * vc.patch_size * vc.patch_size
    return np.broadcast_to(np.zeros((1, dim), np.float32), (total, dim)), vision   # shape only (GBs at real size)


def repeat(x, m: int) -> np.ndarray:
    """[m, *x.shape] view of ``x`` (shapes only: a real-size step's pixels would not fit in RAM)."""
    return np.broadcast_to(x, (m, *np.shape(x)))


# ----------------------------------------------------------------------------- report
def build_report(mesh, resident: dict[str, int], programs: dict[str, dict[str, int]], device_memory_gib: float,
            extra: dict | None = None) -> dict:
    """Per-device GiB components, the peak and whether it fits."""
    gib = lambda b: round(b / GIB, 4)
    resident_total = sum(resident.values())
    transient = {name: st.get("temp", 0) + max(0, st.get("argument", 0) - st.get("resident_args", 0))
                 for name, st in programs.items()}
    worst = max(transient, key=transient.get) if transient else None
    peak = resident_total + (transient[worst] if worst else 0)
    budget = device_memory_gib * GIB * HEADROOM if device_memory_gib else None
    components = {k: gib(v) for k, v in resident.items()}
    components.update({f"{k} (temporaries + inputs)": gib(v) for k, v in transient.items()})
    report = {"devices": int(mesh.devices.size), "mesh": {k: int(v) for k, v in mesh.shape.items()},
              "device_memory_gib": device_memory_gib, "usable_gib": gib(budget) if budget else None,
              "per_device_gib": components, "peak_gib": gib(peak), "peak_program": worst,
              "fits": bool(peak <= budget) if budget else None, "programs": programs, **(extra or {})}
    if report["fits"] is False:
        biggest = max({**resident, **({worst: transient[worst]} if worst else {})}.items(), key=lambda kv: kv[1])
        report["overflow"] = biggest[0]
        report["suggestion"] = suggestion(biggest[0], mesh)
    return report


def suggestion(component: str, mesh) -> str:
    if component in ("policy_params", "optimizer_state", "gradients") or component.startswith("frozen_"):
        return (f"shard the weights over more devices: raise mesh.fsdp (now {mesh.shape['fsdp']}) or mesh.tensor "
                f"(now {mesh.shape['tensor']}), keep frozen models in bf16 (model.dtype), or use more hosts")
    if component == "sampler":
        return ("the sampler's KV cache and logits: fewer rollouts per round (data.batch_size or rl.group_size), "
                "shorter rl.max_new_tokens, or more tensor parallelism (mesh.tensor)")
    return ("activations: a stronger remat policy (model.remat=nothing_saveable or full), smaller micro-batches "
            "(raise train.grad_accum), rl.score_chunk for the vocabulary projection, or shorter sequences")


def device_memory_gib(mesh) -> float | None:
    """Memory of the mesh's first local device (its allocator's limit), None when the
    backend does not say (CPU)."""
    local = [d for d in mesh.devices.flat if d.process_index == jax.process_index()]
    try:
        stats = local[0].memory_stats() if local else None
    except Exception:  # backends without memory stats
        stats = None
    limit = (stats or {}).get("bytes_limit")
    return limit / GIB if limit else None


def summary_line(report: dict) -> str:
    parts = ", ".join(f"{k} {v:.2f}" for k, v in report["per_device_gib"].items())
    if report["fits"] is None:
        return f"{parts}; peak {report['peak_gib']:.2f} GiB (device memory unknown)"
    verdict = "fits" if report["fits"] else f"does NOT fit ({report.get('overflow')})"
    return f"{parts}; peak {report['peak_gib']:.2f} of {report['usable_gib']:.2f} GiB usable: {verdict}"
