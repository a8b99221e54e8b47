"""The one adapter between action formats and the world's primitive events.

Every input the world accepts (a GUI-Libra :class:`actions.Action`, a UI-MOPD
:class:`actions.ToolCall`, or a model response in either text format) is turned into a
list of :class:`Event` here, and the expert's events are rendered back into both formats
here, so the two formats cannot drift apart.

Event points are in unit space ([0, 1] of the screenshot width / height).

GUI-Libra has no desktop-only action types, so desktop interactions are spelled with the
``value`` of a Click (the world's documented convention)::

    GUI-Libra                                  computer_use            mobile_use
    Click, value None ("left"/"single" too)    left_click              click
    Click, value "double"                      double_click            (none)
    Click, value "right"                       right_click             (none)
    LongPress                                  (none)                  long_press
    Write value, point p                       [click p] + type        [click p] + type
    KeyboardPress "ctrl+w" / "enter" / ...     key ["ctrl", "w"]       system_button Enter (enter only)
    Scroll "down" (point optional)             scroll pixels -5        (swipe; see Swipe)
    Swipe "up" from p (finger direction)       left_click_drag (no-op) swipe p -> p - 0.3 H
    NavigateBack / NavigateHome                (none)                  system_button Back / Home
    OpenApp "Mail"                             (none)                  (none)
    Answer / Terminate / Wait                  answer / terminate / wait (same on mobile)

Scroll directions name where the content moves the view: Scroll "down" reveals what is
below. Swipe directions name the finger: Swipe "up" also reveals what is below.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from guilibra_jax import actions as A
from guilibra_jax.choices import PLATFORMS  # noqa: F401 (the platforms, defined once)

SWIPE_FRACTION = 0.3          # swipe length as a fraction of the screen side
SCROLL_PIXELS = 5             # |pixels| of the computer_use scroll the expert writes
DIRECTIONS = ("up", "down", "left", "right")
_OPPOSITE = {"up": "down", "down": "up", "left": "right", "right": "left"}


@dataclasses.dataclass(frozen=True)
class Event:
    """A primitive input. kind: click, double_click, right_click, long_press, type,
    key, scroll, swipe, back, home, open_app, answer, wait, terminate, noop.
    ``text``: typed text, key combo, scroll direction, app name, answer, status."""

    kind: str
    point: tuple[float, float] | None = None
    point2: tuple[float, float] | None = None
    text: str | None = None


_KEY_ALIASES = {"return": "enter", "esc": "escape", "control": "ctrl", "cmd": "ctrl", "command": "ctrl",
                "meta": "ctrl", "super": "ctrl", "page_down": "pagedown", "pgdn": "pagedown",
                "pgdown": "pagedown", "page_up": "pageup", "pgup": "pageup", "option": "alt",
                "del": "delete"}
_MODIFIERS = ("ctrl", "alt", "shift")


def normalize_key(keys: str | Sequence[str]) -> str:
    """Canonical key combo: lower case, aliases folded, modifiers first ("ctrl+w")."""
    if isinstance(keys, str):
        parts = [p for p in keys.replace(" ", "+").split("+") if p]
    else:
        parts = [str(k) for k in keys]
    parts = [_KEY_ALIASES.get(p.strip().lower(), p.strip().lower()) for p in parts]
    mods = [m for m in _MODIFIERS if m in parts]
    rest = [p for p in parts if p not in _MODIFIERS]
    return "+".join(mods + rest)


def click_modifier(value: str | None) -> str | None:
    """The click kind a GUI-Libra Click's value asks for: None (single), "double", "right"."""
    v = (value or "").strip().lower()
    if v in ("double", "double_click", "doubleclick", "double click"):
        return "double"
    if v in ("right", "right_click", "rightclick", "right click"):
        return "right"
    return None


def terminate_status(value: str | None) -> str:
    v = (value or "").lower()
    return "failure" if any(w in v for w in ("fail", "infeasible", "impossible")) else "success"


def swipe_end(start: tuple[float, float], direction: str) -> tuple[float, float]:
    dx, dy = {"up": (0, -1), "down": (0, 1), "left": (-1, 0), "right": (1, 0)}[direction]
    x = min(1.0, max(0.0, start[0] + dx * SWIPE_FRACTION))
    y = min(1.0, max(0.0, start[1] + dy * SWIPE_FRACTION))
    return x, y


def swipe_direction(start: Sequence[float], end: Sequence[float]) -> str:
    dx, dy = end[0] - start[0], end[1] - start[1]
    if abs(dy) >= abs(dx):
        return "up" if dy < 0 else "down"
    return "left" if dx < 0 else "right"


def _direction(value: str | None) -> str | None:
    v = (value or "").strip().lower()
    return v if v in DIRECTIONS else None


# --------------------------------------------------------------------------------------
# GUI-Libra Action <-> events
# --------------------------------------------------------------------------------------

def events_from_action(action: A.Action, *, coord_space: str = "pixels",
                       image_size: Sequence[int] | None = None,
                       resized_size: Sequence[int] | None = None) -> list[Event]:
    """Events of a GUI-Libra action whose point is in ``coord_space`` ("pixels" of the
    screenshot, "unit", "norm1000" or "resized_pixels"). Unusable actions give [noop]."""
    p = None
    if action.point_2d is not None:
        p = A.to_unit(action.point_2d, coord_space, image_size=image_size, resized_size=resized_size)
    t, v = action.action_type, action.value
    if t == "Click":
        if p is None:
            return [Event("noop", text="Click without point_2d")]
        kind = {None: "click", "double": "double_click", "right": "right_click"}[click_modifier(v)]
        return [Event(kind, p)]
    if t == "LongPress":
        return [Event("long_press", p)] if p is not None else [Event("noop", text="LongPress without point")]
    if t == "Write":
        typed = [Event("type", text=v or "")]
        return ([Event("click", p)] + typed) if p is not None else typed
    if t == "Select":
        if p is None:
            return [Event("noop", text="Select without point")]
        return [Event("click", p), Event("select", text=v or "")]
    if t == "KeyboardPress":
        return [Event("key", text=normalize_key(v or ""))]
    if t == "Scroll":
        d = _direction(v)
        return [Event("scroll", p, text=d)] if d else [Event("noop", text=f"Scroll direction {v!r}")]
    if t == "Swipe":
        d = _direction(v)
        if d is None:
            return [Event("noop", text=f"Swipe direction {v!r}")]
        start = p if p is not None else (0.5, 0.5)
        return [Event("swipe", start, swipe_end(start, d))]
    simple = {"NavigateBack": "back", "NavigateHome": "home", "Wait": "wait"}
    if t in simple:
        return [Event(simple[t])]
    if t == "OpenApp":
        return [Event("open_app", text=v or "")]
    if t == "Answer":
        return [Event("answer", text=v or "")]
    if t == "Terminate":
        return [Event("terminate", text=terminate_status(v))]
    return [Event("noop", text=f"unknown action type {t!r}")]


def action_from_event(event: Event, description: str = "", target: str | None = None,
                      coord_space: str = "unit", image_size: Sequence[int] | None = None
                      ) -> A.Action:
    """The GUI-Libra action that performs ``event`` (point in ``coord_space``)."""
    def pt(p):
        if p is None:
            return None
        return A.from_unit(p, coord_space, image_size=image_size)
    k = event.kind
    if k in ("click", "double_click", "right_click"):
        value = {"click": None, "double_click": "double", "right_click": "right"}[k]
        return A.Action("Click", description, value, pt(event.point), target)
    table = {"long_press": "LongPress", "back": "NavigateBack", "home": "NavigateHome",
             "wait": "Wait"}
    if k in table:
        return A.Action(table[k], description, None, pt(event.point), target)
    if k == "type":
        return A.Action("Write", description, event.text, pt(event.point), target)
    if k == "key":
        return A.Action("KeyboardPress", description, event.text, None, target)
    if k == "scroll":
        return A.Action("Scroll", description, event.text, pt(event.point), target)
    if k == "swipe":
        return A.Action("Swipe", description, swipe_direction(event.point, event.point2),
                        pt(event.point), target)
    if k == "open_app":
        return A.Action("OpenApp", description, event.text, None, target)
    if k == "answer":
        return A.Action("Answer", description, event.text, None, target)
    if k == "terminate":
        return A.Action("Terminate", description, event.text or "success", None, target)
    raise ValueError(f"event kind {k!r} has no GUI-Libra action")


# --------------------------------------------------------------------------------------
# UI-MOPD ToolCall <-> events
# --------------------------------------------------------------------------------------

def _tool_unit(coord, tool: str) -> tuple[float, float]:
    size = A.TOOL_SCREEN_SIZE[tool]
    return float(coord[0]) / size, float(coord[1]) / size


def _tool_coord(p: Sequence[float], tool: str) -> list[int]:
    size = A.TOOL_SCREEN_SIZE[tool]
    return [int(round(p[0] * size)), int(round(p[1] * size))]


def events_from_tool_call(call: A.ToolCall, platform: str) -> list[Event]:
    """Events of a tool call. A call of the other platform's tool, or an invalid one,
    is a noop (the world does not guess)."""
    tool = A.TOOL_FOR_PLATFORM[platform]
    err = A.validate_tool_call(call)
    if err is not None:
        return [Event("noop", text=err)]
    if call.name != tool:
        return [Event("noop", text=f"tool {call.name!r} on the {platform} platform (expects {tool!r})")]
    a, args = call.action, call.arguments
    p = _tool_unit(args["coordinate"], tool) if "coordinate" in args else None
    if a in ("left_click", "click", "triple_click"):
        return [Event("click", p)]
    if a == "double_click":
        return [Event("double_click", p)]
    if a == "right_click":
        return [Event("right_click", p)]
    if a == "long_press":
        return [Event("long_press", p)]
    if a == "swipe":
        return [Event("swipe", p, _tool_unit(args["coordinate2"], tool))]
    if a == "left_click_drag":      # drags from the mouse position: nothing in this world
        return [Event("noop", text="left_click_drag has no effect in this world")]
    if a == "type":
        return [Event("type", text=args["text"])]
    if a == "key":
        return [Event("key", text=normalize_key(args["keys"]))]
    if a in ("scroll", "hscroll"):
        px = float(args["pixels"])
        d = ("up" if px > 0 else "down") if a == "scroll" else ("right" if px > 0 else "left")
        return [Event("scroll", p, text=d)]
    if a == "system_button":
        b = str(args["button"]).lower()
        return [{"back": Event("back"), "home": Event("home"), "enter": Event("key", text="enter")}
                .get(b, Event("noop", text=f"system button {args['button']!r} does nothing here"))]
    if a == "answer":
        return [Event("answer", text=args["text"])]
    if a == "terminate":
        return [Event("terminate", text=str(args["status"]).lower())]
    if a == "wait":
        return [Event("wait")]
    return [Event("noop", text=f"{tool}.{a} does nothing in this world")]


def tool_call_from_event(event: Event, platform: str) -> A.ToolCall | None:
    """The ``computer_use`` (desktop) / ``mobile_use`` (mobile) call that performs
    ``event``, or None when the platform's tool cannot express it."""
    tool = A.TOOL_FOR_PLATFORM[platform]
    k = event.kind

    def call(action, **kw):
        return A.ToolCall(tool, {"action": action, **kw})
    if platform == "desktop":
        clicks = {"click": "left_click", "double_click": "double_click", "right_click": "right_click"}
        if k in clicks:
            return call(clicks[k], coordinate=_tool_coord(event.point, tool))
        if k == "key":
            return call("key", keys=event.text.split("+"))
        if k == "scroll":
            if event.text not in ("up", "down"):
                return None
            px = SCROLL_PIXELS if event.text == "up" else -SCROLL_PIXELS
            kw = {"coordinate": _tool_coord(event.point, tool)} if event.point is not None else {}
            return call("scroll", pixels=px, **kw)
    else:
        if k in ("click", "long_press"):
            extra = {"time": 2} if k == "long_press" else {}
            return call(k, coordinate=_tool_coord(event.point, tool), **extra)
        if k == "swipe":
            return call("swipe", coordinate=_tool_coord(event.point, tool),
                        coordinate2=_tool_coord(event.point2, tool))
        if k in ("back", "home"):
            return call("system_button", button=k.capitalize())
        if k == "key":
            return call("system_button", button="Enter") if event.text == "enter" else None
    if k == "type":
        return call("type", text=event.text)
    if k == "answer":
        return call("answer", text=event.text)
    if k == "terminate":
        return call("terminate", status=event.text or "success")
    if k == "wait":
        return call("wait", time=1)
    return None


# --------------------------------------------------------------------------------------
# Tool call -> GUI-Libra action (for offline comparison in one vocabulary)
# --------------------------------------------------------------------------------------

def action_from_tool_call(call: A.ToolCall) -> A.Action | None:
    """The GUI-Libra action (point in unit space) equivalent to a tool call, or None
    when it has none (e.g. mouse_move). Platform-agnostic: a mobile swipe becomes Swipe."""
    if A.validate_tool_call(call) is not None:
        return None
    platform = "desktop" if call.name == "computer_use" else "mobile"
    a = call.action
    if a in ("mouse_move", "middle_click", "ask_user", "left_click_drag"):
        return None
    events = events_from_tool_call(call, platform)
    if len(events) != 1 or events[0].kind == "noop":
        return None
    return action_from_event(events[0])
