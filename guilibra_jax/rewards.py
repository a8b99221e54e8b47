"""Verifier rewards: pure functions on response text and a demo :class:`Target`.

* :func:`guilibra_reward`: GUI-Libra's partially verifiable step reward
  (docs/method.md): ``total = w_fmt * format + (1 - w_fmt) * accuracy`` with
  ``accuracy = r_act * r_val * r_g``.
* :func:`mopd_reward`: UI-MOPD's task reward on Qwen3-VL tool calls (docs/method.md):
  1.0 for a full match (main or alternative label), -0.5 for a partial one, -1.0 when
  either side cannot be parsed or the action is unknown.

Geometry in a :class:`Target` is in the canonical unit space ([0, 1] of the image
width / height); a response's coordinates are converted with :mod:`actions`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any, Literal, Sequence

from guilibra_jax import actions as A
from guilibra_jax import choices as CH

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
    is_grounding: a grounding-only step (GUI-Libra RL data's ``answer.is_grounding``),
    which the release's format rule wants answered without reasoning.
    """

    action_type: str
    value: str | None = None
    point: tuple[float, float] | None = None
    bbox: Box | None = None
    bbox2: Box | None = None
    image_size: tuple[int, int] | None = None
    tool_call: A.ToolCall | None = None
    alternatives: tuple["Target", ...] = ()
    is_grounding: bool = False

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


def box_distance(point: Sequence[float], box: Sequence[float]) -> float:
    """Euclidean distance from ``point`` to the nearest point of ``box`` (0 inside or on it)."""
    x, y = float(point[0]), float(point[1])
    x1, y1, x2, y2 = map(float, box)
    return math.hypot(max(x1 - x, 0.0, x - x2), max(y1 - y, 0.0, y - y2))


NEAR_MISS_WEIGHT = 0.5   # a shaped miss earns at most half of a hit (grounding_score)


def grounding_score(pred_point: Sequence[float] | None, target: Target, *, point_tolerance: float = 0.05,
                    strict_box: bool = False, sigma: float = 0.0) -> float:
    """1 when :func:`grounding_match`; else 0, or with ``sigma`` > 0 (unit space) the shaped
    credit of a near miss, ``NEAR_MISS_WEIGHT * exp(-d^2 / (2 sigma^2))`` where d is the
    point's distance to the demo box (to the tolerance disc around the demo point when only
    a point is known). Not the paper's reward (binary); a miss never reaches 1."""
    if grounding_match(pred_point, target, point_tolerance=point_tolerance, strict_box=strict_box):
        return 1.0
    if sigma <= 0 or pred_point is None or len(pred_point) != 2 \
            or not all(math.isfinite(float(v)) for v in pred_point):
        return 0.0
    if target.bbox is not None:
        d = box_distance(pred_point, target.bbox)
    elif target.point is not None:
        d = max(point_distance(pred_point, target.point) - point_tolerance, 0.0)
    else:
        return 0.0
    return NEAR_MISS_WEIGHT * math.exp(-0.5 * (d / sigma) ** 2)


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
                    point_tolerance: float, grounding_sigma: float = 0.0) -> tuple[float, float, float]:
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
        r_g = grounding_score(unit_point, target, point_tolerance=point_tolerance,
                              strict_box=value_rule == "release", sigma=grounding_sigma)
    return r_act, r_val, r_g


FORMAT_RULES = CH.REWARD_RULES   # GRPO format rules (guilibra_jax/choices.py)
_ANSWER_SPAN_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ANSWER_KEYS = ("action_type", "action_description", "value", "point_2d")


def release_format_score(response_text: str, *, think_tag: str = "think", is_grounding: bool = False) -> float:
    """GUI-Libra's released format reward (EasyR1 ``examples/reward_function/r1gui.py`` and
    ``r1gui_qwen3vl.py``: ``r1gui_format_reward`` and ``compute_score``), 1.0 or 0.0:

    * the whole text is ``[<tag>...</tag>\\s*]<answer>...</answer>`` (``$`` allows one
      trailing newline), with ``<think>`` for Qwen2.5-VL and ``<thinking>`` for Qwen3-VL only;
    * the first answer block is a JSON object (``json.loads``; the release's regex fallback
      never matches, its coordinate pattern does not compile) holding at least action_type,
      action_description and value as strings and point_2d as two integers or "none"
      (any case); the action type need not be known, extra keys are allowed;
    * a step that is not grounding-only must carry reasoning (both tags anywhere in the
      text) and a grounding-only step must not.
    """
    outer = re.compile(rf"^(?:<{think_tag}>.*?</{think_tag}>\s*)?<answer>.*?</answer>$", re.DOTALL)
    score = 1.0
    m = _ANSWER_SPAN_RE.search(response_text)
    if not outer.match(response_text) or m is None:
        score = 0.0
    else:
        try:
            obj = json.loads(m.group(1).strip())
        except (ValueError, RecursionError):
            obj = None
        if not isinstance(obj, dict) or not all(k in obj for k in _ANSWER_KEYS):
            score = 0.0
        elif not all(isinstance(obj[k], str) for k in _ANSWER_KEYS[:3]):
            score = 0.0
        else:
            point = obj["point_2d"]
            if isinstance(point, list):
                score = float(len(point) == 2 and all(isinstance(v, int) for v in point))
            elif isinstance(point, str):
                score = float(point.lower() == "none")
            else:
                score = 0.0
    uses_reasoning = f"<{think_tag}>" in response_text and f"</{think_tag}>" in response_text
    if uses_reasoning == is_grounding:
        return 0.0
    return score


def guilibra_reward(response_text: str, target: Target, *, coord_space: str = "norm1000",
                    resized_size: Sequence[int] | None = None, w_fmt: float = 0.1,
                    value_rule: Literal["paper", "release"] = "paper",
                    point_tolerance: float = 0.05, format_rule: Literal["paper", "release"] = "paper",
                    think_tag: str = "think", think_opened: bool = False,
                    grounding_sigma: float = 0.0) -> GuiLibraReward:
    """GUI-Libra step reward of one response against its demo.

    coord_space: the space the model writes point_2d in ("norm1000" for Qwen3-VL,
    "resized_pixels" for Qwen2.5-VL, which then needs ``resized_size`` = (w, h)).
    format_rule: "paper" (the output parses: optional think block, one ``<answer>`` JSON
    with exactly the four keys, a known action type, a finite point;
    ``actions.parse_response``) or "release" (:func:`release_format_score`, which needs
    ``think_tag``: "think" for Qwen2.5-VL, "thinking" for Qwen3-VL, and uses
    ``target.is_grounding``). think_opened: the prompt opened the think block, so the
    response may lack its opening tag (it is put back before scoring). grounding_sigma:
    0 (the paper: a point scores 1 inside the demo box, else 0) or the width of
    :func:`grounding_score`'s credit for near misses (accuracy stays below 1 on a miss).
    Alternatives in ``target`` are tried when the main label does not give accuracy 1.
    Never raises on any response string.
    """
    if format_rule not in FORMAT_RULES:
        raise ValueError(f"unknown format rule {format_rule!r}; expected one of {FORMAT_RULES}")
    response_text = A.reopen_think(response_text, think_opened)
    parsed = A.parse_response(response_text)
    if format_rule == "release":
        r_fmt = release_format_score(response_text, think_tag=think_tag, is_grounding=target.is_grounding)
    else:
        r_fmt = float(parsed.format_ok)
    best = (0.0, 0.0, 0.0)
    if parsed.action is not None:
        unit_point = None
        if parsed.action.point_2d is not None:
            unit_point = A.to_unit(parsed.action.point_2d, coord_space,
                                   image_size=target.image_size, resized_size=resized_size)
        for label in (target, *target.alternatives):
            parts = _accuracy_parts(parsed.action, unit_point, label, value_rule, point_tolerance, grounding_sigma)
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
                    bbox2: Box | None = None, *, check_tool_name: bool = True) -> float:
    """UI-MOPD sub-score in [0, 1] of a parsed prediction against one label, by the
    label's action (docs/method.md; the "strict" rule). Boxes are in unit space of the tool's
    screen. ``check_tool_name``: the type point also needs the same tool name."""
    act = label.action
    type_ok = float((pred.name == label.name or not check_tool_name) and pred.action == act)
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


# ----------------------------------------------------------------- the release's rule
# Label actions the release's reward dispatches on (verl/ui_mopd/reward/gui_agent.py,
# MOBILE_REWARD_FUNCS / DESKTOP_REWARD_FUNCS); any other label action scores -1.0 there:
# mobile ``ask_user`` and desktop ``answer`` among them.
RELEASE_MOPD_ACTIONS: dict[str, frozenset[str]] = {
    "mobile_use": frozenset({"click", "long_press", "swipe", "type", "answer", "system_button", "wait",
                             "terminate"}),
    "computer_use": frozenset({"left_click", "right_click", "middle_click", "double_click", "triple_click",
                               "mouse_move", "left_click_drag", "type", "key", "scroll", "hscroll", "wait",
                               "terminate"}),
}
MOPD_RULES = CH.MOPD_REWARD_RULES   # (guilibra_jax/choices.py)
_RELEASE_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


class _ReleaseRaises(Exception):
    """Where the release's reward code raises: its caller scores the sample -1.0."""


def release_tool_call(text: str) -> dict | None:
    """The release's parse: the first ``<tool_call>...</tool_call>`` anywhere in the text
    (think block included), plain ``json.loads``, ``arguments`` a dict holding
    ``action``; returned flattened as {"name", **arguments}. None when that fails."""
    m = _RELEASE_CALL_RE.search(text)
    if not m:
        return None
    try:
        obj = json.loads(m.group(1).strip())
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict):
        raise _ReleaseRaises("tool call JSON is not an object")   # the release calls .get on it
    args = obj.get("arguments", {})
    if not isinstance(args, dict) or "action" not in args:
        return None
    return {"name": obj.get("name", ""), **args}


def _release_in_box(coord: Any, box: Box, size: int) -> bool:
    """The release's position_in_bbox (inclusive, either corner order) on the tool's own
    coordinates; ``box`` is in unit space of the label's ``size`` x ``size`` screen."""
    if not coord:
        return False
    try:
        n = len(coord)
        if n != 2:
            return False
        x, y = coord[0], coord[1]
        x1, y1, x2, y2 = (c * size for c in box)
        return min(x1, x2) - 1e-9 <= x <= max(x1, x2) + 1e-9 and min(y1, y2) - 1e-9 <= y <= max(y1, y2) + 1e-9
    except (TypeError, KeyError, IndexError) as e:
        raise _ReleaseRaises(str(e)) from None


def _release_point(pred: dict, label: dict, key: str, box: Box | None, size: int) -> bool:
    if box is not None and key in pred:
        return _release_in_box(pred[key], box, size)
    if box is None and key in pred and key in label:
        return pred[key] == label[key]
    return False


def _sign(v: Any) -> int:
    return (v > 0) - (v < 0)


def release_tool_call_score(pred: dict, label: A.ToolCall, bbox: Box | None = None, bbox2: Box | None = None,
                            *, check_tool_name: bool = False) -> float:
    """The release's sub-score of a flattened prediction (:func:`release_tool_call`) against
    a label whose action it dispatches on. Differences from :func:`tool_call_score`: no
    argument schema (a missing text equals a missing text), button and status compared
    case-sensitively, a scroll label without box or coordinate can never earn its point,
    points compared on the label tool's own coordinates. Raises :class:`_ReleaseRaises`
    where the release's code raises."""
    lab = {"name": label.name, **label.arguments}
    act = label.action
    type_ok = float(pred.get("action") == act and (pred.get("name") == label.name or not check_tool_name))
    size = A.TOOL_SCREEN_SIZE[label.name]
    if act in ("click", "long_press", "left_click", "right_click", "middle_click", "double_click",
               "triple_click", "mouse_move", "left_click_drag"):
        return (type_ok + _release_point(pred, lab, "coordinate", bbox, size)) / 2
    if act == "swipe":
        return (type_ok + _release_point(pred, lab, "coordinate", bbox, size)
                + _release_point(pred, lab, "coordinate2", bbox2, size)) / 3
    if act in ("type", "answer"):
        same = str(pred.get("text", "")).strip().lower() == str(lab.get("text", "")).strip().lower()
        return (type_ok + same) / 2
    if act == "key":
        p, l = pred.get("keys", []), lab.get("keys", [])
        same = False
        if isinstance(p, list) and isinstance(l, list):
            try:
                same = {k.lower() for k in p} == {k.lower() for k in l}
            except AttributeError as e:
                raise _ReleaseRaises(str(e)) from None
        return (type_ok + same) / 2
    if act in ("scroll", "hscroll"):
        point = _release_point(pred, lab, "coordinate", bbox, size)
        try:
            same_sign = _sign(pred.get("pixels", 0)) == _sign(lab.get("pixels", 0))
        except (TypeError, ValueError):
            same_sign = False
        return (type_ok + point + same_sign) / 3
    if act in ("system_button", "terminate"):
        key = "button" if act == "system_button" else "status"
        return (type_ok + (pred.get(key) == lab.get(key))) / 2
    return type_ok  # wait


def _release_single(text: str, label: Target, check_tool_name: bool) -> float:
    call = label.tool_call
    if call is None or call.action not in RELEASE_MOPD_ACTIONS.get(call.name, ()):
        return -1.0
    try:
        pred = release_tool_call(text)
        if pred is None:
            return -1.0
        raw = release_tool_call_score(pred, call, label.bbox, label.bbox2, check_tool_name=check_tool_name)
    except _ReleaseRaises:
        return -1.0
    return 1.0 if raw == 1.0 else -0.5


def mopd_reward(response_text: str, target: Target, *, rule: Literal["strict", "release"] = "strict",
                check_tool_name: bool | None = None, think_opened: bool = False) -> float:
    """UI-MOPD task reward: 1.0 if the response's tool call fully matches the label
    (or an alternative label), -0.5 if it does not, -1.0 as below. ``target.tool_call``
    must be set.

    rule "strict" (ours): -1.0 when the response has no tool call of a known tool and
    action with well-formed arguments (our parser's schema), or the label is not a valid
    call; every label action is scored (ask_user and desktop answer by their text); a
    scroll label without box or coordinate needs no point; button / status compare
    case-insensitively.
    rule "release" (``verl/ui_mopd/reward/gui_agent.py::compute_score``): -1.0 only when
    no ``<tool_call>`` JSON with an ``action`` can be read, the label's action is not one
    the release scores (mobile ``ask_user``, desktop ``answer``: always -1.0 unless an
    alternative scores 1.0), or the release's code would raise on the prediction (e.g.
    a non-list coordinate against a box); a call naming an unknown action or missing
    arguments scores -0.5 like any partial match. Alternatives are tried only for 1.0.
    check_tool_name: the type point also needs the label's tool name (computer_use vs
    mobile_use); default True for "strict", False for "release" (the release compares
    the action alone). think_opened: the prompt opened the think block (Qwen3-VL-Thinking
    chat templates), so a response may lack ``<think>`` (strict rule's parser).
    """
    if rule not in MOPD_RULES:
        raise ValueError(f"unknown MOPD reward rule {rule!r}; expected one of {MOPD_RULES}")
    if target.tool_call is None:
        raise ValueError("mopd_reward needs Target.tool_call (the UI-MOPD label)")
    if rule == "release":
        check = False if check_tool_name is None else check_tool_name
        reward = _release_single(response_text, target, check)
        if reward != 1.0:
            for alt in target.alternatives:
                if _release_single(response_text, alt, check) == 1.0:
                    return 1.0
        return reward
    check = True if check_tool_name is None else check_tool_name
    if A.validate_tool_call(target.tool_call) is not None:
        return -1.0
    parsed = A.parse_tool_call_response(response_text, think_opened=think_opened)
    if parsed.call is None or A.validate_tool_call(parsed.call) is not None:
        return -1.0
    for label in (target, *target.alternatives):
        if label.tool_call is None or A.validate_tool_call(label.tool_call) is not None:
            continue
        if tool_call_score(parsed.call, label.tool_call, label.bbox, label.bbox2, check_tool_name=check) == 1.0:
            return 1.0
    return -0.5
