"""GUI-Libra web actions executed in a MiniWoB++ page.

    events = web_events(action, coord_space="pixels", image_size=(w, h))   # pure
    apply_event(browser, event)                                            # in the page

The web vocabulary (GUI-Libra's web platform: Click, Select, Write, KeyboardPress,
Scroll, Answer; plus Terminate and Wait) becomes the world's primitive
:class:`envs.adapter.Event` list (unit-space points), then real input in Chromium::

    Click p [value "double"/"right"]  pointer click at p (WebDriver actions: real mouse events)
    Write v at p                      click p, select the field's text, type v (replaces it,
                                      as Mind2Web's TYPE); without p: type v at the focus
    Select v at p                     the <select> under p (its ancestor, or the one hidden in a
                                      styled dropdown's wrapper) takes the option whose text is v
                                      (case and space folded); change/input fire
    KeyboardPress "enter"/"ctrl+a"    key down/up of the combo (modifiers held), at the focus
    Scroll d [at p]                   mouse wheel at p (default: the task's centre), 50 CSS px
    Answer / Terminate                end the episode (the page alone decides success)
    Wait                              nothing

LongPress, Swipe, NavigateBack/Home and OpenApp are not web actions: they are no-ops with
an error, like an unusable action (a Click without a point, an unknown key, a Select whose
option does not exist).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Sequence

from guilibra_jax import actions as A
from guilibra_jax.envs import adapter as AD
from guilibra_jax.envs.adapter import Event
from guilibra_jax.envs.miniwob.browser import TASK_HEIGHT, TASK_WIDTH

SCROLL_CSS_PIXELS = 50            # MiniWoB's own DEFAULT_SCROLL_AMOUNT
NOT_WEB = frozenset({"long_press", "swipe", "back", "home", "open_app"})
ENDS_EPISODE = frozenset({"answer", "terminate"})
SETTLE_TIMEOUT_S = 1.5


def web_events(action: A.Action, *, coord_space: str = "pixels", image_size: Sequence[int] | None = None,
               resized_size: Sequence[int] | None = None) -> list[Event]:
    """The events of a GUI-Libra action on the web (points in unit space)."""
    events = AD.events_from_action(action, coord_space=coord_space, image_size=image_size,
                                   resized_size=resized_size)
    kinds = [e.kind for e in events]
    if kinds == ["click", "select"]:          # a Select is one operation on the element under p
        return [Event("select", events[0].point, text=events[1].text)]
    if kinds == ["click", "type"]:            # Write at a point replaces the field's text
        return [events[0], Event("type", events[0].point, text=events[1].text)]
    bad = [e for e in events if e.kind in NOT_WEB]
    if bad:
        return [Event("noop", text=f"{action.action_type} is not a web action "
                                    f"(web: {', '.join(A.WEB_ACTION_TYPES)}, Terminate, Wait)")]
    return events


def css_point(p: Sequence[float]) -> tuple[float, float]:
    """Unit point -> CSS pixels of the viewport (the task region starts at its corner)."""
    return float(p[0]) * TASK_WIDTH, float(p[1]) * TASK_HEIGHT


def _inside(p: Sequence[float] | None) -> bool:
    return p is not None and 0.0 <= p[0] <= 1.0 and 0.0 <= p[1] <= 1.0


# WebDriver key names for the canonical combos of adapter.normalize_key.
_KEY_NAMES = {"enter": "ENTER", "tab": "TAB", "backspace": "BACKSPACE", "delete": "DELETE",
              "escape": "ESCAPE", "space": "SPACE", "up": "ARROW_UP", "down": "ARROW_DOWN",
              "left": "ARROW_LEFT", "right": "ARROW_RIGHT", "arrowup": "ARROW_UP",
              "arrowdown": "ARROW_DOWN", "arrowleft": "ARROW_LEFT", "arrowright": "ARROW_RIGHT",
              "pageup": "PAGE_UP", "pagedown": "PAGE_DOWN", "home": "HOME", "end": "END",
              "ctrl": "CONTROL", "alt": "ALT", "shift": "SHIFT"}


def webdriver_keys(combo: str) -> list[str] | None:
    """Selenium key codes of a canonical combo ("ctrl+a" -> [CONTROL, "a"]), None if unknown."""
    from selenium.webdriver.common.keys import Keys
    out = []
    for part in (combo or "").split("+"):
        if part in _KEY_NAMES:
            out.append(getattr(Keys, _KEY_NAMES[part]))
        elif len(part) == 1:
            out.append(part)
        else:
            return None
    return out or None


def _chain(browser):
    from selenium.webdriver.common.action_chains import ActionChains
    return ActionChains(browser.driver, duration=0)


def _pointer(browser, kind: str, p) -> str | None:
    if not _inside(p):
        return f"{kind} point {p} lies outside the screenshot"
    x, y = css_point(p)
    chain = _chain(browser)
    chain.w3c_actions.pointer_action.move_to_location(int(x), int(y))
    getattr(chain.w3c_actions.pointer_action,
            {"click": "click", "double_click": "double_click", "right_click": "context_click"}[kind])()
    chain.w3c_actions.perform()
    return None


def _type(browser, text: str, replace_at) -> str | None:
    if replace_at is not None:        # select the focused field's text so typing replaces it
        browser.js("var e = document.activeElement;"
                   "if (e && (e.tagName === 'INPUT' || e.tagName === 'TEXTAREA') && e.select) e.select();")
    chain = _chain(browser)
    for ch in text:
        chain.w3c_actions.key_action.key_down(ch)
        chain.w3c_actions.key_action.key_up(ch)
    chain.perform()
    return None


_SELECT_JS = """
var x = arguments[0], y = arguments[1], want = arguments[2];
var norm = function (s) { return String(s).replace(/\\s+/g, ' ').trim().toLowerCase(); };
var hit = document.elementFromPoint(x, y), e = hit;
while (e && e.tagName !== 'SELECT') e = e.parentElement;
// a styled dropdown (e.g. jQuery selectric) hides its <select> inside a wrapper under the point
for (var a = hit, k = 0; !e && a && k < 4; a = a.parentElement, k++) {
  var inner = a.querySelectorAll ? a.querySelectorAll('select') : [];
  if (inner.length === 1) e = inner[0];
}
if (!e) return 'no <select> element at the point';
for (var i = 0; i < e.options.length; i++) {
  if (norm(e.options[i].text) === norm(want) || norm(e.options[i].value) === norm(want)) {
    e.focus(); e.selectedIndex = i;
    e.dispatchEvent(new Event('input', {bubbles: true}));
    e.dispatchEvent(new Event('change', {bubbles: true}));
    if (window.jQuery && jQuery(e).data('selectric')) jQuery(e).selectric('refresh');
    return null;
  }
}
return 'the <select> at the point has no option ' + JSON.stringify(want);
"""


def _select(browser, p, value: str) -> str | None:
    if not _inside(p):
        return f"select point {p} lies outside the screenshot"
    x, y = css_point(p)
    return browser.js(_SELECT_JS, x, y, value or "")


def _key(browser, combo: str) -> str | None:
    keys = webdriver_keys(combo)
    if keys is None:
        return f"unknown key {combo!r}"
    chain = _chain(browser)
    for k in keys:
        chain.key_down(k)
    for k in reversed(keys):
        chain.key_up(k)
    chain.perform()
    return None


def _scroll(browser, p, direction: str) -> str | None:
    x, y = css_point(p) if _inside(p) else (TASK_WIDTH / 2, TASK_HEIGHT / 2 + 25)
    dx, dy = {"up": (0, -1), "down": (0, 1), "left": (-1, 0), "right": (1, 0)}[direction]
    chain = _chain(browser)
    chain.w3c_actions.wheel_action.scroll(x=int(x), y=int(y), delta_x=dx * SCROLL_CSS_PIXELS,
                                          delta_y=dy * SCROLL_CSS_PIXELS, duration=0)
    chain.w3c_actions.perform()
    return None


def apply_event(browser, event: Event) -> str | None:
    """Perform one event in the page; returns an error text, or None when it was performed."""
    k = event.kind
    if k in ("click", "double_click", "right_click"):
        return _pointer(browser, k, event.point)
    if k == "type":
        return _type(browser, event.text or "", event.point)
    if k == "select":
        return _select(browser, event.point, event.text or "")
    if k == "key":
        return _key(browser, event.text or "")
    if k == "scroll":
        return _scroll(browser, event.point, event.text or "down")
    if k in ("wait", "answer", "terminate"):
        return None
    if k == "noop":
        return event.text or "no-op"
    return f"event {k!r} has no web equivalent"


def settle(browser, timeout_s: float = SETTLE_TIMEOUT_S) -> None:
    """Wait for the page's jQuery animations (accordions, dialogs) to finish."""
    t_end = time.monotonic() + timeout_s
    while time.monotonic() < t_end:
        if not browser.js("return window.jQuery ? jQuery(':animated').length : 0;"):
            return
        time.sleep(0.03)


def as_dicts(events: Sequence[Event]) -> list[dict]:
    return [dataclasses.asdict(e) for e in events]
