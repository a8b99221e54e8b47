"""Readers: GUI-Libra SFT JSON, GUI-Libra RL parquet, Uni-GUI episodes and native
JSONL, each a random-access source of native :class:`StepRecord` s.

``source[i]`` never raises on bad data: it returns a :class:`Dropped` marker with the
reason and ``file:index``. Sources are thread-safe and picklable (files are opened
lazily per process and dropped on pickling). ``source.meta(i)`` gives the light
fields mixing and rebalancing need (platform, step, source, has reasoning) without
reading images.

Memory does not grow with the data: every format is read record by record through
an index (byte offsets of JSONL lines or JSON array elements, parquet row groups,
Uni-GUI (episode, step) pairs); no reader loads a whole file or table, and
screenshots are read only when a sample is built.

A file that is not what its format says (not parquet, a truncated footer, missing
columns, not a JSON array, not JSONL, no records, a folder with no matching files, no
such file, permission denied) raises :class:`file_errors.DataFileError` on one line
naming it when the source is opened; ``open_source(..., config_key=)`` names the config
key too.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import logging
import os
import threading
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from guilibra_jax import actions as A
from guilibra_jax.choices import DATA_FORMATS
from guilibra_jax.data import bad_records as B
from guilibra_jax.data import images as I
from guilibra_jax.data import prompts as P
from guilibra_jax.data.file_errors import DataFileError, one_line, os_error_words
from guilibra_jax.data.json_array import JsonArrayIndex
from guilibra_jax.data.jsonl import ByteRanges, JsonlIndex
from guilibra_jax.data.parquet_rows import DEFAULT_MAX_ROW_GROUP_MB, ParquetRows
from guilibra_jax.data.native import RecordError, StepRecord, record_from_dict

log = logging.getLogger(__name__)

FORMATS = DATA_FORMATS   # the record formats (guilibra_jax/choices.py)


@dataclasses.dataclass(frozen=True)
class RecordMeta:
    platform: str
    step: int
    source: str
    has_reasoning: bool
    split: str = "train"


def _dropped_from_error(e: Exception, where: str) -> B.Dropped:
    if isinstance(e, json.JSONDecodeError):
        return B.Dropped(B.INVALID_JSON, where, str(e)[:200])
    if isinstance(e, I.ImageLoadError):
        return B.Dropped(B.UNREADABLE_IMAGE, where, str(e)[:200])
    return B.Dropped(B.classify_record_error(str(e)), where, str(e)[:200])


_RECORD_ERRORS = (RecordError, ValueError, KeyError, TypeError, I.ImageLoadError)


def _abs_image(image: Any, base_dir: str) -> Any:
    if isinstance(image, str) and not os.path.isabs(image):
        return os.path.normpath(os.path.join(base_dir, image))
    return image


def meta_of(r: StepRecord | B.Dropped) -> RecordMeta | None:
    """The :class:`RecordMeta` of a record (None for a dropped one)."""
    if isinstance(r, B.Dropped):
        return None
    return RecordMeta(r.platform, r.step, r.source, r.reasoning is not None, r.split)


class StepSource:
    """Base: ``__len__``, ``__getitem__`` -> StepRecord | Dropped, ``meta``."""

    def __len__(self) -> int:
        raise NotImplementedError

    def __getitem__(self, i: int) -> StepRecord | B.Dropped:
        raise NotImplementedError

    def where(self, i: int) -> str:
        return f"record {i}"

    def meta(self, i: int) -> RecordMeta | None:
        return meta_of(self[i])

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]


class _LightMetaSource(StepSource):
    """A source whose ``_convert(i, full)`` builds record ``i``; with ``full=False`` it
    skips what metadata does not need (screenshots, image lookups)."""

    def _convert(self, i: int, full: bool) -> StepRecord | B.Dropped:
        raise NotImplementedError

    def __getitem__(self, i: int) -> StepRecord | B.Dropped:
        return self._convert(i, True)

    def meta(self, i: int) -> RecordMeta | None:
        return meta_of(self._convert(i, False))


def _check_objects(index: ByteRanges, path: str, what: str) -> None:
    """DataFileError unless the first items of ``index`` include a JSON object."""
    why = index.not_objects()
    if why is not None:
        raise DataFileError(f"{path}: not {what}: {why}")


# --------------------------------------------------------------------------------------
# Native JSONL
# --------------------------------------------------------------------------------------

class NativeJsonlSource(StepSource):
    """Native JSONL (``native.py``); relative image paths resolve against the file's folder."""

    def __init__(self, path: str):
        self.index = JsonlIndex(path)
        _check_objects(self.index, path, "native JSONL records (one JSON object per line)")
        self.base_dir = os.path.dirname(self.index.path)

    def __len__(self) -> int:
        return len(self.index)

    def where(self, i: int) -> str:
        return f"{self.index.path}:{self.index.line_number(i)}"

    def _raw(self, i: int) -> Any:
        return json.loads(self.index.read(i))

    def __getitem__(self, i: int) -> StepRecord | B.Dropped:
        where = self.where(i)
        try:
            rec = record_from_dict(self._raw(i), where)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return B.Dropped(B.INVALID_JSON, where, str(e)[:200])
        except _RECORD_ERRORS as e:
            return _dropped_from_error(e, where)
        return dataclasses.replace(rec, image=_abs_image(rec.image, self.base_dir))

    def meta(self, i: int) -> RecordMeta | None:
        try:
            d = self._raw(i)
            return RecordMeta(str(d["platform"]), int(d["step"]), str(d.get("source") or ""),
                              d.get("reasoning") is not None, str(d.get("split", "train")))
        except Exception:  # noqa: BLE001 - a bad record has no meta; __getitem__ reports it
            return None


# --------------------------------------------------------------------------------------
# GUI-Libra SFT (LLaVA / AGUVIS style JSON)
# --------------------------------------------------------------------------------------

class _SftItems:
    """Items of a JSON array file (byte offsets of its elements, ``json_array``) or a
    JSONL file (byte offsets of its lines): each item is read and parsed on demand."""

    def __init__(self, path: str, cache_dir: str | None = None):
        self.path = os.path.abspath(path)
        self.is_jsonl = self.path.endswith(".jsonl")
        self._jsonl: JsonlIndex | None = JsonlIndex(self.path) if self.is_jsonl else None
        self._array: JsonArrayIndex | None = None if self.is_jsonl else JsonArrayIndex(self.path, cache_dir)
        _check_objects(self._jsonl if self._jsonl is not None else self._array, path,
                       "GUI-Libra SFT records ({\"image\", \"conversations\"} objects)")

    def __len__(self) -> int:
        return len(self._jsonl if self._jsonl is not None else self._array)

    def get(self, i: int) -> Any:
        if self._jsonl is not None:
            return json.loads(self._jsonl.read(i))
        return json.loads(self._array.read(i))

    def where(self, i: int) -> str:
        if self._jsonl is not None:
            return f"{self.path}:{self._jsonl.line_number(i)}"
        return f"{self.path}[{i}]"


def _turn(conversations: Sequence[Mapping[str, Any]], role: str) -> str | None:
    for c in conversations:
        if c.get("from") == role:
            v = c.get("value")
            if not isinstance(v, str):
                raise RecordError(f"conversation turn {role!r} has no string 'value'")
            return v
    return None


def _parse_error_reason(err: str | None) -> str:
    e = (err or "").lower()
    if "json" in e:
        return B.INVALID_JSON
    if "unknown" in e:
        return B.UNKNOWN_ACTION
    return B.MISSING_FIELD


def guilibra_sft_to_native(item: Mapping[str, Any], where: str, base_dir: str, *,
                           image_size: tuple[int, int] | None = None, read_image_size: bool = True
                           ) -> dict[str, Any]:
    """Native record dict of one GUI-Libra SFT record (raises on bad data).

    ``point_2d`` is read in the pixel frame the user turn states (``{W}x{H}``), or the
    image's own size when the turn states none. A ``meta`` object (written by
    :func:`writers.native_to_guilibra_sft`) restores native fields SFT JSON lacks."""
    if not isinstance(item, Mapping):
        raise RecordError(f"{where}: expected a JSON object, got {type(item).__name__}")
    if "image" not in item:
        raise RecordError(f"{where}: missing field 'image'")
    if "conversations" not in item or not isinstance(item["conversations"], list):
        raise RecordError(f"{where}: missing field 'conversations'")
    meta = item.get("meta") or {}
    conv = item["conversations"]
    human, gpt = _turn(conv, "human"), _turn(conv, "gpt")
    system = _turn(conv, "system") or ""
    if human is None or gpt is None:
        raise RecordError(f"{where}: missing field 'conversations' human/gpt turn")
    image = item["image"]
    if isinstance(image, list):
        if not image:
            raise RecordError(f"{where}: missing field 'image' (empty list)")
        image = image[-1]  # the current screenshot is the last one
    image = _abs_image(image, base_dir) if isinstance(image, str) else image
    instruction, history, stated = P.parse_guilibra_user_text(human)
    parsed = A.parse_response(gpt)
    if parsed.action is None:
        raise RecordError(f"{where}: gpt turn: {parsed.error}" if _parse_error_reason(parsed.error) != B.MISSING_FIELD
                          else f"{where}: missing field (gpt turn: {parsed.error})")
    size = meta.get("image_size") or image_size
    if size is None:
        if read_image_size:
            with I.Image.open(I.resolve_image_path(image)) if isinstance(image, str) else \
                    I.load_image(image) as im:
                size = im.size
        else:
            size = stated or (1, 1)
    size = [int(size[0]), int(size[1])]
    frame = stated or size
    act = parsed.action
    point = None if act.point_2d is None else [act.point_2d[0] / frame[0], act.point_2d[1] / frame[1]]
    target = {"action_type": act.action_type, "action_description": act.action_description,
              "value": act.value, "point": point, "action_target": act.action_target}
    for k in ("bbox", "bbox2", "tool_call", "action_target"):
        if k in meta:
            target[k] = meta[k]
    return {
        "trajectory_id": meta.get("trajectory_id", f"{os.path.basename(where)}"),
        "step": int(meta.get("step", len(history))),
        "platform": meta.get("platform", P.platform_from_guilibra_system(system)),
        "instruction": instruction, "history": history, "image": image, "image_size": size,
        "target": target, "reasoning": parsed.reasoning,
        "alternatives": meta.get("alternatives", []), "source": meta.get("source", item.get("source", "")),
        "split": meta.get("split", "train"), **({"thought": meta["thought"]} if "thought" in meta else {}),
    }


class GuiLibraSftSource(_LightMetaSource):
    """GUI-Libra SFT records: a JSON array (or JSONL) of ``{"image", "conversations"}``.
    Relative image paths resolve against ``image_root`` (default: the file's folder).
    The array is never loaded whole: an index of its elements' byte offsets is built
    once (cached in ``index_cache``, see :mod:`index_cache`) and each record is read
    on demand."""

    def __init__(self, path: str, image_root: str | None = None, *, index_cache: str | None = None):
        self.items = _SftItems(path, index_cache)
        self.base_dir = os.path.abspath(image_root) if image_root else os.path.dirname(self.items.path)

    def __len__(self) -> int:
        return len(self.items)

    def _convert(self, i: int, full: bool) -> StepRecord | B.Dropped:
        where = self.items.where(i)
        try:
            d = guilibra_sft_to_native(self.items.get(i), where, self.base_dir, read_image_size=full)
            return record_from_dict(d, where)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return B.Dropped(B.INVALID_JSON, where, str(e)[:200])
        except (OSError, I.ImageLoadError) as e:
            return B.Dropped(B.UNREADABLE_IMAGE, where, str(e)[:200])
        except _RECORD_ERRORS as e:
            return _dropped_from_error(e, where)

    def where(self, i: int) -> str:
        return self.items.where(i)


# --------------------------------------------------------------------------------------
# GUI-Libra RL parquet
# --------------------------------------------------------------------------------------

def _first_image_bytes(images: Any) -> bytes:
    if isinstance(images, (list, tuple)):
        if not images:
            raise RecordError("missing field 'images' (empty)")
        images = images[0]
    if isinstance(images, Mapping):
        images = images.get("bytes")
    if not isinstance(images, (bytes, bytearray)):
        raise RecordError(f"missing field 'images' bytes (got {type(images).__name__})")
    return bytes(images)


def _valid_geom(v: Any, n: int) -> list[float] | None:
    if v is None:
        return None
    v = list(v)
    if len(v) != n or all(c is None for c in v):
        return None
    if any(c is None for c in v) or all(float(c) < 0 for c in v):  # [-1, -1] / [-100, -100]: none
        return None
    return [float(c) for c in v]


def guilibra_rl_to_native(row: Mapping[str, Any], where: str, *, with_image: bool = True) -> dict[str, Any]:
    """Native record dict of one GUI-Libra RL parquet row (raises on bad data).
    ``with_image=False``: the row has no ``images`` column (read for its metadata
    only); the record's image is then empty bytes."""
    for k in ("images", "answer") if with_image else ("answer",):
        if row.get(k) is None:
            raise RecordError(f"{where}: missing field {k!r}")
    ans = row["answer"]
    if isinstance(ans, str):
        ans = json.loads(ans)
    if not isinstance(ans, Mapping) or not ans.get("gt_action"):
        raise RecordError(f"{where}: missing field 'answer.gt_action'")
    extra = row.get("extra_info") or {}
    if isinstance(extra, str):
        extra = json.loads(extra) if extra else {}
    native = dict(extra.get("native") or {})
    context = row.get("context") or ""
    try:
        instruction, history, _ = P.parse_guilibra_user_text(context)
    except ValueError:
        instruction, history = context.strip(), []
    w, h = ans.get("image_width"), ans.get("image_height")
    if not w or not h:
        raise RecordError(f"{where}: missing field 'answer.image_width/image_height'")
    bbox = _valid_geom(ans.get("gt_bbox"), 4)
    if bbox is not None:
        bbox = [c / 1000.0 for c in bbox]
    point = _valid_geom(ans.get("gt_point_2d"), 2)
    value = ans.get("gt_input_text")
    value = None if value in (None, "", "None", "no input text") else str(value)
    target = {"action_type": ans["gt_action"], "value": value, "point": point, "bbox": bbox,
              "action_target": ans.get("gt_target") or None,
              "action_description": native.get("action_description", ""),
              "is_grounding": bool(ans.get("is_grounding", False))}
    for k in ("bbox2", "tool_call"):
        if k in native:
            target[k] = native[k]
    return {
        "trajectory_id": native.get("trajectory_id", where), "step": int(native.get("step", len(history))),
        "platform": native.get("platform", P.platform_from_guilibra_system(row.get("system_prompt") or "")),
        "instruction": instruction, "history": history,
        "image": {"bytes": _first_image_bytes(row["images"]) if with_image else b""}, "image_size": [int(w), int(h)],
        "target": target, "reasoning": native.get("reasoning"), "alternatives": native.get("alternatives", []),
        "source": str(row.get("data_source") or ""), "split": native.get("split", "train"),
        **({"thought": native["thought"]} if "thought" in native else {}),
    }


_RL_COLUMNS = ("images", "system_prompt", "context", "data_source", "answer", "extra_info")


def _check_rl_schema(path: str, types: Mapping[str, str]) -> None:
    """DataFileError unless the parquet columns (name -> arrow type) hold GUI-Libra RL
    rows: ``images`` with bytes, ``answer`` a struct or JSON string."""
    missing = [c for c in ("images", "answer") if c not in types]
    if missing:
        raise DataFileError(f"{path}: not GUI-Libra RL parquet: no column {' or '.join(map(repr, missing))} "
                            f"(its columns: {', '.join(types) or 'none'})")
    if "binary" not in types["images"]:
        raise DataFileError(f"{path}: not GUI-Libra RL parquet: column 'images' is {types['images']}, expected "
                            f"image bytes (binary, a list of binary, or {{bytes, path}} structs)")
    answer = types["answer"]
    if not (answer in ("string", "large_string") or (answer.startswith("struct<") and "gt_action" in answer)):
        raise DataFileError(f"{path}: not GUI-Libra RL parquet: column 'answer' is {answer}, expected a struct "
                            f"with gt_action or a JSON string")


class GuiLibraRlSource(_LightMetaSource):
    """GUI-Libra RL parquet rows (``images``, ``system_prompt``, ``context``,
    ``data_source``, ``answer``, optional ``extra_info``).

    Rows are read one row group at a time (:class:`parquet_rows.ParquetRows`): a
    record reads only the row group that holds it, ``meta`` reads every column but
    ``images``, and screenshots stay encoded bytes until a sample is built. A file
    whose row groups exceed ``max_row_group_mb`` raises ``RowGroupTooLarge`` with the
    command that rewrites it. ``open_file``: see ``ParquetRows``."""

    def __init__(self, path: str, *, max_row_group_mb: float = DEFAULT_MAX_ROW_GROUP_MB,
                 index_cache: str | None = None, open_file=None):
        self.rows = ParquetRows(path, max_row_group_mb=max_row_group_mb, cache_dir=index_cache,
                                open_file=open_file)
        self.path = self.rows.path
        _check_rl_schema(path, self.rows.types)
        self._columns = [c for c in _RL_COLUMNS if c in self.rows.columns]
        self._meta_columns = [c for c in self._columns if c != "images"]

    def __len__(self) -> int:
        return len(self.rows)

    def where(self, i: int) -> str:
        return f"{self.path}[{i}]"

    def _convert(self, i: int, full: bool) -> StepRecord | B.Dropped:
        where = self.where(i)
        try:
            row = self.rows.row(i, self._columns) if full else self.rows.row_via_group(i, self._meta_columns)
            return record_from_dict(guilibra_rl_to_native(row, where, with_image=full), where)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return B.Dropped(B.INVALID_JSON, where, str(e)[:200])
        except _RECORD_ERRORS as e:
            return _dropped_from_error(e, where)
        except (OSError, NotImplementedError) as e:   # a row group pyarrow cannot decode
            return B.Dropped(B.INVALID_RECORD, where, f"unreadable row group: {one_line(str(e), 180)}")


# --------------------------------------------------------------------------------------
# Uni-GUI episodes (UI-MOPD)
# --------------------------------------------------------------------------------------

_PLATFORM_OF_DEVICE = {"computer": "desktop", "desktop": "desktop", "mobile": "mobile"}


def _direction(dx: float, dy: float) -> str:
    if abs(dx) >= abs(dy):
        return "right" if dx >= 0 else "left"
    return "down" if dy >= 0 else "up"


def tool_call_to_guilibra(call: A.ToolCall) -> tuple[str, str | None]:
    """(GUI-Libra action type, value) of a UI-MOPD tool call.

    computer_use: clicks and mouse_move -> Click, left_click_drag -> Swipe, type ->
    Write, key -> KeyboardPress ("ctrl+u"), scroll / hscroll -> Scroll (up / down /
    left / right by the sign of pixels, positive = up / right), wait -> Wait,
    terminate -> Terminate (status), answer -> Answer. mobile_use: click -> Click,
    long_press -> LongPress, swipe -> Swipe (finger direction), type -> Write, answer
    and ask_user -> Answer, system_button Back / Home -> NavigateBack / NavigateHome,
    Menu / Enter -> KeyboardPress, wait -> Wait, terminate -> Terminate."""
    a, args = call.action, call.arguments
    if a in ("left_click", "right_click", "middle_click", "double_click", "triple_click", "mouse_move", "click"):
        return "Click", None
    if a == "long_press":
        return "LongPress", None
    if a == "left_click_drag":
        return "Swipe", None
    if a == "swipe":
        (x1, y1), (x2, y2) = args["coordinate"], args["coordinate2"]
        return "Swipe", _direction(x2 - x1, y2 - y1)
    if a == "type":
        return "Write", str(args["text"])
    if a in ("answer", "ask_user"):
        return "Answer", str(args["text"])
    if a == "key":
        return "KeyboardPress", "+".join(str(k) for k in args["keys"])
    if a == "scroll":
        return "Scroll", "up" if float(args["pixels"]) > 0 else "down"
    if a == "hscroll":
        return "Scroll", "right" if float(args["pixels"]) > 0 else "left"
    if a == "wait":
        return "Wait", str(args["time"])
    if a == "terminate":
        return "Terminate", str(args["status"])
    if a == "system_button":
        b = str(args["button"])
        return {"Back": "NavigateBack", "Home": "NavigateHome"}.get(b, "KeyboardPress"), (
            None if b in ("Back", "Home") else b.lower())
    raise RecordError(f"unknown {call.name} action {a!r}")


def _box(v: Any, size: int, key: str, where: str) -> list[float] | None:
    """A Uni-GUI box [[x1, y1], [x2, y2]] (tool coordinates, corners in any order, as the
    release's ``position_in_bbox`` reads them) in unit space; None when empty."""
    if v is None or v == []:
        return None
    try:
        (x1, y1), (x2, y2) = v
        x1, x2, y1, y2 = min(x1, x2), max(x1, x2), min(y1, y2), max(y1, y2)
    except (TypeError, ValueError):
        raise RecordError(f"{where}: field {key!r} must be [[x1, y1], [x2, y2]], got {str(v)[:60]}") from None
    return [x1 / size, y1 / size, x2 / size, y2 / size]


_WARNED: set[str] = set()


def _other_label_call(label: Any) -> tuple[A.ToolCall | None, str, str | None]:
    """(tool call, action text, why not) of an ``other_label``: the release's form, a
    ground-truth string with a ``<tool_call>{...}</tool_call>`` block, or a
    ``{"name", "arguments"}`` object."""
    if isinstance(label, str):
        parsed = A.parse_tool_call_response(label)
        if parsed.call is None:
            return None, "", parsed.error
        return parsed.call, parsed.action_text or "", None
    if isinstance(label, Mapping) and isinstance(label.get("name"), str) and isinstance(label.get("arguments"), Mapping):
        return A.ToolCall(label["name"], dict(label["arguments"])), "", None
    return None, "", f"expected a <tool_call> string or a {{name, arguments}} object, got {str(label)[:60]}"


def uni_gui_alternative(step: Mapping[str, Any], platform: str, where: str) -> dict[str, Any] | None:
    """The native alternative target of a Uni-GUI step's ``other_label`` (in the step's
    ``extra_info`` object or the step itself), or None when it has none.

    As the UI-MOPD release's reward (``verl/ui_mopd/reward/gui_agent.py``, "Plan B"):
    the alternative is scored with ``other_bbox`` / ``other_bbox2`` when the step has
    those keys and with the main label's ``bbox`` / ``bbox2`` otherwise. An
    ``other_label`` that does not parse as a valid tool call of the step's platform
    earns no credit in the release; here it is left out with a warning."""
    info = dict(step.get("extra_info") or {}) if isinstance(step.get("extra_info"), Mapping) else {}
    for k in ("other_label", "other_bbox", "other_bbox2"):
        if k not in info and k in step:
            info[k] = step[k]
    if not info.get("other_label"):
        return None
    call, action_text, err = _other_label_call(info["other_label"])
    tool = A.TOOL_FOR_PLATFORM[platform]
    if call is not None:
        err = A.validate_tool_call(call)
        if err is None and call.name != tool:
            err = f"tool {call.name!r} on a {platform} episode"
    size = A.TOOL_SCREEN_SIZE[tool]
    if err is None:
        for key in ("coordinate", "coordinate2"):
            if key in call.arguments and not all(0 <= c <= size for c in call.arguments[key]):
                err = f"{key} {call.arguments[key]} lies outside the 0-{size} screen"
    boxes = None
    if err is None:
        try:
            boxes = [_box(info[k] if k in info else step.get(k.replace("other_", "")), size, k, where)
                     for k in ("other_bbox", "other_bbox2")]
        except RecordError as e:
            err = str(e)
    if err is not None:
        if where not in _WARNED:
            _WARNED.add(where)
            log.warning("%s: other_label left out (no alternative credit): %s", where, err)
        return None
    action_type, value = tool_call_to_guilibra(call)
    coord = call.arguments.get("coordinate")
    return {"action_type": action_type, "action_description": action_text, "value": value,
            "point": None if coord is None else [coord[0] / size, coord[1] / size],
            "bbox": boxes[0], "bbox2": boxes[1], "tool_call": call.to_json_dict()}


def uni_gui_step_to_native(task: Mapping[str, Any], k: int, episode_dir: str, *,
                           resolve_image: bool = True) -> dict[str, Any]:
    """Native record dict of step ``k`` (0-based) of a Uni-GUI ``task.json``. The
    screenshot is named, not opened (``resolve_image=False``: not even looked up, for
    metadata). An ``other_label`` becomes the record's alternative
    (:func:`uni_gui_alternative`)."""
    where = f"{os.path.join(episode_dir, 'task.json')}:step{k + 1}"
    steps = task["data"]
    s = steps[k]
    for key in ("plan", "screenshot"):
        if key not in s:
            raise RecordError(f"{where}: missing field {key!r}")
    device = task.get("device")
    platform = _PLATFORM_OF_DEVICE.get(device)
    if platform is None:
        raise RecordError(f"{where}: field 'device' = {device!r}, expected computer or mobile")
    plan = s["plan"]
    if not isinstance(plan, Mapping) or not isinstance(plan.get("arguments"), Mapping):
        raise RecordError(f"{where}: missing field 'plan' {{name, arguments}}")
    call = A.ToolCall(str(plan.get("name")), dict(plan["arguments"]))
    err = A.validate_tool_call(call)
    if err is not None:
        raise RecordError(f"{where}: plan: {err}")
    if call.name != A.TOOL_FOR_PLATFORM[platform]:
        raise RecordError(f"{where}: plan uses tool {call.name!r} on a {platform} episode (unknown tool)")
    size = A.TOOL_SCREEN_SIZE[call.name]
    for key in ("coordinate", "coordinate2"):
        if key in call.arguments and not all(0 <= c <= size for c in call.arguments[key]):
            raise RecordError(f"{where}: plan {key} {call.arguments[key]} lies outside the image "
                              f"(0-{size} screen)")
    action_type, value = tool_call_to_guilibra(call)
    coord = call.arguments.get("coordinate")
    point = None if coord is None else [coord[0] / size, coord[1] / size]
    res = task.get("screen_resolution") or s.get("pixel")
    if not res:
        raise RecordError(f"{where}: missing field 'screen_resolution'")
    thought = s.get("raw_thought") if platform == "mobile" else None
    image = os.path.join(episode_dir, s["screenshot"])
    alternative = uni_gui_alternative(s, platform, where)
    return {
        "trajectory_id": str(task.get("episode_id") or os.path.basename(episode_dir)),
        "step": k, "platform": platform, "instruction": s.get("query") or task["query"],
        "history": [str(p.get("action", "")) for p in steps[:k]],
        "image": I.resolve_image_path(image) if resolve_image else image, "image_size": [int(res[0]), int(res[1])],
        "target": {"action_type": action_type, "action_description": str(s.get("action") or ""),
                   "value": value, "point": point, "bbox": _box(s.get("bbox"), size, "bbox", where),
                   "bbox2": _box(s.get("bbox2"), size, "bbox2", where), "tool_call": call.to_json_dict()},
        "reasoning": s.get("thought") or None, "alternatives": [] if alternative is None else [alternative],
        "source": "/".join(str(x) for x in (task.get("task"), task.get("app")) if x),
        "split": "test" if s.get("train_test") == "test" else "train",
        **({"thought": thought} if thought else {}),
    }


class UniGuiSource(_LightMetaSource):
    """Uni-GUI episode folders (``task.json`` + screenshots) under ``root`` (a folder
    of episodes, nested folders, or one episode). Steps with ``is_delete`` or (unless
    ``include_unused``) ``is_use`` false, and deleted episodes, yield no record but stay
    in the history of later steps; ``skipped`` counts them.

    The index is (episode, step) pairs in two integer arrays; an episode's
    ``task.json`` is read again when one of its steps is requested (a few recent ones
    are kept), and a screenshot is only named in the record: it is opened when the
    sample is built."""

    def __init__(self, root: str | Sequence[str], include_unused: bool = False):
        roots = [root] if isinstance(root, str) else list(root)
        paths: list[str] = []
        given: set[str] = set()       # task.json files named directly: unreadable is an error
        for r in roots:
            a = os.path.abspath(r)
            if os.path.isfile(a):
                paths.append(a)
                given.add(a)
                continue
            found = sorted(p for p in glob.glob(os.path.join(a, "**", "task.json"), recursive=True)
                           if os.path.isfile(p))
            if not found:
                raise DataFileError(f"{r}: no such file or folder" if not glob.has_magic(r) and not os.path.exists(a)
                                    else f"{r}: no task.json under it (Uni-GUI episodes are folders holding a "
                                         f"task.json)")
            paths.extend(found)
        self.episodes = paths
        episode, step = [], []        # step -1: an unreadable task.json
        self.skipped = {"deleted_episode": 0, "deleted_step": 0, "unused_step": 0}
        first_error = None
        for e, p in enumerate(paths):
            try:
                task = self._read_task(p)
                steps = task["data"]
                if not isinstance(steps, list):
                    raise TypeError(f"'data' is a {type(steps).__name__}, not a list of steps")
                flags = [(bool(s.get("is_delete")), s.get("is_use") is False) for s in steps]
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
                why = os_error_words(err) if isinstance(err, OSError) else (
                    f"no key {err}" if isinstance(err, KeyError) else one_line(str(err), 160))
                if p in given:
                    raise DataFileError(f"{p}: not a Uni-GUI task.json ({type(err).__name__}: {why})") from err
                first_error = first_error or f"{p}: not a Uni-GUI task.json ({type(err).__name__}: {why})"
                episode.append(e)
                step.append(-1)
                continue
            if task.get("is_delete"):
                self.skipped["deleted_episode"] += len(steps)
                continue
            for k, (deleted, unused) in enumerate(flags):
                if deleted:
                    self.skipped["deleted_step"] += 1
                elif not include_unused and unused:
                    self.skipped["unused_step"] += 1
                else:
                    episode.append(e)
                    step.append(k)
        if first_error is not None and all(k < 0 for k in step):
            raise DataFileError(f"{first_error}; no task.json under {', '.join(map(str, roots))} could be read")
        if not step:
            skipped = ", ".join(f"{k}={v}" for k, v in self.skipped.items() if v)
            raise DataFileError(f"{', '.join(map(str, roots))}: no usable Uni-GUI steps in {len(paths)} "
                                f"task.json file(s)" + (f" (left out: {skipped})" if skipped else " (no steps)"))
        self._episode = np.asarray(episode, np.int32)
        self._step = np.asarray(step, np.int32)
        self._cache: dict[str, Any] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _read_task(path: str) -> Any:
        with open(path, encoding="utf-8") as f:
            return json.load(f)

    def _task(self, path: str) -> Any:
        t = self._cache.get(path)
        if t is None:
            t = self._read_task(path)
            with self._lock:
                while len(self._cache) >= 16:
                    self._cache.pop(next(iter(self._cache)))
                self._cache[path] = t
        return t

    def __len__(self) -> int:
        return len(self._step)

    def item(self, i: int) -> tuple[str, int]:
        """(task.json path, 0-based step) of record ``i`` (step -1: unreadable task.json)."""
        return self.episodes[int(self._episode[i])], int(self._step[i])

    def where(self, i: int) -> str:
        path, k = self.item(i)
        return f"{path}:step{k + 1}"

    def _convert(self, i: int, full: bool) -> StepRecord | B.Dropped:
        path, k = self.item(i)
        where = self.where(i)
        try:
            task = self._task(path)
            if k < 0:
                raise RecordError(f"{path}: missing field 'data'")
            d = uni_gui_step_to_native(task, k, os.path.dirname(path), resolve_image=full)
            return record_from_dict(d, where)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return B.Dropped(B.INVALID_JSON, where, str(e)[:200])
        except (_RECORD_ERRORS + (OSError,)) as e:
            return _dropped_from_error(e, where)


    def __getstate__(self):
        state = self.__dict__.copy()
        state["_cache"] = {}
        del state["_lock"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()


# --------------------------------------------------------------------------------------
# Several files
# --------------------------------------------------------------------------------------

class ConcatSource(StepSource):
    """Sources one after another."""

    def __init__(self, sources: Sequence[StepSource]):
        self.sources = list(sources)
        self._starts = [0]
        for s in self.sources:
            self._starts.append(self._starts[-1] + len(s))

    def __len__(self) -> int:
        return self._starts[-1]

    def _locate(self, i: int) -> tuple[StepSource, int]:
        if not 0 <= i < len(self):
            raise IndexError(f"index {i} out of range for {len(self)} records")
        import bisect
        j = bisect.bisect_right(self._starts, i) - 1
        return self.sources[j], i - self._starts[j]

    def __getitem__(self, i: int) -> StepRecord | B.Dropped:
        s, j = self._locate(i)
        return s[j]

    def meta(self, i: int) -> RecordMeta | None:
        s, j = self._locate(i)
        return s.meta(j)

    def where(self, i: int) -> str:
        s, j = self._locate(i)
        return s.where(j)


def expand_paths(paths: str | Sequence[str], exts: Iterable[str]) -> list[str]:
    """Files named by ``paths``: files, folders (their ``*ext`` files) or globs. A path
    that names nothing (no such file, a folder without such files, a glob matching none)
    raises :class:`DataFileError`."""
    exts = tuple(exts)
    out: list[str] = []
    for p in [paths] if isinstance(paths, str) else paths:
        if glob.has_magic(p):
            hits = sorted(glob.glob(p))
            if not hits:
                raise DataFileError(f"{p}: the pattern matches no file")
            out.extend(hits)
        elif os.path.isdir(p):
            hits = sorted(f for e in exts for f in glob.glob(os.path.join(p, f"*{e}")))
            if not hits:
                raise DataFileError(f"{p}: a folder with no {' or '.join('*' + e for e in exts)} files")
            out.extend(hits)
        elif not os.path.exists(p):
            raise DataFileError(f"{p}: no such file or folder")
        else:
            out.append(p)
    if not out:
        raise DataFileError(f"no input files in {paths!r}")
    return out


def _opened(path: str, fmt: str, make) -> StepSource:
    """``make(path)``, its errors as a :class:`DataFileError` naming ``path``; a file
    without records is one too."""
    try:
        src = make(path)
    except DataFileError:
        raise
    except OSError as e:
        raise DataFileError(f"{path}: {os_error_words(e)}") from e
    except (ValueError, NotImplementedError) as e:   # pyarrow's ArrowInvalid is a ValueError
        raise DataFileError(f"{path}: cannot be read as {fmt} ({type(e).__name__}: {one_line(str(e), 200)})") from e
    if len(src) == 0:
        raise DataFileError(f"{path}: holds no records (an empty file?)")
    return src


def open_source(paths: str | Sequence[str], fmt: str, *, image_root: str | None = None,
                include_unused: bool = False, index_cache: str | None = None,
                max_row_group_mb: float = DEFAULT_MAX_ROW_GROUP_MB, config_key: str | None = None) -> StepSource:
    """A random-access source of native records over ``paths`` (files, folders or globs)
    in format ``fmt`` (one of :data:`FORMATS`). ``index_cache``: folder of the cached
    JSON-array / parquet indexes (default: :func:`index_cache.default_cache_dir`);
    ``max_row_group_mb``: the largest parquet row group a reader accepts.

    A path that cannot be opened or indexed as ``fmt`` raises :class:`DataFileError`
    naming it, after ``config_key`` (the config key or flag that named the files, e.g.
    ``data.train_files``) when given: ``data.train_files (format guilibra_rl):
    /data/x.parquet: not a parquet file (...)``. Bad records in a readable file are
    ``Dropped`` markers, not errors."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown data format {fmt!r}; expected one of {FORMATS}")
    try:
        if fmt == "native":
            srcs: list[StepSource] = [_opened(p, fmt, NativeJsonlSource) for p in expand_paths(paths, (".jsonl",))]
        elif fmt == "guilibra_sft":
            srcs = [_opened(p, fmt, lambda q: GuiLibraSftSource(q, image_root, index_cache=index_cache))
                    for p in expand_paths(paths, (".json", ".jsonl"))]
        elif fmt == "guilibra_rl":
            srcs = [_opened(p, fmt, lambda q: GuiLibraRlSource(q, max_row_group_mb=max_row_group_mb,
                                                                index_cache=index_cache))
                    for p in expand_paths(paths, (".parquet",))]
        else:
            return _opened(paths if isinstance(paths, str) else ", ".join(map(str, paths)), fmt,
                           lambda _: UniGuiSource(paths, include_unused=include_unused))
    except DataFileError as e:
        if config_key:
            e.args = (f"{config_key} (format {fmt}): {e}",) + e.args[1:]
        raise
    return srcs[0] if len(srcs) == 1 else ConcatSource(srcs)
