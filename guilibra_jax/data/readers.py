"""Readers: GUI-Libra SFT JSON, GUI-Libra RL parquet, Uni-GUI episodes and native
JSONL, each a random-access source of native :class:`StepRecord` s.

``source[i]`` never raises on bad data: it returns a :class:`Dropped` marker with the
reason and ``file:index``. Sources are thread-safe and picklable (files are opened
lazily per process and dropped on pickling). ``source.meta(i)`` gives the light
fields mixing and rebalancing need (platform, step, source, has reasoning) without
decoding images.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import threading
from typing import Any, Iterable, Mapping, Sequence

from guilibra_jax import actions as A
from guilibra_jax.data import bad_records as B
from guilibra_jax.data import images as I
from guilibra_jax.data import prompts as P
from guilibra_jax.data.jsonl import JsonlIndex
from guilibra_jax.data.native import RecordError, StepRecord, record_from_dict

FORMATS = ("native", "guilibra_sft", "guilibra_rl", "uni_gui")


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


class StepSource:
    """Base: ``__len__``, ``__getitem__`` -> StepRecord | Dropped, ``meta``."""

    def __len__(self) -> int:
        raise NotImplementedError

    def __getitem__(self, i: int) -> StepRecord | B.Dropped:
        raise NotImplementedError

    def where(self, i: int) -> str:
        return f"record {i}"

    def meta(self, i: int) -> RecordMeta | None:
        r = self[i]
        if isinstance(r, B.Dropped):
            return None
        return RecordMeta(r.platform, r.step, r.source, r.reasoning is not None, r.split)

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]


# --------------------------------------------------------------------------------------
# Native JSONL
# --------------------------------------------------------------------------------------

class NativeJsonlSource(StepSource):
    """Native JSONL (``native.py``); relative image paths resolve against the file's folder."""

    def __init__(self, path: str):
        self.index = JsonlIndex(path)
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

class _LazyItems:
    """Items of a JSON array file or a JSONL file, loaded on first use per process."""

    def __init__(self, path: str):
        self.path = os.path.abspath(path)
        self.is_jsonl = self.path.endswith(".jsonl")
        self._items: list[Any] | None = None
        self._jsonl: JsonlIndex | None = JsonlIndex(self.path) if self.is_jsonl else None
        self._lock = threading.Lock()
        self._n = len(self._jsonl) if self.is_jsonl else len(self._load())

    def _load(self) -> list[Any]:
        if self._items is None:
            with self._lock:
                if self._items is None:
                    with open(self.path, encoding="utf-8") as f:
                        items = json.load(f)
                    if not isinstance(items, list):
                        raise ValueError(f"{self.path}: expected a JSON array of records")
                    self._items = items
        return self._items

    def __len__(self) -> int:
        return self._n

    def get(self, i: int) -> Any:
        if self._jsonl is not None:
            return json.loads(self._jsonl.read(i))
        return self._load()[i]

    def where(self, i: int) -> str:
        if self._jsonl is not None:
            return f"{self.path}:{self._jsonl.line_number(i)}"
        return f"{self.path}[{i}]"

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_items"] = None
        del state["_lock"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()


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


class GuiLibraSftSource(StepSource):
    """GUI-Libra SFT records: a JSON array (or JSONL) of ``{"image", "conversations"}``.
    Relative image paths resolve against ``image_root`` (default: the file's folder)."""

    def __init__(self, path: str, image_root: str | None = None):
        self.items = _LazyItems(path)
        self.base_dir = os.path.abspath(image_root) if image_root else os.path.dirname(self.items.path)

    def __len__(self) -> int:
        return len(self.items)

    def _convert(self, i: int, read_image_size: bool) -> StepRecord | B.Dropped:
        where = self.items.where(i)
        try:
            d = guilibra_sft_to_native(self.items.get(i), where, self.base_dir, read_image_size=read_image_size)
            return record_from_dict(d, where)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return B.Dropped(B.INVALID_JSON, where, str(e)[:200])
        except (OSError, I.ImageLoadError) as e:
            return B.Dropped(B.UNREADABLE_IMAGE, where, str(e)[:200])
        except _RECORD_ERRORS as e:
            return _dropped_from_error(e, where)

    def where(self, i: int) -> str:
        return self.items.where(i)

    def __getitem__(self, i: int) -> StepRecord | B.Dropped:
        return self._convert(i, True)

    def meta(self, i: int) -> RecordMeta | None:
        r = self._convert(i, False)
        return None if isinstance(r, B.Dropped) else RecordMeta(
            r.platform, r.step, r.source, r.reasoning is not None, r.split)


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


def guilibra_rl_to_native(row: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Native record dict of one GUI-Libra RL parquet row (raises on bad data)."""
    for k in ("images", "answer"):
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
        "image": {"bytes": _first_image_bytes(row["images"])}, "image_size": [int(w), int(h)],
        "target": target, "reasoning": native.get("reasoning"), "alternatives": native.get("alternatives", []),
        "source": str(row.get("data_source") or ""), "split": native.get("split", "train"),
        **({"thought": native["thought"]} if "thought" in native else {}),
    }


class GuiLibraRlSource(StepSource):
    """GUI-Libra RL parquet rows (``images``, ``system_prompt``, ``context``,
    ``data_source``, ``answer``, optional ``extra_info``)."""

    def __init__(self, path: str):
        import pyarrow.parquet as pq
        self.path = os.path.abspath(path)
        self._n = pq.ParquetFile(self.path).metadata.num_rows
        self._table = None
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._n

    def _row(self, i: int) -> dict[str, Any]:
        if self._table is None:
            import pyarrow.parquet as pq
            with self._lock:
                if self._table is None:
                    self._table = pq.read_table(self.path)
        return self._table.slice(i, 1).to_pylist()[0]

    def where(self, i: int) -> str:
        return f"{self.path}[{i}]"

    def __getitem__(self, i: int) -> StepRecord | B.Dropped:
        where = self.where(i)
        try:
            return record_from_dict(guilibra_rl_to_native(self._row(i), where), where)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return B.Dropped(B.INVALID_JSON, where, str(e)[:200])
        except _RECORD_ERRORS as e:
            return _dropped_from_error(e, where)

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_table"] = None
        del state["_lock"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()


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
    if v is None or v == []:
        return None
    try:
        (x1, y1), (x2, y2) = v
    except (TypeError, ValueError):
        raise RecordError(f"{where}: field {key!r} must be [[x1, y1], [x2, y2]], got {str(v)[:60]}") from None
    return [x1 / size, y1 / size, x2 / size, y2 / size]


def uni_gui_step_to_native(task: Mapping[str, Any], k: int, episode_dir: str) -> dict[str, Any]:
    """Native record dict of step ``k`` (0-based) of a Uni-GUI ``task.json``."""
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
    return {
        "trajectory_id": str(task.get("episode_id") or os.path.basename(episode_dir)),
        "step": k, "platform": platform, "instruction": s.get("query") or task["query"],
        "history": [str(p.get("action", "")) for p in steps[:k]],
        "image": I.resolve_image_path(os.path.join(episode_dir, s["screenshot"])), "image_size": [int(res[0]), int(res[1])],
        "target": {"action_type": action_type, "action_description": str(s.get("action") or ""),
                   "value": value, "point": point, "bbox": _box(s.get("bbox"), size, "bbox", where),
                   "bbox2": _box(s.get("bbox2"), size, "bbox2", where), "tool_call": call.to_json_dict()},
        "reasoning": s.get("thought") or None, "alternatives": [],
        "source": "/".join(str(x) for x in (task.get("task"), task.get("app")) if x),
        "split": "test" if s.get("train_test") == "test" else "train",
        **({"thought": thought} if thought else {}),
    }


class UniGuiSource(StepSource):
    """Uni-GUI episode folders (``task.json`` + screenshots) under ``root`` (a folder
    of episodes, nested folders, or one episode). Steps with ``is_delete`` or (unless
    ``include_unused``) ``is_use`` false, and deleted episodes, yield no record but stay
    in the history of later steps; ``skipped`` counts them."""

    def __init__(self, root: str | Sequence[str], include_unused: bool = False):
        roots = [root] if isinstance(root, str) else list(root)
        paths: list[str] = []
        for r in roots:
            r = os.path.abspath(r)
            if os.path.isfile(r):
                paths.append(r)
            else:
                paths.extend(sorted(glob.glob(os.path.join(r, "**", "task.json"), recursive=True)))
        self.items: list[tuple[str, int]] = []  # (task.json path, step index or -1 = unreadable)
        self.skipped = {"deleted_episode": 0, "deleted_step": 0, "unused_step": 0}
        self._cache: dict[str, Any] = {}
        for p in paths:
            try:
                task = self._task(p)
                steps = task["data"]
            except (OSError, ValueError, KeyError, TypeError):
                self.items.append((p, -1))
                continue
            if task.get("is_delete"):
                self.skipped["deleted_episode"] += len(steps)
                continue
            for k, s in enumerate(steps):
                if s.get("is_delete"):
                    self.skipped["deleted_step"] += 1
                elif not include_unused and s.get("is_use") is False:
                    self.skipped["unused_step"] += 1
                else:
                    self.items.append((p, k))
        self._cache = {}

    def _task(self, path: str) -> Any:
        t = self._cache.get(path)
        if t is None:
            with open(path, encoding="utf-8") as f:
                t = json.load(f)
            if len(self._cache) > 64:
                self._cache.clear()
            self._cache[path] = t
        return t

    def __len__(self) -> int:
        return len(self.items)

    def where(self, i: int) -> str:
        path, k = self.items[i]
        return f"{path}:step{k + 1}"

    def __getitem__(self, i: int) -> StepRecord | B.Dropped:
        path, k = self.items[i]
        where = self.where(i)
        try:
            task = self._task(path)
            if k < 0:
                raise RecordError(f"{path}: missing field 'data'")
            return record_from_dict(uni_gui_step_to_native(task, k, os.path.dirname(path)), where)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return B.Dropped(B.INVALID_JSON, where, str(e)[:200])
        except (_RECORD_ERRORS + (OSError,)) as e:
            return _dropped_from_error(e, where)

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_cache"] = {}
        return state


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


def _expand(paths: str | Sequence[str], exts: Iterable[str]) -> list[str]:
    out: list[str] = []
    for p in [paths] if isinstance(paths, str) else paths:
        if any(ch in p for ch in "*?["):
            out.extend(sorted(glob.glob(p)))
        elif os.path.isdir(p):
            out.extend(sorted(f for e in exts for f in glob.glob(os.path.join(p, f"*{e}"))))
        else:
            out.append(p)
    if not out:
        raise FileNotFoundError(f"no input files match {paths!r}")
    return out


def open_source(paths: str | Sequence[str], fmt: str, *, image_root: str | None = None,
                include_unused: bool = False) -> StepSource:
    """A random-access source of native records over ``paths`` (files, folders or globs)
    in format ``fmt`` (one of :data:`FORMATS`)."""
    if fmt == "native":
        srcs: list[StepSource] = [NativeJsonlSource(p) for p in _expand(paths, (".jsonl",))]
    elif fmt == "guilibra_sft":
        srcs = [GuiLibraSftSource(p, image_root) for p in _expand(paths, (".json", ".jsonl"))]
    elif fmt == "guilibra_rl":
        srcs = [GuiLibraRlSource(p) for p in _expand(paths, (".parquet",))]
    elif fmt == "uni_gui":
        return UniGuiSource(paths, include_unused=include_unused)
    else:
        raise ValueError(f"unknown data format {fmt!r}; expected one of {FORMATS}")
    return srcs[0] if len(srcs) == 1 else ConcatSource(srcs)
