"""Action vocabularies, response parsing and rendering, coordinate spaces.

Two response formats are first-class (docs/method.md):

* GUI-Libra: an optional ``<think>`` (Qwen2.5) or ``<thinking>`` (Qwen3) block, then
  ``<answer>{"action_type", "action_description", "value", "point_2d"}</answer>``
  over 13 unified action types (:data:`GUILIBRA_ACTION_TYPES`).
* UI-MOPD: Qwen3-VL tool calls, ``<think>...</think>`` then ``Action: ...`` then
  ``<tool_call>{"name": "computer_use" | "mobile_use", "arguments": {...}}</tool_call>``.

Parsers never raise on any string: they report whether the format is valid, why not,
and whatever action could be recovered. Renderers produce the exact training target.

Coordinates. Qwen2.5-VL speaks absolute pixels of the smart-resized image
(``"resized_pixels"``); Qwen3-VL speaks 0-1000 normalised coordinates (``"norm1000"``).
Rewards and evaluators work in the canonical ``"unit"`` space ([0, 1] relative to the
image width / height); :func:`to_unit` and :func:`from_unit` convert.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any, Literal, Mapping, Sequence

# --------------------------------------------------------------------------------------
# GUI-Libra vocabulary
# --------------------------------------------------------------------------------------

GUILIBRA_ACTION_TYPES: tuple[str, ...] = (
    "Click", "Write", "Terminate", "Swipe", "Scroll", "NavigateHome", "Answer", "Wait",
    "OpenApp", "NavigateBack", "KeyboardPress", "LongPress", "Select",
)
MOBILE_ACTION_TYPES: tuple[str, ...] = (
    "Answer", "Click", "Write", "LongPress", "Scroll", "Swipe", "Wait", "NavigateHome",
    "NavigateBack", "OpenApp", "Terminate",
)
WEB_ACTION_TYPES: tuple[str, ...] = ("Click", "Select", "Write", "KeyboardPress", "Scroll", "Answer")
PLATFORM_ACTION_TYPES: dict[str, tuple[str, ...]] = {"mobile": MOBILE_ACTION_TYPES, "web": WEB_ACTION_TYPES}

# Actions whose demo carries a point (grounding) and actions whose value is compared.
POINT_ACTION_TYPES = frozenset({"Click", "LongPress", "Write", "Select", "Swipe", "Scroll"})
VALUE_ACTION_TYPES = frozenset(
    {"Write", "Select", "Scroll", "Swipe", "OpenApp", "Terminate", "Answer", "KeyboardPress", "Wait"})

# (action_target, value, point_2d, explanation) shown per action in the system prompt.
_PROMPT_SPEC: dict[str, tuple[str, str, str, str]] = {
    "Click": ("Element description", "None", "[x, y]",
              "Tap or click a specific UI element and provide its coordinates"),
    "Write": ("Element description or None", "Text to enter", "[x, y] or None",
              "Enter text into a specific input field or at the current focus if coordinate is None"),
    "Select": ("Element description", "Option to select", "[x, y]",
               "Select an option from a dropdown or list element"),
    "LongPress": ("Element description", "None", "[x, y]",
                  "Press and hold on a specific UI element"),
    "Swipe": ("Element description or None", '"up" | "down" | "left" | "right"', "[x, y] or None",
              "Swipe from the given point (or the screen centre) in the given direction"),
    "Scroll": ("None", '"up" | "down" | "left" | "right"', "None",
               "Scroll a view or container in the specified direction"),
    "Answer": ("None", "Answer text", "None", "Return the final answer to the user's question"),
    "KeyboardPress": ("None", 'Key name (e.g., "enter")', "None", "Press a specific key on the keyboard"),
    "Wait": ("None", "Number of seconds", "None",
             "Pause execution for a specified duration to allow UI updates"),
    "NavigateHome": ("None", "None", "None", "Navigate to the device's home screen"),
    "NavigateBack": ("None", "None", "None", 'Press the system "Back" button'),
    "OpenApp": ("None", "The name of the App", "None", "Launch an app by its name"),
    "Terminate": ("None", "End-task message", "None",
                  "Signal the end of the current task with a final message"),
}

NOT_APPLICABLE_POINT = (-100, -100)
REQUIRED_ANSWER_KEYS = frozenset({"action_type", "action_description", "value", "point_2d"})
OPTIONAL_ANSWER_KEYS = frozenset({"action_target"})


def _norm_key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


_ALIASES: dict[str, str] = {_norm_key(t): t for t in GUILIBRA_ACTION_TYPES}
_ALIASES.update({
    "type": "Write", "input": "Write", "inputtext": "Write", "typing": "Write", "text": "Write",
    "tap": "Click", "leftclick": "Click", "press": "Click",
    "longclick": "LongPress", "longtap": "LongPress", "longpress": "LongPress",
    "back": "NavigateBack", "goback": "NavigateBack", "navigateback": "NavigateBack",
    "home": "NavigateHome", "gohome": "NavigateHome", "navigatehome": "NavigateHome",
    "openapp": "OpenApp", "launch": "OpenApp", "launchapp": "OpenApp", "open": "OpenApp",
    "key": "KeyboardPress", "keypress": "KeyboardPress", "keyboard": "KeyboardPress",
    "hotkey": "KeyboardPress", "presskey": "KeyboardPress", "keyboardenter": "KeyboardPress",
    "status": "Terminate", "finish": "Terminate", "done": "Terminate", "stop": "Terminate",
    "complete": "Terminate", "selectoption": "Select", "dropdown": "Select",
    "drag": "Swipe", "fling": "Swipe", "sleep": "Wait", "reply": "Answer",
})


def normalize_action_type(name: Any) -> str | None:
    """Canonical GUI-Libra action type for ``name`` (aliases such as type->Write,
    tap->Click), or None when it is not a known action."""
    if not isinstance(name, str):
        return None
    return _ALIASES.get(_norm_key(name))


def action_prompt_line(action_type: str) -> str:
    """The system-prompt line for one action type, as in GUI-Libra's release."""
    target, value, point, why = _PROMPT_SPEC[action_type]
    return (f"action_type: {action_type}, action_target: {target}, value: {value}, "
            f"point_2d: {point}\n    ## Explanation: {why}")


def action_space_prompt(platform: str) -> str:
    """The action list of the system prompt for ``platform`` ("mobile" or "web")."""
    if platform not in PLATFORM_ACTION_TYPES:
        raise ValueError(f"unknown GUI-Libra platform {platform!r}; expected one of "
                         f"{sorted(PLATFORM_ACTION_TYPES)}")
    return "\n\n".join(action_prompt_line(t) for t in PLATFORM_ACTION_TYPES[platform])


@dataclasses.dataclass(frozen=True)
class Action:
    """A GUI-Libra action. ``point_2d`` is in whatever space the producer states (a
    model's own space when parsed; the caller converts); None when not applicable."""

    action_type: str
    action_description: str = ""
    value: str | None = None
    point_2d: tuple[float, float] | None = None
    action_target: str | None = None

    def to_json_dict(self, include_target: bool = False) -> dict[str, Any]:
        point = NOT_APPLICABLE_POINT if self.point_2d is None else self.point_2d
        d: dict[str, Any] = {
            "action_type": self.action_type,
            "action_description": self.action_description,
            "value": "None" if self.value is None else self.value,
            "point_2d": [_int_if_whole(point[0]), _int_if_whole(point[1])],
        }
        if include_target:
            d["action_target"] = "None" if self.action_target is None else self.action_target
        return d


def _int_if_whole(x: float) -> int | float:
    return int(x) if float(x).is_integer() else float(x)


@dataclasses.dataclass(frozen=True)
class ParsedResponse:
    """Result of :func:`parse_response`.

    ``format_ok`` is the strict release format: optional think block, then one
    ``<answer>`` JSON object with exactly action_type, action_description, value and
    point_2d (action_target allowed), a known action type, and a finite point.
    ``action`` is recovered leniently and may be set even when ``format_ok`` is False.
    """

    format_ok: bool
    reasoning: str | None
    action: Action | None
    error: str | None = None


_THINK_RE = re.compile(r"^\s*<(think|thinking)>(.*?)</\1>\s*", re.DOTALL)
_OPEN_THINK_RE = re.compile(r"^\s*<(think|thinking)>")
_CLOSE_THINK_RE = re.compile(r"</(think|thinking)>")


def reopen_think(text: str, think_opened: bool = True) -> str:
    """The response as the model wrote it when the prompt already opened the think block
    (Qwen3-VL-*-Thinking chat templates end the generation prompt with ``<think>\\n``):
    a text without an opening tag but with a closing one gets the matching opening tag
    back. Anything else (or ``think_opened`` False) is returned unchanged."""
    if not think_opened or _OPEN_THINK_RE.match(text):
        return text
    m = _CLOSE_THINK_RE.search(text)
    return text if m is None else f"<{m.group(1)}>" + text
_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_TAG_RE = re.compile(r"</?(think|thinking|answer)>")


def _reject_constant(name: str) -> None:
    raise ValueError(f"non-finite number {name} in JSON")


def _loads_strict(text: str) -> Any:
    """json.loads that rejects NaN/Infinity instead of accepting them."""
    return json.loads(text, parse_constant=_reject_constant)


def _coerce_point(raw: Any) -> tuple[tuple[float, float] | None, str | None]:
    """(point or None, error). [-100, -100], None, "None" and [] mean not applicable."""
    if raw is None or raw == [] or (isinstance(raw, str) and raw.strip().lower() in ("none", "")):
        return None, None
    if isinstance(raw, str):  # "[12, 34]" or "(12, 34)"
        nums = re.findall(r"-?\d+(?:\.\d+)?", raw)
        if len(nums) != 2:
            return None, f"point_2d string {raw[:40]!r} does not hold two numbers"
        raw = [float(n) for n in nums]
    if not isinstance(raw, (list, tuple)) or len(raw) != 2:
        return None, f"point_2d must be [x, y], got {str(raw)[:40]}"
    out = []
    for v in raw:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return None, f"point_2d coordinate {str(v)[:20]!r} is not a number"
        if not math.isfinite(v) or abs(v) > 1e9:
            return None, f"point_2d coordinate {v!r} is not finite"
        out.append(float(v))
    if tuple(out) == tuple(float(c) for c in NOT_APPLICABLE_POINT):
        return None, None
    return (out[0], out[1]), None


def _coerce_text(raw: Any) -> str | None:
    if raw is None:
        return None
    if isinstance(raw, bool):
        return str(raw).lower()
    if isinstance(raw, (int, float, str)):
        s = str(raw)
        return None if s.strip().lower() == "none" else s
    return json.dumps(raw, ensure_ascii=False)


def action_from_dict(d: Mapping[str, Any]) -> tuple[Action | None, str | None]:
    """Build a normalised :class:`Action` from a JSON answer dict: (action, error)."""
    action_type = normalize_action_type(d.get("action_type"))
    if action_type is None:
        return None, f"unknown action_type {str(d.get('action_type'))[:40]!r}"
    point, err = _coerce_point(d.get("point_2d"))
    desc = d.get("action_description")
    action = Action(
        action_type=action_type,
        action_description=desc if isinstance(desc, str) else "",
        value=_coerce_text(d.get("value")),
        point_2d=point,
        action_target=_coerce_text(d.get("action_target")),
    )
    return action, err


def parse_response(text: str, *, think_opened: bool = False) -> ParsedResponse:
    """Parse a GUI-Libra model response. Never raises on a string. ``think_opened``: the
    prompt opened the think block, so the response may lack its opening tag
    (:func:`reopen_think`)."""
    if not isinstance(text, str):
        raise TypeError(f"parse_response expects str, got {type(text).__name__}")
    text = reopen_think(text, think_opened)
    reasoning = None
    rest = text
    think = _THINK_RE.match(text)
    if think:
        reasoning = think.group(2).strip()
        rest = text[think.end():]
    answers = _ANSWER_RE.findall(rest)
    if not answers:
        return ParsedResponse(False, reasoning, None, "no <answer>...</answer> block")
    body = answers[-1].strip()
    try:
        obj = _loads_strict(body)
    except (ValueError, RecursionError) as e:
        return ParsedResponse(False, reasoning, None, f"answer is not valid JSON: {str(e)[:80]}")
    if not isinstance(obj, dict):
        return ParsedResponse(False, reasoning, None, "answer JSON is not an object")
    action, err = action_from_dict(obj)
    if err is None:
        keys = set(obj)
        missing = REQUIRED_ANSWER_KEYS - keys
        extra = keys - REQUIRED_ANSWER_KEYS - OPTIONAL_ANSWER_KEYS
        if missing:
            err = f"answer misses keys {sorted(missing)}"
        elif extra:
            err = f"answer has unexpected keys {sorted(extra)[:5]}"
    if err is None:
        stripped = rest.strip()
        if not (stripped.startswith("<answer>") and stripped.endswith("</answer>")) or len(answers) != 1:
            err = "text outside the think block and the single <answer> block"
        elif _TAG_RE.search(reasoning or "") or _TAG_RE.search(body):
            err = "nested think/answer tags"
        elif not think and _TAG_RE.search(stripped[len("<answer>"):-len("</answer>")]):
            err = "nested think/answer tags"
    return ParsedResponse(err is None, reasoning, action, err)


Family = Literal["qwen2_5_vl", "qwen3_vl"]
THINK_TAG: dict[str, str] = {"qwen2_5_vl": "think", "qwen3_vl": "thinking"}


def render_answer_json(action: Action, include_target: bool = False) -> str:
    """The JSON text inside ``<answer>``: keys in release order, point_2d last."""
    return json.dumps(action.to_json_dict(include_target), ensure_ascii=False)


def render_response(action: Action, reasoning: str | None = None, family: Family = "qwen2_5_vl",
                    include_target: bool = False) -> str:
    """Exact GUI-Libra training target: ``<think>c</think><answer>{json}</answer>``
    (``<thinking>`` for Qwen3 family); direct-action samples (reasoning None) have no
    think block. ``action.point_2d`` must already be in the family's coordinate space."""
    if family not in THINK_TAG:
        raise ValueError(f"unknown model family {family!r}; expected one of {sorted(THINK_TAG)}")
    answer = f"<answer>{render_answer_json(action, include_target)}</answer>"
    if reasoning is None:
        return answer
    tag = THINK_TAG[family]
    return f"<{tag}>{reasoning}</{tag}>{answer}"


# --------------------------------------------------------------------------------------
# UI-MOPD tool-call vocabulary (Qwen3-VL computer_use / mobile_use)
# --------------------------------------------------------------------------------------

# action -> required argument names.
COMPUTER_USE_ACTIONS: dict[str, tuple[str, ...]] = {
    "key": ("keys",), "type": ("text",), "mouse_move": ("coordinate",),
    "left_click": ("coordinate",), "left_click_drag": ("coordinate",),
    "right_click": ("coordinate",), "middle_click": ("coordinate",),
    "double_click": ("coordinate",), "triple_click": ("coordinate",),
    "scroll": ("pixels",), "hscroll": ("pixels",), "wait": ("time",),
    "terminate": ("status",), "answer": ("text",),
}
MOBILE_USE_ACTIONS: dict[str, tuple[str, ...]] = {
    "click": ("coordinate",), "long_press": ("coordinate",),
    "swipe": ("coordinate", "coordinate2"), "type": ("text",), "answer": ("text",),
    "ask_user": ("text",), "system_button": ("button",), "wait": ("time",),
    "terminate": ("status",),
}
TOOL_ACTIONS: dict[str, dict[str, tuple[str, ...]]] = {
    "computer_use": COMPUTER_USE_ACTIONS, "mobile_use": MOBILE_USE_ACTIONS}
TOOL_FOR_PLATFORM: dict[str, str] = {"desktop": "computer_use", "mobile": "mobile_use"}
SYSTEM_BUTTONS = ("Back", "Home", "Menu", "Enter")
TERMINATE_STATUSES = ("success", "failure")
# Coordinate range the system prompt announces: desktop 1000x1000, mobile 999x999.
TOOL_SCREEN_SIZE: dict[str, int] = {"computer_use": 1000, "mobile_use": 999}


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One Qwen3-VL tool call: ``{"name": ..., "arguments": {"action": ..., ...}}``."""

    name: str
    arguments: Mapping[str, Any]

    @property
    def action(self) -> str:
        return str(self.arguments.get("action", ""))

    def to_json_dict(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": dict(self.arguments)}


@dataclasses.dataclass(frozen=True)
class ParsedToolCall:
    """Result of :func:`parse_tool_call_response`. ``call`` is set when a tool call
    with a known tool name and action could be read, ``format_ok`` when moreover its
    required arguments are present and well-typed and the layout is right."""

    format_ok: bool
    reasoning: str | None
    thought: str | None
    action_text: str | None
    call: ToolCall | None
    error: str | None = None


_TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_THOUGHT_RE = re.compile(r"^\s*Thought:\s*(.*?)\s*(?=^\s*Action:|<tool_call>|\Z)", re.DOTALL | re.MULTILINE)
_ACTION_LINE_RE = re.compile(r"^\s*Action:\s*(.*?)\s*$", re.MULTILINE)


def _is_coord(v: Any) -> bool:
    return (isinstance(v, (list, tuple)) and len(v) == 2
            and all(isinstance(c, (int, float)) and not isinstance(c, bool)
                    and math.isfinite(c) and abs(c) < 1e9 for c in v))


def validate_tool_call(call: ToolCall) -> str | None:
    """None when ``call`` is a well-formed action of its tool, else the reason."""
    actions = TOOL_ACTIONS.get(call.name)
    if actions is None:
        return f"unknown tool {call.name!r}; expected one of {sorted(TOOL_ACTIONS)}"
    if call.action not in actions:
        return f"unknown {call.name} action {call.action[:40]!r}"
    for arg in actions[call.action]:
        if arg not in call.arguments:
            return f"{call.name}.{call.action} misses argument {arg!r}"
        v = call.arguments[arg]
        if arg.startswith("coordinate") and not _is_coord(v):
            return f"{call.name}.{call.action} argument {arg} is not [x, y]: {str(v)[:40]}"
        if arg == "keys" and not (isinstance(v, list) and v and all(isinstance(k, str) for k in v)):
            return f"{call.name}.key argument keys must be a non-empty list of strings"
        if arg in ("text", "status", "button") and not isinstance(v, str):
            return f"{call.name}.{call.action} argument {arg} must be a string"
        if arg in ("pixels", "time") and (isinstance(v, bool) or not isinstance(v, (int, float))
                                          or not math.isfinite(v)):
            return f"{call.name}.{call.action} argument {arg} must be a finite number"
    if "coordinate" in call.arguments and not _is_coord(call.arguments["coordinate"]):
        return f"{call.name}.{call.action} argument coordinate is not [x, y]"
    return None


def parse_tool_call_response(text: str, *, think_opened: bool = False) -> ParsedToolCall:
    """Parse a UI-MOPD (Qwen3-VL tool call) response. Never raises on a string.
    ``think_opened``: the prompt opened the think block (Qwen3-VL-*-Thinking), so the
    response may lack ``<think>`` (:func:`reopen_think`)."""
    if not isinstance(text, str):
        raise TypeError(f"parse_tool_call_response expects str, got {type(text).__name__}")
    text = reopen_think(text, think_opened)
    reasoning = None
    rest = text
    think = _THINK_RE.match(text)
    if think:
        reasoning = think.group(2).strip()
        rest = text[think.end():]
    pre = rest.split("<tool_call>", 1)[0]
    thought_m = _THOUGHT_RE.search(pre)
    thought = thought_m.group(1) if thought_m and thought_m.group(1) else None
    action_m = _ACTION_LINE_RE.search(pre)
    action_text = action_m.group(1) if action_m else None
    calls = _TOOL_CALL_RE.findall(rest)
    if not calls:
        return ParsedToolCall(False, reasoning, thought, action_text, None, "no <tool_call> block")
    try:
        obj = _loads_strict(calls[0].strip())
    except (ValueError, RecursionError) as e:
        return ParsedToolCall(False, reasoning, thought, action_text, None,
                              f"tool call is not valid JSON: {str(e)[:80]}")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) \
            or not isinstance(obj.get("arguments"), dict):
        return ParsedToolCall(False, reasoning, thought, action_text, None,
                              "tool call must be {\"name\": str, \"arguments\": {...}}")
    call = ToolCall(obj["name"], obj["arguments"])
    err = validate_tool_call(call)
    if err is not None and (call.name not in TOOL_ACTIONS or call.action not in TOOL_ACTIONS[call.name]):
        return ParsedToolCall(False, reasoning, thought, action_text, None, err)
    if err is None and len(calls) != 1:
        err = "more than one <tool_call> block"
    if err is None and rest.rstrip().endswith("</tool_call>") is False:
        err = "text after </tool_call>"
    if err is None and _TAG_RE.search(reasoning or ""):
        err = "nested think tags"
    return ParsedToolCall(err is None, reasoning, thought, action_text, call, err)


def render_tool_call_response(call: ToolCall, reasoning: str | None = None,
                              action_text: str | None = None, thought: str | None = None) -> str:
    """Exact UI-MOPD training target::

        <think>\\nreasoning\\n</think>\\n[Thought: ...\\n]Action: ...\\n<tool_call>\\n{json}\\n</tool_call>
    """
    err = validate_tool_call(call)
    if err is not None:
        raise ValueError(f"cannot render an invalid tool call: {err}")
    parts = []
    if reasoning is not None:
        parts.append(f"<think>\n{reasoning}\n</think>\n")
    if thought is not None:
        parts.append(f"Thought: {thought}\n")
    if action_text is not None:
        parts.append(f"Action: {action_text}\n")
    parts.append(f"<tool_call>\n{json.dumps(call.to_json_dict(), ensure_ascii=False)}\n</tool_call>")
    return "".join(parts)


# --------------------------------------------------------------------------------------
# Coordinates
# --------------------------------------------------------------------------------------

CoordSpace = Literal["unit", "norm1000", "resized_pixels", "pixels"]
FAMILY_COORD_SPACE: dict[str, str] = {"qwen2_5_vl": "resized_pixels", "qwen3_vl": "norm1000"}
# Patch size times spatial merge size: the factor both image sides are rounded to.
FAMILY_RESIZE_FACTOR: dict[str, int] = {"qwen2_5_vl": 28, "qwen3_vl": 32}


def smart_resize(height: int, width: int, factor: int = 28, min_pixels: int = 56 * 56,
                 max_pixels: int = 14 * 14 * 4 * 1280) -> tuple[int, int]:
    """(height, width) of the resized image: both divisible by ``factor``, area in
    [min_pixels, max_pixels], aspect ratio kept. Equal to transformers'
    ``qwen2_vl.image_processing_qwen2_vl.smart_resize`` for the same arguments."""
    if min(height, width) <= 0:
        raise ValueError(f"image size must be positive, got {height}x{width}")
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"absolute aspect ratio must be smaller than 200, got "
                         f"{max(height, width) / min(height, width)}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def _space_size(space: str, image_size: Sequence[int] | None, resized_size: Sequence[int] | None
                ) -> tuple[float, float]:
    """(width, height) of a coordinate space."""
    if space == "unit":
        return 1.0, 1.0
    if space == "norm1000":
        return 1000.0, 1000.0
    if space == "pixels":
        if image_size is None:
            raise ValueError("coordinate space 'pixels' needs image_size=(width, height)")
        return float(image_size[0]), float(image_size[1])
    if space == "resized_pixels":
        if resized_size is None:
            raise ValueError("coordinate space 'resized_pixels' needs resized_size=(width, height)")
        return float(resized_size[0]), float(resized_size[1])
    raise ValueError(f"unknown coordinate space {space!r}; expected unit, norm1000, "
                     f"resized_pixels or pixels")


def to_unit(point: Sequence[float], space: str, *, image_size: Sequence[int] | None = None,
            resized_size: Sequence[int] | None = None) -> tuple[float, float]:
    """Convert a point from ``space`` to the canonical unit space. Sizes are (width, height)."""
    w, h = _space_size(space, image_size, resized_size)
    return float(point[0]) / w, float(point[1]) / h


def from_unit(point: Sequence[float], space: str, *, image_size: Sequence[int] | None = None,
              resized_size: Sequence[int] | None = None, round_to_int: bool = True
              ) -> tuple[float, float]:
    """Convert a unit-space point to ``space``; integer coordinates by default, as
    models write them."""
    w, h = _space_size(space, image_size, resized_size)
    x, y = float(point[0]) * w, float(point[1]) * h
    if round_to_int and space != "unit":
        return float(round(x)), float(round(y))
    return x, y


def resized_size_for(image_size: Sequence[int], family: str, *, min_pixels: int | None = None,
                     max_pixels: int | None = None) -> tuple[int, int]:
    """(width, height) a family's image processor resizes an image of ``image_size``
    = (width, height) to."""
    kw = {}
    if min_pixels is not None:
        kw["min_pixels"] = min_pixels
    if max_pixels is not None:
        kw["max_pixels"] = max_pixels
    h, w = smart_resize(int(image_size[1]), int(image_size[0]), FAMILY_RESIZE_FACTOR[family], **kw)
    return w, h
