"""The memory plan of a recipe (``launch.plan``, ``launch.train --dry_run``): its trainer's
programs compiled at the recipe's shapes on fake CPU devices, or by the TPU compiler for
a TPU slice (with a roofline estimate of the step), and the report's text."""

from __future__ import annotations

import tempfile

import jax

from guilibra_jax import sharding as S
from guilibra_jax.errors import ConfigError
from guilibra_jax.models.model import param_count
from guilibra_jax.train import data_source, model_factory
from guilibra_jax.train import plan as P
from guilibra_jax.train import tpu_topology as TT
from guilibra_jax.train.multihost import run_mesh
from guilibra_jax.train.rl.plan import plan_stage2
from guilibra_jax.train.rl.setup import setup
from guilibra_jax.train.sft.plan import plan_sft
from guilibra_jax.train.sft.step import sft_step_from_config
from guilibra_jax.train.lora_state import FrozenBase
from guilibra_jax.train.state import jit_update, optimizer_from_config, sharded_state


def plan_config(config, devices: int, hosts: int = 1, device_memory_gib: float | None = 80.0,
                workdir: str = "", topology=None) -> dict:
    """The memory plan of ``config`` on ``devices`` devices (this process's, fake on a CPU)
    over ``hosts`` processes; the programs are compiled, nothing is allocated. With
    ``topology`` (a :class:`tpu_topology.Topology`), compiled by the TPU compiler for that
    slice's devices instead, with a roofline estimate of the step (:func:`tpu_estimate`)."""
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
    mesh = run_mesh(config)
    tokenizer = _tokenizer(config, workdir)
    if config.method == "sft":
        return _plan_sft(config, mesh, tokenizer, device_memory_gib, hosts)
    s, state, state_sh = setup(config, mesh, tokenizer, materialize=False)
    return plan_stage2(s, state, state_sh, device_memory_gib, processes=hosts)


def _plan_topology(config, topo, hosts, device_memory_gib, workdir) -> dict:
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
        s, state, state_sh = setup(config, mesh, tokenizer, materialize=False)
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
        decode_bytes = report["per_device_gib"]["policy_params"] * P.GIB + samp.get("kv_cache_estimate", 0)
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
    if config.model.hf_path or config.tokenizer.path or config.model.name == "tiny":
        return data_source.prepare_tokenizer(config, workdir or tempfile.mkdtemp(prefix="plan-"))
    return None


def _plan_sft(config, mesh, tokenizer, device_memory_gib, hosts):
    mc = model_factory.model_config_of(config, tokenizer)
    graphdef, params, param_sh = model_factory.abstract_model(mc, mesh, **model_factory.model_kwargs(config))
    frozen = FrozenBase.build(config, params, param_sh, mesh, materialize=False)
    if frozen is not None:   # LoRA: the adapters train, the base is a frozen argument
        params, param_sh = frozen.adapters, frozen.adapter_sh
    tx, schedule = optimizer_from_config(config, params, config.train.steps)
    state, state_sh = sharded_state(params, tx, param_sh, mesh, materialize=False)
    step = sft_step_from_config(config, graphdef, tx, schedule)
    jit_step = jit_update(step, mesh, state_sh, None if frozen is None else frozen.base_sh)
    return plan_sft(config, mesh, graphdef, state, state_sh, jit_step, mc, device_memory_gib, hosts, frozen)


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
    mem = P.device_memory_gib(S.make_mesh(dict(config.mesh)))
    return format_report(plan_config(config, jax.device_count(), jax.process_count(), mem))
