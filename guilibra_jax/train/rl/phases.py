"""The stage-2 loop shared by GUI-Libra's conservative GRPO and UI-MOPD. One step:

    prompts ──rollout──► G responses per prompt, sampled by the policy over the whole mesh
            ──reward───► rewards and passes (host: rewards.guilibra_reward | mopd_reward)
            [group filter (rl.group_filter): drop groups whose pass rate is 0 or 1 (with
             greedy_wrong also those whose greedy response passes) and draw more prompts
             until rl.update_groups groups are kept]
            ──advantages► group-relative; GRPO: SNGS on the negative ones; MOPD: pass-rate
                          floor and adaptive KL mask (rl.mopd.kl_mask)
            ──score────► old log-probs (policy) and reference (GRPO: the frozen SFT model) or
                         teacher (MOPD: each row's platform teacher) log-probs
            ──update───► ppo_epochs x minibatches optimizer updates (rl/step.py)

Each phase is a function below with explicit inputs and outputs; ``rl/trainer.py`` runs
them in order, once per step (``python -m launch.train`` with ``method=grpo|mopd``).

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

import jax
import numpy as np

from guilibra_jax import actions as A
from guilibra_jax import generate as G
from guilibra_jax import sharding as S
from guilibra_jax.train import data_source
from guilibra_jax.train import multihost as MH
from guilibra_jax.train.batching import stack_micro_batches
from guilibra_jax.train.rl import advantages as ADV
from guilibra_jax.train.rl import frozen as FZ
from guilibra_jax.train.rl import rollout as RO
from guilibra_jax.train.rl.layout import (agreed_copies, device_inputs, local_chunk, model_batch, row_chunks,
                                          update_calls)
from guilibra_jax.train.rl.setup import Stage2, reuse_sampler_log_probs, shares_prompts, update_groups, uses_full_kl

log = logging.getLogger(__name__)


def rollout(s: Stage2, params, batch: dict, key, *, group_size: int | None = None,
            sampling: G.SamplingConfig | None = None) -> RO.Rollout:
    """G responses to each prompt of this process's batch (``collate_rl``), sampled with the
    policy ``params``; the rollout holds tokens, lengths, the sampler's log-probs and texts.
    ``group_size`` / ``sampling``: other than the run's (the greedy play of live episodes)."""
    group_size = s.rl.group_size if group_size is None else group_size
    ro = RO.expand_groups(batch, group_size)
    ro = RO.pad_prompts(ro, MH.agree_max(ro.prompt_ids.shape[1]))
    outs = []
    for c, rows in enumerate(row_chunks(ro.rows, local_chunk(s, s.rl.generation_rows))):
        # each prompt's prefill once, shared by its copies (rows of a group are copies of one prompt)
        copies = RO.prompt_copies(len(rows), group_size, s.row_multiple) if s.rl.share_prefill else 1
        part = ro if len(rows) == ro.rows and copies == 1 else RO.take_rows(ro, rows[::copies])
        inputs = device_inputs(s, RO.prompt_inputs(part, s.model_config, s.patch_bucket))
        with S.mesh_context(s.mesh):
            out = G.generate(s.graphdef, params, inputs["prompt_ids"], inputs["prompt_mask"], inputs["positions"],
                             inputs["rope_deltas"], inputs["pixel_values"], inputs["vision"],
                             key if c == 0 else jax.random.fold_in(key, c), sampling or s.sampling, copies=copies)
        outs.append([MH.local_rows(x, s.mesh) for x in (out.tokens, out.lengths, out.logprobs)])
    ro.tokens, ro.lengths, ro.sample_logp = (np.concatenate(x) for x in zip(*outs))
    ro.texts = [G.decode_response(s.tokenizer, ro.tokens[i, :ro.lengths[i]], s.stop) for i in range(ro.rows)]
    return ro


def rewarded(s: Stage2, ro: RO.Rollout) -> tuple[RO.Rollout, RO.Scored, list[int]]:
    """The rollout's rewards; with ``rl.demo_in_failed_groups`` first the demonstrated
    response in place of the last one of every group where no sampled response passed
    (``rollout.insert_demos``), rescored. Returns (rollout, scored, [demo responses
    inserted, of which passed their own reward, failed groups left without one])."""
    scored = reward(s, ro)
    if not s.rl.get("demo_in_failed_groups", False):
        return ro, scored, [0, 0, 0]
    decode = lambda ids: G.decode_response(s.tokenizer, ids, s.stop)
    ro, replaced, unplaced = RO.insert_demos(ro, scored.success, s.stop, s.pad_id, decode)
    if replaced.any():
        scored = reward(s, ro)
    return ro, scored, [int(replaced.sum()), int((replaced & scored.success).sum()), unplaced]


def reward(s: Stage2, ro: RO.Rollout) -> RO.Scored:
    """Rewards and passes of the rollout's responses (invalid rows score 0, never pass)."""
    rw = s.rl.reward
    return RO.score_responses(ro.texts, ro, s.method, coord_space=A.FAMILY_COORD_SPACE[s.model_config.family],
                              w_fmt=rw.w_fmt, value_rule=rw.value_rule, point_tolerance=rw.point_tolerance,
                              format_rule=rw.format_rule, think_opened=s.think_opened,
                              think_tag=A.THINK_TAG[s.model_config.family], mopd_rule=rw.mopd_rule,
                              check_tool_name=rw.check_tool_name, grounding_sigma=rw.grounding_sigma)


@dataclasses.dataclass
class Collected:
    """The rollout a step updates on, with its rewards and the group filter's counts."""

    ro: RO.Rollout
    scored: RO.Scored
    rounds: int = 1
    kept_groups: int = 0       # this process
    dropped_groups: int = 0
    short_groups: int = 0      # update slots filled with dropped groups (no loss) at the round limit
    greedy_right: int = 0      # groups whose prompt's greedy response passed (greedy_wrong drops them)
    demos: tuple = (0, 0, 0)   # demonstrated responses put in failed groups (rl.demo_in_failed_groups), kept
                               # or not; of which passed their own reward (a rendering check: all should);
                               # failed groups left without one (no label, or longer than rl.max_new_tokens)


def collect(s: Stage2, params, prompts, step: int, base_key) -> Collected:
    """Rollout + reward for one step: one round of ``data.batch_size`` prompts, or with
    ``rl.group_filter`` as many rounds as it takes to keep ``rl.update_groups`` groups whose
    pass rate is strictly between 0 and 1 (every process keeps its share; at most
    ``rl.group_filter.max_rounds`` rounds (0 = no limit), then the update is completed with
    dropped groups that carry no loss, logged as ``short_groups``)."""
    gf = s.rl.group_filter
    key = lambda r: jax.random.fold_in(jax.random.fold_in(base_key, step), r)
    if not gf.enabled:
        ro, _ = _rollout_next(s, params, prompts, key(0))
        ro, scored, demos = rewarded(s, ro)
        return Collected(ro, scored, demos=tuple(demos))
    G_ = s.rl.group_size
    quota = update_groups(s.config) // jax.process_count()
    parts, kept, rounds, greedy_right, demos = [], 0, 0, 0, np.zeros(3, np.int64)
    while True:
        ro, greedy = _rollout_next(s, params, prompts, key(rounds), greedy_needed=gf.greedy_wrong)
        ro, scored, n_demos = rewarded(s, ro)
        demos += n_demos
        keep = ADV.keep_groups(scored.success & ro.valid, ro.valid, G_)
        if gf.greedy_wrong:   # the mode already right: sharpening it cannot change greedy play
            right = reward(s, greedy).success & greedy.valid
            greedy_right += int(right.sum())
            keep &= ~right
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
                     dropped_groups=n_groups - kept, short_groups=max(0, quota - kept), greedy_right=greedy_right,
                     demos=tuple(int(x) for x in demos))


def _rollout_next(s: Stage2, params, prompts, key, greedy_needed: bool = False
                  ) -> tuple[RO.Rollout, RO.Rollout | None]:
    """The rollout of the next prompts, and (with ``greedy_needed`` or greedy play) each
    prompt's greedy response as a rollout of groups of one. A live prompt source (rl.world,
    rl/online.py) then advances its episodes (``prompts.advance``): each with the first
    response of its group, or (``rl.online.play = "greedy"``) the greedy one."""
    batch = next(prompts)
    ro = rollout(s, params, batch, key)
    live = hasattr(prompts, "advance")
    greedy = None
    if greedy_needed or (live and s.rl.online.play == "greedy"):
        greedy = rollout(s, params, batch, key, group_size=1, sampling=dataclasses.replace(s.sampling, temperature=0.0))
    if live:
        prompts.advance(ro, greedy.texts if greedy is not None and s.rl.online.play == "greedy" else None)
    return ro, greedy


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
    kl_ok: np.ndarray | None = None   # [R] bool: False where a served scorer failed (no KL term on the row)
    served: dict = dataclasses.field(default_factory=dict)   # served name -> [rows sent, scored, retokenized]


def score(s: Stage2, params, ro: RO.Rollout) -> Scores:
    """Old-policy log-probs and the frozen models' log-probs of the sampled tokens: GRPO's
    reference on every row; MOPD's teachers, each on its own platform's rows only (none with
    rl.mopd.estimator full_kl: the update runs them; the reference log-probs are then the
    old ones, the unused K3 term 0)."""
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
    size = local_chunk(s, s.rl.score_rows)

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

    ok = np.ones(ro.rows, bool)
    served = {}

    def serve_rows(f, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # (per process, no collective: a served scorer gets this process's rows)
        logp, scored, retok = FZ.serve(f, ro, rows, n_slots, shared, s.tokenizer, image_configs(s))
        sent = ro.valid[rows] & (ro.lengths[rows] > 0)
        before = served.get(f.name, [0, 0, 0])
        served[f.name] = [before[0] + int(sent.sum()), before[1] + int((sent & scored).sum()),
                          before[2] + int((sent & retok).sum())]
        return logp, scored

    ref = s.frozen["reference"] if s.method == "grpo" else None
    if ref is not None and FZ.is_served(ref):
        ref_logp, ok = serve_rows(ref, all_rows)
    elif ref is not None:
        ref_logp = score_rows(ref, all_rows)
    elif uses_full_kl(s.config):   # the update runs the teachers and forms the exact KL: nothing to score
        FZ.check_platforms(ro.platform, ro.valid, s.frozen)
        ref_logp = old_logp
    else:
        ref_logp = FZ.score_by_platform(ro.platform, ro.valid, s.frozen, score_rows, s.row_multiple,
                                        np.zeros_like(old_logp), serve_rows, ok)
    ref_logp = np.where(ok[:, None], ref_logp, old_logp)   # unscored rows: no KL (weight 0, and K3 = 0)
    return Scores(seq_host, old_logp, ref_logp.astype(np.float32), n_slots, shared, ok, served)


def image_configs(s: Stage2):
    """The image processor configs of the run's platforms (data.pixels bounds), as the data
    pipeline resizes prompts' screenshots."""
    return data_source.pixel_budgets(s.config.data).for_family(s.model_config.family, s.model_config)


def update(s: Stage2, state: dict, ro: RO.Rollout, adv: dict, scores: Scores) -> tuple[dict, dict, list[bool]]:
    """ppo_epochs x minibatches optimizer updates on the rollout; returns (state, metrics of
    the last update, whether each update was applied (finite))."""
    rl, accum = s.rl, s.config.train.grad_accum
    kl_mode = ADV.kl_mask_mode(rl) if s.method == "mopd" else "off"
    if scores.shared:
        ro = RO.pad_prompts(ro, MH.agree_max(ro.prompt_ids.shape[1]))
    kl_mask = adv["kl_mask"] if scores.kl_ok is None else adv["kl_mask"] * scores.kl_ok   # served failures: off
    host = dict(scores.seq, old_logp=scores.old_logp, ref_logp=scores.ref_logp, advantages=adv["advantages"],
                kl_mask=kl_mask)
    if s.method == "mopd":   # full_kl: the update runs each row's teacher; all: the KL per teacher
        host["teacher_index"] = FZ.teacher_index(ro.platform, FZ.teacher_order(s.frozen))
    token_counts = scores.seq["response_mask"].sum(1)
    metrics, applied = {}, []
    for _ in range(rl.ppo_epochs):
        for m in range(rl.minibatches):
            idx, calls = update_calls(ro.rows, rl.minibatches, accum, m)
            totals = None
            if kl_mode == "release":
                totals = MH.gather_rows(ADV.kl_totals(kl_mask[idx], token_counts[idx])[None]).sum(0)
            weights = ADV.kl_weights(kl_mask, kl_mode, totals)
            if scores.kl_ok is not None:    # (kl_mask "off" weighs every row 1: unscored rows still 0)
                weights = weights * scores.kl_ok
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
        out = {k: host[k][idx] for k in ("old_logp", "ref_logp", "advantages", "kl_mask", "teacher_index")
               if k in host}
        out.update(RO.shared_batch(ro, idx, s.model_config, s.patch_bucket, s.pad_id, scores.n_slots, copies))
        return out
    out = {k: (v[:, idx] if k == "positions" else v[idx]) for k, v in host.items()
           if k not in ("pixel_values", "vision")}
    dim = next((p.shape[1] for p in ro.pixels if p is not None), 0)
    out["pixel_values"], out["vision"] = RO.vision_arrays([ro.grids[r] for r in idx], [ro.pixels[r] for r in idx],
                                                          s.model_config, s.patch_bucket, dim)
    return out


# ----------------------------------------------------------------------------- metrics
def teacher_kl_metrics(s: Stage2, metrics: dict) -> dict[str, float]:
    """The update's per-teacher KL sums (MOPD with several teachers) as ``<platform>/kl``:
    each teacher's mean per-token KL over its rows' tokens with the KL on, and
    ``<platform>/kl_tokens`` their count (both absent for a teacher with no such token in
    the step; the token-weighted mean over teachers is ``kl``). The raw sums are removed
    from ``metrics``."""
    out = {}
    for i, label in enumerate(FZ.teacher_order(s.frozen) if s.method == "mopd" else ()):
        kl, n = metrics.pop(f"kl_teacher_{i}", None), metrics.pop(f"kl_tokens_teacher_{i}", None)
        if kl is not None and n:
            out[f"{label}/kl"], out[f"{label}/kl_tokens"] = float(kl) / float(n), float(n)
    return out


def served_metrics(s: Stage2, scores: Scores, watches: dict) -> dict[str, float]:
    """Each served scorer's rows of the step over all processes (a collective):
    ``served/<name>/rows`` sent, ``ok`` scored, ``dropped_rows`` (no KL term), of which
    ``retokenized`` (image rows whose response the server tokenizes otherwise); ``watches``
    (name -> served_scorer.FailedSteps) stop the run after too many fully failed steps."""
    scorers = {f.name: f for f in s.frozen.values() if FZ.is_served(f)}
    if not scorers:
        return {}
    names = sorted(scorers)
    local = np.array([scores.served.get(n, [0, 0, 0]) for n in names], np.int64).reshape(1, -1)
    totals = MH.gather_rows(local).sum(0).reshape(-1, 3)
    row = {}
    for n, (sent, ok, retok) in zip(names, totals.tolist()):
        row.update({f"served/{n}/rows": sent, f"served/{n}/ok": ok, f"served/{n}/dropped_rows": sent - ok,
                    f"served/{n}/retokenized": retok})
        if sent > ok:
            log.warning("%s: %d of %d rows unscored (no KL term); attempts so far by outcome: %s",
                        scorers[n].key, sent - ok, sent, dict(scorers[n].counts))
        watches[n].note(ok, sent, ", ".join(f"{k} {v}" for k, v in sorted(scorers[n].counts.items()) if k != "ok"))
    return row


def rollout_metrics(c: Collected, adv: dict, method: str, max_new_tokens: int, filtered: bool = False,
                    demo: bool = False) -> dict[str, float]:
    """Step metrics over all processes' rows (a collective); ``filtered``: add the group
    filter's counts (rounds, kept / dropped / short groups over all processes)."""
    ro, sc = c.ro, c.scored
    g = {k: MH.gather_rows(np.asarray(v)) for k, v in dict(
        valid=ro.valid, reward=sc.reward, success=sc.success, lengths=ro.lengths, adv=adv["advantages"],
        lam=adv["lambda"], kl_mask=adv["kl_mask"], **{f"part_{k}": v for k, v in sc.parts.items()}).items()}
    platform = np.array(MH.gather_strings([p or "" for p in ro.platform]))
    counts = MH.gather_rows(np.array([[c.kept_groups, c.dropped_groups, c.short_groups, c.greedy_right, *c.demos]],
                                     np.int64)).sum(0)
    v = g["valid"].astype(bool)
    row: dict[str, float] = {}
    if filtered:
        row.update({"group_filter/rounds": c.rounds, "group_filter/kept_groups": int(counts[0]),
                    "group_filter/dropped_groups": int(counts[1]), "group_filter/short_groups": int(counts[2]),
                    "group_filter/greedy_right": int(counts[3])})
    if not v.any():
        return row
    r = RO.group_view(g["reward"], ro.group_size)
    gv = RO.group_view(v, ro.group_size)[:, 0]
    passed = RO.group_view(g["success"].astype(bool), ro.group_size)
    row.update({"reward_mean": float(g["reward"][v].mean()), "success_rate": float(g["success"][v].mean()),
                "reward_group_std": float(r[gv].std(1).mean()),
                "equal_reward_groups": float((np.ptp(r[gv], axis=1) == 0).mean()),   # no GRPO signal
                # of which: every response passes / none passes (the policy cannot find the answer)
                "solved_groups": float(passed[gv].all(1).mean()),
                "failed_groups": float((~passed[gv].any(1)).mean()),
                "response_length": float(g["lengths"][v].mean()),
                "truncated_fraction": float((g["lengths"][v] >= max_new_tokens).mean()),
                "advantage_abs_mean": float(np.abs(g["adv"][v]).mean())})
    if demo:   # demonstrated responses put in this step's rounds, how many passed their own reward, and
        # the failed groups that got none (no label, or a label longer than rl.max_new_tokens)
        row.update({"demo/inserted": int(counts[4]), "demo/passed": int(counts[5]), "demo/unplaced": int(counts[6])})
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
