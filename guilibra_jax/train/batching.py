"""Host batches -> arrays on the mesh, in one process or many.

Per-row arrays (``input_ids`` [B, T], ``positions`` [3, B, T] ...) are sharded over
(data, fsdp) along their row axis; with several processes each process passes only its
own rows (its data shard) and they are assembled into the global batch.

Image inputs: ``pixel_values`` [P, D] (all images' patches concatenated) is rearranged on
the host into the vision tower's slot layout [S, L, D] (:func:`slot_pixels`: slot s holds
its frame's patches, zeros after) and sharded over (data, fsdp) along the slot axis, like
the vision dict's per-slot entries ([S, ...]: one slot per image frame), so each device
holds and runs the tower on its own slots only (S is padded with empty slots to a multiple
of the batch devices); the per-token entries (``token_slot``, ``token_unit``) are
replicated. In one process the host arrays are placed as they are. With several
processes each process holds different images, so :func:`gather_images` first joins them
into the global layout of the global batch, identical on every process:

- the model gives the k-th ``<|image_pad|>`` token of the batch (row-major) merged
  feature k, so the consumed patches, slots and tokens of each process are concatenated
  in the order of the processes' rows in the global batch, and all padding goes last;
- every index of the vision dict is renumbered to the global layout (pixel rows of the
  slots, slot of each token);
- the global patch count is ``process_count * max(local P)``, the slot count
  ``process_count * max(local S)`` and the slot length ``max(local L)`` on every process,
  so compiled shapes agree and change only when a local bucket does. Padding patches are
  zero and in no slot; padding slots are empty; the result equals
  ``prepare_vision_inputs`` of all images of the global batch at those shapes.

Memory: every device holds only its slots' pixels ([M, S / batch devices, L, D]); every
process receives all processes' patches on the host (float32: Qwen2.5 D = 1176,
2048-patch bucket, 8 processes, M = 4 -> 308 MB per host), and the all-gather
(jax.experimental.multihost_utils.process_allgather) briefly holds the gathered arrays on
every device as well.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from guilibra_jax import sharding as S
from guilibra_jax.models.vision import vision_shape

IMAGE_KEYS = ("pixel_values", "vision")
# Vision-dict entries by how a process's entries become global ones (see prepare_vision_inputs).
_SLOT_VALUES = ("slot_lengths", "pos_hw", "window_lengths", "interp_indices", "interp_weights")  # kept, pad 0
_SLOT_LOCAL_INDEX = ("window_index", "full_index")   # positions inside the slot: kept, pad -1
_PIXEL_INDEX = ("patch_index",)                      # pixel rows: shifted by earlier parts' rows, pad -1
_TOKEN_SLOT = ("token_slot",)                        # slots: shifted by earlier parts' slots, pad -1
_TOKEN_VALUES = ("token_unit",)                      # kept, pad -1
_SLOT_KEYS = _SLOT_VALUES + _SLOT_LOCAL_INDEX + _PIXEL_INDEX
_TOKEN_KEYS = _TOKEN_SLOT + _TOKEN_VALUES


def stack_micro_batches(batches: list[dict]) -> dict:
    """[M] list of batches -> one batch with a leading M axis. Batches whose image layouts
    differ (collate rounds each to its own patch bucket, slot count and slot length) are
    first padded to the largest with inert padding; every other array must have equal shapes."""
    images = [b for b in batches if b.get("pixel_values") is not None]
    shapes = {(len(b["pixel_values"]),) + vision_shape(b["vision"])[1:] for b in images}
    if len(shapes) > 1:
        p, s, l = (max(x[i] for x in shapes) for i in range(3))
        batches = [{**b, **dict(zip(IMAGE_KEYS, pad_patches(b["pixel_values"], b["vision"], p, s, l)))}
                   if b.get("pixel_values") is not None else b for b in batches]

    def stack(path, *xs):
        if len({np.shape(x) for x in xs}) > 1:
            raise ValueError(f"stack_micro_batches: {jax.tree_util.keystr(path)} has shapes "
                             f"{[np.shape(x) for x in xs]} across the micro-batches; they must be equal "
                             f"(use one sequence bucket, data.seq_buckets=(), with grad_accum > 1)")
        return np.stack(xs)
    return jax.tree_util.tree_map_with_path(stack, *batches)


def pad_patches(pixels: np.ndarray, vision: dict, num_patches: int, num_slots: int | None = None,
                slot_len: int | None = None) -> tuple[np.ndarray, dict]:
    """pixel_values [P, D] and its vision dict extended with inert padding to
    ``num_patches`` rows, ``num_slots`` slots and slots of ``slot_len`` positions (None:
    unchanged), as prepare_vision_inputs(grids, config, num_patches, num_slots=, slot_len=)
    makes them."""
    vision = {k: np.asarray(v) for k, v in vision.items()}
    p = len(pixels)
    _, s, l = vision_shape(vision)
    real = int(vision["slot_lengths"].sum())
    return join_patches([(np.asarray(pixels), vision, real)], num_patches, p // len(vision["token_slot"]),
                        num_slots=s if num_slots is None else num_slots, slot_len=l if slot_len is None else slot_len)


def batch_devices(mesh) -> int:
    """Devices the batch axes (data, fsdp) split rows and image slots over."""
    return int(np.prod([mesh.shape[a] for a in S.BATCH_AXES]))


def placement(path, ndim: int, mesh, micro_axis: bool):
    """Sharding of one host-batch entry (``path`` from tree_map_with_path): rows over
    (data, fsdp); vision slots and slot-layout pixels over (data, fsdp); row-layout pixels,
    per-token vision entries and scalars replicated."""
    batch_dim = 1 if micro_axis else 0
    names = [str(getattr(k, "key", k)) for k in path]
    if names[0] == "vision" and names[-1] in _SLOT_KEYS + ("row_slots",) and ndim > batch_dim:
        return S.batch_sharding(mesh, ndim, batch_dim)
    if names[0] == "pixel_values" and ndim == batch_dim + 3:
        return S.batch_sharding(mesh, ndim, batch_dim)
    if names[0] in IMAGE_KEYS or ndim <= batch_dim:
        return S.replicated(mesh)
    return S.batch_sharding(mesh, ndim, batch_dim + (1 if is_positions(names[0]) else 0))


def is_positions(name: str) -> bool:
    """M-RoPE position arrays ([3, rows, T]: the row axis second): ``positions``, and the
    shared-prompt layout's ``prompt_positions`` / ``response_positions``."""
    return name == "positions" or name.endswith("_positions")


def pad_slots_to_mesh(batch: dict, mesh, micro_axis: bool) -> dict:
    """Empty slots appended so that the slot count divides over the batch devices."""
    if batch.get("pixel_values") is None or not batch.get("vision"):
        return batch
    n = batch_devices(mesh)
    slots = np.shape(batch["vision"]["patch_index"])[-2]
    if slots % n == 0:
        return batch
    want = -(-slots // n) * n
    if not micro_axis:
        pixels, vision = pad_patches(batch["pixel_values"], batch["vision"], len(batch["pixel_values"]), want)
        return {**batch, "pixel_values": pixels, "vision": vision}
    micro = [pad_patches(batch["pixel_values"][j], {k: v[j] for k, v in batch["vision"].items()},
                         np.shape(batch["pixel_values"])[1], want) for j in range(len(batch["pixel_values"]))]
    return {**batch, "pixel_values": np.stack([x[0] for x in micro]),
            "vision": {k: np.stack([x[1][k] for x in micro]) for k in batch["vision"]}}


def slot_pixels(pixels, patch_index) -> np.ndarray:
    """Host pixel rows [..., P, D] -> the vision tower's slot layout [..., S, L, D]
    (row patch_index[s, j] at [s, j]; zeros where it is -1)."""
    pixels, index = np.asarray(pixels), np.asarray(patch_index)
    if pixels.ndim == 2:
        return _slot_pixels(pixels, index)
    return np.stack([slot_pixels(p, i) for p, i in zip(pixels, index)])


def _slot_pixels(pixels: np.ndarray, index: np.ndarray) -> np.ndarray:
    out = np.zeros(index.shape + pixels.shape[1:], pixels.dtype)
    real = index >= 0
    out[real] = pixels[index[real]]
    return out


def slot_pixels_shape(pixels_shape, patch_index_shape) -> tuple[int, ...]:
    """Shape of :func:`slot_pixels`' result (planning: nothing is allocated)."""
    return tuple(patch_index_shape) + (pixels_shape[-1],)


def put_batch(batch: dict, mesh, *, micro_axis: bool = True, model_config: Any = None) -> dict:
    """Place a host batch on the mesh: the per-sample dimension of every array is
    sharded over (data, fsdp), and so is the slot dimension of the vision dict's
    per-slot arrays (padded with empty slots to a multiple of those devices) and of the
    pixels, rearranged into that slot layout (:func:`slot_pixels`); per-token vision
    entries are replicated.

    Multi-process: each process passes its own rows; a batch with images also needs
    ``model_config`` (image token id and merge unit) to join the processes' images
    with :func:`gather_images` (see the module doc for the cost)."""
    row_tokens = None
    if jax.process_count() > 1 and batch.get("pixel_values") is not None:
        if model_config is None:
            raise ValueError("put_batch: a multi-process batch with pixel_values needs model_config= to join "
                             "the processes' images")
        joined = gather_images(batch, mesh, model_config, micro_axis=micro_axis)
        row_tokens = joined.pop("row_image_tokens")
        batch = {**batch, **joined}
    batch = pad_slots_to_mesh(batch, mesh, micro_axis)
    if model_config is not None and batch.get("pixel_values") is not None and batch.get("vision"):
        if row_tokens is None:
            row_tokens = _row_image_tokens(_token_ids(batch), model_config.image_token_id, micro_axis)
        aligned = row_slots(row_tokens, batch["vision"]["token_slot"], np.shape(batch["vision"]["patch_index"])[-2])
        if aligned is not None:
            batch = {**batch, "vision": {**batch["vision"], "row_slots": aligned}}
    if batch.get("pixel_values") is not None and batch.get("vision"):
        batch = {**batch, "pixel_values": slot_pixels(batch["pixel_values"], batch["vision"]["patch_index"])}
    batch_dim = 1 if micro_axis else 0

    def place(path, x):
        x = np.asarray(x)
        name = str(getattr(path[0], "key", path[0]))
        sh = placement(path, x.ndim, mesh, micro_axis)
        if jax.process_count() == 1:
            return jax.device_put(x, sh)
        if name in IMAGE_KEYS or x.ndim <= batch_dim:  # identical on every process (joined)
            return S.put_host(x, sh)
        global_shape = list(x.shape)
        global_shape[batch_dim + (1 if is_positions(name) else 0)] *= jax.process_count()
        return jax.make_array_from_process_local_data(sh, x, tuple(global_shape))

    return jax.tree_util.tree_map_with_path(place, batch)


def _token_ids(batch: dict) -> np.ndarray:
    return np.asarray(batch["input_ids"] if "input_ids" in batch else batch["prompt_ids"])


def _row_image_tokens(ids: np.ndarray, image_token_id: int, micro_axis: bool) -> np.ndarray:
    """<|image_pad|> tokens of each row: [M, B] (a leading micro-batch axis added if absent)."""
    counts = (np.asarray(ids) == image_token_id).sum(-1)
    return counts if micro_axis else counts[None]


def row_slots(row_tokens: np.ndarray, token_slot: np.ndarray, n_slots: int) -> np.ndarray | None:
    """``vision["row_slots"]`` ([M, B, k], or [B, k] when ``token_slot`` has no micro-batch
    axis) when the image layout is row-aligned in every micro-batch, else None.

    Row-aligned: with k = S / B slots per row, the image tokens of row b (``row_tokens``
    [M, B], in row-major order as the model consumes them) all take features of slots
    b*k .. b*k+k-1. The usual GUI batch (one screenshot per row, collate's S = B) is; the
    model then gathers each row's features from its own slots (QwenVL._row_local_take)
    instead of from one image-order table on every device. Slot ids [b*k + i] are stored."""
    token_slot = np.asarray(token_slot)
    micro = token_slot.ndim == 2
    slots = token_slot if micro else token_slot[None]
    rows = np.shape(row_tokens)[-1]
    if rows == 0 or n_slots % rows:
        return None
    k = n_slots // rows
    for counts, ts in zip(np.asarray(row_tokens), slots):
        owner = np.repeat(np.arange(rows), counts)
        if len(owner) > len(ts) or (ts[:len(owner)] // k != owner).any() or (ts[:len(owner)] < 0).any():
            return None
    ids = (np.arange(rows)[:, None] * k + np.arange(k)).astype(np.int32)
    return np.broadcast_to(ids, (len(slots), rows, k)).copy() if micro else ids


def gather_images(batch: dict, mesh, model_config: Any, *, micro_axis: bool = True) -> dict:
    """{pixel_values, vision, row_image_tokens} of the global batch from every process's
    local ones (collective: all processes call it together). Host numpy arrays, identical on
    all processes, shaped like the local ones with P = process_count * max(local P),
    S = process_count * max(local S) slots of L = max(local L) positions;
    ``row_image_tokens`` [M, global B]: image tokens of each global row (for :func:`row_slots`)."""
    mu = model_config.vision.merge_unit
    ids = _token_ids(batch)
    pixels = np.asarray(batch["pixel_values"])
    vision = {k: np.asarray(v) for k, v in batch["vision"].items()}
    if not micro_axis:
        ids, pixels, vision = ids[None], pixels[None], {k: v[None] for k, v in vision.items()}
    m, p_local = pixels.shape[:2]
    _, s_local, l_local = vision_shape({k: v[0] for k, v in vision.items()})
    consumed = (ids == model_config.image_token_id).reshape(m, -1).sum(1) * mu  # [M] patches used
    if (consumed > p_local).any():
        raise ValueError(f"process {jax.process_index()}: the batch has {consumed.max() // mu} image tokens "
                         f"but pixel_values holds only {p_local} patches ({p_local // mu} merged tokens)")
    # per process: B, T, P, S, L, its first row in the global batch, consumed patches per micro-batch
    per_row = (ids == model_config.image_token_id).sum(-1)             # [M, B local]
    meta = multihost_utils.process_allgather(np.array(
        [*ids.shape[1:], p_local, s_local, l_local, first_global_row(mesh, ids.shape[1]), *consumed,
         *per_row.reshape(-1)], np.int64))
    shapes, first_rows, consumed_all = meta[:, :2], meta[:, 5], meta[:, 6:6 + m]
    p_max, s_max, l_max = (int(meta[:, i].max()) for i in (2, 3, 4))
    if (shapes != shapes[0]).any():
        raise ValueError(f"token arrays [B, T] differ across processes: {shapes.tolist()}; every process "
                         f"must collate the same shape (one sequence bucket: data.seq_buckets=())")
    if p_max % mu:
        raise ValueError(f"pixel_values rows ({p_max}) must be a multiple of the merge unit {mu}")
    padded = [pad_patches(pixels[j], {k: v[j] for k, v in vision.items()}, p_max, s_max, l_max) for j in range(m)]
    local = {"pixel_values": np.stack([x[0] for x in padded]),
             "vision": {k: np.stack([x[1][k] for x in padded]) for k in vision}}
    every = multihost_utils.process_allgather(local)    # leaves [n_proc, M, ...]
    order = np.argsort(first_rows, kind="stable")       # processes in global row order
    n = len(meta)
    micro = []
    for j in range(m):
        parts = [(every["pixel_values"][i, j], {k: v[i, j] for k, v in every["vision"].items()},
                  int(consumed_all[i, j])) for i in order]
        micro.append(join_patches(parts, n * p_max, mu, num_slots=n * s_max, slot_len=l_max))
    pixels_g = np.stack([x[0] for x in micro])
    vision_g = {k: np.stack([x[1][k] for x in micro]) for k in vision}
    rows_g = np.concatenate([meta[i, 6 + m:].reshape(m, -1) for i in order], axis=1)   # [M, global B]
    if not micro_axis:
        pixels_g, vision_g = pixels_g[0], {k: v[0] for k, v in vision_g.items()}
    return {"pixel_values": pixels_g, "vision": vision_g, "row_image_tokens": rows_g}


def join_patches(parts: list[tuple[np.ndarray, dict, int]], num_patches: int, merge_unit: int, *,
                 num_slots: int | None = None, slot_len: int | None = None) -> tuple[np.ndarray, dict]:
    """One image layout from several: ``parts`` is, in global row order, (pixel_values
    [P_i, D], vision dict of prepare_vision_inputs, consumed patches R_i) where the first
    R_i patches are the images whose tokens are in that part's rows (the rest is padding,
    or collate's dummy image of a batch without samples). Returns ([num_patches, D],
    vision) with the consumed patches, slots and tokens first, renumbered, then inert
    padding: ``num_slots`` slots of ``slot_len`` positions (default: as many as the
    consumed frames need, as prepare_vision_inputs' defaults)."""
    counts = [r for _, _, r in parts]
    total = sum(counts)
    if total > num_patches or num_patches % merge_unit:
        raise ValueError(f"num_patches={num_patches} must be a multiple of {merge_unit} and >= {total}")
    for key in parts[0][1]:
        if key not in _SLOT_KEYS + _TOKEN_KEYS:
            raise ValueError(f"join_patches does not know how to renumber vision[{key!r}] across processes; "
                             f"add it to a key group in guilibra_jax/train/batching.py")
    slots, needs = [], []
    for _, v, r in parts:
        k, need = _consumed_slots(v, r, merge_unit)
        slots.append(k)
        needs += need
    l0 = np.shape(parts[0][1]["patch_index"])[1]
    unit = l0 // np.shape(parts[0][1]["window_lengths"])[1] if "window_lengths" in parts[0][1] else merge_unit
    n_slots = max(1, sum(slots)) if num_slots is None else int(num_slots)
    length = max(needs + [unit]) if slot_len is None else int(slot_len)
    if n_slots < sum(slots) or length < max(needs + [unit]) or length % unit:
        raise ValueError(f"join_patches: {sum(slots)} slots needing {max(needs + [unit])} positions do not fit "
                         f"num_slots={n_slots}, slot_len={length} (a multiple of {unit})")
    pixels = np.zeros((num_patches,) + parts[0][0].shape[1:], parts[0][0].dtype)
    pixels[:total] = np.concatenate([p[:r] for p, _, r in parts])
    vision = {}
    for key in parts[0][1]:
        arrays = [v[key] for _, v, _ in parts]
        if key in _TOKEN_KEYS:
            vision[key] = _join_tokens(key, arrays, [r // merge_unit for r in counts], slots, num_patches // merge_unit)
        else:
            vision[key] = _join_slots(key, arrays, slots, counts, n_slots,
                                      length // unit if key == "window_lengths" else length)
    return pixels, vision


def _consumed_slots(vision: dict, consumed: int, merge_unit: int) -> tuple[int, list[int]]:
    """(leading slots whose patches are the ``consumed`` ones, their slot-length needs)."""
    lens = np.asarray(vision["slot_lengths"])
    cum = np.cumsum(lens)
    k = 0
    while k < len(lens) and lens[k] > 0 and cum[k] <= consumed:
        k += 1
    held = int(cum[k - 1]) if k else 0
    if held != consumed:
        raise ValueError(f"vision['slot_lengths']: the image tokens of a process's rows take {consumed} patches "
                         f"but its leading images hold {held} (slot lengths {lens.tolist()}): the image tokens "
                         f"of its rows do not match its images")
    slot = np.asarray(vision["token_slot"])[:consumed // merge_unit]
    if len(slot) and (slot.min() < 0 or slot.max() >= k):
        raise ValueError(f"vision['token_slot'] points outside the {k} consumed slots of its process")
    if "window_lengths" in vision:
        wl = np.asarray(vision["window_lengths"])
        unit = np.shape(vision["patch_index"])[1] // wl.shape[1]
        return k, [int(np.count_nonzero(wl[s])) * unit for s in range(k)]
    return k, [int(x) for x in lens[:k]]


def _join_slots(key: str, arrays: list[np.ndarray], slots: list[int], counts: list[int], n_slots: int,
                width: int) -> np.ndarray:
    """The first slots[i] slots of arrays[i] (pixel rows shifted past earlier parts' rows),
    their second axis widened to ``width``, then padding slots up to ``n_slots``."""
    fill = -1 if key in _SLOT_LOCAL_INDEX + _PIXEL_INDEX else 0
    pieces, shift = [], 0
    for x, k, r in zip(arrays, slots, counts):
        x = np.asarray(x)[:k]
        if key in _PIXEL_INDEX:
            x = np.where(x >= 0, x + shift, -1)
        if x.ndim > 1:
            x = np.pad(x, [(0, 0), (0, width - x.shape[1])] + [(0, 0)] * (x.ndim - 2), constant_values=fill)
        pieces.append(x)
        shift += r
    ref = np.asarray(arrays[0])
    tail = np.full((n_slots - sum(slots),) + ((width,) if ref.ndim > 1 else ()) + ref.shape[2:], fill, ref.dtype)
    return np.concatenate(pieces + [tail]).astype(ref.dtype)


def _join_tokens(key: str, arrays: list[np.ndarray], tokens: list[int], slots: list[int], n: int) -> np.ndarray:
    """The first tokens[i] entries of arrays[i] (slot numbers shifted past earlier parts'
    slots), then -1 up to ``n``."""
    pieces, shift = [], 0
    for x, t, k in zip(arrays, tokens, slots):
        x = np.asarray(x)[:t]
        pieces.append(x + shift if key in _TOKEN_SLOT else x)
        shift += k
    dtype = np.asarray(arrays[0]).dtype
    return np.concatenate(pieces + [np.full(n - sum(tokens), -1, dtype)]).astype(dtype)


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
