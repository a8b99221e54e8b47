"""Compile-time memory plans: will a recipe fit its devices, before the job starts?

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
import tempfile
from types import SimpleNamespace
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from guilibra_jax import sharding as S
from guilibra_jax.data import images as I
from guilibra_jax.models.vision import device_vision_inputs, prepare_vision_inputs
from guilibra_jax.train import rollout as RO
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
    pixels = d.get("pixels", None) if hasattr(d, "get") else None
    if pixels:
        budgets += [int(v[1]) for v in dict(pixels).values() if v and v[1]]
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


def _repeat(x, m: int) -> np.ndarray:
    """[m, *x.shape] view of ``x`` (shapes only: a real-size step's pixels would not fit in RAM)."""
    return np.broadcast_to(x, (m, *np.shape(x)))


def _struct_like(x, dtype=None):
    return np.zeros(np.shape(x), dtype or np.asarray(x).dtype)


# ----------------------------------------------------------------------------- report
def _report(mesh, resident: dict[str, int], programs: dict[str, dict[str, int]], device_memory_gib: float,
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


# ----------------------------------------------------------------------------- ASFT
def plan_sft(config, mesh, graphdef, state, state_sh, step_jit, model_config, device_memory_gib: float = 80.0,
             processes: int = 1) -> dict:
    """The ASFT step at the recipe's shapes: ``state`` abstract or concrete with
    ``state_sh``; ``step_jit`` the jitted (state, batch) -> (state, metrics)."""
    d, tc = config.data, config.train
    rows, T, M = d.batch_size, prompt_length(config), tc.grad_accum
    pv, vision = image_inputs(config, model_config, rows, processes)
    i32 = np.zeros((M, rows, T), np.int32)
    host = {"input_ids": i32, "targets": i32, "loss_segments": i32, "segment_ids": i32,
            "positions": np.zeros((M, 3, rows, T), np.int32), "pixel_values": _repeat(pv, M),
            "vision": {k: _repeat(v, M) for k, v in vision.items()}}
    abs_state = abstract(state, state_sh)
    batch = batch_struct(mesh, host, micro_axis=True)
    compiled = compile_program(step_jit.lower(abs_state, batch), (abs_state, batch))
    st = compiled_stats(compiled)
    params_b = per_device_bytes(abs_state["params"])
    opt_b = per_device_bytes(abs_state["opt_state"])
    st["resident_args"] = per_device_bytes(abs_state)
    resident = {"policy_params": params_b, "optimizer_state": opt_b}
    grads = params_b
    step = {**st, "gradients_estimate": grads}
    return _report(mesh, resident, {"asft_step": step}, device_memory_gib,
                   {"shapes": {"micro_batches": M, "rows": rows, "tokens": T, "patches": int(pv.shape[0])}})


# ----------------------------------------------------------------------------- stage 2
def plan_stage2(s, state, state_sh, device_memory_gib: float = 80.0, processes: int | None = None) -> dict:
    """Update, sampler and scoring programs of a stage-2 run (``rl_loop.Stage2``)."""
    from guilibra_jax import generate as G
    from guilibra_jax.train import rl_loop

    config, mesh, mc = s.config, s.mesh, s.model_config
    rl, tc = config.rl, config.train
    processes = processes or jax.process_count()
    Tp, N = prompt_length(config), rl.max_new_tokens
    round_rows = config.data.batch_size * rl.group_size
    gen_rows = rl.get("generation_rows", 0) or round_rows    # rows per sampler call
    score_rows = rl.get("score_rows", 0) or round_rows       # rows per scoring call
    upd_rows = rl_loop.update_groups(config) * rl.group_size
    micro_rows = upd_rows // rl.minibatches // tc.grad_accum
    M = tc.grad_accum
    abs_state = abstract(state, state_sh)
    resident = {"policy_params": per_device_bytes(abs_state["params"]),
                "optimizer_state": per_device_bytes(abs_state["opt_state"])}
    for name, f in s.frozen.items():
        resident[f"frozen_{name}"] = per_device_bytes(f.params)
    programs: dict[str, dict[str, int]] = {}

    # update step (the shared-prompt layout with the copies per prompt the trainer's micro-batches allow)
    dp = math.prod(mesh.shape[a] for a in S.BATCH_AXES)
    row_multiple = max(1, dp // processes)
    shared = rl_loop.shares_prompts(s)
    _, calls = rl_loop.update_calls(upd_rows // processes, rl.minibatches, M)   # this process's, as update() cuts them
    upd_copies = int(np.gcd.reduce([RO.run_copies(c // rl.group_size, row_multiple) for c in calls])) if shared else 1
    host = _update_host(config, mc, micro_rows, upd_copies if shared else 0, Tp, N, M, processes)
    batch = batch_struct(mesh, host, micro_axis=True)
    st = compiled_stats(compile_program(s.update_fn.lower(abs_state, batch), (abs_state, batch)))
    st["resident_args"] = per_device_bytes(abs_state)
    st["gradients_estimate"] = resident["policy_params"]
    programs["update"] = st

    # sampler: prefill of the call's distinct prompts (shared by their copies) + decode loop
    # over gen_rows rows (KV cache of T - 1 slots)
    # rows per process: a multiple of the batch devices of one process (s.row_multiple counts
    # this planning process's, which holds every fake device)
    copies = (RO.prompt_copies(gen_rows // processes, rl.group_size, max(1, dp // processes))
              if rl.get("share_prefill", True) else 1)
    p_rows = gen_rows // copies
    pv, vision = image_inputs(config, mc, p_rows, processes)
    prompt = {"prompt_ids": np.zeros((p_rows, Tp), np.int32), "prompt_mask": np.zeros((p_rows, Tp), np.int32),
              "positions": np.zeros((3, p_rows, Tp), np.int32), "rope_deltas": np.zeros((p_rows,), np.int32),
              "pixel_values": pv, "vision": vision}
    b = batch_struct(mesh, prompt, micro_axis=False)
    key = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=S.replicated(mesh))
    with S.mesh_context(mesh):
        lowered = G.lower_generate(s.graphdef, abs_state["params"], b["prompt_ids"], b["prompt_mask"],
                                   b["positions"], b["rope_deltas"], b["pixel_values"], b["vision"], key, s.sampling,
                                   copies)
    compiled = compile_program(lowered, (abs_state["params"], b))
    st = compiled_stats(compiled)
    st["resident_args"] = resident["policy_params"]
    st["kv_cache_estimate"] = kv_cache_bytes(mc, gen_rows, Tp + N - 1, config.model.dtype, mesh)
    programs["sampler"] = st

    # scoring: the policy (old log-probs) and each frozen model, rl.score_rows rows per call
    score_copies = RO.run_copies(np.arange(score_rows // processes) // rl.group_size, row_multiple) if shared else 1
    seq = {k: jax.tree.map(lambda x: x[0], v) for k, v in _update_host(config, mc, score_rows, score_copies if shared else 0, Tp, N, 1,
                                            processes).items() if k in SCORE_KEYS}
    b = batch_struct(mesh, seq, micro_axis=False)
    scored = [] if rl_loop.reuse_sampler_log_probs(rl) else [("policy", s.graphdef, abs_state["params"])]
    done = []   # (graphdef, params' shapes and shardings, stats): teachers of one architecture compile once
    for name, gd, params in scored + [(n, f.graphdef, abstract(f.params)) for n, f in s.frozen.items()]:
        sig = [(x.shape, x.dtype, x.sharding) for x in jax.tree.leaves(params)]
        same = next((st for g, sg, st in done if g == gd and sg == sig), None)
        if same is not None:
            programs[f"score_{name}"] = dict(same)
            continue
        with S.mesh_context(mesh):
            if shared:
                lowered = G.score_shared.lower(gd, params, b, temperature=float(rl.temperature), chunk_size=s.chunk,
                                               banned_token_ids=s.banned)
            else:
                lowered = G.score.lower(gd, params, b["input_ids"], b["positions"], b["segment_ids"],
                                        b["pixel_values"], b["vision"], b["response_mask"],
                                        temperature=float(rl.temperature), chunk_size=s.chunk,
                                        banned_token_ids=s.banned)
        compiled = compile_program(lowered, (params, b))
        st = compiled_stats(compiled)
        st["resident_args"] = per_device_bytes(params)
        programs[f"score_{name}"] = st
        done.append((gd, sig, st))
    shapes = {"round_rows": round_rows, "generation_rows": gen_rows, "prompt_copies": copies, "score_rows": score_rows,
              "score_prompt_copies": score_copies, "update_rows": upd_rows, "micro_rows": micro_rows,
              "update_prompt_copies": upd_copies, "micro_batches": M,
              "prompt_tokens": Tp, "response_tokens": N, "patches_per_image": patches_per_image(config, mc)}
    return _report(mesh, resident, programs, device_memory_gib, {"shapes": shapes})


SCORE_KEYS = ("input_ids", "positions", "segment_ids", "response_mask", "pixel_values", "vision", "prompt_ids",
              "prompt_positions", "prompt_segment_ids", "response_ids", "response_positions")   # what scoring reads


def _update_host(config, mc, rows: int, copies: int, Tp: int, N: int, M: int, processes: int) -> dict:
    """Host-shaped (zeros) update micro-batches [M, ...] of ``rows`` rows: the shared-prompt
    layout with ``copies`` rows per prompt (``rollout.shared_batch``; its images: one per
    prompt), or with ``copies=0`` whole sequences of Tp + N tokens."""
    f32 = lambda *shape: np.zeros((M,) + shape, np.float32)
    i32 = lambda *shape: np.zeros((M,) + shape, np.int32)
    per_row = {"advantages": f32(rows), "kl_mask": f32(rows)}
    if copies:
        p = rows // copies
        pv, vision = image_inputs(config, mc, p, processes)
        host = {"prompt_ids": i32(p, Tp), "prompt_segment_ids": i32(p, Tp), "prompt_positions": i32(3, p, Tp),
                "response_ids": i32(rows, N), "response_mask": i32(rows, N), "response_positions": i32(3, rows, N),
                "old_logp": f32(rows, N), "ref_logp": f32(rows, N), **per_row}
    else:
        pv, vision = image_inputs(config, mc, rows, processes)
        T = Tp + N
        host = {"input_ids": i32(rows, T), "segment_ids": i32(rows, T), "positions": i32(3, rows, T),
                "response_mask": i32(rows, T), "old_logp": f32(rows, T), "ref_logp": f32(rows, T), **per_row}
    host["pixel_values"], host["vision"] = _repeat(pv, M), {k: _repeat(v, M) for k, v in vision.items()}
    return host


def kv_cache_bytes(model_config, rows: int, slots: int, dtype: str, mesh) -> int:
    """Per-device bytes of the sampler's KV cache (rows over (data, fsdp), kv heads over tensor)."""
    t = model_config.text
    dp = math.prod(mesh.shape[a] for a in S.BATCH_AXES)
    tp = mesh.shape["tensor"] if t.num_kv_heads % mesh.shape["tensor"] == 0 else 1
    per = 2 * t.num_layers * slots * (t.num_kv_heads // tp) * t.head_dim * jnp.dtype(dtype).itemsize
    return int(-(-rows // dp) * per)


# ----------------------------------------------------------------------------- a recipe
def plan_config(config, devices: int, hosts: int = 1, device_memory_gib: float | None = 80.0,
                workdir: str = "", topology=None) -> dict:
    """The memory plan of ``config`` on ``devices`` devices (this process's, fake on a CPU)
    over ``hosts`` processes; the programs are compiled, nothing is allocated. With
    ``topology`` (a :class:`tpu_topology.Topology`), compiled by the TPU compiler for that
    slice's devices instead, with a roofline estimate of the step (:func:`tpu_estimate`)."""
    from guilibra_jax.errors import ConfigError

    if topology is not None:
        return _plan_topology(config, topology, hosts, device_memory_gib, workdir)
    if jax.device_count() != devices:
        raise ConfigError(f"--devices={devices} but this process has {jax.device_count()} devices: XLA_FLAGS was set "
                          f"before launch.plan started; unset it")
    if devices % hosts:
        raise ConfigError(f"--hosts={hosts} does not divide --devices={devices}")
    if config.data.batch_size % hosts:
        raise ConfigError(f"config key data.batch_size = {config.data.batch_size} is invalid: expected a multiple of "
                          f"--hosts={hosts}")
    from guilibra_jax.train.multihost import run_mesh
    mesh = run_mesh(config)
    tokenizer = _tokenizer(config, workdir)
    if config.method == "sft":
        return _plan_sft(config, mesh, tokenizer, device_memory_gib, hosts)
    from guilibra_jax.train import rl_loop
    s, state, state_sh = rl_loop.setup(config, mesh, tokenizer, materialize=False)
    return plan_stage2(s, state, state_sh, device_memory_gib, processes=hosts)


def _plan_topology(config, topo, hosts, device_memory_gib, workdir) -> dict:
    from guilibra_jax.errors import ConfigError
    from guilibra_jax.train import model_factory

    hosts = hosts or topo.hosts
    if config.data.batch_size % hosts:
        raise ConfigError(f"config key data.batch_size = {config.data.batch_size} is invalid: expected a multiple of "
                          f"the {hosts} hosts of {topo.name}")
    try:
        mesh = S.make_mesh(dict(config.mesh), devices=topo.devices)
    except ValueError as e:
        raise ConfigError(f"config key mesh = {dict(config.mesh)} is invalid for the {len(topo.devices)} devices of "
                          f"{topo.name}: {e}") from None
    memory = device_memory_gib or topo.device_memory_gib
    tokenizer = _tokenizer(config, workdir)
    if config.method == "sft":
        report = _plan_sft(config, mesh, tokenizer, memory, hosts)
    else:
        from guilibra_jax.train import rl_loop
        s, state, state_sh = rl_loop.setup(config, mesh, tokenizer, materialize=False)
        report = plan_stage2(s, state, state_sh, memory, processes=hosts)
    mc = model_factory.model_config_of(config, tokenizer)
    report["tpu"] = tpu_estimate(config, mc, report, topo)
    return report


def tpu_estimate(config, model_config, report: dict, topo) -> dict:
    """The slice, the chip's published figures and a roofline lower bound of each program's
    time (per device: max(FLOPs / peak, HBM bytes / bandwidth), from the TPU compiler's cost
    analysis), an optimizer step's (ASFT) or an RL round's time, and the MFU that bound allows
    (model FLOPs 6N per token + attention over the slice's peak). The sampler's decode loop
    counts once in the cost analysis; its other steps are added as memory-bound reads of the
    policy's parameters and the KV cache."""
    from guilibra_jax.models.model import param_count
    from guilibra_jax.train import tpu_topology as TT

    sh = report["shapes"]
    # the ASFT step and the update scan over their micro-batches: the cost analysis counts one
    loops = {"asft_step": sh.get("micro_batches", 1), "update": sh.get("micro_batches", 1)}
    progs = {name: TT.roofline(st.get("flops", 0) * loops.get(name, 1), st.get("bytes_accessed", 0) * loops.get(name, 1),
                               topo)
             for name, st in report["programs"].items()}
    n = param_count(model_config)
    t = model_config.text
    v = model_config.vision
    n_vision = v.depth * (4 * v.hidden_size ** 2 + 3 * v.hidden_size * v.intermediate_size)
    n -= n_vision          # 6N per text token for the decoder; the vision tower's per patch below
    peak = topo.device_peak_flops * len(topo.devices)
    if "asft_step" in progs:
        tokens = sh["micro_batches"] * sh["rows"] * sh["tokens"]
        model_flops = (TT.model_flops_per_token(n, t.num_layers, t.hidden_size, sh["tokens"]) * tokens
                       + 6 * n_vision * sh["patches"] * sh["micro_batches"])
        step = progs["asft_step"]["time_s"]
        what = "asft optimizer step"
    else:
        rl = config.rl
        samp = report["programs"]["sampler"]
        decode_bytes = report["per_device_gib"]["policy_params"] * GIB + samp.get("kv_cache_estimate", 0)
        progs["sampler"]["decode_steps_s"] = (sh["response_tokens"] - 1) * decode_bytes / topo.device_hbm_bytes_per_s
        progs["sampler"]["time_s"] += progs["sampler"]["decode_steps_s"]
        updates = rl.minibatches * rl.ppo_epochs
        step = sum(p["time_s"] for k, p in progs.items() if k != "update") + updates * progs["update"]["time_s"]
        Tp, N = sh["prompt_tokens"], sh["response_tokens"]
        T = Tp + N
        # tokens each program runs: a prompt once for the copies of it that a call holds
        per_row = lambda copies: Tp / max(1, copies) + N   # noqa: E731
        upd_tokens = sh["update_rows"] * per_row(sh.get("update_prompt_copies", 1))
        n_scores = len([k for k in progs if k.startswith("score_")])
        infer_tokens = sh["generation_rows"] * (per_row(sh.get("prompt_copies", 1))
                                                + n_scores * per_row(sh.get("score_prompt_copies", 1)))
        model_flops = (TT.model_flops_per_token(n, t.num_layers, t.hidden_size, T) * upd_tokens * rl.ppo_epochs
                       + TT.model_flops_per_token(n, t.num_layers, t.hidden_size, T, train=False) * infer_tokens)
        what = "rl round (sampler + scoring + updates)"
    # XLA's cost analysis counts a while loop's body once (scanned layers, flash-attention
    # tiles, the decode loop), so the compiler's FLOPs undercount: the step takes at least the
    # model's FLOPs at peak.
    floor = model_flops / peak
    if step and floor > step:
        step, what = floor, what + " (bounded by the model's FLOPs: the compiler's count misses loop trips)"
    if any(st.get("refused_by_compiler") for st in report["programs"].values()):
        step, what = 0.0, what + ": unknown (a program was refused by the compiler)"
    return {"topology": topo.name, "chips": topo.chips, "devices": len(topo.devices), "hosts": topo.hosts,
            "micro_batch_scan_counted": loops["asft_step"],
            "chip": {"kind": topo.chip.kind, "peak_bf16_tflops": topo.chip.peak_bf16_flops / 1e12,
                     "hbm_gib": topo.chip.hbm_gib, "hbm_gb_per_s": topo.chip.hbm_bytes_per_s / 1e9},
            "params": n, "roofline": progs, "step": what, "step_time_s": step,
            "model_tflops_per_step": model_flops / 1e12,
            "mfu_bound": model_flops / (peak * step) if step else None}


def _tokenizer(config, workdir: str):
    """The run's tokenizer when it has one without downloads; None for named sizes."""
    from guilibra_jax.train import data_source
    if config.model.hf_path or config.tokenizer.path or config.model.name == "tiny":
        return data_source.prepare_tokenizer(config, workdir or tempfile.mkdtemp(prefix="plan-"))
    return None


def _plan_sft(config, mesh, tokenizer, device_memory_gib, hosts):
    from guilibra_jax.train import model_factory
    from guilibra_jax.train.loop import optimizer_from_config, sharded_state
    from guilibra_jax.train.sft_step import sft_step_from_config

    mc = model_factory.model_config_of(config, tokenizer)
    graphdef, params, param_sh = model_factory.abstract_model(mc, mesh, **model_factory.model_kwargs(config))
    tx, schedule = optimizer_from_config(config, params, config.train.steps)
    state, state_sh = sharded_state(params, tx, param_sh, mesh, materialize=False)
    step = sft_step_from_config(config, graphdef, tx, schedule)
    jit_step = jax.jit(S.traced_on(mesh, step), in_shardings=(state_sh, None), out_shardings=(state_sh, None),
                       donate_argnums=0)
    return plan_sft(config, mesh, graphdef, state, state_sh, jit_step, mc, device_memory_gib, hosts)


def format_report(report: dict) -> str:
    lines = [f"mesh {report['mesh']} ({report['devices']} devices), per device (GiB):"]
    for k, v in report["per_device_gib"].items():
        lines.append(f"  {k:<44} {v:10.3f}")
    for name, st in report["programs"].items():
        if st.get("refused_by_compiler"):
            lines.append(f"  ({name}: the TPU compiler refused it: {st['refused_by_compiler']})")
        extra = {k: round(v / 2**30, 3) for k, v in st.items() if k.endswith("_estimate")}
        if extra:
            lines.append(f"  ({name}: {', '.join(f'{k[:-9]} ~{v} GiB' for k, v in extra.items())} of its temporaries)")
    usable = report["usable_gib"]
    lines.append(f"  {'peak (' + str(report['peak_program']) + ')':<44} {report['peak_gib']:10.3f}"
                 + (f"  of {usable:.2f} usable" if usable else ""))
    if report.get("tpu"):
        lines += tpu_lines(report["tpu"])
    if report["fits"] is None:
        lines.append("fits: unknown (no device memory given)")
    elif report["fits"]:
        lines.append("fits: yes")
    else:
        lines.append(f"fits: NO: {report['overflow']} overflows; {report['suggestion']}")
    return "\n".join(lines)


def tpu_lines(est: dict) -> list[str]:
    c = est["chip"]
    lines = [f"TPU {est['topology']}: {est['chips']} chips ({c['kind']}: {c['peak_bf16_tflops']:.0f} TFLOP/s bf16, "
             f"{c['hbm_gib']:.0f} GB HBM at {c['hbm_gb_per_s']:.0f} GB/s), {est['hosts']} host(s); roofline per device:"]
    for name, r in est["roofline"].items():
        lines.append(f"  {name:<44} {r['time_s']:10.3f} s ({r['bound']}-bound)")
    mfu = est["mfu_bound"]
    lines.append(f"  {est['step']}: >= {est['step_time_s']:.2f} s, {est['model_tflops_per_step']:.0f} model TFLOPs, "
                 f"MFU <= {100 * mfu:.0f}%" if mfu else f"  {est['step']}: unknown")
    return lines


def dry_run_summary(config) -> str:
    """``launch.train --dry_run``: the plan of ``config`` on this process's devices."""
    mem = device_memory_gib(S.make_mesh(dict(config.mesh)))
    return format_report(plan_config(config, jax.device_count(), jax.process_count(), mem))
