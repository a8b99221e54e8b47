"""Host rows -> global arrays on the mesh: device inputs (images of every process joined),
the row chunks of sampler / scoring calls, how many rows of a group share their prompt in
a call, the model batch of rollout rows, and the update's minibatch / micro-batch rows."""

from __future__ import annotations

import jax
import numpy as np

from guilibra_jax.models.vision import device_vision_inputs, prepare_vision_inputs
from guilibra_jax.train import multihost as MH
from guilibra_jax.train.batching import put_batch
from guilibra_jax.train.rl import rollout as RO
from guilibra_jax.train.rl.setup import Stage2, shares_prompts


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


def update_calls(rows: int, minibatches: int, accum: int, m: int = 0) -> tuple[np.ndarray, list[np.ndarray]]:
    """(rows of minibatch m, their ``accum`` micro-batches) of a process's ``rows`` rollout rows:
    minibatch m takes the rows r with r % minibatches == m (each holds responses of every
    group: the same global minibatches whatever the process count), cut into equal runs."""
    idx = np.arange(m, rows, minibatches)
    micro = rows // minibatches // accum
    return idx, [idx[k * micro:(k + 1) * micro] for k in range(accum)]
