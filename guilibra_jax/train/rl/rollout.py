"""Rollouts on the host: G copies of each prompt, prompt + response sequences for
scoring and updates, rewards and group statistics. numpy only; the device work
(sampling, scoring, updates) is in :mod:`rl.phases`.

Rows. An RL batch (``collate.collate_rl``) of B prompt rows becomes B*G rollout rows,
group-major: row ``b * G + k`` is response k of prompt b. A prompt row whose record was
dropped (``row_valid`` False) is replaced by a valid prompt so that sampling never sees
an empty prompt, and its whole group is marked invalid (no loss, no metrics).

Sequences. Row r is ``[left-padded prompt | response | padding]`` of ``Tp + N`` slots with
``segment_ids`` 1 on real tokens and 0 on padding; response token i sits at M-RoPE
position ``n_real + rope_deltas + i`` on all axes (``generate.decode_positions``), exactly
where the sampler put it. ``response_mask[:, t]`` marks the positions whose next token
is a response token (the alignment of ``generate.token_logprobs``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from guilibra_jax import rewards as R
from guilibra_jax.data.collate import round_up
from guilibra_jax.models import prepare_vision_inputs


def vision_token_ids(model_config: Any) -> tuple[int, ...]:
    """The vision placeholder ids a policy must never sample (``SamplingConfig.banned_token_ids``)."""
    ids = (model_config.image_token_id, model_config.video_token_id, model_config.vision_start_token_id,
           model_config.vision_end_token_id)
    return tuple(sorted({int(i) for i in ids if i is not None}))


def _per_row_pixels(batch: dict) -> list[np.ndarray | None]:
    """Pixel rows of each prompt row (one image per sample, samples first, in order)."""
    grids = np.asarray(batch.get("image_grid_thw", np.zeros((0, 3))), np.int64).reshape(-1, 3)
    sizes = np.prod(grids, axis=1) if len(grids) else np.zeros((0,), np.int64)
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    pix = batch.get("pixel_values")
    out: list[np.ndarray | None] = [None] * batch["prompt_ids"].shape[0]
    for i in range(len(grids)):
        out[i] = np.asarray(pix[bounds[i]:bounds[i + 1]])
    return out


@dataclasses.dataclass
class Rollout:
    """B*G rollout rows on the host. Response fields are set by :meth:`set_responses`."""

    group_size: int
    prompt_ids: np.ndarray        # [R, Tp] left-padded
    prompt_mask: np.ndarray       # [R, Tp]
    positions: np.ndarray         # [3, R, Tp]
    rope_deltas: np.ndarray       # [R]
    grids: list                   # [R] of [3] int64 or None
    pixels: list                  # [R] of [n, D] float32 or None
    valid: np.ndarray             # [R] bool
    targets: list                 # [R] rewards.Target or None
    platform: list                # [R] str
    resized_size: list            # [R] (w, h)
    tokens: np.ndarray | None = None    # [R, N]
    lengths: np.ndarray | None = None   # [R]
    sample_logp: np.ndarray | None = None  # [R, N] the sampler's log-probs of the tokens
    texts: list | None = None           # [R] decoded responses
    label_ids: list | None = None       # [R] the record's demonstrated response ids (int32) or None

    @property
    def rows(self) -> int:
        return self.prompt_ids.shape[0]

    @property
    def groups(self) -> int:
        return self.rows // self.group_size


def expand_groups(batch: dict, group_size: int) -> Rollout:
    """G copies of every prompt row of an RL batch (see module doc); raises if the batch
    holds no valid prompt."""
    valid_rows = np.nonzero(np.asarray(batch["row_valid"], bool))[0]
    if len(valid_rows) == 0:
        raise ValueError("RL batch holds no valid prompt (every record was dropped)")
    n = batch["prompt_ids"].shape[0]
    src = np.array([r if batch["row_valid"][r] else valid_rows[0] for r in range(n)])
    rows = np.repeat(src, group_size)
    valid = np.repeat(np.asarray(batch["row_valid"], bool), group_size)
    pix = _per_row_pixels(batch)
    grids = np.asarray(batch.get("image_grid_thw", np.zeros((0, 3))), np.int64).reshape(-1, 3)
    side = lambda key: [batch[key][r] if r < len(batch[key]) else None for r in rows]
    return Rollout(
        group_size=group_size, prompt_ids=batch["prompt_ids"][rows], prompt_mask=batch["prompt_mask"][rows],
        positions=batch["positions"][:, rows], rope_deltas=np.asarray(batch["rope_deltas"])[rows],
        grids=[grids[r] if r < len(grids) else None for r in rows], pixels=[pix[r] for r in rows],
        valid=valid, targets=side("reward_targets"), platform=side("platform"),
        resized_size=side("resized_size"), label_ids=side("label_ids") if "label_ids" in batch else None)


def pad_prompts(ro: Rollout, width: int) -> Rollout:
    """``ro`` with its left-padded prompts widened to ``width`` slots (more left padding:
    mask 0, position 0), e.g. to the width every process agrees on."""
    extra = width - ro.prompt_ids.shape[1]
    if extra < 0:
        raise ValueError(f"cannot narrow prompts of {ro.prompt_ids.shape[1]} slots to {width}")
    if extra == 0:
        return ro
    pad2 = lambda x: np.pad(x, ((0, 0), (extra, 0)))
    return dataclasses.replace(ro, prompt_ids=pad2(ro.prompt_ids), prompt_mask=pad2(ro.prompt_mask),
                               positions=np.pad(ro.positions, ((0, 0), (0, 0), (extra, 0))))


def take_rows(ro: Rollout, rows, valid: np.ndarray | None = None) -> Rollout:
    """The rollout restricted to ``rows`` (whole groups, in order); ``valid`` replaces
    their valid flags when given."""
    rows = np.asarray(rows, np.int64)
    pick = lambda x: None if x is None else x[rows]
    return dataclasses.replace(
        ro, prompt_ids=ro.prompt_ids[rows], prompt_mask=ro.prompt_mask[rows], positions=ro.positions[:, rows],
        rope_deltas=ro.rope_deltas[rows], grids=[ro.grids[r] for r in rows], pixels=[ro.pixels[r] for r in rows],
        valid=ro.valid[rows] if valid is None else np.asarray(valid, bool), targets=[ro.targets[r] for r in rows],
        platform=[ro.platform[r] for r in rows], resized_size=[ro.resized_size[r] for r in rows],
        tokens=pick(ro.tokens), lengths=pick(ro.lengths), sample_logp=pick(ro.sample_logp),
        texts=None if ro.texts is None else [ro.texts[r] for r in rows],
        label_ids=None if ro.label_ids is None else [ro.label_ids[r] for r in rows])


def concat(parts: Sequence[Rollout]) -> Rollout:
    """One rollout of several (same group size and response slots), prompts widened to the widest."""
    width = max(p.prompt_ids.shape[1] for p in parts)
    parts = [pad_prompts(p, width) for p in parts]
    cat = lambda name: np.concatenate([getattr(p, name) for p in parts])
    opt = lambda name: None if getattr(parts[0], name) is None else cat(name)
    lists = lambda name: [x for p in parts for x in getattr(p, name)]
    return Rollout(group_size=parts[0].group_size, prompt_ids=cat("prompt_ids"), prompt_mask=cat("prompt_mask"),
                   positions=np.concatenate([p.positions for p in parts], axis=1), rope_deltas=cat("rope_deltas"),
                   grids=lists("grids"), pixels=lists("pixels"), valid=cat("valid"), targets=lists("targets"),
                   platform=lists("platform"), resized_size=lists("resized_size"), tokens=opt("tokens"),
                   lengths=opt("lengths"), sample_logp=opt("sample_logp"),
                   texts=None if parts[0].texts is None else lists("texts"),
                   label_ids=None if any(p.label_ids is None for p in parts) else lists("label_ids"))


def vision_arrays(grids: Sequence, pixels: Sequence, model_config: Any, patch_bucket: int, patch_dim: int
                  ) -> tuple[np.ndarray | None, dict | None]:
    """(pixel_values [P, D], host vision dict) of the rows' images in row order, P a
    multiple of ``patch_bucket``, one tower slot per row (or frame); (None, None) without images."""
    used = [(g, p) for g, p in zip(grids, pixels) if g is not None]
    if not used:
        return None, None
    real = sum(len(p) for _, p in used)
    P = round_up(real, patch_bucket)
    pv = np.zeros((P, patch_dim), np.float32)
    pv[:real] = np.concatenate([p for _, p in used])
    g = np.asarray([g for g, _ in used]).reshape(-1, 3)
    return pv, prepare_vision_inputs(g, model_config, num_patches=P, num_slots=max(len(grids), int(g[:, 0].sum())),
                                     slot_bucket=patch_bucket)


def prompt_copies(rows: int, group_size: int, row_multiple: int = 1) -> int:
    """Device copies per prompt of a sampler call over ``rows`` rollout rows (whole groups):
    the call passes rows / c prompt rows and ``generate(copies=c)`` repeats their prefill.
    c is the largest divisor of ``group_size`` that leaves the prompt rows a multiple of
    ``row_multiple`` (the rows every global batch of a process must be a multiple of, to
    split over the batch devices): G when the groups divide over the devices, 1 at worst
    (every row its own prompt, as ``rows`` themselves are such a multiple)."""
    if rows % group_size:
        raise ValueError(f"a sampler call over {rows} rows does not hold whole groups of {group_size}")
    return max(c for c in range(1, group_size + 1) if group_size % c == 0 and (rows // c) % row_multiple == 0)


def prompt_inputs(ro: Rollout, model_config: Any, patch_bucket: int) -> dict:
    """Host arrays :func:`generate.generate` takes for the rollout rows."""
    dim = next((p.shape[1] for p in ro.pixels if p is not None), 0)
    pv, vision = vision_arrays(ro.grids, ro.pixels, model_config, patch_bucket, dim)
    return {"prompt_ids": ro.prompt_ids, "prompt_mask": ro.prompt_mask, "positions": ro.positions,
            "rope_deltas": ro.rope_deltas, "pixel_values": pv, "vision": vision}


def response_buckets(max_new_tokens: int) -> tuple[int, ...]:
    """Response lengths sequences are trimmed to (few shapes, few compilations)."""
    return tuple(sorted({max(1, max_new_tokens // 4), max(1, max_new_tokens // 2), max_new_tokens}))


def sequence_batch(ro: Rollout, rows: Sequence[int], model_config: Any, patch_bucket: int, pad_id: int,
                   n_slots: int | None = None) -> dict:
    """Model inputs of prompt + response for ``rows`` (see module doc): input_ids,
    segment_ids [R', T], positions [3, R', T], response_mask [R', T], pixel_values,
    vision (host dict). The response part is trimmed to the smallest of
    :func:`response_buckets` that holds the longest response (or ``n_slots``)."""
    if ro.tokens is None:
        raise ValueError("rollout has no responses yet")
    rows = np.asarray(rows, np.int64)
    N = ro.tokens.shape[1]
    if n_slots is None:
        longest = int(ro.lengths.max()) if ro.rows else 1
        n_slots = next(b for b in response_buckets(N) if b >= longest)
    tok = ro.tokens[rows, :n_slots]
    on = (np.arange(n_slots)[None] < ro.lengths[rows, None]) & ro.valid[rows, None]
    Tp = ro.prompt_ids.shape[1]
    pmask = ro.prompt_mask[rows] > 0
    seg = np.concatenate([pmask, on], axis=1).astype(np.int32)
    ids = np.concatenate([ro.prompt_ids[rows], tok], axis=1).astype(np.int32)
    ids = np.where(seg > 0, ids, pad_id).astype(np.int32)
    first = pmask.sum(1) + ro.rope_deltas[rows]                          # [R']
    resp_pos = first[:, None] + np.arange(n_slots)[None]                  # [R', N']
    positions = np.concatenate([ro.positions[:, rows], np.broadcast_to(resp_pos, (3,) + resp_pos.shape)], axis=2)
    response_mask = np.zeros_like(seg)
    response_mask[:, Tp - 1:Tp - 1 + n_slots] = on
    dim = next((p.shape[1] for p in ro.pixels if p is not None), 0)
    pv, vision = vision_arrays([ro.grids[r] for r in rows], [ro.pixels[r] for r in rows], model_config,
                               patch_bucket, dim)
    return {"input_ids": ids, "segment_ids": seg, "positions": positions.astype(np.int32),
            "response_mask": response_mask.astype(np.int32), "pixel_values": pv, "vision": vision}


def run_copies(keys: np.ndarray, row_multiple: int = 1) -> int:
    """The largest c such that the n rows of ``keys`` ([n, ...]) split into consecutive runs
    of c equal rows and n / c is a multiple of ``row_multiple``; 1 at worst."""
    keys = np.asarray(keys).reshape(len(keys), -1)
    n = len(keys)
    for c in range(n, 1, -1):
        if n % c == 0 and (n // c) % row_multiple == 0:
            runs = keys.reshape(n // c, c, -1)
            if (runs == runs[:, :1]).all():
                return c
    return 1


def shared_copies(ro: Rollout, rows: Sequence[int], row_multiple: int = 1) -> int:
    """Rows per prompt of a scoring / update call over rollout rows ``rows`` in the shared
    layout (:func:`shared_batch`): the largest c such that ``rows`` split into consecutive
    runs of c rows with one prompt (rows of one group, their prompts equal) and the
    len(rows) / c prompts are a multiple of ``row_multiple`` (the rows every global batch of
    a process must be a multiple of). 1 at worst: every row its own prompt. Divisors of a
    valid c are valid too (processes agree on the gcd of theirs)."""
    rows = np.asarray(rows, np.int64)
    return run_copies(np.concatenate([(rows // ro.group_size)[:, None], ro.prompt_ids[rows]], axis=1), row_multiple)


def shared_batch(ro: Rollout, rows: Sequence[int], model_config: Any, patch_bucket: int, pad_id: int,
                 n_slots: int, copies: int) -> dict:
    """The rows' prompts and responses in the shared-prompt layout (each prompt once for its
    ``copies`` consecutive rows, :func:`shared_copies`): prompt_ids, prompt_segment_ids [P, Tp],
    prompt_positions [3, P, Tp], pixel_values / vision of the P prompts' images;
    response_ids, response_mask [R, N'] (1 on the response tokens to score; also the response
    stream's segment ids), response_positions [3, R, N'] (R = P x copies, N' = ``n_slots``).
    Response token j of row r is scored at column j (:func:`generate.shared_token_logprobs`):
    the same tokens, positions and attention as :func:`sequence_batch`'s row, whose column
    Tp - 1 + j scores it."""
    if ro.tokens is None:
        raise ValueError("rollout has no responses yet")
    rows = np.asarray(rows, np.int64)
    if len(rows) % copies:
        raise ValueError(f"{len(rows)} rows do not split into prompts of {copies} copies")
    first_rows = rows[::copies]
    tok = ro.tokens[rows, :n_slots]
    on = (np.arange(n_slots)[None] < ro.lengths[rows, None]) & ro.valid[rows, None]
    pmask = ro.prompt_mask[first_rows] > 0
    resp_pos = (pmask.sum(1) + ro.rope_deltas[first_rows]).repeat(copies)[:, None] + np.arange(n_slots)[None]
    dim = next((p.shape[1] for p in ro.pixels if p is not None), 0)
    pv, vision = vision_arrays([ro.grids[r] for r in first_rows], [ro.pixels[r] for r in first_rows], model_config,
                               patch_bucket, dim)
    return {"prompt_ids": np.where(pmask, ro.prompt_ids[first_rows], pad_id).astype(np.int32),
            "prompt_segment_ids": pmask.astype(np.int32),
            "prompt_positions": ro.positions[:, first_rows].astype(np.int32),
            "response_ids": np.where(on, tok, pad_id).astype(np.int32), "response_mask": on.astype(np.int32),
            "response_positions": np.broadcast_to(resp_pos, (3,) + resp_pos.shape).astype(np.int32),
            "pixel_values": pv, "vision": vision}


def to_response_columns(x: np.ndarray, prompt_slots: int, n_slots: int) -> np.ndarray:
    """[R, Tp + N'] in :func:`sequence_batch`'s alignment -> [R, N'] in :func:`shared_batch`'s."""
    return np.asarray(x)[:, prompt_slots - 1:prompt_slots - 1 + n_slots]


def sampler_log_probs(ro: Rollout, n_slots: int) -> np.ndarray:
    """The sampler's log-probs of the responses in :func:`sequence_batch`'s layout [R, Tp +
    n_slots] (column t scores token t + 1; 0 off the responses), so they can stand in for a
    rescoring by the same policy: equal up to float noise when the sampling distribution is
    the policy's (top_p 1, top_k 0; ``test_rescored_rollout_equals_the_samplers_log_probs``)."""
    if ro.sample_logp is None:
        raise ValueError("rollout has no sampler log-probs")
    Tp = ro.prompt_ids.shape[1]
    on = (np.arange(n_slots)[None] < ro.lengths[:, None]) & ro.valid[:, None]
    out = np.zeros((ro.rows, Tp + n_slots), np.float32)
    out[:, Tp - 1:Tp - 1 + n_slots] = np.where(on, ro.sample_logp[:, :n_slots], 0.0)
    return out


# ----------------------------------------------------------------------------- rewards
@dataclasses.dataclass
class Scored:
    """Per-row rewards [R] and per-row parts (dict of [R]); ``success`` [R] bool is the
    method's pass: GUI-Libra accuracy == 1, UI-MOPD reward == 1."""

    reward: np.ndarray
    success: np.ndarray
    parts: dict[str, np.ndarray]


def score_responses(texts: Sequence[str], ro: Rollout, method: str, *, coord_space: str = "resized_pixels",
                    w_fmt: float = 0.1, value_rule: str = "paper", point_tolerance: float = 0.05,
                    format_rule: str = "paper", think_tag: str = "think", think_opened: bool = False,
                    mopd_rule: str = "strict", check_tool_name: bool | None = None,
                    grounding_sigma: float = 0.0) -> Scored:
    """Rewards of decoded responses: ``rewards.guilibra_reward`` (method "grpo"; its
    value_rule, point_tolerance, format_rule with the family's think_tag, grounding_sigma) or
    ``rewards.mopd_reward`` ("mopd"; its rule = mopd_rule, check_tool_name). think_opened:
    the prompts opened the think block (Thinking chat templates). Invalid rows score 0
    and never succeed."""
    n = len(texts)
    reward = np.zeros(n, np.float32)
    success = np.zeros(n, bool)
    names = ("format", "action_type", "value", "grounding", "accuracy") if method == "grpo" else ()
    parts = {k: np.zeros(n, np.float32) for k in names}
    for i, text in enumerate(texts):
        target = ro.targets[i]
        if not ro.valid[i] or target is None:
            continue
        if method == "grpo":
            r = R.guilibra_reward(text, target, coord_space=coord_space, resized_size=ro.resized_size[i],
                                  w_fmt=w_fmt, value_rule=value_rule, point_tolerance=point_tolerance,
                                  format_rule=format_rule, think_tag=think_tag, think_opened=think_opened,
                                  grounding_sigma=grounding_sigma)
            reward[i], success[i] = r.total, r.accuracy >= 1.0
            for k in names:
                parts[k][i] = getattr(r, k)
        else:
            reward[i] = R.mopd_reward(text, target, rule=mopd_rule, check_tool_name=check_tool_name,
                                      think_opened=think_opened)
            success[i] = reward[i] >= 1.0
    return Scored(reward, success, parts)


def take_scored(scored: Scored, rows) -> Scored:
    rows = np.asarray(rows, np.int64)
    return Scored(scored.reward[rows], scored.success[rows], {k: v[rows] for k, v in scored.parts.items()})


def concat_scored(parts: Sequence[Scored]) -> Scored:
    return Scored(np.concatenate([p.reward for p in parts]), np.concatenate([p.success for p in parts]),
                  {k: np.concatenate([p.parts[k] for p in parts]) for k in parts[0].parts})


def group_view(x: np.ndarray, group_size: int) -> np.ndarray:
    """[R] -> [R / G, G]."""
    return np.asarray(x).reshape(-1, group_size)


def demo_response(label_ids, stop_token_ids: Sequence[int], slots: int) -> np.ndarray | None:
    """A record's demonstrated response as the sampler would have emitted it: its ids up to
    and including the first stop token; None when there is none, or it needs more than
    ``slots`` tokens (a sampled response could not have been it)."""
    if label_ids is None:
        return None
    ids = np.asarray(label_ids, np.int32)
    stops = np.nonzero(np.isin(ids, np.asarray(list(stop_token_ids), np.int32)))[0]
    if len(stops) == 0 or stops[0] + 1 > slots:
        return None
    return ids[:stops[0] + 1]


def insert_demos(ro: Rollout, passed: np.ndarray, stop_token_ids: Sequence[int], pad_id: int, decode
                 ) -> tuple[Rollout, np.ndarray, int]:
    """Off-policy guidance (``rl.demo_in_failed_groups``): in every valid group where no
    response passed, the last response becomes the record's demonstrated one (tokens,
    length, text; its sampler log-probs 0: they must be recomputed). ``decode``: ids -> text.
    Returns the new rollout, the rows replaced (bool [R]) and the failed groups left as they
    were (no label, or a label longer than the response slots: :func:`demo_response`)."""
    G_ = ro.group_size
    replaced = np.zeros(ro.rows, bool)
    ok = np.asarray(passed, bool) & ro.valid
    failed = [g for g in range(ro.groups) if ro.valid[g * G_] and not ok[g * G_:(g + 1) * G_].any()]
    if ro.label_ids is None:
        return ro, replaced, len(failed)
    tokens, lengths, logp, texts = ro.tokens.copy(), ro.lengths.copy(), ro.sample_logp.copy(), list(ro.texts)
    for g in failed:
        r = g * G_ + G_ - 1
        ids = demo_response(ro.label_ids[r], stop_token_ids, tokens.shape[1])
        if ids is None:
            continue
        tokens[r] = pad_id
        tokens[r, :len(ids)] = ids
        lengths[r], logp[r], texts[r], replaced[r] = len(ids), 0.0, decode(ids), True
    ro = dataclasses.replace(ro, tokens=tokens, lengths=lengths, sample_logp=logp, texts=texts)
    return ro, replaced, len(failed) - int(replaced.sum())
