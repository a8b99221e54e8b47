"""Offline step metrics of model responses on native step records (docs/method.md).

A response is in either format (detected by a ``<tool_call>`` block): GUI-Libra
``<answer>`` JSON (point_2d in ``coord_space``) or a UI-MOPD tool call (its tool's
0-1000 / 0-999 space). Both are compared in one vocabulary, GUI-Libra actions with unit
points (tool calls through :func:`envs.adapter.action_from_tool_call`).

Per step, against the main label only:

* action-type accuracy: the predicted action type equals the label's;
* step success: the type matches and
    - Click / LongPress: the point lies inside the target box (within 0.05 of the
      target point when there is no box); a Click's modifier (value None / "double" /
      "right") must also match;
    - Write: same text (case-insensitive, whitespace-normalised) and, when the response
      gives a point, it lies inside the box (a point-less Write types at the focus);
    - Select: point inside the box and the same option;
    - Swipe: same direction and the start (the point, or the screen centre) inside the box;
    - Scroll: same direction; KeyboardPress: same key combo; OpenApp / Answer: same
      text; Terminate: same status; NavigateBack / NavigateHome / Wait: type alone;
* grounding accuracy, over grounding steps only (label Click, LongPress, Select or
  Swipe with a box): the response's point lies inside the box, whatever its type.

A response wrong against the main label may still match one of the step's valid
alternatives: ``alternative_match_rate`` is that share of the wrong responses, and
``step_success_any`` counts a step correct when it matches the main label or any
alternative. Alternatives are misses for ``step_success`` (partial verifiability).
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Iterable, Sequence

from guilibra_jax import actions as A
from guilibra_jax import rewards as R
from guilibra_jax.data import native as N
from guilibra_jax.envs import adapter as AD

GROUNDING_TYPES = frozenset({"Click", "LongPress", "Select", "Swipe"})
POINT_TOLERANCE = 0.05


@dataclasses.dataclass(frozen=True)
class Prediction:
    """A parsed response: GUI-Libra action with its point in unit space (None when
    nothing could be read), the detected format and the parse error."""

    action: A.Action | None
    format: str                 # "guilibra" | "tool_call"
    error: str | None = None


def parse_prediction(text: str, image_size: Sequence[int], coord_space: str = "norm1000",
                     resized_size: Sequence[int] | None = None) -> Prediction:
    if "<tool_call>" in text:
        parsed = A.parse_tool_call_response(text)
        if parsed.call is None:
            return Prediction(None, "tool_call", parsed.error)
        action = AD.action_from_tool_call(parsed.call)
        err = None if action is not None else f"tool call {parsed.call.action!r} has no equivalent"
        return Prediction(action, "tool_call", err)
    parsed = A.parse_response(text)
    if parsed.action is None:
        return Prediction(None, "guilibra", parsed.error)
    a = parsed.action
    if a.point_2d is not None:
        unit = A.to_unit(a.point_2d, coord_space, image_size=image_size, resized_size=resized_size)
        a = dataclasses.replace(a, point_2d=unit)
    return Prediction(a, "guilibra", None)


def _norm_text(s: str | None) -> str:
    return " ".join((s or "").lower().split())


def _in_target(point, target: N.StepTarget) -> bool:
    if point is None:
        return False
    if target.bbox is not None:
        return R.point_in_box(point, target.bbox)
    if target.point is not None:
        return R.point_distance(point, target.point) <= POINT_TOLERANCE
    return True


def grounding_step(target: N.StepTarget) -> bool:
    return target.action_type in GROUNDING_TYPES and target.bbox is not None


def action_matches(pred: A.Action, target: N.StepTarget) -> bool:
    """Whether ``pred`` (unit-space point) performs ``target`` (rules in the module doc)."""
    t = target.action_type
    if pred.action_type != t:
        return False
    p = pred.point_2d
    if t == "Click":
        return _in_target(p, target) and AD.click_modifier(pred.value) == AD.click_modifier(target.value)
    if t == "LongPress":
        return _in_target(p, target)
    if t == "Write":
        return _norm_text(pred.value) == _norm_text(target.value) and (p is None or _in_target(p, target))
    if t == "Select":
        return _in_target(p, target) and _norm_text(pred.value) == _norm_text(target.value)
    if t == "Swipe":
        start = p if p is not None else (0.5, 0.5)
        return (_norm_text(pred.value) == _norm_text(target.value)
                and (target.bbox is None or R.point_in_box(start, target.bbox)))
    if t == "Scroll":
        return _norm_text(pred.value) == _norm_text(target.value)
    if t == "KeyboardPress":
        return AD.normalize_key(pred.value or "") == AD.normalize_key(target.value or "")
    if t in ("OpenApp", "Answer"):
        return _norm_text(pred.value) == _norm_text(target.value)
    if t == "Terminate":
        return AD.terminate_status(pred.value) == AD.terminate_status(target.value)
    return True     # NavigateBack, NavigateHome, Wait


@dataclasses.dataclass(frozen=True)
class StepOutcome:
    platform: str
    action_type: str            # the label's
    format: str
    parsed: bool
    type_match: bool
    grounding_step: bool
    grounding_ok: bool
    step_success: bool
    alternative_match: bool     # wrong against the main label, right against an alternative


def score_step(record: N.StepRecord, response: str, coord_space: str = "norm1000",
               resized_size: Sequence[int] | None = None) -> StepOutcome:
    pred = parse_prediction(response, record.image_size, coord_space, resized_size)
    a, target = pred.action, record.target
    ok = a is not None and action_matches(a, target)
    gstep = grounding_step(target)
    alt = (not ok and a is not None and any(action_matches(a, alt) for alt in record.alternatives))
    return StepOutcome(
        platform=record.platform, action_type=target.action_type, format=pred.format,
        parsed=a is not None, type_match=a is not None and a.action_type == target.action_type,
        grounding_step=gstep,
        grounding_ok=gstep and a is not None and a.point_2d is not None
        and R.point_in_box(a.point_2d, target.bbox),
        step_success=ok, alternative_match=alt)


def _mean(xs: list[bool]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def summarize(outcomes: Sequence[StepOutcome]) -> dict[str, Any]:
    g = [o.grounding_ok for o in outcomes if o.grounding_step]
    wrong = [o for o in outcomes if not o.step_success]
    return {
        "n": len(outcomes),
        "parse_rate": _mean([o.parsed for o in outcomes]),
        "action_type_accuracy": _mean([o.type_match for o in outcomes]),
        "grounding_accuracy": _mean(g), "n_grounding": len(g),
        "step_success": _mean([o.step_success for o in outcomes]),
        "step_success_any": _mean([o.step_success or o.alternative_match for o in outcomes]),
        "n_wrong": len(wrong),
        "alternative_match_rate": _mean([o.alternative_match for o in wrong]),
    }


def _groups(outcomes: Sequence[StepOutcome], key: Callable[[StepOutcome], str]) -> dict[str, Any]:
    keys = sorted({key(o) for o in outcomes})
    return {k: summarize([o for o in outcomes if key(o) == k]) for k in keys}


def resized_size_of(resized_size: Any, size: tuple[int, int], platform: str | None) -> Sequence[int] | None:
    """``resized_size`` itself, or its value for an image of ``size``: a function of
    (size, platform) gets both (the platform picks the pixel budget, ``data.images.
    PixelBudgets``), a function of the size alone gets the size."""
    if not callable(resized_size):
        return resized_size
    try:
        params = list(inspect.signature(resized_size).parameters.values())
    except (TypeError, ValueError):
        return resized_size(size)
    takes_two = len(params) >= 2 or any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
    return resized_size(size, platform) if takes_two else resized_size(size)


def evaluate_offline(records: Sequence[N.StepRecord], responses: Iterable[str],
                     coord_space: str = "norm1000",
                     resized_size: Sequence[int] | Callable[..., Sequence[int]] | None = None
                     ) -> dict[str, Any]:
    """Metrics of ``responses`` (aligned with ``records``): overall, per platform, per
    label action type, and per (platform, action type); ``steps``: each record's outcome
    (trajectory, step, platform, step success), for paired resampling. ``resized_size`` (for
    coord_space "resized_pixels") is one (w, h) or a function of the image size, or of
    (image size, platform) (:func:`resized_size_of`)."""
    responses = list(responses)
    if len(responses) != len(records):
        raise ValueError(f"evaluate_offline: {len(records)} records but {len(responses)} responses")
    outcomes = []
    for rec, resp in zip(records, responses):
        rs = resized_size_of(resized_size, tuple(rec.image_size), rec.platform)
        outcomes.append(score_step(rec, resp, coord_space, rs))
    return {
        "overall": summarize(outcomes),
        "by_platform": _groups(outcomes, lambda o: o.platform),
        "by_action_type": _groups(outcomes, lambda o: o.action_type),
        "by_platform_action_type": _groups(outcomes, lambda o: f"{o.platform}/{o.action_type}"),
        "by_format": _groups(outcomes, lambda o: o.format),
        "steps": [{"trajectory_id": r.trajectory_id, "step": r.step, "platform": o.platform,
                   "step_success": o.step_success} for r, o in zip(records, outcomes)],
    }

