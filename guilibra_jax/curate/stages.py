"""The curation stages over blocks of records, and their keep / remove decisions.

A stage runs over a fixed, ordered list of record ids in blocks of ``rows x
process_count`` records (process p takes rows p*rows .. of each block). A block whose
ids all have a line in the stage's log is skipped; any other block is run again whole,
with a random seed derived from the stage and the block index only, so a resumed run
samples exactly what an uninterrupted one would (same blocks, same seeds, same shapes).
The rows of every process are gathered and process 0 appends them to the log.

Logged rows hold measurements (match counts, the box, the reasoning); the decisions
(:func:`decide`) are made from them with the current thresholds.
"""

from __future__ import annotations

import collections
import dataclasses
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

import jax
import numpy as np

from guilibra_jax import rewards as R
from guilibra_jax.curate import prompts as CP
from guilibra_jax.curate.samplers import Reply, Sampler, SamplingParams
from guilibra_jax.curate.stage_log import StageLog
from guilibra_jax.data import bad_records as B
from guilibra_jax.data import mixing as M
from guilibra_jax.data.native import StepRecord
from guilibra_jax.data.readers import StepSource
from guilibra_jax.train import multihost as MH

STAGES = ("consistency", "box", "reasoning", "rebalance")
BIG_FIELDS = ("responses", "reasoning")


# ----------------------------------------------------------------------------- matching

def label_match(text: str, record: StepRecord, method: str, frame: CP.Frame, *, value_rule: str = "paper",
                point_tolerance: float = 0.05) -> bool:
    """Whether a response matches the record's label under the verifier's rules:
    GUI-Libra accuracy == 1 (``rewards.guilibra_reward``), UI-MOPD reward == 1
    (``rewards.mopd_reward``; the label's tool call is needed)."""
    target = record.reward_target()
    if method == "mopd":
        return target.tool_call is not None and R.mopd_reward(text, target) >= 1.0
    r = R.guilibra_reward(text, target, coord_space=frame.coord_space, resized_size=frame.resized,
                          value_rule=value_rule, point_tolerance=point_tolerance)
    return r.accuracy >= 1.0


def _parsed_action(text: str, method: str) -> bool:
    from guilibra_jax import actions as A
    return (A.parse_tool_call_response(text).call if method == "mopd" else A.parse_response(text).action) is not None


# ----------------------------------------------------------------------------- blocks

@dataclasses.dataclass
class Runner:
    """What every stage shares: the records, rows per block and process, the run seed,
    and the per-stage counters (seconds, prompts, responses) for the report."""

    source: StepSource
    rows: int = 8
    seed: int = 0
    read_threads: int = 4
    timing: dict = dataclasses.field(default_factory=dict)

    def read(self, ids: Sequence[int]) -> list[StepRecord | B.Dropped]:
        if len(ids) <= 1 or self.read_threads <= 1:
            return [self.source[i] for i in ids]
        with ThreadPoolExecutor(max_workers=min(self.read_threads, len(ids))) as pool:
            return list(pool.map(self.source.__getitem__, ids))

    def block_seed(self, stage: str, block: int) -> int:
        return zlib.crc32(f"{self.seed}/{stage}/{block}".encode())

    def count(self, stage: str, **kw: float) -> None:
        t = self.timing.setdefault(stage, collections.Counter())
        t.update(kw)


Work = Callable[[list[int], list, int], list[dict]]


def run_blocks(stage: str, ids: Sequence[int], log: StageLog, runner: Runner, rows: int, work: Work,
               *, collective: bool) -> None:
    """Run ``work(local ids, their records, block seed) -> rows`` over the blocks of
    ``ids`` not yet in ``log`` (module doc); ``collective``: the sampler needs every
    process in every call, so a process without records in a block still takes part."""
    procs, me = jax.process_count(), jax.process_index()
    size = rows * procs
    for b in range(0, -(-len(ids) // size)):
        block = list(ids[b * size:(b + 1) * size])
        if all(i in log for i in block):
            continue
        t0 = time.perf_counter()
        local = block[me * rows:(me + 1) * rows]
        out = work(local, runner.read(local), runner.block_seed(stage, b)) if (local or collective) else []
        if procs > 1:
            out = [row for part in MH.gather_json(out) for row in part]
        log.append(out, write=me == 0)
        runner.count(stage, seconds=time.perf_counter() - t0, blocks=1)


def call_sampler(sampler: Sampler, prompts: list[CP.Prompt], params: SamplingParams, seed: int, runner: Runner,
                 stage: str) -> list[list[Reply]]:
    """The sampler's replies (a collective sampler is called on every process when any has prompts)."""
    if sampler.collective and jax.process_count() > 1:
        if not MH.agree_max(int(bool(prompts))):
            return []
    elif not prompts:
        return []
    replies = sampler.sample(prompts, params, seed)
    runner.count(stage, prompts=len(prompts), responses=sum(r.text is not None for rs in replies for r in rs))
    return replies


def _dropped_row(i: int, d: B.Dropped) -> dict:
    return {"id": i, "where": d.where, "reason": d.reason, "message": d.message[:200]}


PROMPT_ERRORS = ("unreadable_image", "too_long")


def _errors(replies: Sequence[Reply]) -> dict[str, int]:
    return dict(collections.Counter(r.error for r in replies if r.text is None))


def _failure(replies: Sequence[Reply]) -> str:
    """The reason a prompt got no response: its own (unreadable image, too long) or no_response."""
    errors = _errors(replies)
    return next(iter(errors)) if len(errors) == 1 and next(iter(errors)) in PROMPT_ERRORS else "no_response"


# ----------------------------------------------------------------------------- 1. consistency

def consistency_work(sampler: Sampler, params: SamplingParams, runner: Runner, reward: dict) -> Work:
    """K responses to the training prompt of each record; matches against its label."""

    def work(ids, records, seed):
        rows, prompts, slots = [], [], []
        for i, r in zip(ids, records):
            if isinstance(r, B.Dropped):
                rows.append(_dropped_row(i, r))
                continue
            prompts.append(CP.action_prompt(r, sampler.spec, sampler.frame(r)))
            slots.append(len(rows))
            rows.append({"id": i, "where": runner.source.where(i)})
        replies = call_sampler(sampler, prompts, params, seed, runner, "consistency")
        for slot, p, reps in zip(slots, prompts, replies):
            texts = [x.text for x in reps if x.text is not None]
            m = sum(label_match(t, p.record, sampler.spec.method, p.frame, **reward) for t in texts)
            rows[slot].update(reason="sampled" if texts else _failure(reps), samples=len(texts), matches=m,
                              freq=m / len(texts) if texts else None, errors=_errors(reps),
                              responses=[t[:1000] for t in texts[:2]])
        return rows

    return work


# ----------------------------------------------------------------------------- 2. box

def box_work(sampler: Sampler, params: SamplingParams, runner: Runner, template: str, fallback: str) -> Work:
    """The model's box for each record's action target; whether the label's point is inside."""

    def work(ids, records, seed):
        rows, prompts, slots = [], [], []
        for i, r in zip(ids, records):
            if isinstance(r, B.Dropped):
                rows.append(_dropped_row(i, r))
                continue
            row = {"id": i, "where": runner.source.where(i)}
            target = CP.box_target_text(r, fallback)
            if r.target.point is None:
                row["reason"] = "no_point"
            elif target is None:
                row["reason"] = "no_target"
            else:
                row["target"] = target
                prompts.append(CP.box_prompt(r, target, sampler.frame(r), template))
                slots.append(len(rows))
            rows.append(row)
        replies = call_sampler(sampler, prompts, params, seed, runner, "box")
        for slot, p, reps in zip(slots, prompts, replies):
            texts = [x.text for x in reps if x.text is not None]
            box = next((b for b in (CP.parse_box(t, p.frame) for t in texts) if b is not None), None)
            reason = "boxed" if box is not None else ("no_box" if texts else _failure(reps))
            inside = box is not None and R.point_in_box(p.record.target.point, box)
            rows[slot].update(reason=reason, box=None if box is None else [round(v, 6) for v in box],
                              inside=bool(inside), responses=[t[:300] for t in texts[:1]], errors=_errors(reps))
        return rows

    return work


# ----------------------------------------------------------------------------- 3. reasoning

def classify_reasoning(text: str | None, error: str | None, record: StepRecord, method: str, frame: CP.Frame,
                       reward: dict) -> tuple[str, str | None]:
    """(verdict, reasoning) of one augmentation response: ``accepted`` (a think block and
    an action the verifier credits for the label), ``contradicts_label``,
    ``no_reasoning`` (right action, empty think block), ``unparsed`` (no action), or
    ``failed:<reason>`` (no response)."""
    if text is None:
        return f"failed:{error or 'unknown'}", None
    if not _parsed_action(text, method):
        return "unparsed", None
    if not label_match(text, record, method, frame, **reward):
        return "contradicts_label", None
    reasoning = CP.response_reasoning(text, method)
    return ("accepted", reasoning) if reasoning else ("no_reasoning", None)


def reasoning_work(sampler: Sampler, params: SamplingParams, runner: Runner, reward: dict,
                   only_missing: bool) -> Work:
    """Up to n responses per record without reasoning; the first accepted one is kept."""

    def work(ids, records, seed):
        rows, prompts, slots = [], [], []
        method = sampler.spec.method
        for i, r in zip(ids, records):
            if isinstance(r, B.Dropped):
                rows.append(_dropped_row(i, r))
                continue
            row = {"id": i, "where": runner.source.where(i)}
            if only_missing and r.reasoning is not None:
                row["reason"] = "has_reasoning"
            else:
                try:
                    prompts.append(CP.reasoning_prompt(r, method, sampler.frame(r)))
                    slots.append(len(rows))
                except ValueError as e:
                    row.update(reason="invalid_label", message=str(e)[:200])
            rows.append(row)
        replies = call_sampler(sampler, prompts, params, seed, runner, "reasoning")
        for slot, p, reps in zip(slots, prompts, replies):
            verdicts, chosen = collections.Counter(), None
            for rep in reps:
                verdict, reasoning = classify_reasoning(rep.text, rep.error, p.record, method, p.frame, reward)
                verdicts[verdict] += 1
                if verdict == "accepted" and chosen is None:
                    chosen = reasoning
            failed_all = all(rep.text is None for rep in reps)
            rows[slot].update(reason="written" if chosen else (_failure(reps) if failed_all else "rejected"),
                              verdicts=dict(verdicts), reasoning=chosen)
        return rows

    return work


# ----------------------------------------------------------------------------- decisions

def decide(stage: str, row: dict, cfg: Any) -> tuple[bool, str]:
    """(keep, reason) of a logged row under ``cfg`` (the curation config)."""
    reason = row["reason"]
    if stage == "consistency":
        if reason == "sampled":
            ok = row["freq"] >= cfg.consistency.threshold - 1e-12
            return ok, "consistent" if ok else "low_consistency"
        return False, reason
    if stage == "box":
        if reason == "boxed":
            return (True, "point_inside_box") if row["inside"] else (False, "point_outside_box")
        if reason in ("no_point", "no_target"):
            return True, reason
        if reason in ("no_box", "no_response"):
            return cfg.box.on_unparsed == "keep", reason
        return False, reason
    return True, reason       # reasoning never removes a step


def kept_ids(stage: str, ids: Sequence[int], log: StageLog, cfg: Any) -> list[int]:
    return [i for i in ids if decide(stage, log.get(i), cfg)[0]]


# ----------------------------------------------------------------------------- 4. rebalance

def parse_mapping(spec: str, key: str, cast_key=str) -> dict:
    """``"0:0.5,1:0.75"`` -> {0: 0.5, 1: 0.75} (``cast_key`` applied to keys)."""
    from guilibra_jax.errors import ConfigError
    out = {}
    for part in filter(None, (p.strip() for p in str(spec or "").split(","))):
        k, sep, v = part.rpartition(":")
        try:
            if not sep:
                raise ValueError
            out[cast_key(k.strip())] = float(v)
        except ValueError:
            raise ConfigError(f"config key {key} = {spec!r} is invalid: expected 'key:value,key:value' "
                              f"(e.g. '0:0.5,1:0.75'), could not read {part!r}") from None
    return out


def rebalance(source: StepSource, ids: Sequence[int], cfg: Any) -> tuple[list[int], dict]:
    """GUI-Libra's RL subset of ``ids``: ``data.mixing.rebalance`` (keep probability per
    step, largest share per domain), then a uniform draw down to ``target_size`` (0: no
    cap). Returns (kept ids, distributions before / after rebalancing / final)."""
    rb = cfg.rebalance
    metas = [source.meta(i) for i in ids]
    step_keep = parse_mapping(rb.step_keep, "rebalance.step_keep", int)
    max_share = parse_mapping(rb.max_share, "rebalance.max_share")
    pos, dist = M.rebalance(metas, step_keep=step_keep, max_share=max_share, domain_key=rb.domain_key,
                            seed=cfg.seed)
    final = pos
    if rb.target_size and len(pos) > rb.target_size:
        rng = np.random.default_rng(cfg.seed + 1)
        final = np.sort(rng.choice(pos, size=int(rb.target_size), replace=False))
    report = {"before": dist["before"], "after_rebalance": dist["after"],
              "final": M.distribution(metas, final), "target_size": int(rb.target_size),
              "step_keep": {str(k): v for k, v in step_keep.items()}, "max_share": max_share,
              "domain_key": rb.domain_key}
    return [int(ids[k]) for k in final], report
