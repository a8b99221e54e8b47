"""Batches: samples -> dicts of numpy arrays with a fixed shape per length bucket.

SFT batch (``collate_sft``), B rows of T tokens (T from ``seq_buckets``):
    input_ids      [B, T] int32   tokens, right-padded with the pad id
    targets        [B, T] int32   next token: logits[:, t] predicts targets[:, t]
    loss_segments  [B, T] int32   segment of targets[:, t]: 0 none, 1 reasoning,
                                  2 action, 3 grounding
    segment_ids    [B, T] int32   attention segments: 0 padding, k = k-th sample of the row
    positions      [3, B, T] int32  M-RoPE positions, restarting per packed sample
    pixel_values   [P, D] float32 patches of all images in row order, zero-padded to a
                                  multiple of ``patch_bucket`` (P) rows
    image_grid_thw [n, 3] int64   (t, h, w) per image, row order (n varies; host metadata)
    vision         dict           prepare_vision_inputs(image_grid_thw, config, P, ...): one
                                  tower slot per frame (a multiple of B slots), slots as long
                                  as the largest image needs, bucketed (vision.bucket_slot_len)
    num_samples    int            real samples in the batch
    platform, where  lists        per sample, row order
    dropped        list[Dropped]  records of this batch that yielded no sample

RL batch (``collate_rl``): prompts only, left-padded for generation:
    prompt_ids [B, Tp], prompt_mask [B, Tp], positions [3, B, Tp], rope_deltas [B],
    pixel_values, image_grid_thw, vision, row_valid [B] bool, and side lists
    reward_targets (rewards.Target), platform, resized_size, where, dropped.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from guilibra_jax.data import bad_records as B
from guilibra_jax.data.samples import Sample

DEFAULT_SEQ_BUCKETS = (256, 512, 1024, 2048, 4096, 8192, 16384)


def bucket(n: int, buckets: Sequence[int]) -> int:
    """Smallest bucket >= n."""
    for b in sorted(buckets):
        if b >= n:
            return int(b)
    raise ValueError(f"sequence of {n} tokens exceeds the largest bucket {max(buckets)}; raise "
                     f"data.seq_buckets (DataConfig.seq_buckets) or lower data.max_length")


def round_up(n: int, multiple: int) -> int:
    return max(multiple, -(-n // multiple) * multiple)


def _models():
    from guilibra_jax import models
    return models.get_rope_index, models.prepare_vision_inputs


@dataclasses.dataclass(frozen=True)
class CollateConfig:
    batch_rows: int
    pad_id: int
    seq_buckets: tuple[int, ...] = DEFAULT_SEQ_BUCKETS
    patch_bucket: int = 2048
    pack: bool = False
    pack_length: int | None = None   # row capacity when packing (default: largest bucket)


def _split(items: Sequence[Any]) -> tuple[list[Sample], list[B.Dropped]]:
    samples = [x for x in items if isinstance(x, Sample)]
    dropped = [x for x in items if isinstance(x, B.Dropped)]
    return samples, dropped


def _pack_rows(samples: list[Sample], rows: int, capacity: int) -> list[list[int]]:
    """First-fit-decreasing assignment of samples to rows of ``capacity`` tokens; the
    row count grows in multiples of ``rows`` when they do not fit. Rows keep the
    samples' arrival order inside."""
    order = sorted(range(len(samples)), key=lambda i: -len(samples[i].input_ids))
    bins: list[list[int]] = [[] for _ in range(rows)]
    free = [capacity] * rows
    for i in order:
        n = len(samples[i].input_ids)
        if n > capacity:
            raise ValueError(f"sample {samples[i].where} has {n} tokens > pack_length {capacity}")
        j = next((j for j in range(len(bins)) if free[j] >= n), None)
        if j is None:
            bins.extend([] for _ in range(rows))
            free.extend([capacity] * rows)
            j = len(bins) - rows
        bins[j].append(i)
        free[j] -= n
    return [sorted(b) for b in bins]


def _vision(samples_in_order: list[Sample], model_config: Any, patch_bucket: int, patch_dim: int, rows: int
            ) -> dict[str, Any]:
    """Pixels and vision layout of the samples' images: P rows rounded up to a multiple of
    ``patch_bucket``, one tower slot per frame (at least ``rows``, a multiple of it), each slot
    as long as the largest frame needs: a power of two times the slot unit below
    ``patch_bucket``, a multiple of it above (:func:`vision.bucket_slot_len`)."""
    _, prepare_vision_inputs = _models()
    pix = [s.pixel_values for s in samples_in_order]
    grids = np.stack([s.grid_thw for s in samples_in_order]) if samples_in_order else np.zeros((0, 3), np.int64)
    real = sum(len(p) for p in pix)
    P = round_up(real, patch_bucket)
    pixel_values = np.zeros((P, patch_dim), np.float32)
    if pix:
        pixel_values[:real] = np.concatenate(pix)
    # A batch whose records were all dropped has no images: every slot is empty.
    frames = int(grids[:, 0].sum()) if len(grids) else 0
    vision = prepare_vision_inputs(grids, model_config, num_patches=P, num_slots=round_up(frames, max(rows, 1)),
                                   slot_bucket=patch_bucket)
    return {"pixel_values": pixel_values, "image_grid_thw": grids.astype(np.int64), "vision": vision}


def collate_sft(items: Sequence[Sample | B.Dropped], cfg: CollateConfig, model_config: Any) -> dict[str, Any]:
    """An SFT batch (see module doc) from samples and dropped markers."""
    get_rope_index, _ = _models()
    samples, dropped = _split(items)
    if cfg.pack:
        cap = cfg.pack_length or max(cfg.seq_buckets)
        rows = _pack_rows(samples, cfg.batch_rows, cap)
    else:
        rows = [[i] for i in range(len(samples))] + [[] for _ in range(cfg.batch_rows - len(samples))]
    n_rows = len(rows)
    longest = max([sum(len(samples[i].input_ids) for i in r) for r in rows] + [1])
    T = bucket(longest, cfg.seq_buckets)
    input_ids = np.full((n_rows, T), cfg.pad_id, np.int32)
    segs = np.zeros((n_rows, T), np.int32)
    seg_ids = np.zeros((n_rows, T), np.int32)
    positions = np.zeros((3, n_rows, T), np.int32)
    ordered: list[Sample] = []
    for r, members in enumerate(rows):
        off = 0
        for k, i in enumerate(members, 1):
            s = samples[i]
            n = len(s.input_ids)
            input_ids[r, off:off + n] = s.input_ids
            segs[r, off:off + n] = s.segments
            seg_ids[r, off:off + n] = k
            pos, _ = get_rope_index(s.input_ids[None], None, s.grid_thw[None], model_config)
            positions[:, r, off:off + n] = pos[:, 0]
            ordered.append(s)
            off += n
    targets = np.full_like(input_ids, cfg.pad_id)
    targets[:, :-1] = input_ids[:, 1:]
    loss_segments = np.zeros_like(segs)
    loss_segments[:, :-1] = segs[:, 1:]
    # never predict across a packed-sample boundary or into padding
    same = np.zeros_like(seg_ids, bool)
    same[:, :-1] = (seg_ids[:, :-1] == seg_ids[:, 1:]) & (seg_ids[:, :-1] > 0)
    loss_segments = np.where(same, loss_segments, 0)
    patch_dim = ordered[0].pixel_values.shape[1] if ordered else _patch_dim(model_config)
    out = {"input_ids": input_ids, "targets": targets, "loss_segments": loss_segments, "segment_ids": seg_ids,
           "positions": positions, "num_samples": len(samples),
           "platform": [s.platform for s in ordered], "where": [s.where for s in ordered], "dropped": dropped}
    out.update(_vision(ordered, model_config, cfg.patch_bucket, patch_dim, cfg.batch_rows))
    return out


def _patch_dim(model_config: Any) -> int:
    v = model_config.vision
    return v.in_channels * v.temporal_patch_size * v.patch_size * v.patch_size


def collate_rl(items: Sequence[Sample | B.Dropped], cfg: CollateConfig, model_config: Any) -> dict[str, Any]:
    """An RL batch of left-padded prompts (see module doc); empty rows where records dropped."""
    get_rope_index, _ = _models()
    samples, dropped = _split(items)
    n_rows = max(cfg.batch_rows, len(samples))
    Tp = bucket(max([s.prompt_len for s in samples] + [1]), cfg.seq_buckets)
    ids = np.full((n_rows, Tp), cfg.pad_id, np.int32)
    mask = np.zeros((n_rows, Tp), np.int32)
    for r, s in enumerate(samples):
        ids[r, Tp - s.prompt_len:] = s.input_ids[:s.prompt_len]
        mask[r, Tp - s.prompt_len:] = 1
    grids = np.stack([s.grid_thw for s in samples]) if samples else np.zeros((0, 3), np.int64)
    positions, deltas = get_rope_index(ids, mask, grids, model_config)
    row_valid = np.zeros((n_rows,), bool)
    row_valid[:len(samples)] = True
    patch_dim = samples[0].pixel_values.shape[1] if samples else _patch_dim(model_config)
    out = {"prompt_ids": ids, "prompt_mask": mask, "positions": positions, "rope_deltas": deltas,
           "row_valid": row_valid, "num_samples": len(samples),
           "reward_targets": [s.reward_target for s in samples], "platform": [s.platform for s in samples],
           "resized_size": [s.resized_size for s in samples], "where": [s.where for s in samples],
           "label_ids": [np.asarray(s.input_ids[s.prompt_len:], np.int32) for s in samples],
           "dropped": dropped}
    out.update(_vision(samples, model_config, cfg.patch_bucket, patch_dim, n_rows))
    return out
