"""Host batches -> arrays on the mesh, in one process or many.

Per-row arrays (``input_ids`` [B, T], ``positions`` [3, B, T] ...) are sharded over
(data, fsdp) along their row axis; with several processes each process passes only its
own rows (its data shard) and they are assembled into the global batch.

Image inputs (``pixel_values`` [P, D] and the ``vision`` dict of
``models.prepare_vision_inputs``) are replicated: the vision tower attends over a whole
image, so every device gets the whole patch sequence. In one process the host arrays
are placed as they are. With several processes each process holds different images, so
:func:`gather_images` first joins them into the global patch sequence of the global
batch, identical on every process:

- the model gives the k-th ``<|image_pad|>`` token of the batch (row-major) merged
  feature k, so the consumed patches of each process are concatenated in the order of
  the processes' rows in the global batch, and all padding goes last;
- every index of the vision dict is renumbered to the global patch sequence (window
  permutation, merge inverse) and the image and window segment ids are made unique;
- the global patch count is ``process_count * max(local P)`` on every process, so
  compiled shapes agree and change only when a local bucket does. Padding patches are
  zero with segment id 0 (they attend only to each other and no token takes them), as
  in ``prepare_vision_inputs``; the result equals ``prepare_vision_inputs`` of all
  images of the global batch.

Memory: every process receives all processes' patches, and every device holds the global
[M, process_count * max(P), D] pixel array (float32: Qwen2.5 D = 1176, 2048-patch bucket,
8 processes, M = 4 -> 308 MB per device, as many bytes again on each host), and the
vision tower sees the whole sequence, as in one process with its replicated patches.
The all-gather (jax.experimental.multihost_utils.process_allgather) briefly holds the
gathered arrays on every device as well.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from guilibra_jax import sharding as S

IMAGE_KEYS = ("pixel_values", "vision")
# Vision-dict entries by how a process's entries become global ones.
_PATCH_ROWS = ("pos_hw", "interp_indices", "interp_weights")   # per patch, values kept
_SEGMENT_IDS = ("segment_ids", "window_segment_ids")           # 1-based ids, 0 = padding
_PATCH_INDEX = ("window_perm",)                                # indices into the patches
_UNIT_INDEX = ("merge_inverse",)                               # indices into merged units


def stack_micro_batches(batches: list[dict]) -> dict:
    """[M] list of batches -> one batch with a leading M axis. Batches whose patch
    counts differ (collate rounds each to its own patch bucket) are first padded to the
    largest with inert padding patches; every other array must have equal shapes."""
    if len({np.shape(b["pixel_values"]) for b in batches if b.get("pixel_values") is not None}) > 1:
        n = max(len(b["pixel_values"]) for b in batches)
        batches = [{**b, **dict(zip(IMAGE_KEYS, pad_patches(b["pixel_values"], b["vision"], n)))} for b in batches]

    def stack(path, *xs):
        if len({np.shape(x) for x in xs}) > 1:
            raise ValueError(f"stack_micro_batches: {jax.tree_util.keystr(path)} has shapes "
                             f"{[np.shape(x) for x in xs]} across the micro-batches; they must be equal "
                             f"(use one sequence bucket, data.seq_buckets=(), with grad_accum > 1)")
        return np.stack(xs)
    return jax.tree_util.tree_map_with_path(stack, *batches)


def pad_patches(pixels: np.ndarray, vision: dict, num_patches: int) -> tuple[np.ndarray, dict]:
    """pixel_values [P, D] and its vision dict extended with padding patches to
    ``num_patches`` rows, as prepare_vision_inputs(grids, config, num_patches) makes them."""
    p = len(pixels)
    mu = p // len(vision["merge_inverse"]) if "merge_inverse" in vision else 1
    return join_patches([(np.asarray(pixels), {k: np.asarray(v) for k, v in vision.items()}, p)], num_patches, mu)


def put_batch(batch: dict, mesh, *, micro_axis: bool = True, model_config: Any = None) -> dict:
    """Place a host batch on the mesh: the per-sample dimension of every array is
    sharded over (data, fsdp); pixel arrays and vision metadata are replicated.

    Multi-process: each process passes its own rows; a batch with images also needs
    ``model_config`` (image token id and merge unit) to join the processes' images
    with :func:`gather_images` (see the module doc for the cost)."""
    if jax.process_count() > 1 and batch.get("pixel_values") is not None:
        if model_config is None:
            raise ValueError("put_batch: a multi-process batch with pixel_values needs model_config= to join "
                             "the processes' images")
        batch = {**batch, **gather_images(batch, mesh, model_config, micro_axis=micro_axis)}
    batch_dim = 1 if micro_axis else 0

    def place(path, x):
        x = np.asarray(x)
        name = str(getattr(path[0], "key", path[0]))
        if name in IMAGE_KEYS or x.ndim <= batch_dim:
            sh = S.replicated(mesh)
            spec_dim = None
        else:
            dim = batch_dim + (1 if name == "positions" else 0)
            sh = S.batch_sharding(mesh, x.ndim, dim)
            spec_dim = dim
        if jax.process_count() == 1:
            return jax.device_put(x, sh)
        if spec_dim is None:  # replicated: identical on every process
            return jax.make_array_from_process_local_data(sh, x, x.shape)
        global_shape = list(x.shape)
        global_shape[spec_dim] *= jax.process_count()
        return jax.make_array_from_process_local_data(sh, x, tuple(global_shape))

    return jax.tree_util.tree_map_with_path(place, batch)


def gather_images(batch: dict, mesh, model_config: Any, *, micro_axis: bool = True) -> dict:
    """{pixel_values, vision} of the global batch from every process's local ones
    (collective: all processes call it together). Host numpy arrays, identical on all
    processes, shaped like the local ones with P = process_count * max(local P)."""
    mu = model_config.vision.merge_unit
    ids = np.asarray(batch["input_ids"] if "input_ids" in batch else batch["prompt_ids"])
    pixels = np.asarray(batch["pixel_values"])
    vision = {k: np.asarray(v) for k, v in batch["vision"].items()}
    if not micro_axis:
        ids, pixels, vision = ids[None], pixels[None], {k: v[None] for k, v in vision.items()}
    m, p_local = pixels.shape[:2]
    consumed = (ids == model_config.image_token_id).reshape(m, -1).sum(1) * mu  # [M] patches used
    if (consumed > p_local).any():
        raise ValueError(f"process {jax.process_index()}: the batch has {consumed.max() // mu} image tokens "
                         f"but pixel_values holds only {p_local} patches ({p_local // mu} merged tokens)")
    # per process: B, T, P, its first row in the global batch, consumed patches per micro-batch
    meta = multihost_utils.process_allgather(
        np.array([*ids.shape[1:], p_local, first_global_row(mesh, ids.shape[1]), *consumed], np.int64))
    shapes, p_all, first_rows, consumed_all = meta[:, :2], meta[:, 2], meta[:, 3], meta[:, 4:]
    if (shapes != shapes[0]).any():
        raise ValueError(f"token arrays [B, T] differ across processes: {shapes.tolist()}; every process "
                         f"must collate the same shape (one sequence bucket: data.seq_buckets=())")
    p_max = int(p_all.max())
    if p_max % mu:
        raise ValueError(f"pixel_values rows ({p_max}) must be a multiple of the merge unit {mu}")
    local = {"pixel_values": _pad_rows(pixels, p_max),
             "vision": {k: _pad_rows(v, p_max // mu if k in _UNIT_INDEX else p_max) for k, v in vision.items()}}
    every = multihost_utils.process_allgather(local)    # leaves [n_proc, M, ...]
    order = np.argsort(first_rows, kind="stable")       # processes in global row order
    micro = []
    for j in range(m):
        parts = [(every["pixel_values"][i, j], {k: v[i, j] for k, v in every["vision"].items()},
                  int(consumed_all[i, j])) for i in order]
        micro.append(join_patches(parts, len(meta) * p_max, mu))
    pixels_g = np.stack([x[0] for x in micro])
    vision_g = {k: np.stack([x[1][k] for x in micro]) for k in vision}
    if not micro_axis:
        pixels_g, vision_g = pixels_g[0], {k: v[0] for k, v in vision_g.items()}
    return {"pixel_values": pixels_g, "vision": vision_g}


def join_patches(parts: list[tuple[np.ndarray, dict, int]], num_patches: int, merge_unit: int
                 ) -> tuple[np.ndarray, dict]:
    """One patch sequence from several: ``parts`` is, in global row order, (pixel_values
    [P_i, D], vision dict of prepare_vision_inputs, consumed patches R_i) where the first
    R_i patches are the images whose tokens are in that part's rows (the rest is padding,
    or collate's dummy image of a batch without samples). Returns ([num_patches, D],
    vision) with the consumed patches first, renumbered, then inert padding."""
    counts = [r for _, _, r in parts]
    total = sum(counts)
    if total > num_patches or num_patches % merge_unit:
        raise ValueError(f"num_patches={num_patches} must be a multiple of {merge_unit} and >= {total}")
    pixels = np.zeros((num_patches,) + parts[0][0].shape[1:], parts[0][0].dtype)
    pixels[:total] = np.concatenate([p[:r] for p, _, r in parts])
    vision = {}
    for key in parts[0][1]:
        if key not in _PATCH_ROWS + _SEGMENT_IDS + _PATCH_INDEX + _UNIT_INDEX:
            raise ValueError(f"join_patches does not know how to renumber vision[{key!r}] across processes; "
                             f"add it to a key group in guilibra_jax/train/batching.py")
        if key in _UNIT_INDEX:
            vision[key] = _join_entry(key, [v[key] for _, v, _ in parts], [r // merge_unit for r in counts],
                                      num_patches // merge_unit)
        else:
            vision[key] = _join_entry(key, [v[key] for _, v, _ in parts], counts, num_patches)
    return pixels, vision


def _join_entry(key: str, arrays: list[np.ndarray], counts: list[int], n: int) -> np.ndarray:
    """Concatenate the first counts[i] rows of arrays[i], renumbered, and pad to n rows."""
    is_index = key in _PATCH_INDEX or key in _UNIT_INDEX
    pieces, shift = [], 0
    for x, r in zip(arrays, counts):
        x = x[:r]
        if key in _SEGMENT_IDS:
            pieces.append(np.where(x > 0, x + shift, 0))
            shift += int(x.max(initial=0))
        elif is_index:
            if r and (x.min() < 0 or x.max() >= r):
                raise ValueError(f"vision[{key!r}] points outside the {r} consumed rows of its process: the "
                                 f"image tokens of its rows do not match its images")
            pieces.append(x + shift)
            shift += r
        else:
            pieces.append(x)
    real = sum(counts)
    tail = np.arange(real, n) if is_index else np.zeros((n - real,) + arrays[0].shape[1:])
    return np.concatenate(pieces + [tail.astype(arrays[0].dtype)]).astype(arrays[0].dtype)


def _pad_rows(x: np.ndarray, n: int) -> np.ndarray:
    """Pad axis 1 (after the micro axis) of ``x`` with zeros to ``n`` rows."""
    return np.pad(x, [(0, 0), (0, n - x.shape[1])] + [(0, 0)] * (x.ndim - 2))


def first_global_row(mesh, local_rows: int) -> int:
    """Index in the global batch of this process's first row (rows of one process are
    contiguous there: make_array_from_process_local_data fills its devices' shards)."""
    global_rows = local_rows * jax.process_count()
    index = S.batch_sharding(mesh, 1, 0).addressable_devices_indices_map((global_rows,))
    spans = sorted({(s[0].start or 0, global_rows if s[0].stop is None else s[0].stop) for s in index.values()})
    start, stop = spans[0][0], spans[-1][1]
    if stop - start != local_rows or any(a[1] != b[0] for a, b in zip(spans, spans[1:])):
        raise ValueError(f"process {jax.process_index()} holds batch rows {spans} of {global_rows}: not one "
                         f"contiguous block of {local_rows}, so its images cannot be ordered")
    return start
