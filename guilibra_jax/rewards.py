"""Verifier rewards: pure functions on response text and a demo :class:`Target`.

* :func:`guilibra_reward`: GUI-Libra's partially verifiable step reward (METHOD.md
  sections 2 and 5): ``total = w_fmt * format + (1 - w_fmt) * accuracy`` with
  ``accuracy = r_act * r_val * r_g``.
* :func:`mopd_reward`: UI-MOPD's task reward on Qwen3-VL tool calls (METHOD.md 3b):
  1.0 for a full match (main or alternative label), -0.5 for a partial one, -1.0 when
  either side cannot be parsed or the action is unknown.

Geometry in a :class:`Target` is in the canonical unit space ([0, 1] of the image
width / height); a response's coordinates are converted with :mod:`actions`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Literal, Sequence

from guilibra_jax import actions as A

Box = tuple[float, float, float, float]  # x1, y1, x2, y2


@dataclasses.dataclass(frozen=True)
class Target:
    """The demonstrated action of one step.

    action_type: canonical GUI-Libra type (``actions.GUILIBRA_ACTION_TYPES``).
    value: the demo's text / key / direction / app name, None when not applicable.
    point: demo point in unit space, or None. bbox: target element box
    (x1, y1, x2, y2) in unit space, or None. bbox2: end box of a swipe (unit space).
    image_size: (width, height) of the original screenshot in pixels.
    tool_call: UI-MOPD label (``actions.ToolCall``, coordinates in the tool's own
    0-1000 / 0-999 space) when the step comes from a tool-call dataset.
    alternatives: other actions that are also correct in this state (partial
    verifiability made explicit); rewards accept a response matching any of them.
    """

    action_type: str
    value: str | None = None
    point: tuple[float, float] | None = None
    bbox: Box | None = None
    bbox2: Box | None = None
    image_size: tuple[int, int] | None = None
    tool_call: A.ToolCall | None = None
    alternatives: tuple["Target", ...] = ()

    def __post_init__(self):
        if A.normalize_action_type(self.action_type) != self.action_type:
            raise ValueError(f"Target.action_type {self.action_type!r} is not a canonical GUI-Libra "
                             f"action type; expected one of {A.GUILIBRA_ACTION_TYPES}")
        for name in ("bbox", "bbox2"):
            box = getattr(self, name)
            if box is not None and (len(box) != 4 or box[0] > box[2] or box[1] > box[3]):
                raise ValueError(f"Target.{name} must be (x1, y1, x2, y2) with x1<=x2, y1<=y2; got {box}")


# --------------------------------------------------------------------------------------
# Building blocks
# --------------------------------------------------------------------------------------

_WORD_RE = re.compile(r"\w+", re.UNICODE)


def _words(text: str | None) -> list[str]:
    return _WORD_RE.findall((text or "").lower())


def word_f1(pred: str | None, gold: str | None, *, use_set: bool = False) -> float:
    """Word-level F1 between two strings (lower-cased ``\\w+`` tokens). Multiset
    overlap by default, token sets with ``use_set`` (the release's). Two empty
    strings give 1.0; one empty gives 0.0."""
    p, g = _words(pred), _words(gold)
    if use_set:
        p, g = sorted(set(p)), sorted(set(g))
    if not p and not g:
        return 1.0
    if not p or not g:
        return 0.0
    counts: dict[str, int] = {}
    for w in g:
        counts[w] = counts.get(w, 0) + 1
    overlap = 0
    for w in p:
        if counts.get(w, 0) > 0:
            counts[w] -= 1
            overlap += 1
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(p), overlap / len(g)
    return 2 * precision * recall / (precision + recall)


def point_in_box(point: Sequence[float] | None, box: Sequence[float] | None, *,
                 strict: bool = False) -> bool:
    """Whether ``point`` (x, y) lies inside ``box`` (x1, y1, x2, y2); False when
    either is missing or not finite. ``strict`` excludes the border."""
    if point is None or box is None or len(point) != 2 or len(box) != 4:
        return False
    x, y = float(point[0]), float(point[1])
    if not all(math.isfinite(v) for v in (x, y, *map(float, box))):
        return False
    x1, y1, x2, y2 = map(float, box)
    if strict:
        return x1 < x < x2 and y1 < y < y2
    return x1 <= x <= x2 and y1 <= y <= y2


def point_distance(a: Sequence[float], b: Sequence[float]) -> float:
    """Euclidean distance between two points (unit space: normalised distance)."""
    return math.hypot(float(a[0]) - float(b[0]), float(a[1]) - float(b[1]))


# --------------------------------------------------------------------------------------
# GUI-Libra reward
# --------------------------------------------------------------------------------------

# The release checks the value of these types with token-set F1 and grounds only Click
# and LongPress; the paper checks any demo value and any demo geometry.
RELEASE_VALUE_TYPES = frozenset({"Write", "Select", "Scroll", "OpenApp", "Swipe", "Terminate", "Answer"})
RELEASE_GROUNDED_TYPES = frozenset({"Click", "LongPress"})


@dataclasses.dataclass(frozen=True)
class GuiLibraReward:
    """Breakdown of :func:`guilibra_reward`; every field is in [0, 1]."""

    format: float
    action_type: float
    value: float
    grounding: float
    accuracy: float
    total: float


def value_match(pred: str | None, gold: str | None, *, rule: Literal["paper", "release"] = "paper") -> bool:
    """Paper: word-level F1 > 0.5. Release: token-set F1 >= 0.5, or one side is a
    single word contained in the other."""
    if rule == "paper":
        return word_f1(pred, gold) > 0.5
    if rule == "release":
        if word_f1(pred, gold, use_set=True) >= 0.5:
            return True
        p, g = _words(pred), _words(gold)
        return (len(p) == 1 and p[0] in g) or (len(g) == 1 and g[0] in p)
    raise ValueError(f"unknown value rule {rule!r}; expected 'paper' or 'release'")


def grounding_match(pred_point: Sequence[float] | None, target: Target, *,
                    point_tolerance: float = 0.05, strict_box: bool = False) -> bool:
    """Point (unit space) inside the demo box, or within ``point_tolerance`` of the
    demo point when only a point is known."""
    if pred_point is None:
        return False
    if target.bbox is not None:
        return point_in_box(pred_point, target.bbox, strict=strict_box)
    if target.point is not None:
        return point_distance(pred_point, target.point) <= point_tolerance + 1e-9
    return True


def _accuracy_parts(action: A.Action, unit_point, target: Target, value_rule: str,
                    point_tolerance: float) -> tuple[float, float, float]:
    r_act = float(action.action_type == target.action_type)
    if value_rule == "release":
        check_value = target.action_type in RELEASE_VALUE_TYPES
        check_point = target.action_type in RELEASE_GROUNDED_TYPES
    else:
        check_value = target.value is not None
        check_point = target.action_type in A.POINT_ACTION_TYPES
    r_val = float(value_match(action.value, target.value, rule=value_rule)) if check_value else 1.0
    has_geometry = target.bbox is not None or target.point is not None
    r_g = 1.0
    if check_point and has_geometry:
        r_g = float(grounding_match(unit_point, target, point_tolerance=point_tolerance,
                                    strict_box=value_rule == "release"))
    return r_act, r_val, r_g


def guilibra_reward(response_text: str, target: Target, *, coord_space: str = "norm1000",
                    resized_size: Sequence[int] | None = None, w_fmt: float = 0.1,
                    value_rule: Literal["paper", "release"] = "paper",
                    point_tolerance: float = 0.05) -> GuiLibraReward:
    """GUI-Libra step reward of one response against its demo.

    coord_space: the space the model writes point_2d in ("norm1000" for Qwen3-VL,
    "resized_pixels" for Qwen2.5-VL, which then needs ``resized_size`` = (w, h)).
    Alternatives in ``target`` are tried when the main label does not give accuracy 1.
    Never raises on any response string.
    """
    parsed = A.parse_response(response_text)
    r_fmt = float(parsed.format_ok)
    best = (0.0, 0.0, 0.0)
    if parsed.action is not None:
        unit_point = None
        if parsed.action.point_2d is not None:
            unit_point = A.to_unit(parsed.action.point_2d, coord_space,
                                   image_size=target.image_size, resized_size=resized_size)
        for label in (target, *target.alternatives):
            parts = _accuracy_parts(parsed.action, unit_point, label, value_rule, point_tolerance)
            if math.prod(parts) > math.prod(best) or (math.prod(best) == 0 and sum(parts) > sum(best)):
                best = parts
            if math.prod(best) == 1.0:
                break
    r_act, r_val, r_g = best
    accuracy = r_act * r_val * r_g
    return GuiLibraReward(format=r_fmt, action_type=r_act, value=r_val, grounding=r_g,
                          accuracy=accuracy, total=w_fmt * r_fmt + (1.0 - w_fmt) * accuracy)


# --------------------------------------------------------------------------------------
# UI-MOPD reward
# --------------------------------------------------------------------------------------

_CLICK_LIKE = frozenset({"left_click", "right_click", "middle_click", "double_click", "triple_click",
                         "mouse_move", "left_click_drag", "click", "long_press"})
_TEXT_LIKE = frozenset({"type", "answer", "ask_user"})
_SCROLL_LIKE = frozenset({"scroll", "hscroll"})


def _tool_point_ok(pred: A.ToolCall, label: A.ToolCall, key: str, box: Box | None) -> bool:
    """Pred coordinate ``key`` in ``box`` (unit space of the tool's screen), or equal to
    the label's coordinate when the label has no box."""
    pc, lc = pred.arguments.get(key), label.arguments.get(key)
    if box is None:
        return lc is not None and pc is not None and list(map(float, pc)) == list(map(float, lc))
    if pc is None or not A._is_coord(pc):
        return False
    size = A.TOOL_SCREEN_SIZE[label.name]
    return point_in_box((pc[0] / size, pc[1] / size), box)


def tool_call_score(pred: A.ToolCall, label: A.ToolCall, bbox: Box | None = None,
                    bbox2: Box | None = None) -> float:
    """UI-MOPD sub-score in [0, 1] of a parsed prediction against one label, by the
    label's action (METHOD.md 3b). Boxes are in unit space of the tool's screen."""
    act = label.action
    type_ok = float(pred.name == label.name and pred.action == act)
    if act in _CLICK_LIKE:
        return (type_ok + _tool_point_ok(pred, label, "coordinate", bbox)) / 2
    if act == "swipe":
        return (type_ok + _tool_point_ok(pred, label, "coordinate", bbox)
                + _tool_point_ok(pred, label, "coordinate2", bbox2)) / 3
    if act in _TEXT_LIKE:
        p, l = pred.arguments.get("text"), label.arguments.get("text")
        same = isinstance(p, str) and isinstance(l, str) and p.strip().lower() == l.strip().lower()
        return (type_ok + same) / 2
    if act == "key":
        p, l = pred.arguments.get("keys"), label.arguments.get("keys")
        same = (isinstance(p, list) and isinstance(l, list)
                and {str(k).lower() for k in p} == {str(k).lower() for k in l})
        return (type_ok + same) / 2
    if act in _SCROLL_LIKE:
        p, l = pred.arguments.get("pixels"), label.arguments.get("pixels")
        same_sign = (isinstance(p, (int, float)) and isinstance(l, (int, float))
                     and math.copysign(1, p) == math.copysign(1, l))
        point_ok = _tool_point_ok(pred, label, "coordinate", bbox) if (
            bbox is not None or "coordinate" in label.arguments) else True
        return (type_ok + point_ok + same_sign) / 3
    if act in ("system_button", "terminate"):
        key = "button" if act == "system_button" else "status"
        p, l = pred.arguments.get(key), label.arguments.get(key)
        same = isinstance(p, str) and isinstance(l, str) and p.lower() == l.lower()
        return (type_ok + same) / 2
    return type_ok  # wait


def mopd_reward(response_text: str, target: Target) -> float:
    """UI-MOPD task reward: 1.0 if the response's tool call fully matches the label
    (or an alternative label), -0.5 if it parses but does not, -1.0 if it cannot be
    parsed or its action is unknown. ``target.tool_call`` must be set."""
    if target.tool_call is None:
        raise ValueError("mopd_reward needs Target.tool_call (the UI-MOPD label)")
    if A.validate_tool_call(target.tool_call) is not None:
        return -1.0
    parsed = A.parse_tool_call_response(response_text)
    if parsed.call is None or A.validate_tool_call(parsed.call) is not None:
        return -1.0
    for label in (target, *target.alternatives):
        if label.tool_call is None or A.validate_tool_call(label.tool_call) is not None:
            continue
        if tool_call_score(parsed.call, label.tool_call, label.bbox, label.bbox2) == 1.0:
            return 1.0
    return -0.5
