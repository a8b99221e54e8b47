"""The memory plan of a stage-2 run: its update, sampler and scoring programs
(``train/plan.py`` compiles and measures)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from guilibra_jax import generate as G
from guilibra_jax import sharding as S
from guilibra_jax.train import plan as P
from guilibra_jax.train.rl import frozen as FZ
from guilibra_jax.train.rl import layout as L
from guilibra_jax.train.rl import replay as RP
from guilibra_jax.train.rl import rollout as RO
from guilibra_jax.train.rl.setup import reuse_sampler_log_probs, shares_prompts, update_groups
from guilibra_jax.train.sft.plan import sft_host


def plan_stage2(s, state, state_sh, device_memory_gib: float = 80.0, processes: int | None = None) -> dict:
    """Update, sampler and scoring programs of a stage-2 run (``rl/setup.py``'s ``Stage2``)."""
    config, mesh, mc = s.config, s.mesh, s.model_config
    rl, tc = config.rl, config.train
    processes = processes or jax.process_count()
    Tp, N = P.prompt_length(config), rl.max_new_tokens
    round_rows = config.data.batch_size * rl.group_size
    gen_rows = rl.generation_rows or round_rows    # rows per sampler call
    score_rows = rl.score_rows or round_rows       # rows per scoring call
    upd_rows = update_groups(config) * rl.group_size
    micro_rows = upd_rows // rl.minibatches // tc.grad_accum
    M = tc.grad_accum
    abs_state = P.abstract(state, state_sh)
    # the policy's model parameters: the state's, or with LoRA the base's shapes (merged with the adapters)
    policy = abs_state["params"] if s.lora is None else s.lora.plain_abstract()
    trained = "policy_params" if s.lora is None else "lora_adapters"
    resident = {trained: P.per_device_bytes(abs_state["params"]),
                "optimizer_state": P.per_device_bytes(abs_state["opt_state"])}
    for name, f in s.frozen.items():
        if not FZ.is_served(f):      # a served scorer holds nothing here
            resident[f"frozen_{name}"] = P.per_device_bytes(f.params)
    if s.lora is not None and not any(f.params is s.lora.base for f in s.frozen.values()):
        # (GRPO's default reference is the base itself)
        resident["frozen_base"] = P.per_device_bytes(P.abstract(s.lora.base, s.lora.base_sh))
    programs: dict[str, dict[str, int]] = {}

    # update step (the shared-prompt layout with the copies per prompt the trainer's micro-batches allow)
    dp = math.prod(mesh.shape[a] for a in S.BATCH_AXES)
    row_multiple = max(1, dp // processes)
    shared = shares_prompts(s)
    _, calls = L.update_calls(upd_rows // processes, rl.minibatches, M)   # this process's, as update() cuts them
    upd_copies = int(np.gcd.reduce([RO.run_copies(c // rl.group_size, row_multiple) for c in calls])) if shared else 1
    host = _update_host(config, mc, micro_rows, upd_copies if shared else 0, Tp, N, M, processes)
    batch = P.batch_struct(mesh, host, micro_axis=True)
    st = P.compiled_stats(P.compile_program(s.update_fn.lower(abs_state, batch), (abs_state, batch)))
    st["resident_args"] = P.per_device_bytes(abs_state)
    st["gradients_estimate"] = resident[trained]
    programs["update"] = st

    if s.replay_fn is not None:   # rl.sft_replay: the ASFT step on the same state
        rc = RP.replay_config(config)
        host = sft_host(rc, mc, rc.data.batch_size, processes)
        batch = P.batch_struct(mesh, host, micro_axis=True)
        extra = () if s.lora is None else (P.abstract(s.lora.base, s.lora.base_sh),)
        st = P.compiled_stats(P.compile_program(s.replay_fn.lower(abs_state, batch, *extra),
                                                (abs_state, batch, *extra)))
        st["resident_args"] = P.per_device_bytes((abs_state, *extra))
        st["gradients_estimate"] = resident[trained]
        programs["sft_replay"] = st

    # sampler: prefill of the call's distinct prompts (shared by their copies) + decode loop
    # over gen_rows rows (KV cache: each prompt's Tp slots once and N - 1 per row, or T - 1 per row)
    # rows per process: a multiple of the batch devices of one process (s.row_multiple counts
    # this planning process's, which holds every fake device)
    copies = (RO.prompt_copies(gen_rows // processes, rl.group_size, max(1, dp // processes))
              if rl.share_prefill else 1)
    p_rows = gen_rows // copies
    pv, vision = P.image_inputs(config, mc, p_rows, processes)
    prompt = {"prompt_ids": np.zeros((p_rows, Tp), np.int32), "prompt_mask": np.zeros((p_rows, Tp), np.int32),
              "positions": np.zeros((3, p_rows, Tp), np.int32), "rope_deltas": np.zeros((p_rows,), np.int32),
              "pixel_values": pv, "vision": vision}
    b = P.batch_struct(mesh, prompt, micro_axis=False)
    key = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=S.replicated(mesh))
    with S.mesh_context(mesh):
        lowered = G.lower_generate(s.graphdef, policy, b["prompt_ids"], b["prompt_mask"],
                                   b["positions"], b["rope_deltas"], b["pixel_values"], b["vision"], key, s.sampling,
                                   copies)
    compiled = P.compile_program(lowered, (policy, b))
    st = P.compiled_stats(compiled)
    st["resident_args"] = P.per_device_bytes(policy)
    if G.prompts_held_once(s.sampling, copies):   # generate.share_prefix: each prompt's part once
        st["kv_cache_estimate"] = (kv_cache_bytes(mc, p_rows, Tp, config.model.dtype, mesh)
                                   + kv_cache_bytes(mc, gen_rows, max(N - 1, 1), config.model.dtype, mesh))
    else:
        st["kv_cache_estimate"] = kv_cache_bytes(mc, gen_rows, Tp + N - 1, config.model.dtype, mesh)
    programs["sampler"] = st

    # scoring: the policy (old log-probs) and each frozen model, rl.score_rows rows per call
    score_copies = RO.run_copies(np.arange(score_rows // processes) // rl.group_size, row_multiple) if shared else 1
    seq = {k: jax.tree.map(lambda x: x[0], v) for k, v in _update_host(config, mc, score_rows, score_copies if shared else 0, Tp, N, 1,
                                            processes).items() if k in SCORE_KEYS}
    b = P.batch_struct(mesh, seq, micro_axis=False)
    scored = [] if reuse_sampler_log_probs(rl) else [("policy", s.graphdef, policy)]
    done = []   # (graphdef, params' shapes and shardings, stats): teachers of one architecture compile once
    on_mesh = [(n, f.graphdef, s.lora.plain_abstract() if f.unpack else P.abstract(f.params))
               for n, f in s.frozen.items() if not FZ.is_served(f)]
    for name, gd, params in scored + on_mesh:
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
        compiled = P.compile_program(lowered, (params, b))
        st = P.compiled_stats(compiled)
        st["resident_args"] = P.per_device_bytes(params)
        programs[f"score_{name}"] = st
        done.append((gd, sig, st))
    shapes = {"round_rows": round_rows, "generation_rows": gen_rows, "prompt_copies": copies, "score_rows": score_rows,
              "score_prompt_copies": score_copies, "update_rows": upd_rows, "micro_rows": micro_rows,
              "update_prompt_copies": upd_copies, "micro_batches": M,
              "prompt_tokens": Tp, "response_tokens": N, "patches_per_image": P.patches_per_image(config, mc)}
    return P.build_report(mesh, resident, programs, device_memory_gib, {"shapes": shapes})


SCORE_KEYS = ("input_ids", "positions", "segment_ids", "response_mask", "pixel_values", "vision", "prompt_ids",
              "prompt_positions", "prompt_segment_ids", "response_ids", "response_positions")   # what scoring reads


def _update_host(config, mc, rows: int, copies: int, Tp: int, N: int, M: int, processes: int) -> dict:
    """Host-shaped (zeros) update micro-batches [M, ...] of ``rows`` rows: the shared-prompt
    layout with ``copies`` rows per prompt (``rollout.shared_batch``; its images: one per
    prompt), or with ``copies=0`` whole sequences of Tp + N tokens."""
    f32 = lambda *shape: np.zeros((M,) + shape, np.float32)
    i32 = lambda *shape: np.zeros((M,) + shape, np.int32)
    per_row = {"advantages": f32(rows), "kl_mask": f32(rows)}
    if config.method == "mopd":
        per_row["teacher_index"] = i32(rows)
    if copies:
        p = rows // copies
        pv, vision = P.image_inputs(config, mc, p, processes)
        host = {"prompt_ids": i32(p, Tp), "prompt_segment_ids": i32(p, Tp), "prompt_positions": i32(3, p, Tp),
                "response_ids": i32(rows, N), "response_mask": i32(rows, N), "response_positions": i32(3, rows, N),
                "old_logp": f32(rows, N), "ref_logp": f32(rows, N), **per_row}
    else:
        pv, vision = P.image_inputs(config, mc, rows, processes)
        T = Tp + N
        host = {"input_ids": i32(rows, T), "segment_ids": i32(rows, T), "positions": i32(3, rows, T),
                "response_mask": i32(rows, T), "old_logp": f32(rows, T), "ref_logp": f32(rows, T), **per_row}
    host["pixel_values"], host["vision"] = P.repeat(pv, M), {k: P.repeat(v, M) for k, v in vision.items()}
    return host


def kv_cache_bytes(model_config, rows: int, slots: int, dtype: str, mesh) -> int:
    """Per-device bytes of the sampler's KV cache (rows over (data, fsdp), kv heads over tensor)."""
    t = model_config.text
    dp = math.prod(mesh.shape[a] for a in S.BATCH_AXES)
    tp = mesh.shape["tensor"] if t.num_kv_heads % mesh.shape["tensor"] == 0 else 1
    per = 2 * t.num_layers * slots * (t.num_kv_heads // tp) * t.head_dim * jnp.dtype(dtype).itemsize
    return int(-(-rows // dp) * per)
