"""The stage-2 loop shared by GUI-Libra's conservative GRPO and UI-MOPD. One step:

    prompts ──rollout──► G responses per prompt, sampled by the policy over the whole mesh
            ──reward───► rewards and passes (host: rewards.guilibra_reward | mopd_reward)
            [group filter (rl.group_filter): drop groups whose pass rate is 0 or 1 and draw
             more prompts until rl.update_groups groups are kept]
            ──advantages► group-relative; GRPO: SNGS on the negative ones; MOPD: pass-rate
                          floor and adaptive KL mask (rl.mopd.kl_mask)
            ──score────► old log-probs (policy) and reference (GRPO: the frozen SFT model) or
                         teacher (MOPD: each row's platform teacher) log-probs
            ──update───► ppo_epochs x minibatches optimizer updates (rl_step)

``train_rl(config, workdir)`` is what ``python -m launch.train`` runs for
``method=grpo|mopd``; each phase is a function below with explicit inputs and outputs.

Processes. Every process draws its own prompts (``data.batch_size / process_count`` per
round) and keeps the G responses of a prompt, so group statistics are computed where the
group lives; sampling, scoring and updates run on global arrays over the whole mesh (each
process's rows are one block of them), with shapes every process agrees on. Batch k of the
processes together is batch k of a single process with the whole batch, so a run does not
depend on the process count. Re-running resumes from the latest checkpoint: the state,
every process's prompt iterator, and the sampling key (derived from the step and round).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any

import jax
import numpy as np
from flax import nnx

from guilibra_jax import actions as A
from guilibra_jax import generate as G
from guilibra_jax import sharding as S
from guilibra_jax.models.vision import device_vision_inputs, prepare_vision_inputs
from guilibra_jax.train import advantages as ADV
from guilibra_jax.train import checkpoint as C
from guilibra_jax.train import frozen as FZ
from guilibra_jax.train import model_factory
from guilibra_jax.train import multihost as MH
from guilibra_jax.train import rollout as RO
from guilibra_jax.train import run_history
from guilibra_jax.train.batching import put_batch, stack_micro_batches
from guilibra_jax.train.guards import Divergence, Preemption
from guilibra_jax.train.loop import (eval_and_checkpoint, finish_run, open_checkpoints, optimizer_from_config,
                                     sharded_state)
from guilibra_jax.train.metrics import Progress, writer_for_run
from guilibra_jax.train.profiler import StepProfiler
from guilibra_jax.train.rl_step import make_rl_step

log = logging.getLogger(__name__)

# Kept for callers of the old names.
Frozen = FZ.Frozen
advantages = ADV.compute


# ----------------------------------------------------------------------------- the run's fixed parts
@dataclasses.dataclass
class Stage2:
    """What every phase needs, built once per run by :func:`setup`."""

    config: Any
    mesh: Any
    graphdef: Any
    model_config: Any
    tokenizer: Any
    sampling: G.SamplingConfig
    frozen: dict
    update_fn: Any          # jitted (state, batch) -> (state, metrics)
    pad_id: int
    stop: tuple
    banned: tuple
    row_multiple: int       # rows per process of any global batch: a multiple of this
    think_opened: bool = False   # prompts open <think> (data.open_think): responses may lack it

    @property
    def rl(self):
        return self.config.rl

    @property
    def method(self) -> str:
        return self.config.method

    @property
    def patch_bucket(self) -> int:
        return self.config.data.patch_bucket

    @property
    def chunk(self) -> int | None:
        return self.config.rl.score_chunk or None


def loss_kwargs(config) -> dict:
    rl = config.rl
    if config.method == "grpo":
        return dict(clip_low=rl.clip_low, clip_high=rl.clip_high, kl_beta=rl.kl_beta, kl_kind=rl.kl_kind,
                    kl_clamp=rl.kl_clamp or None, aggregation=rl.aggregation, dual_clip=rl.dual_clip or None)
    return dict(beta=rl.mopd.beta, clip_low=rl.clip_low, clip_high=rl.clip_high, kl_clamp=rl.kl_clamp or None,
                aggregation=rl.aggregation, dual_clip=rl.dual_clip or None)


def setup(config, mesh, tokenizer, *, materialize: bool = True) -> tuple[Stage2, dict, dict]:
    """(Stage2, train state, its shardings): the policy, its optimizer state and the frozen
    models, sharded over ``mesh``, and the jitted update. ``materialize=False`` allocates
    nothing: parameters and state are abstract (what ``launch.plan`` compiles against)."""
    rl, tc = config.rl, config.train
    if materialize:
        model, model_config = model_factory.build_model(config, tokenizer, mesh=mesh)
        graphdef, pstate, _ = nnx.split(model, nnx.Param, ...)
        param_sh = S.param_shardings(pstate, mesh)
        params = nnx.to_pure_dict(pstate)
        del model, pstate
    else:
        model_config = model_factory.model_config_of(config, tokenizer)
        graphdef, params, param_sh = model_factory.abstract_model(model_config, mesh,
                                                                  **model_factory.model_kwargs(config))
    tx, schedule = optimizer_from_config(config, params, tc.steps * rl.ppo_epochs * rl.minibatches)
    frozen: dict[str, FZ.Frozen] = {}
    if config.method == "grpo":
        if rl.reference or not materialize:
            frozen["reference"] = FZ.load("reference", rl.reference, config, mesh, tokenizer, materialize=materialize)
        else:  # the starting policy
            frozen["reference"] = FZ.from_params("reference", graphdef, params, model_config,
                                                 model_factory.dtype_of(config.model.dtype, "model.dtype"), param_sh)
    else:
        for label, spec in rl.teachers.items():
            frozen[label] = FZ.load(f"teacher_{label}", spec, config, mesh, tokenizer, materialize=materialize)
    state, state_sh = sharded_state(params, tx, param_sh, mesh, materialize=materialize)
    del params
    banned = RO.vision_token_ids(model_config)
    step_fn = make_rl_step(graphdef, tx, loss=config.method, loss_kwargs=loss_kwargs(config),
                           temperature=rl.temperature, chunk_size=rl.score_chunk or None, banned_token_ids=banned,
                           schedule=schedule)
    update_fn = jax.jit(S.traced_on(mesh, step_fn), in_shardings=(state_sh, None), out_shardings=(state_sh, None),
                        donate_argnums=0)
    pad_id, stop = special_ids(tokenizer, model_config)
    sampling = G.SamplingConfig(temperature=rl.temperature, top_p=rl.top_p, top_k=rl.top_k,
                                max_new_tokens=rl.max_new_tokens, stop_token_ids=stop, pad_token_id=pad_id,
                                banned_token_ids=banned)
    dp = int(np.prod([mesh.shape[a] for a in S.BATCH_AXES]))
    s2 = Stage2(config, mesh, graphdef, model_config, tokenizer, sampling, frozen, update_fn, pad_id, stop, banned,
                row_multiple=max(1, dp // jax.process_count()),
                think_opened=_think_opened(config, tokenizer))
    return s2, state, state_sh


def _think_opened(config, tokenizer) -> bool:
    """data_source.think_opened, False when planning without a tokenizer."""
    from guilibra_jax.train import data_source
    return tokenizer is not None and data_source.think_opened(config, tokenizer)


def special_ids(tokenizer, model_config) -> tuple[int, tuple[int, ...]]:
    """(pad id, stop ids): the tokenizer's, or the model config's when planning without one."""
    if tokenizer is None:
        t = model_config.text
        eos = t.eos_token_id if isinstance(t.eos_token_id, (list, tuple)) else (t.eos_token_id,)
        return int(t.pad_token_id or 0), tuple(int(i) for i in eos if i is not None)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    stop = tuple(i for i in (tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.eos_token_id) if i is not None)
    return pad_id, stop


# ----------------------------------------------------------------------------- device inputs
def device_inputs(s: Stage2, host: dict, micro_axis: bool = False) -> dict:
    """Host arrays of this process's rows -> global arrays on the mesh (images of all
    processes joined; a process without images joins with an empty patch set)."""
    host = dict(host)
    vision = host.pop("vision", None)
    has = host.get("pixel_values") is not None
    if MH.agree_max(int(has)) and not has:
        host["pixel_values"], vision = _no_images(s, micro_axis, host)
    if host.get("pixel_values") is None:
        host.pop("pixel_values", None)
        out = put_batch(host, s.mesh, micro_axis=micro_axis)
        out["pixel_values"], out["vision"] = None, None
        return out
    host["vision"] = device_vision_inputs(vision)
    return put_batch(host, s.mesh, micro_axis=micro_axis, model_config=s.model_config)


def _no_images(s: Stage2, micro_axis: bool, host: dict):
    """Inert padding patches and empty tower slots (as collate's batch without images)."""
    vc = s.model_config.vision
    n = s.patch_bucket
    dim = vc.in_channels * vc.temporal_patch_size * vc.patch_size * vc.patch_size
    pv = np.zeros((n, dim), np.float32)
    vision = prepare_vision_inputs(np.zeros((0, 3), np.int64), s.model_config, num_patches=n)
    if micro_axis:
        k = len(next(iter(host.values())))
        return np.stack([pv] * k), {key: np.stack([v] * k) for key, v in vision.items()}
    return pv, vision


def local_chunk(s: Stage2, rows_over_processes: int) -> int:
    """This process's share of a per-call row count (``rl.generation_rows`` /
    ``rl.score_rows``; 0 = every row in one call)."""
    return rows_over_processes // jax.process_count() if rows_over_processes else 0


def row_chunks(n: int, size: int) -> list[np.ndarray]:
    """Row indices 0..n-1 in calls of ``size`` rows (0: one call). Every process has the
    same n and size (validated), so all make the same calls."""
    if not size or size >= n:
        return [np.arange(n)]
    return [np.arange(i, min(i + size, n)) for i in range(0, n, size)]


# ----------------------------------------------------------------------------- phases
def rollout(s: Stage2, params, batch: dict, key) -> RO.Rollout:
    """G responses to each prompt of this process's batch (``collate_rl``), sampled with the
    policy ``params``; the rollout holds tokens, lengths, the sampler's log-probs and texts."""
    ro = RO.expand_groups(batch, s.rl.group_size)
    ro = RO.pad_prompts(ro, MH.agree_max(ro.prompt_ids.shape[1]))
    outs = []
    for c, rows in enumerate(row_chunks(ro.rows, local_chunk(s, s.rl.get("generation_rows", 0)))):
        # each prompt's prefill once, shared by its copies (rows of a group are copies of one prompt)
        copies = RO.prompt_copies(len(rows), s.rl.group_size, s.row_multiple) if s.rl.get("share_prefill", True) else 1
        part = ro if len(rows) == ro.rows and copies == 1 else RO.take_rows(ro, rows[::copies])
        inputs = device_inputs(s, RO.prompt_inputs(part, s.model_config, s.patch_bucket))
        with S.mesh_context(s.mesh):
            out = G.generate(s.graphdef, params, inputs["prompt_ids"], inputs["prompt_mask"], inputs["positions"],
                             inputs["rope_deltas"], inputs["pixel_values"], inputs["vision"],
                             key if c == 0 else jax.random.fold_in(key, c), s.sampling, copies=copies)
        outs.append([MH.local_rows(x, s.mesh) for x in (out.tokens, out.lengths, out.logprobs)])
    ro.tokens, ro.lengths, ro.sample_logp = (np.concatenate(x) for x in zip(*outs))
    ro.texts = [G.decode_response(s.tokenizer, ro.tokens[i, :ro.lengths[i]], s.stop) for i in range(ro.rows)]
    return ro


def reward(s: Stage2, ro: RO.Rollout) -> RO.Scored:
    """Rewards and passes of the rollout's responses (invalid rows score 0, never pass)."""
    rw = s.rl.reward
    return RO.score_responses(ro.texts, ro, s.method, coord_space=A.FAMILY_COORD_SPACE[s.model_config.family],
                              w_fmt=rw.w_fmt, value_rule=rw.value_rule, point_tolerance=rw.point_tolerance,
                              format_rule=rw.format_rule, think_opened=s.think_opened,
                              think_tag=A.THINK_TAG[s.model_config.family], mopd_rule=rw.mopd_rule,
                              check_tool_name=rw.check_tool_name)


@dataclasses.dataclass
class Collected:
    """The rollout a step updates on, with its rewards and the group filter's counts."""

    ro: RO.Rollout
    scored: RO.Scored
    rounds: int = 1
    kept_groups: int = 0       # this process
    dropped_groups: int = 0
    short_groups: int = 0      # update slots filled with dropped groups (no loss) at the round limit


def collect(s: Stage2, params, prompts, step: int, base_key) -> Collected:
    """Rollout + reward for one step: one round of ``data.batch_size`` prompts, or with
    ``rl.group_filter`` as many rounds as it takes to keep ``rl.update_groups`` groups whose
    pass rate is strictly between 0 and 1 (every process keeps its share; at most
    ``rl.group_filter.max_rounds`` rounds (0 = no limit), then the update is completed with
    dropped groups that carry no loss, logged as ``short_groups``)."""
    gf = s.rl.group_filter
    key = lambda r: jax.random.fold_in(jax.random.fold_in(base_key, step), r)
    if not gf.enabled:
        ro = _rollout_next(s, params, prompts, key(0))
        return Collected(ro, reward(s, ro))
    G_ = s.rl.group_size
    quota = update_groups(s.config) // jax.process_count()
    parts, kept, rounds = [], 0, 0
    while True:
        ro = _rollout_next(s, params, prompts, key(rounds))
        scored = reward(s, ro)
        keep = ADV.keep_groups(scored.success & ro.valid, ro.valid, G_)
        parts.append((ro, scored, keep))
        kept += int(keep.sum())
        rounds += 1
        need_more = MH.agree_max(int(kept < quota))
        if not need_more or (gf.max_rounds and rounds >= gf.max_rounds):
            break
    picks, fills = [], []
    for i, (_, _, keep) in enumerate(parts):
        picks += [(i, g) for g in np.nonzero(keep)[0]]
        fills += [(i, g) for g in np.nonzero(~keep)[0]]
    chosen = [(i, g, True) for i, g in picks[:quota]] + [(i, g, False) for i, g in fills[:max(0, quota - len(picks))]]
    ros, scs = [], []
    for i, g, ok in chosen:
        ro, scored, _ = parts[i]
        rows = np.arange(g * G_, (g + 1) * G_)
        ros.append(RO.take_rows(ro, rows, valid=ro.valid[rows] & ok))
        sc = RO.take_scored(scored, rows)
        if not ok:
            sc = RO.Scored(np.zeros_like(sc.reward), np.zeros_like(sc.success), {k: np.zeros_like(v)
                                                                                 for k, v in sc.parts.items()})
        scs.append(sc)
    n_groups = sum(len(k) for _, _, k in parts)
    return Collected(RO.concat(ros), RO.concat_scored(scs), rounds=rounds, kept_groups=min(kept, quota),
                     dropped_groups=n_groups - kept, short_groups=max(0, quota - kept))


def _rollout_next(s: Stage2, params, prompts, key) -> RO.Rollout:
    """The rollout of the next prompts; a live prompt source (rl.world, train/online.py) then
    advances its episodes with it (``prompts.advance``)."""
    ro = rollout(s, params, next(prompts), key)
    if hasattr(prompts, "advance"):
        prompts.advance(ro)
    return ro


@dataclasses.dataclass
class Scores:
    """Log-probs of the update's response tokens (host arrays of this process's rows): old
    (policy) and reference / teacher, and ``seq``: in the shared-prompt layout
    (``rl.share_prefill``) just ``response_mask`` [R, N'], the arrays [R, N']; otherwise
    the whole sequence batch (:func:`rollout.sequence_batch`) and the arrays [R, Tp + N']."""

    seq: dict
    old_logp: np.ndarray
    ref_logp: np.ndarray
    n_slots: int = 0
    shared: bool = False


def reuse_sampler_log_probs(rl) -> bool:
    """``rl.old_logprobs``: the old-policy log-probs are the sampler's ("sampler"; "auto"
    when sampling is neither top-p nor top-k truncated, so the sampler drew from the
    policy's own tempered distribution) or a rescoring pass ("recompute")."""
    mode = rl.get("old_logprobs", "recompute")
    return mode == "sampler" or (mode == "auto" and rl.top_p >= 1.0 and rl.top_k == 0)


def shares_prompts(s: Stage2) -> bool:
    """``rl.share_prefill``: each prompt computed once for the rows of its group that a call
    holds, in sampling, scoring and updates (the shared-prompt layout, ``rollout.shared_batch``)."""
    return bool(s.rl.get("share_prefill", True))


def agreed_copies(s: Stage2, ro: RO.Rollout, calls: list[np.ndarray]) -> int:
    """Rows per prompt every process can use for each of ``calls`` (row index arrays of
    equal length, batched alike): the gcd over calls and processes of
    :func:`rollout.shared_copies` (a divisor of a valid count is valid)."""
    c = int(np.gcd.reduce([RO.shared_copies(ro, rows, s.row_multiple) for rows in calls]))
    return int(np.gcd.reduce(MH.gather_counts(c))) if jax.process_count() > 1 else c


def model_batch(s: Stage2, ro: RO.Rollout, rows: np.ndarray, model_config, n_slots: int, copies: int = 0) -> dict:
    """Host model inputs of rollout rows ``rows``: the shared-prompt layout with ``copies``
    rows per prompt (:func:`agreed_copies` when 0), or without ``rl.share_prefill`` the
    whole sequences."""
    if not shares_prompts(s):
        return RO.sequence_batch(ro, rows, model_config, s.patch_bucket, s.pad_id, n_slots)
    copies = copies or agreed_copies(s, ro, [rows])
    return RO.shared_batch(ro, rows, model_config, s.patch_bucket, s.pad_id, n_slots, copies)


def score(s: Stage2, params, ro: RO.Rollout) -> Scores:
    """Old-policy log-probs and the frozen models' log-probs of the sampled tokens: GRPO's
    reference on every row; MOPD's teachers, each on its own platform's rows only."""
    ro = RO.pad_prompts(ro, MH.agree_max(ro.prompt_ids.shape[1]))
    longest = MH.agree_max(int(ro.lengths.max()) if ro.rows else 1)
    n_slots = next(b for b in RO.response_buckets(ro.tokens.shape[1]) if b >= longest)
    all_rows = np.arange(ro.rows)
    shared = shares_prompts(s)
    Tp = ro.prompt_ids.shape[1]
    if shared:
        on = (np.arange(n_slots)[None] < ro.lengths[:, None]) & ro.valid[:, None]
        seq_host = {"response_mask": on.astype(np.int32)}
    else:
        seq_host = RO.sequence_batch(ro, all_rows, s.model_config, s.patch_bucket, s.pad_id, n_slots)
    kw = dict(temperature=s.rl.temperature, chunk=s.chunk, banned=s.banned)
    size = local_chunk(s, s.rl.get("score_rows", 0))

    def score_rows(f: FZ.Frozen, rows: np.ndarray) -> np.ndarray:
        # (a collective: every process builds its batches, whatever rows it holds; at most
        # rl.score_rows rows over all processes per call)
        out = []
        for part in row_chunks(len(rows), size):
            fseq = device_inputs(s, model_batch(s, ro, rows[part], f.model_config, n_slots))
            with S.mesh_context(s.mesh):
                logp = FZ.score(f, fseq, **kw)
            out.append(MH.local_rows(logp, s.mesh))
        return np.concatenate(out)

    if reuse_sampler_log_probs(s.rl):   # the sampler scored the same policy's distribution
        old_logp = RO.sampler_log_probs(ro, n_slots)
        if shared:
            old_logp = RO.to_response_columns(old_logp, Tp, n_slots)
    else:
        old_logp = score_rows(FZ.Frozen("policy", s.graphdef, params, s.model_config), all_rows)

    if s.method == "grpo":
        ref_logp = score_rows(s.frozen["reference"], all_rows)
    else:
        ref_logp = FZ.score_by_platform(ro.platform, ro.valid, s.frozen, score_rows, s.row_multiple,
                                        np.zeros_like(old_logp))
    return Scores(seq_host, old_logp, ref_logp.astype(np.float32), n_slots, shared)


def update_calls(rows: int, minibatches: int, accum: int, m: int = 0) -> tuple[np.ndarray, list[np.ndarray]]:
    """(rows of minibatch m, their ``accum`` micro-batches) of a process's ``rows`` rollout rows:
    minibatch m takes the rows r with r % minibatches == m (each holds responses of every
    group: the same global minibatches whatever the process count), cut into equal runs."""
    idx = np.arange(m, rows, minibatches)
    micro = rows // minibatches // accum
    return idx, [idx[k * micro:(k + 1) * micro] for k in range(accum)]


def update(s: Stage2, state: dict, ro: RO.Rollout, adv: dict, scores: Scores) -> tuple[dict, dict, list[bool]]:
    """ppo_epochs x minibatches optimizer updates on the rollout; returns (state, metrics of
    the last update, whether each update was applied (finite))."""
    rl, accum = s.rl, s.config.train.grad_accum
    kl_mode = ADV.kl_mask_mode(rl) if s.method == "mopd" else "off"
    if scores.shared:
        ro = RO.pad_prompts(ro, MH.agree_max(ro.prompt_ids.shape[1]))
    host = dict(scores.seq, old_logp=scores.old_logp, ref_logp=scores.ref_logp, advantages=adv["advantages"],
                kl_mask=adv["kl_mask"])
    token_counts = scores.seq["response_mask"].sum(1)
    metrics, applied = {}, []
    for _ in range(rl.ppo_epochs):
        for m in range(rl.minibatches):
            idx, calls = update_calls(ro.rows, rl.minibatches, accum, m)
            totals = None
            if kl_mode == "release":
                totals = MH.gather_rows(ADV.kl_totals(adv["kl_mask"][idx], token_counts[idx])[None]).sum(0)
            weights = ADV.kl_weights(adv["kl_mask"], kl_mode, totals)
            copies = agreed_copies(s, ro, calls) if scores.shared else 0
            micros = [_update_rows(s, dict(host, kl_mask=weights), ro, rows, scores, copies) for rows in calls]
            state, metrics = s.update_fn(state, device_inputs(s, stack_micro_batches(micros), micro_axis=True))
            applied.append(metrics["update_ok"])
    metrics = jax.device_get(metrics)
    return state, metrics, [bool(x) for x in jax.device_get(applied)]


def _update_rows(s: Stage2, host: dict, ro: RO.Rollout, idx: np.ndarray, scores: Scores, copies: int) -> dict:
    """The update arrays of rows ``idx``: per-row arrays sliced, model inputs rebuilt (the
    shared-prompt layout with ``copies`` rows per prompt) or sliced (whole sequences, their
    images regathered)."""
    if scores.shared:
        out = {k: host[k][idx] for k in ("old_logp", "ref_logp", "advantages", "kl_mask")}
        out.update(RO.shared_batch(ro, idx, s.model_config, s.patch_bucket, s.pad_id, scores.n_slots, copies))
        return out
    out = {k: (v[:, idx] if k == "positions" else v[idx]) for k, v in host.items()
           if k not in ("pixel_values", "vision")}
    dim = next((p.shape[1] for p in ro.pixels if p is not None), 0)
    out["pixel_values"], out["vision"] = RO.vision_arrays([ro.grids[r] for r in idx], [ro.pixels[r] for r in idx],
                                                          s.model_config, s.patch_bucket, dim)
    return out


# ----------------------------------------------------------------------------- metrics
def rollout_metrics(c: Collected, adv: dict, method: str, max_new_tokens: int, filtered: bool = False
                    ) -> dict[str, float]:
    """Step metrics over all processes' rows (a collective); ``filtered``: add the group
    filter's counts (rounds, kept / dropped / short groups over all processes)."""
    ro, sc = c.ro, c.scored
    g = {k: MH.gather_rows(np.asarray(v)) for k, v in dict(
        valid=ro.valid, reward=sc.reward, success=sc.success, lengths=ro.lengths, adv=adv["advantages"],
        lam=adv["lambda"], kl_mask=adv["kl_mask"], **{f"part_{k}": v for k, v in sc.parts.items()}).items()}
    platform = np.array(MH.gather_strings([p or "" for p in ro.platform]))
    counts = MH.gather_rows(np.array([[c.kept_groups, c.dropped_groups, c.short_groups]], np.int64)).sum(0)
    v = g["valid"].astype(bool)
    row: dict[str, float] = {}
    if filtered:
        row.update({"group_filter/rounds": c.rounds, "group_filter/kept_groups": int(counts[0]),
                    "group_filter/dropped_groups": int(counts[1]), "group_filter/short_groups": int(counts[2])})
    if not v.any():
        return row
    r = RO.group_view(g["reward"], ro.group_size)
    gv = RO.group_view(v, ro.group_size)[:, 0]
    row.update({"reward_mean": float(g["reward"][v].mean()), "success_rate": float(g["success"][v].mean()),
                "reward_group_std": float(r[gv].std(1).mean()), "response_length": float(g["lengths"][v].mean()),
                "truncated_fraction": float((g["lengths"][v] >= max_new_tokens).mean()),
                "advantage_abs_mean": float(np.abs(g["adv"][v]).mean())})
    for k in sc.parts:
        row[f"reward_{k}"] = float(g[f"part_{k}"][v].mean())
    if method == "grpo":
        neg = g["adv"] < 0
        row["sngs_lambda_mean"] = float(g["lam"][v].mean())
        row["negative_scale_mean"] = float(g["lam"][v & neg].mean()) if (v & neg).any() else 1.0
    else:
        row["kl_mask_on_fraction"] = float(g["kl_mask"][v].mean())
        for label in sorted(set(platform[v])):
            on = v & (platform == label)
            row[f"{label}/reward_mean"] = float(g["reward"][on].mean())
    return row


# ----------------------------------------------------------------------------- the loop
class Prompts:
    """Endless RL prompt batches of this process; skips (and counts) batches with no valid prompt."""

    MAX_EMPTY = 3

    def __init__(self, loader):
        self.loader = loader
        self.empty = 0

    def __next__(self) -> dict:
        for _ in range(self.MAX_EMPTY):
            batch = next(self.loader)
            if np.any(batch["row_valid"]):
                return batch
            self.empty += 1
        raise RuntimeError(f"{self.MAX_EMPTY} consecutive RL batches hold no valid prompt "
                           f"(bad or filtered: {self.loader.bad_records.summary()}); raise data.max_length?")

    def get_state(self):
        return self.loader.get_state()

    def set_state(self, state):
        self.loader.set_state(state)

    def close(self):
        self.loader.close()


def update_groups(config) -> int:
    """Groups (prompts) per update over all processes: rl.update_groups, or every prompt of a round."""
    return config.rl.update_groups or config.data.batch_size


def train_rl(config, workdir: str) -> dict:
    """Run (or resume) a GRPO / MOPD job (``config.method``) in ``workdir``; returns the
    last logged metrics row."""
    from guilibra_jax.data.pipeline import make_rl_loader
    from guilibra_jax.train import data_source

    rl, tc = config.rl, config.train
    is_main = jax.process_index() == 0
    os.makedirs(workdir, exist_ok=True)
    run_history.record_config(config, workdir, is_main=is_main)
    mesh = MH.run_mesh(config)
    data_source.per_process_batch(config)   # bad batch / process counts fail before any model
    tokenizer = data_source.prepare_tokenizer(config, workdir)
    s, state, state_sh = setup(config, mesh, tokenizer)

    if rl.world:   # live browser states (train/online.py)
        from guilibra_jax.train.online import OnlinePrompts
        prompts = OnlinePrompts(config, tokenizer, s.model_config, workdir)
    else:
        dcfg = data_source.data_config(config, data_source.train_files(config, workdir))
        prompts = Prompts(make_rl_loader(dcfg, tokenizer, s.model_config, shard_index=jax.process_index(),
                                         shard_count=jax.process_count()))
        data_source.record_data_info(workdir, prompts.loader.info)
    if config.method == "mopd":   # every platform of the data has a teacher (ConfigError naming rl.teachers)
        from guilibra_jax.train.config import check_teachers
        check_teachers(rl.teachers, MH.gather_strings(list(prompts.loader.info.get("platforms", []))))
    if tc.memory_plan:
        from guilibra_jax.train import plan as PLAN
        report = PLAN.plan_stage2(s, state, state_sh, device_memory_gib=PLAN.device_memory_gib(mesh))
        if is_main:
            C.write_json(os.path.join(workdir, "memory_plan.json"), report)
        log.info("memory plan (GiB per device): %s", PLAN.summary_line(report))

    ckpt, start, state = open_checkpoints(workdir, tc, state, prompts)
    writer = writer_for_run(config, workdir, enabled=is_main)
    progress = Progress(tc.steps, start, enabled=is_main and tc.progress)
    profiler = StepProfiler(workdir, tc.profile_steps, enabled=is_main)
    evaluator = (data_source.make_evaluator(config, tokenizer, s.model_config, s.graphdef, workdir, mesh)
                 if tc.eval_every > 0 and config.method == "grpo" else None)
    if evaluator is not None and start == 0:   # the starting (SFT) policy, for comparison
        writer.write(0, evaluator(state["params"], 0))
    base_key = jax.random.PRNGKey(config.data.seed + 7919 * config.model.seed)
    divergence = Divergence(tc.max_skipped_updates, ckpt.latest_step)
    last_row: dict = {}
    step = start
    with Preemption() as preempt:
        while step < tc.steps:
            t0 = time.time()
            profiler.before(step + 1)
            c = collect(s, state["params"], prompts, step, base_key)
            adv = ADV.compute(c.scored.reward, c.scored.success & c.ro.valid, rl.group_size, config.method, rl)
            adv["advantages"] = np.where(c.ro.valid, adv["advantages"], 0.0).astype(np.float32)
            t1 = time.time()
            scores = score(s, state["params"], c.ro)
            t2 = time.time()
            state, metrics, applied = update(s, state, c.ro, adv, scores)
            t3 = time.time()
            step += 1
            profiler.after(step, state)
            for ok in applied:
                divergence.update(step, ok)
            row = rollout_metrics(c, adv, config.method, rl.max_new_tokens, rl.group_filter.enabled)
            row.update({k: float(v) for k, v in metrics.items()})
            row.update(sample_s=t1 - t0, score_s=t2 - t1, update_s=t3 - t2, step_s=t3 - t0)
            row.update(data_source.drop_metrics(prompts))   # process 0's record counts
            if hasattr(prompts, "metrics"):                  # process 0's episodes (rl.world)
                row.update(prompts.metrics())
            if step % tc.log_every == 0 or step == tc.steps:
                last_row = writer.write(step, row)
                progress.update(step, last_row)
            stop = preempt.should_stop()
            last_row = eval_and_checkpoint(step, state, last_row, tc, evaluator, writer, ckpt, prompts.get_state,
                                           stop)
            if stop:
                break
    profiler.close()
    finish_run(step, state, tc, ckpt, progress, writer, s.graphdef, s.model_config, tokenizer, workdir, is_main)
    log.info("data: %s", data_source.drop_report(prompts))
    prompts.close()
    return last_row
