"""The stage-2 loop shared by GUI-Libra's conservative GRPO and UI-MOPD: per step,

    prompts (make_rl_loader) -> G copies -> sample (generate, KV cache)
      -> rewards (guilibra_reward | mopd_reward) -> group advantages
         GRPO: SNGS on the negative ones;  MOPD: zeroed below the pass-rate floor
      -> old log-probs (policy), reference log-probs (GRPO: the frozen SFT model;
         MOPD: each sequence's platform teacher, scored on its own rows only)
      -> ppo_epochs x minibatches updates (rl_step)

``train_rl(config, workdir)`` is what ``python -m launch.train`` runs for
``method=grpo|mopd``. Re-running resumes from the latest checkpoint: the state, the
prompt iterator, and the sampling key (derived from the step), so a resumed run repeats
the uninterrupted one. Frozen models (reference, teachers) hold no optimizer state and
are sharded like the policy.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from guilibra_jax import actions as A
from guilibra_jax import generate as G
from guilibra_jax import losses
from guilibra_jax import sharding as S
from guilibra_jax.models.vision import device_vision_inputs
from guilibra_jax.train import checkpoint as C
from guilibra_jax.train import model_factory
from guilibra_jax.train import rollout as RO
from guilibra_jax.train import run_history
from guilibra_jax.train.batching import put_batch, stack_micro_batches
from guilibra_jax.train.loop import (_Preemption, eval_and_checkpoint, finish_run, open_checkpoints,
                                     optimizer_from_config, sharded_state)
from guilibra_jax.train.metrics import MetricsWriter, Progress
from guilibra_jax.train.rl_step import make_rl_step

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- advantages
def advantages(rewards: np.ndarray, success: np.ndarray, group_size: int, method: str, rl) -> dict[str, np.ndarray]:
    """Per-row advantages [R] and KL mask [R] from rewards and passes [R] (group-major).

    GRPO: group-relative advantages, then SNGS (negative ones times λ = min(λ0 + κ p^, 1),
    p^ the group's mean reward or success rate); kl_mask 1.
    MOPD: advantages r - mean (std-normalised if rl.normalize_std), zeroed for groups whose
    pass rate is below rl.mopd.pass_floor; kl_mask μ_g = 0 for groups whose pass rate
    exceeds rl.mopd.kl_mask_tau, else 1.
    """
    r = RO.group_view(rewards, group_size)
    s = RO.group_view(success, group_size).astype(np.float32)
    adv = np.asarray(losses.group_advantages(jnp.asarray(r), normalize_std=rl.normalize_std))
    n = r.shape[0]
    lam = np.ones(n, np.float32)
    kl_mask = np.ones(n, np.float32)
    if method == "grpo" and rl.sngs.enabled:
        signal = r.mean(1) if rl.sngs.signal == "mean_reward" else s.mean(1)
        scaled, lam = losses.sngs_scale(jnp.asarray(adv), jnp.asarray(signal), lambda0=rl.sngs.lambda0,
                                        kappa=rl.sngs.kappa)
        adv, lam = np.asarray(scaled), np.asarray(lam)
    if method == "mopd":
        pass_rate = s.mean(1)
        adv = np.where((pass_rate < rl.mopd.pass_floor)[:, None], 0.0, adv)
        kl_mask = (pass_rate <= rl.mopd.kl_mask_tau).astype(np.float32)
    rep = lambda x: np.repeat(np.asarray(x, np.float32), group_size)
    return {"advantages": adv.reshape(-1).astype(np.float32), "kl_mask": rep(kl_mask), "lambda": rep(lam)}


# ----------------------------------------------------------------------------- frozen models
def _n_params(params) -> int:
    return int(sum(x.size for x in jax.tree.leaves(params)))


class Frozen:
    """A scored-only model: graphdef, params sharded on the mesh, its ModelConfig."""

    def __init__(self, name: str, graphdef, params, model_config):
        self.name, self.graphdef, self.params, self.model_config = name, graphdef, params, model_config
        self.bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))


def _load_frozen(name: str, path: str, config, mesh) -> Frozen:
    graphdef, params, mc = model_factory.load_frozen(path, dtype=config.model.dtype,
                                                     param_dtype=config.model.dtype)
    model = nnx.merge(graphdef, params)
    _, pstate, _ = nnx.split(model, nnx.Param, ...)
    params = jax.device_put(params, S.param_shardings(pstate, mesh))
    log.info("%s: %s (%.1fM parameters)", name, path, _n_params(params) / 1e6)
    return Frozen(name, graphdef, params, mc)


def memory_plan(policy_params, frozen: list[Frozen], rows: int, seq_len: int, model_config, param_dtype,
                compute_dtype) -> dict[str, float]:
    """GiB per component over the whole mesh: policy params, its gradients and AdamW
    moments (param dtype), frozen models, and the sampler's KV cache."""
    gib = 1024 ** 3
    n = _n_params(policy_params)
    pbytes = jnp.dtype(param_dtype).itemsize
    t = model_config.text
    kv = rows * seq_len * t.num_layers * 2 * t.num_kv_heads * t.head_dim * jnp.dtype(compute_dtype).itemsize
    plan = {"policy_params": n * pbytes / gib, "policy_grads": n * pbytes / gib, "adam_moments": 2 * n * 4 / gib,
            "kv_cache": kv / gib}
    for f in frozen:
        plan[f"frozen_{f.name}"] = f.bytes / gib
    plan["total"] = sum(plan.values())
    return plan


# ----------------------------------------------------------------------------- loop
class _Prompts:
    """Endless RL prompt batches; skips (and counts) batches with no valid prompt."""

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


def _device_inputs(host: dict, mesh, micro_axis: bool) -> dict:
    host = dict(host)
    vision = host.pop("vision", None)
    if host.get("pixel_values") is None:
        host.pop("pixel_values", None)
    out = put_batch(host, mesh, micro_axis=micro_axis)
    if vision is not None:
        out["vision"] = put_batch({"vision": device_vision_inputs(vision)}, mesh, micro_axis=micro_axis)["vision"]
    else:
        out["pixel_values"], out["vision"] = None, None
    return out


def _pad_rows(rows: np.ndarray, size: int) -> np.ndarray:
    return np.concatenate([rows, np.full(size - len(rows), rows[0] if len(rows) else 0)]).astype(np.int64)


def train_rl(config, workdir: str) -> dict:
    """Run (or resume) a GRPO / MOPD job (``config.method``) in ``workdir``; returns the
    last logged metrics row."""
    from guilibra_jax.data.pipeline import make_rl_loader
    from guilibra_jax.train import data_source

    method, rl, tc = config.method, config.rl, config.train
    if jax.process_count() > 1:
        raise NotImplementedError(
            "RL training runs in one process (any number of local devices) for now: rollouts, rewards "
            "and routing are computed on the host of that process. Multi-host RL needs per-process "
            "rollout gathering, which is not built yet.")
    os.makedirs(workdir, exist_ok=True)
    run_history.record_config(config, workdir)
    mesh = S.make_mesh(dict(config.mesh))
    tokenizer = data_source.prepare_tokenizer(config, workdir)
    model, model_config = model_factory.build_model(config, tokenizer)
    graphdef, pstate, _ = nnx.split(model, nnx.Param, ...)
    param_sh = S.param_shardings(pstate, mesh)
    params = nnx.to_pure_dict(pstate)
    del model, pstate

    tx, schedule = optimizer_from_config(config, params, tc.steps * rl.ppo_epochs * rl.minibatches)
    params = jax.device_put(params, param_sh)

    # Frozen models: the GRPO reference (default: the starting policy), or MOPD teachers.
    frozen: dict[str, Frozen] = {}
    if method == "grpo":
        if rl.reference:
            frozen["reference"] = _load_frozen("reference", rl.reference, config, mesh)
        else:
            cast = model_factory.dtype_of(config.model.dtype, "model.dtype")
            ref_params = jax.jit(lambda p: jax.tree.map(lambda x: x.astype(cast), p), out_shardings=param_sh)(params)
            frozen["reference"] = Frozen("reference", graphdef, ref_params, model_config)
    else:
        for label, path in rl.teachers.items():
            frozen[label] = _load_frozen(f"teacher_{label}", path, config, mesh)
    state, state_sh = sharded_state(params, tx, param_sh, mesh)
    del params

    rows = config.data.batch_size * rl.group_size
    dcfg = data_source.data_config(config, data_source.train_files(config, workdir))
    prompts = _Prompts(make_rl_loader(dcfg, tokenizer, model_config, shard_index=0, shard_count=1))
    plan = memory_plan(state["params"], list(frozen.values()), rows, config.data.max_length + rl.max_new_tokens,
                       model_config, config.model.param_dtype, config.model.dtype)
    log.info("memory plan (GiB, whole mesh): %s", {k: round(v, 3) for k, v in plan.items()})
    C.write_json(os.path.join(workdir, "memory_plan.json"), plan)

    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    stop = tuple(i for i in (tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.eos_token_id) if i is not None)
    banned = RO.vision_token_ids(model_config)
    sampling = G.SamplingConfig(temperature=rl.temperature, top_p=rl.top_p, top_k=rl.top_k,
                                max_new_tokens=rl.max_new_tokens, stop_token_ids=stop, pad_token_id=pad_id,
                                banned_token_ids=banned)
    coord_space = A.FAMILY_COORD_SPACE[model_config.family]
    chunk = rl.score_chunk or None
    loss_kwargs = (dict(clip_low=rl.clip_low, clip_high=rl.clip_high, kl_beta=rl.kl_beta, kl_kind=rl.kl_kind,
                        kl_clamp=rl.kl_clamp or None, aggregation=rl.aggregation) if method == "grpo" else
                   dict(beta=rl.mopd.beta, clip_low=rl.clip_low, clip_high=rl.clip_high,
                        kl_clamp=rl.kl_clamp or None, aggregation=rl.aggregation))
    step_fn = make_rl_step(graphdef, tx, loss=method, loss_kwargs=loss_kwargs, temperature=rl.temperature,
                           chunk_size=chunk, banned_token_ids=banned, schedule=schedule)
    jit_update = jax.jit(step_fn, in_shardings=(state_sh, None), out_shardings=(state_sh, None), donate_argnums=0)
    dp = int(np.prod([mesh.shape[a] for a in ("data", "fsdp") if a in mesh.shape]))

    ckpt, start, state = open_checkpoints(workdir, tc, state, prompts)
    writer = MetricsWriter(workdir, tensorboard=tc.tensorboard)
    progress = Progress(tc.steps, start, enabled=tc.progress)
    evaluator = (data_source.make_evaluator(config, tokenizer, model_config, graphdef, workdir)
                 if tc.eval_every > 0 and method == "grpo" else None)
    if evaluator is not None and start == 0:   # the starting (SFT) policy, for comparison
        writer.write(0, evaluator(state["params"], 0))
    base_key = jax.random.PRNGKey(config.data.seed + 7919 * config.model.seed)
    patch_bucket = config.data.patch_bucket
    last_row: dict = {}
    step = start
    with _Preemption() as preempt:
        while step < tc.steps:
            t0 = time.time()
            ro = RO.expand_groups(next(prompts), rl.group_size)
            inputs = _device_inputs(RO.prompt_inputs(ro, model_config, patch_bucket), mesh, micro_axis=False)
            out = G.generate(graphdef, state["params"], inputs["prompt_ids"], inputs["prompt_mask"],
                             inputs["positions"], inputs["rope_deltas"], inputs["pixel_values"], inputs["vision"],
                             jax.random.fold_in(base_key, step), sampling)
            ro.tokens, ro.lengths = (np.asarray(x) for x in jax.device_get((out.tokens, out.lengths)))
            texts = [G.decode_response(tokenizer, ro.tokens[i, :ro.lengths[i]], stop) for i in range(ro.rows)]
            scored = RO.score_responses(texts, ro, method, coord_space=coord_space, w_fmt=rl.reward.w_fmt,
                                        value_rule=rl.reward.value_rule, point_tolerance=rl.reward.point_tolerance)
            adv = advantages(scored.reward, scored.success & ro.valid, rl.group_size, method, rl)
            adv["advantages"] = np.where(ro.valid, adv["advantages"], 0.0).astype(np.float32)
            t1 = time.time()

            # Old and reference / teacher log-probs of the sampled tokens.
            all_rows = np.arange(ro.rows)
            seq_host = RO.sequence_batch(ro, all_rows, model_config, patch_bucket, pad_id)
            n_slots = seq_host["input_ids"].shape[1] - ro.prompt_ids.shape[1]
            seq = _device_inputs(seq_host, mesh, micro_axis=False)
            old_logp = np.asarray(G.score(graphdef, state["params"], seq["input_ids"], seq["positions"],
                                          seq["segment_ids"], seq["pixel_values"], seq["vision"],
                                          seq["response_mask"], temperature=rl.temperature, chunk_size=chunk,
                                          banned_token_ids=banned))
            ref_logp = np.zeros_like(old_logp)
            if method == "grpo":
                f = frozen["reference"]
                fseq = seq if f.model_config == model_config else _device_inputs(
                    RO.sequence_batch(ro, all_rows, f.model_config, patch_bucket, pad_id, n_slots), mesh, False)
                ref_logp = np.asarray(G.score(f.graphdef, f.params, fseq["input_ids"], fseq["positions"],
                                              fseq["segment_ids"], fseq["pixel_values"], fseq["vision"],
                                              fseq["response_mask"], temperature=rl.temperature, chunk_size=chunk,
                                              banned_token_ids=banned))
            else:
                ref_logp = _teacher_logp(ro, frozen, n_slots, patch_bucket, pad_id, rl.temperature, chunk, mesh, dp,
                                         ref_logp, banned)
            t2 = time.time()

            # Updates: ppo_epochs passes over minibatches of rows (a fixed permutation per step).
            update_host = dict(seq_host, old_logp=old_logp, ref_logp=ref_logp.astype(np.float32),
                               advantages=adv["advantages"], kl_mask=adv["kl_mask"])
            perm = np.random.default_rng([config.data.seed, step]).permutation(ro.rows)
            mb_rows = ro.rows // rl.minibatches
            micro_rows = mb_rows // tc.grad_accum
            metrics: dict[str, Any] = {}
            for _ in range(rl.ppo_epochs):
                for m in range(rl.minibatches):
                    idx = perm[m * mb_rows:(m + 1) * mb_rows]
                    micros = [_take_rows(update_host, idx[k * micro_rows:(k + 1) * micro_rows], model_config,
                                         patch_bucket, ro) for k in range(tc.grad_accum)]
                    batch = _device_inputs(stack_micro_batches(micros), mesh, micro_axis=True)
                    state, metrics = jit_update(state, batch)
            metrics = jax.device_get(metrics)
            t3 = time.time()
            step += 1
            row = _rollout_metrics(scored, adv, ro, method)
            row.update({k: float(v) for k, v in metrics.items()})
            row.update(sample_s=t1 - t0, score_s=t2 - t1, update_s=t3 - t2, step_s=t3 - t0)
            if step % tc.log_every == 0 or step == tc.steps:
                last_row = writer.write(step, row)
                progress.update(step, last_row)
            last_row = eval_and_checkpoint(step, state, last_row, tc, evaluator, writer, ckpt, prompts.get_state,
                                           preempt.requested)
            if preempt.requested:
                break
    finish_run(step, state, tc, ckpt, progress, writer, graphdef, model_config, tokenizer, workdir)
    prompts.close()
    return last_row


def _take_rows(update_host: dict, idx: np.ndarray, model_config, patch_bucket: int, ro: RO.Rollout) -> dict:
    """The update arrays of rows ``idx`` (images regathered for those rows)."""
    out = {k: (v[:, idx] if k == "positions" else v[idx]) for k, v in update_host.items()
           if k not in ("pixel_values", "vision")}
    dim = next((p.shape[1] for p in ro.pixels if p is not None), 0)
    pv, vision = RO.vision_arrays([ro.grids[r] for r in idx], [ro.pixels[r] for r in idx], model_config,
                                  patch_bucket, dim)
    out["pixel_values"], out["vision"] = pv, vision
    return out


def _teacher_logp(ro: RO.Rollout, teachers: dict[str, Frozen], n_slots: int, patch_bucket: int, pad_id: int,
                  temperature: float, chunk, mesh, dp: int, out: np.ndarray, banned: tuple[int, ...] = ()
                  ) -> np.ndarray:
    """Each row's log-probs under the teacher of its platform label, scoring every
    teacher on its own rows only (padded to a fixed size per teacher call)."""
    labels = np.array([p if p is not None else "" for p in ro.platform])
    assigned = np.zeros(ro.rows, bool)
    for label, f in teachers.items():
        if label == "*":
            continue
        rows = np.nonzero(labels == label)[0]
        _score_rows(ro, f, rows, n_slots, patch_bucket, pad_id, temperature, chunk, mesh, dp, out, banned)
        assigned[rows] = True
    rest = np.nonzero(~assigned & ro.valid)[0]
    if len(rest):
        if "*" not in teachers:
            raise KeyError(f"no teacher for platform labels {sorted(set(labels[rest]))}; rl.teachers has "
                           f"{sorted(teachers)} (add '*' for a default teacher)")
        _score_rows(ro, teachers["*"], rest, n_slots, patch_bucket, pad_id, temperature, chunk, mesh, dp, out,
                    banned)
    return out


def _score_rows(ro, f: Frozen, rows: np.ndarray, n_slots, patch_bucket, pad_id, temperature, chunk, mesh, dp, out,
                banned=()):
    if len(rows) == 0:
        return
    sizes = sorted({s for s in (ro.rows // 4, ro.rows // 2, ro.rows) if s > 0 and s % dp == 0} | {ro.rows})
    size = next(s for s in sizes if s >= len(rows))
    padded = _pad_rows(rows, size)
    host = RO.sequence_batch(ro, padded, f.model_config, patch_bucket, pad_id, n_slots)
    seq = _device_inputs(host, mesh, micro_axis=False)
    lp = np.asarray(G.score(f.graphdef, f.params, seq["input_ids"], seq["positions"], seq["segment_ids"],
                            seq["pixel_values"], seq["vision"], seq["response_mask"], temperature=temperature,
                            chunk_size=chunk, banned_token_ids=banned))
    out[rows] = lp[:len(rows)]


def _rollout_metrics(scored: RO.Scored, adv: dict, ro: RO.Rollout, method: str) -> dict[str, float]:
    v = ro.valid
    if not v.any():
        return {}
    r = RO.group_view(scored.reward, ro.group_size)
    gv = RO.group_view(v, ro.group_size)[:, 0]
    a = adv["advantages"][v]
    row = {"reward_mean": float(scored.reward[v].mean()), "success_rate": float(scored.success[v].mean()),
           "reward_group_std": float(r[gv].std(1).mean()), "response_length": float(ro.lengths[v].mean()),
           "truncated_fraction": float((ro.lengths[v] >= ro.tokens.shape[1]).mean()),
           "advantage_abs_mean": float(np.abs(a).mean())}
    for k, x in scored.parts.items():
        row[f"reward_{k}"] = float(x[v].mean())
    if method == "grpo":
        neg = adv["advantages"] < 0
        row["sngs_lambda_mean"] = float(adv["lambda"][v].mean())
        row["negative_scale_mean"] = float(adv["lambda"][v & neg].mean()) if (v & neg).any() else 1.0
    else:
        row["kl_mask_on_fraction"] = float(adv["kl_mask"][v].mean())
        for label in sorted({p for p, ok in zip(ro.platform, v) if ok}):
            on = v & (np.array(ro.platform) == label)
            row[f"{label}/reward_mean"] = float(scored.reward[on].mean())
    return row
