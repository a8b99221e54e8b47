"""Writers: native JSONL, and native -> GUI-Libra SFT JSON / RL parquet, so the
converter round-trips (native -> guilibra_sft -> native, native -> guilibra_rl -> native).

Fields the GUI-Libra formats lack travel in a ``meta`` object (SFT) or the
``extra_info`` JSON column (RL): trajectory id, step, platform, split, boxes, tool call,
alternatives. Coordinates are written unrounded by default (``round_coords=False``) so
that a round trip keeps them up to float rounding; the releases use integers.

Every output appears whole or not at all: written as ``<path>.tmp-<pid>`` (an SFT
images folder as ``<stem>_images.tmp-<pid>``) and renamed into place when complete
(``guilibra_jax.atomic``).
"""

from __future__ import annotations

import base64
import json
import os
from typing import Any, Iterable, Sequence

from guilibra_jax import actions as A
from guilibra_jax import atomic
from guilibra_jax.data import images as I
from guilibra_jax.data import prompts as P
from guilibra_jax.data.native import StepRecord
from guilibra_jax.data.parquet_rows import DEFAULT_ROW_GROUP_MB


def _rel(path: str, out_dir: str) -> str:
    """``path`` relative to ``out_dir`` when it lies inside it, else absolute."""
    if not os.path.isabs(path):
        return path
    rel = os.path.relpath(path, out_dir)
    return path if rel.startswith("..") else rel


def _json_image(image: Any, out_dir: str) -> Any:
    """A JSON-able native image field: paths relative to ``out_dir``, bytes as base64."""
    if isinstance(image, str):
        return _rel(image, out_dir)
    if isinstance(image, dict) and isinstance(image.get("bytes"), (bytes, bytearray)):
        return {"b64": base64.b64encode(bytes(image["bytes"])).decode("ascii")}
    return image


def _image_bytes(image: Any) -> bytes:
    if isinstance(image, dict) and isinstance(image.get("bytes"), (bytes, bytearray)):
        return bytes(image["bytes"])
    if isinstance(image, dict):
        key = next((k for k in ("png_b64", "jpeg_b64", "b64") if k in image), None)
        if key is not None:
            return base64.b64decode(image[key])
    if isinstance(image, str):
        with open(I.resolve_image_path(image), "rb") as f:
            return f.read()
    raise ValueError(f"cannot get bytes of image {str(image)[:60]!r}")


def write_native(records: Iterable[StepRecord], path: str) -> int:
    """Native JSONL; image paths relative to the output folder. Returns the count."""
    out_dir = os.path.dirname(os.path.abspath(path))
    n = 0
    with atomic.writing_file(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for r in records:
            d = r.to_dict()
            d["image"] = _json_image(r.image, out_dir)
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
            n += 1
    return n


def _meta(r: StepRecord) -> dict[str, Any]:
    t = r.target.to_dict()
    m = {"trajectory_id": r.trajectory_id, "step": r.step, "platform": r.platform, "source": r.source,
         "split": r.split, "image_size": list(r.image_size), "bbox": t["bbox"], "bbox2": t["bbox2"],
         "tool_call": t["tool_call"], "action_target": t["action_target"],
         "alternatives": [a.to_dict() for a in r.alternatives]}
    if r.thought is not None:
        m["thought"] = r.thought
    return m


def sft_item(r: StepRecord, image: Any, *, round_coords: bool = False, with_reasoning: bool = True) -> dict:
    """One GUI-Libra SFT record (LLaVA style); point_2d in pixels of ``image_size``,
    the frame the user turn states. Qwen2.5 think tag (``<think>``)."""
    action = r.target.action("pixels", image_size=r.image_size)
    if r.target.point is not None and not round_coords:
        action = A.Action(action.action_type, action.action_description, action.value,
                          A.from_unit(r.target.point, "pixels", image_size=r.image_size, round_to_int=False),
                          action.action_target)
    gpt = A.render_response(action, r.reasoning if with_reasoning else None, "qwen2_5_vl")
    human = P.IMAGE_PLACEHOLDER + "\n" + P.guilibra_user_text(r.instruction, r.history, r.image_size,
                                                              with_image=False)
    return {"image": image, "conversations": [
        {"from": "system", "value": P.guilibra_system_prompt(r.platform)},
        {"from": "human", "value": human}, {"from": "gpt", "value": gpt}], "meta": _meta(r)}


def native_to_guilibra_sft(records: Iterable[StepRecord], path: str, *, round_coords: bool = False,
                           noreason_twin: bool = False) -> int:
    """GUI-Libra SFT JSON array at ``path`` (and ``*_noreason.json`` with ``noreason_twin``).
    Inline images are written as PNG files into ``<path stem>_images/``."""
    out_dir = os.path.dirname(os.path.abspath(path))
    stem = os.path.splitext(os.path.abspath(path))[0]
    images, twin = stem + "_images", stem + "_noreason.json"
    parts = [(atomic.temp_name(images), images), (atomic.temp_name(twin), twin), (atomic.temp_name(path), path)]
    for tmp, _ in parts:   # this process's leftovers
        atomic.discard(tmp)
    items, twins = [], []
    for k, r in enumerate(records):
        if isinstance(r.image, str):
            image = _rel(r.image, out_dir)
        else:
            os.makedirs(parts[0][0], exist_ok=True)
            I.load_image(r.image).save(os.path.join(parts[0][0], f"{k:07d}.png"))
            image = _rel(os.path.join(images, f"{k:07d}.png"), out_dir)   # its name once published
        items.append(sft_item(r, image, round_coords=round_coords))
        if noreason_twin:
            twins.append(sft_item(r, image, round_coords=round_coords, with_reasoning=False))
    with open(parts[2][0], "w", encoding="utf-8") as f:
        json.dump(items, f, ensure_ascii=False)
    if noreason_twin:
        with open(parts[1][0], "w", encoding="utf-8") as f:
            json.dump(twins, f, ensure_ascii=False)
    atomic.publish_together([p for p in parts if os.path.exists(p[0])])   # the JSON array last
    return len(items)


def rl_row(r: StepRecord) -> dict[str, Any]:
    t = r.target
    extra = {"trajectory_id": r.trajectory_id, "step": r.step, "platform": r.platform, "split": r.split,
             "reasoning": r.reasoning, "action_description": t.action_description,
             "alternatives": [a.to_dict() for a in r.alternatives],
             "bbox2": None if t.bbox2 is None else list(t.bbox2),
             "tool_call": None if t.tool_call is None else t.tool_call.to_json_dict()}
    if r.thought is not None:
        extra["thought"] = r.thought
    return {
        "images": [{"bytes": _image_bytes(r.image), "path": None}],
        "system_prompt": P.guilibra_system_prompt(r.platform),
        "context": P.guilibra_user_text(r.instruction, r.history, r.image_size, with_image=False),
        "data_source": r.source,
        "answer": {"gt_action": t.action_type,
                   "gt_bbox": None if t.bbox is None else [c * 1000.0 for c in t.bbox],
                   "gt_point_2d": None if t.point is None else list(t.point),
                   "gt_input_text": t.value, "gt_target": t.action_target,
                   "image_width": int(r.image_size[0]), "image_height": int(r.image_size[1])},
        "extra_info": json.dumps({"native": extra}, ensure_ascii=False),
    }


def rl_schema():
    """The arrow schema of GUI-Libra RL parquet as written here."""
    import pyarrow as pa
    return pa.schema([
        ("images", pa.list_(pa.struct([("bytes", pa.binary()), ("path", pa.string())]))),
        ("system_prompt", pa.string()), ("context", pa.string()), ("data_source", pa.string()),
        ("answer", pa.struct([("gt_action", pa.string()), ("gt_bbox", pa.list_(pa.float64())),
                              ("gt_point_2d", pa.list_(pa.float64())), ("gt_input_text", pa.string()),
                              ("gt_target", pa.string()), ("image_width", pa.int64()),
                              ("image_height", pa.int64())])),
        ("extra_info", pa.string()),
    ])


def _leaf_paths(schema) -> list[str]:
    """Parquet column paths (``images.list.element.bytes``, ...) of an arrow schema."""
    import io
    import pyarrow.parquet as pq
    buf = io.BytesIO()
    pq.write_table(schema.empty_table(), buf)
    pschema = pq.ParquetFile(io.BytesIO(buf.getvalue())).schema
    return [pschema.column(i).path for i in range(len(pschema))]


def parquet_writer(path: str, schema):
    """A pyarrow ParquetWriter for record files read by row group: no column statistics
    (min/max of screenshots and prompts would grow the footer every reader holds),
    dictionary encoding only for the repetitive text columns, and the screenshots
    (already compressed PNG / JPEG) stored without compression, so reading them is a copy."""
    import pyarrow.parquet as pq
    dict_cols = [n for n in ("system_prompt", "data_source") if n in schema.names]
    compression = {p: "NONE" if p.split(".")[0] == "images" else "SNAPPY" for p in _leaf_paths(schema)}
    return pq.ParquetWriter(path, schema, write_statistics=False, use_dictionary=dict_cols,
                            compression=compression)


def native_to_guilibra_rl(records: Iterable[StepRecord], path: str, *,
                          row_group_mb: float = DEFAULT_ROW_GROUP_MB) -> int:
    """GUI-Libra RL parquet at ``path``, streamed: rows are written in row groups of
    about ``row_group_mb`` MB (screenshots included), so that readers load a small
    group per sample and the writer holds one group at a time."""
    import pyarrow as pa
    schema = rl_schema()
    limit = float(row_group_mb) * 2 ** 20
    n = 0
    with atomic.writing_file(path) as tmp, parquet_writer(tmp, schema) as w:
        rows: list[dict[str, Any]] = []
        size = 0
        for r in records:
            row = rl_row(r)
            rows.append(row)
            size += len(row["images"][0]["bytes"]) + len(row["context"]) + len(row["extra_info"]) + 256
            if size >= limit:
                w.write_table(pa.Table.from_pylist(rows, schema=schema), row_group_size=len(rows))
                n += len(rows)
                rows, size = [], 0
        if rows or n == 0:
            w.write_table(pa.Table.from_pylist(rows, schema=schema), row_group_size=max(1, len(rows)))
            n += len(rows)
    return n


def rewrite_parquet_row_groups(inputs: Sequence[str], path: str, *,
                               row_group_mb: float = DEFAULT_ROW_GROUP_MB) -> dict[str, int]:
    """Copy the rows of parquet files ``inputs`` (one schema) unchanged into ``path``
    with row groups of about ``row_group_mb`` MB. Streams page by page, so an input
    whose row groups are far larger than memory can be rewritten. Returns
    {"written": rows, "row_groups": groups written}."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from guilibra_jax.errors import UserError
    limit = float(row_group_mb) * 2 ** 20
    schema = None
    written = groups = 0
    writer = None
    tmp = atomic.temp_name(path)   # renamed to path when complete
    try:
        for src in inputs:
            try:
                pf = pq.ParquetFile(src, buffer_size=1 << 23, pre_buffer=False)
            except (OSError, ValueError) as e:   # pyarrow's errors: not parquet, a truncated footer
                from guilibra_jax.data.file_errors import DataFileError
                from guilibra_jax.data.parquet_rows import parquet_error_words
                raise DataFileError(f"{src}: {parquet_error_words(e)}") from e
            if schema is None:
                schema = pf.schema_arrow
                writer = parquet_writer(tmp, schema)
            elif not pf.schema_arrow.equals(schema, check_metadata=False):
                raise UserError(f"{src}: its columns differ from those of {inputs[0]}; "
                                f"rewrite files with different schemas separately")
            md = pf.metadata
            total = sum(md.row_group(g).total_byte_size for g in range(md.num_row_groups))
            per_row = max(1.0, total / max(1, md.num_rows))
            batch = max(1, int(limit // per_row))
            for b in pf.iter_batches(batch_size=batch):
                writer.write_table(pa.Table.from_batches([b]), row_group_size=b.num_rows)
                written += b.num_rows
                groups += 1
    except BaseException:
        atomic.discard(tmp)
        raise
    finally:
        if writer is not None:
            writer.close()
    atomic.publish_file(tmp, path)
    return {"written": written, "row_groups": groups}


WRITERS = {"native": write_native, "guilibra_sft": native_to_guilibra_sft, "guilibra_rl": native_to_guilibra_rl}
