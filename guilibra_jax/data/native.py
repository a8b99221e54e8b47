"""The native step format: one JSON object per line (JSONL), one step per object.

GUI-Libra's SFT JSON and RL parquet and UI-MOPD's Uni-GUI episodes all convert into
it; the synthetic world writes it directly. Fields::

    trajectory_id  str            episode id
    step           int >= 0       index of the step in its trajectory
    platform       str            "mobile" | "desktop" | "web"
    instruction    str            the task
    history        list[str]      descriptions of the previous actions, oldest first
    image          str | dict     path (relative to the JSONL file's folder, or absolute),
                                  or {"png_b64": "..."} / {"jpeg_b64": ...} inline bytes
    image_size     [w, h]         pixels of the screenshot
    target         dict           the demonstrated action (below)
    reasoning      str | null     the demo's reasoning (None: direct-action only)
    alternatives   list[dict]     other valid actions in this state (same form as target)
    source         str            data source / domain (for mixing and rebalancing)
    split          str            "train" | "test"
    thought        str | null     optional short "Thought:" line of UI-MOPD mobile targets
                                  (written only when set)

    target = {action_type (canonical GUI-Libra), action_description, value | null,
              point [x, y] | null (unit space), bbox [x1, y1, x2, y2] | null (unit space),
              bbox2 | null (swipe end, unit space), action_target | null,
              tool_call {"name", "arguments"} | null (UI-MOPD label, tool's own coordinates),
              is_grounding bool (optional, default false: a grounding-only step)}

A record that breaks this schema raises :class:`RecordError`, naming the field.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Mapping

from guilibra_jax import actions as A
from guilibra_jax import rewards as R

PLATFORMS = ("mobile", "desktop", "web")
SPLITS = ("train", "test")


class RecordError(ValueError):
    """A record that does not fit the schema; the message names the field."""


@dataclasses.dataclass(frozen=True)
class StepTarget:
    """The demonstrated action of a step (geometry in unit space)."""

    action_type: str
    action_description: str = ""
    value: str | None = None
    point: tuple[float, float] | None = None
    bbox: tuple[float, float, float, float] | None = None
    bbox2: tuple[float, float, float, float] | None = None
    action_target: str | None = None
    tool_call: A.ToolCall | None = None
    is_grounding: bool = False   # grounding-only step (GUI-Libra RL answer.is_grounding)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["tool_call"] = None if self.tool_call is None else self.tool_call.to_json_dict()
        if not self.is_grounding:
            d.pop("is_grounding")   # written only when set
        for k in ("point", "bbox", "bbox2"):
            d[k] = None if d[k] is None else list(d[k])
        return d

    def action(self, coord_space: str = "unit", *, image_size=None, resized_size=None) -> A.Action:
        """The target as an :class:`actions.Action` with its point in ``coord_space``."""
        point = None
        if self.point is not None:
            point = A.from_unit(self.point, coord_space, image_size=image_size, resized_size=resized_size)
        return A.Action(self.action_type, self.action_description, self.value, point, self.action_target)


@dataclasses.dataclass(frozen=True)
class StepRecord:
    trajectory_id: str
    step: int
    platform: str
    instruction: str
    history: tuple[str, ...]
    image: Any
    image_size: tuple[int, int]
    target: StepTarget
    reasoning: str | None = None
    alternatives: tuple[StepTarget, ...] = ()
    source: str = ""
    split: str = "train"
    thought: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = {
            "trajectory_id": self.trajectory_id, "step": self.step, "platform": self.platform,
            "instruction": self.instruction, "history": list(self.history), "image": self.image,
            "image_size": list(self.image_size), "target": self.target.to_dict(),
            "reasoning": self.reasoning, "alternatives": [a.to_dict() for a in self.alternatives],
            "source": self.source, "split": self.split,
        }
        if self.thought is not None:
            d["thought"] = self.thought
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False)

    def reward_target(self) -> R.Target:
        """The :class:`rewards.Target` of this step, alternatives included."""
        def one(t: StepTarget) -> R.Target:
            return R.Target(t.action_type, t.value, t.point, t.bbox, t.bbox2, self.image_size, t.tool_call,
                            is_grounding=t.is_grounding)
        main = one(self.target)
        return dataclasses.replace(main, alternatives=tuple(one(a) for a in self.alternatives))


def _need(d: Mapping[str, Any], key: str, types, where: str):
    if key not in d:
        raise RecordError(f"{where}: missing field {key!r}")
    v = d[key]
    if not isinstance(v, types) or isinstance(v, bool):
        raise RecordError(f"{where}: field {key!r} has type {type(v).__name__}, expected {types}")
    return v


def _geom(v: Any, n: int, key: str, where: str):
    if v is None:
        return None
    if (not isinstance(v, (list, tuple)) or len(v) != n
            or not all(isinstance(c, (int, float)) and not isinstance(c, bool) and math.isfinite(c) for c in v)):
        raise RecordError(f"{where}: field {key!r} must be {n} finite numbers or null, got {str(v)[:60]}")
    if not all(-1e-6 <= c <= 1 + 1e-6 for c in v):
        raise RecordError(f"{where}: field {key!r} = {list(v)} lies outside the image (unit space [0, 1])")
    if n == 4 and (v[0] > v[2] or v[1] > v[3]):
        raise RecordError(f"{where}: field {key!r} = {list(v)} is not (x1, y1, x2, y2) with x1<=x2, y1<=y2")
    return tuple(float(c) for c in v)


def target_from_dict(d: Any, where: str = "target") -> StepTarget:
    if not isinstance(d, Mapping):
        raise RecordError(f"{where}: expected an object, got {type(d).__name__}")
    raw_type = _need(d, "action_type", str, where)
    action_type = A.normalize_action_type(raw_type)
    if action_type is None:
        raise RecordError(f"{where}: unknown action_type {raw_type!r}")
    tool_call = None
    if d.get("tool_call") is not None:
        tc = d["tool_call"]
        if not isinstance(tc, Mapping) or not isinstance(tc.get("name"), str) or not isinstance(tc.get("arguments"), Mapping):
            raise RecordError(f"{where}.tool_call: expected {{'name': str, 'arguments': {{...}}}}")
        tool_call = A.ToolCall(tc["name"], dict(tc["arguments"]))
        err = A.validate_tool_call(tool_call)
        if err is not None:
            raise RecordError(f"{where}.tool_call: {err}")
    value = d.get("value")
    if value is not None and not isinstance(value, str):
        raise RecordError(f"{where}: field 'value' must be a string or null, got {type(value).__name__}")
    is_grounding = d.get("is_grounding", False)
    if not isinstance(is_grounding, bool):
        raise RecordError(f"{where}: field 'is_grounding' must be true or false, got {is_grounding!r}")
    return StepTarget(
        action_type=action_type,
        action_description=str(d.get("action_description") or ""),
        value=value,
        point=_geom(d.get("point"), 2, "point", where),
        bbox=_geom(d.get("bbox"), 4, "bbox", where),
        bbox2=_geom(d.get("bbox2"), 4, "bbox2", where),
        action_target=d.get("action_target"),
        tool_call=tool_call,
        is_grounding=is_grounding,
    )


def record_from_dict(d: Any, where: str = "record") -> StepRecord:
    """Validate and build a :class:`StepRecord`; raises :class:`RecordError` naming
    ``where`` (e.g. "file.jsonl:12") and the bad field."""
    if not isinstance(d, Mapping):
        raise RecordError(f"{where}: expected a JSON object, got {type(d).__name__}")
    platform = _need(d, "platform", str, where)
    if platform not in PLATFORMS:
        raise RecordError(f"{where}: field 'platform' = {platform!r}, expected one of {PLATFORMS}")
    split = d.get("split", "train")
    if split not in SPLITS:
        raise RecordError(f"{where}: field 'split' = {split!r}, expected one of {SPLITS}")
    history = _need(d, "history", list, where)
    if not all(isinstance(h, str) for h in history):
        raise RecordError(f"{where}: field 'history' must be a list of strings")
    image = _need(d, "image", (str, dict), where)
    size = _need(d, "image_size", list, where)
    if len(size) != 2 or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in size):
        raise RecordError(f"{where}: field 'image_size' must be [width, height] positive ints, got {size}")
    step = _need(d, "step", int, where)
    if step < 0:
        raise RecordError(f"{where}: field 'step' must be >= 0, got {step}")
    reasoning = d.get("reasoning")
    if reasoning is not None and not isinstance(reasoning, str):
        raise RecordError(f"{where}: field 'reasoning' must be a string or null")
    thought = d.get("thought")
    if thought is not None and not isinstance(thought, str):
        raise RecordError(f"{where}: field 'thought' must be a string or null")
    alts = d.get("alternatives") or []
    if not isinstance(alts, list):
        raise RecordError(f"{where}: field 'alternatives' must be a list")
    return StepRecord(
        trajectory_id=str(_need(d, "trajectory_id", (str, int), where)),
        step=step,
        platform=platform,
        instruction=_need(d, "instruction", str, where),
        history=tuple(history),
        image=image,
        image_size=(size[0], size[1]),
        target=target_from_dict(_need(d, "target", dict, where), f"{where}: target"),
        reasoning=reasoning,
        alternatives=tuple(target_from_dict(a, f"{where}: alternatives[{i}]") for i, a in enumerate(alts)),
        source=str(d.get("source") or ""),
        split=split,
        thought=thought,
    )
