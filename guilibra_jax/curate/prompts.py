"""The curation prompts and how their answers are read: pure text functions.

* action: the model's own training prompt (``data.samples.prompt_turns``), so that
  re-prediction asks exactly what the model learned to answer.
* box: a grounding request for the step's ``action_target`` in the family's coordinate
  space (Qwen2.5-VL: absolute pixels of the image the model sees; Qwen3-VL: 0-1000),
  answered the way Qwen-VL models ground: ``{"bbox_2d": [x1, y1, x2, y2]}``.
* reasoning: the screenshot, instruction, history and the *gold* action; the answer is
  a think block followed by the action in the training format, which is parsed and
  checked against the label (a response that contradicts it is rejected).

A :class:`Frame` is how a sampler shows the image: its coordinate space and the
(width, height) of the resized image that space may refer to.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Sequence

from guilibra_jax import actions as A
from guilibra_jax.data import prompts as P
from guilibra_jax.data import samples as S
from guilibra_jax.data.native import StepRecord

KINDS = ("action", "box", "reasoning")


@dataclasses.dataclass(frozen=True)
class Frame:
    """coord_space: an ``actions`` space ("resized_pixels", "norm1000", ...);
    resized: (width, height) of the image as the model sees it."""

    coord_space: str
    resized: tuple[int, int]


@dataclasses.dataclass(frozen=True)
class Prompt:
    """One request: system and user text (the user turn holds one ``<image>``), the
    record it is about (its image is the screenshot) and the frame the text refers to."""

    kind: str
    system: str
    user: str
    record: StepRecord
    frame: Frame


# ----------------------------------------------------------------------------- action

def action_prompt(record: StepRecord, spec: S.SampleSpec, frame: Frame) -> Prompt:
    """The training prompt of ``record`` (the text ``make_sample`` builds)."""
    system, user = S.prompt_turns(record, spec, frame.resized)
    return Prompt("action", system, user, record, frame)


# ----------------------------------------------------------------------------- box

BOX_TEMPLATE = ('Locate the UI element "{target}" in this screenshot and output its bounding box in JSON '
                'format: {{"bbox_2d": [x1, y1, x2, y2]}}, with {frame}.')
_FRAME_TEXT = {
    "resized_pixels": "absolute pixel coordinates of this {w}x{h} image",
    "pixels": "absolute pixel coordinates of this {w}x{h} image",
    "norm1000": "coordinates from 0 to 1000 relative to the image width and height",
    "unit": "coordinates from 0 to 1 relative to the image width and height",
}


def box_target_text(record: StepRecord, fallback: str = "action_description") -> str | None:
    """What to ground: the target's ``action_target``, else (``fallback``) its
    ``action_description``; None when neither is there."""
    t = record.target
    for text in (t.action_target, t.action_description if fallback == "action_description" else None):
        if text and text.strip() and text.strip().lower() != "none":
            return text.strip()
    return None


def box_prompt(record: StepRecord, target: str, frame: Frame, template: str = BOX_TEMPLATE) -> Prompt:
    """A grounding request for ``target`` in ``frame``'s coordinate space."""
    w, h = frame.resized
    frame_text = _FRAME_TEXT[frame.coord_space].format(w=w, h=h)
    try:
        text = template.format(target=target, frame=frame_text)
    except (KeyError, IndexError, ValueError) as e:
        raise ValueError(f"box.prompt template {template!r} is invalid ({e!r}); it may use {{target}} and "
                         "{frame} (write literal braces as {{ }})") from None
    return Prompt("box", P.DEFAULT_SYSTEM, P.IMAGE_PLACEHOLDER + "\n" + text, record, frame)


_NUM = r"(-?\d+(?:\.\d+)?)"
_SEP = r"\s*,\s*"
_BOX_KEY_RE = re.compile(r'"?bbox(?:_2d)?"?\s*[:=]\s*[\[(]\s*' + _SEP.join([_NUM] * 4) + r"\s*[\])]")
_BOX_LIST_RE = re.compile(r"\[\s*" + _SEP.join([_NUM] * 4) + r"\s*\]")
_BOX_PAIRS_RE = re.compile(r"\(\s*" + _NUM + _SEP + _NUM + r"\s*\)\s*,?\s*\(\s*" + _NUM + _SEP + _NUM + r"\s*\)")


def parse_box(text: str | None, frame: Frame) -> tuple[float, float, float, float] | None:
    """The box (x1, y1, x2, y2) in unit space of a grounding answer written in
    ``frame``'s space: ``"bbox_2d": [x1, y1, x2, y2]``, else the first list of four
    numbers, else ``(x1,y1),(x2,y2)``. None when no box is found or it is not a box
    (x1 >= x2 or y1 >= y2, not finite, entirely outside the image); corners are clipped
    to the image."""
    if not text:
        return None
    m = _BOX_KEY_RE.search(text) or _BOX_LIST_RE.search(text) or _BOX_PAIRS_RE.search(text)
    if m is None:
        return None
    x1, y1, x2, y2 = (float(g) for g in m.groups())
    if not all(math.isfinite(v) for v in (x1, y1, x2, y2)) or x1 >= x2 or y1 >= y2:
        return None
    (ux1, uy1), (ux2, uy2) = (A.to_unit(p, frame.coord_space, resized_size=frame.resized)
                              for p in ((x1, y1), (x2, y2)))
    if ux2 <= 0 or uy2 <= 0 or ux1 >= 1 or uy1 >= 1:
        return None
    clip = lambda v: min(1.0, max(0.0, v))  # noqa: E731
    return clip(ux1), clip(uy1), clip(ux2), clip(uy2)


def render_box(box_unit: Sequence[float], frame: Frame) -> str:
    """A grounding answer for a unit-space box, as a Qwen-VL model writes it (the oracle's)."""
    (x1, y1), (x2, y2) = (A.from_unit(p, frame.coord_space, resized_size=frame.resized)
                          for p in (box_unit[:2], box_unit[2:]))
    nums = [int(v) if float(v).is_integer() else round(v, 4) for v in (x1, y1, x2, y2)]
    return json.dumps([{"bbox_2d": nums, "label": "target"}])


# ----------------------------------------------------------------------------- reasoning

REASONING_SYSTEM = (
    "You write the reasoning of a GUI agent on a {platform}. You see a screenshot of the screen, the user's "
    "task, the actions taken so far and the correct next action. Explain, step by step and as the agent "
    "thinking aloud, what the screen shows and why this action is the right next step; do not mention that "
    "the action was given to you. Then write the action exactly as given.\n"
    "Answer in this format:\n{format}")
_GUILIBRA_FORMAT = "<think>your reasoning</think><answer>{the action JSON}</answer>"
_MOPD_FORMAT = "<think>\nyour reasoning\n</think>\nAction: a short description\n<tool_call>\n{the tool call JSON}\n</tool_call>"


def gold_action_text(record: StepRecord, method: str, frame: Frame) -> str:
    """The label as the model would write it: the answer JSON (GUI-Libra, point in the
    frame's space, action_target included) or the tool call (UI-MOPD)."""
    if method == "mopd":
        if record.target.tool_call is None:
            raise ValueError("missing field target.tool_call: method 'mopd' needs a tool-call label")
        return json.dumps(record.target.tool_call.to_json_dict(), ensure_ascii=False)
    action = record.target.action(frame.coord_space, image_size=record.image_size, resized_size=frame.resized)
    return A.render_answer_json(action, include_target=True)


def reasoning_prompt(record: StepRecord, method: str, frame: Frame) -> Prompt:
    """The augmentation request: screenshot, instruction, history and the gold action."""
    fmt = _MOPD_FORMAT if method == "mopd" else _GUILIBRA_FORMAT
    system = REASONING_SYSTEM.format(platform=record.platform, format=fmt)
    user = (f"{P.IMAGE_PLACEHOLDER}\nScreenshot size: {frame.resized[0]}x{frame.resized[1]}\n\n"
            f"Instruction: {record.instruction}\n\nInteraction History: {P.guilibra_history(record.history)}\n\n"
            f"Correct next action: {gold_action_text(record, method, frame)}")
    return Prompt("reasoning", system, user, record, frame)


def response_reasoning(text: str, method: str) -> str | None:
    """The think block of a response in ``method``'s format (None: none or empty)."""
    parsed = A.parse_tool_call_response(text) if method == "mopd" else A.parse_response(text)
    r = parsed.reasoning
    return r.strip() if r and r.strip() else None
