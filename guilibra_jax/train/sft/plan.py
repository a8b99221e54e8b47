"""The memory plan of the ASFT step (``train/plan.py`` compiles and measures)."""

from __future__ import annotations

import numpy as np

from guilibra_jax.train import plan as P


def plan_sft(config, mesh, graphdef, state, state_sh, step_jit, model_config, device_memory_gib: float = 80.0,
             processes: int = 1, frozen=None) -> dict:
    """The ASFT step at the recipe's shapes: ``state`` abstract or concrete with
    ``state_sh``; ``step_jit`` the jitted (state, batch[, base]) -> (state, metrics);
    ``frozen``: LoRA's :class:`lora_state.FrozenBase` (the state's params are adapters)."""
    rows, T, M = config.data.batch_size, P.prompt_length(config), config.train.grad_accum
    host = sft_host(config, model_config, rows, processes)
    pv = host["pixel_values"][0]
    abs_state = P.abstract(state, state_sh)
    batch = P.batch_struct(mesh, host, micro_axis=True)
    extra = () if frozen is None else (P.abstract(frozen.base, frozen.base_sh),)
    compiled = P.compile_program(step_jit.lower(abs_state, batch, *extra), (abs_state, batch, *extra))
    st = P.compiled_stats(compiled)
    params_b = P.per_device_bytes(abs_state["params"])
    opt_b = P.per_device_bytes(abs_state["opt_state"])
    st["resident_args"] = P.per_device_bytes((abs_state, *extra))
    if frozen is None:
        resident = {"policy_params": params_b, "optimizer_state": opt_b}
    else:
        resident = {"frozen_base": P.per_device_bytes(extra[0]), "lora_adapters": params_b, "optimizer_state": opt_b}
    grads = params_b
    step = {**st, "gradients_estimate": grads}
    return P.build_report(mesh, resident, {"asft_step": step}, device_memory_gib,
                   {"shapes": {"micro_batches": M, "rows": rows, "tokens": T, "patches": int(pv.shape[0])}})


def sft_host(config, model_config, rows: int, processes: int) -> dict:
    """Host-shaped (zeros) ASFT micro-batches [train.grad_accum, ...] of ``rows`` packed
    rows of the recipe's longest sequence, with their images (what the step compiles for)."""
    T, M = P.prompt_length(config), config.train.grad_accum
    pv, vision = P.image_inputs(config, model_config, rows, processes)
    i32 = np.zeros((M, rows, T), np.int32)
    return {"input_ids": i32, "targets": i32, "loss_segments": i32, "segment_ids": i32,
            "positions": np.zeros((M, 3, rows, T), np.int32), "pixel_values": P.repeat(pv, M),
            "vision": {k: P.repeat(v, M) for k, v in vision.items()}}
