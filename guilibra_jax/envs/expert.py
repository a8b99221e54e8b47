"""The expert: reads the world's state and demonstrates the next step.

Each :class:`ExpertStep` carries the demonstrated primitive event, its GUI-Libra action
and UI-MOPD tool call with the target element's box (the main label), the set of other
actions that are also correct in this state (alternatives, each with its own box and,
where the platform's tool can express it, its own tool call), a short reasoning text,
and the step's *intent*.

Intents whose action differs per platform (the behavioural conventions) and what each
platform's convention does::

    intent     desktop convention                   mobile convention
    open_app   double-click the app icon            tap the app icon (alt: OpenApp)
    back       click the window's close button      Back key
               (alt: KeyboardPress ctrl+w)
    home       (desktop plans never need it)        Home key (alt: Back on a root page)
    scroll     mouse wheel: Scroll down/up          swipe up/down on the list
               (alt: KeyboardPress pagedown/pageup)  (alt: Scroll down/up)
    context    right-click the item                 long-press the item

Other intents (click, menu, type, submit, answer, terminate) are the same on both
platforms; submit has the alternative KeyboardPress enter, focusing a field has the
alternative Write-at-the-field, opening a dropdown has the alternative Select, and a
toggle's row label toggles it as well as the switch.
"""

from __future__ import annotations

import dataclasses

from guilibra_jax import actions as A
from guilibra_jax.envs import adapter as AD
from guilibra_jax.envs import tasks as T
from guilibra_jax.envs.adapter import Event
from guilibra_jax.envs.ui import Element
from guilibra_jax.envs.world import Page, World

UnitBox = tuple[float, float, float, float]
CONVENTION_INTENTS = ("open_app", "back", "home", "scroll", "context")
# Intents a platform only accepts in its own convention, per response format: an agent
# following the other platform's convention fails a task whose expert plan contains one
# of them. In GUI-Libra format mobile also accepts a wheel-style Scroll, so scrolling is
# critical there on desktop only; mobile_use has no scroll action, so in tool-call format
# it is critical on both platforms.
CRITICAL_INTENTS = {
    ("desktop", "guilibra"): frozenset({"open_app", "back", "home", "scroll", "context"}),
    ("mobile", "guilibra"): frozenset({"open_app", "back", "home", "context"}),
    ("desktop", "tool_call"): frozenset({"open_app", "back", "home", "scroll", "context"}),
    ("mobile", "tool_call"): frozenset({"open_app", "back", "home", "scroll", "context"}),
}
OTHER_PLATFORM = {"desktop": "mobile", "mobile": "desktop"}
# Where a desktop close button sits; a desktop-convention agent clicks here to go back.
CLOSE_CORNER = (0.97, 0.02)


@dataclasses.dataclass(frozen=True)
class Demo:
    """One valid action: GUI-Libra action (point in unit space), tool call (or None
    when the platform's tool cannot express it) and target boxes in unit space."""

    action: A.Action
    tool_call: A.ToolCall | None = None
    bbox: UnitBox | None = None
    bbox2: UnitBox | None = None


@dataclasses.dataclass(frozen=True)
class ExpertStep:
    intent: str
    event: Event
    main: Demo
    alternatives: tuple[Demo, ...]
    reasoning: str
    element_id: str | None = None

    @property
    def description(self) -> str:
        return self.main.action.action_description


def _round_box(box) -> UnitBox:
    return tuple(round(float(v), 6) for v in box)


class Expert:
    """Demonstrations for one :class:`World` (``step()`` reads the current state)."""

    def __init__(self, world: World):
        self.w = world

    # -- builders -----------------------------------------------------------------------
    def _el(self, el_id: str) -> Element:
        for e in self.w.elements():
            if e.id == el_id:
                return e
        raise KeyError(f"expert: element {el_id!r} is not on screen")

    def _ubox(self, el: Element) -> UnitBox:
        return _round_box(el.unit_box(self.w.size))

    def _ucenter(self, el: Element) -> tuple[float, float]:
        cx, cy = el.center
        return round(cx / self.w.size[0], 6), round(cy / self.w.size[1], 6)

    def _demo(self, event: Event, desc: str, target: str | None = None, bbox=None, bbox2=None,
              tool: bool = True) -> Demo:
        action = AD.action_from_event(event, desc, target)
        call = AD.tool_call_from_event(event, self.w.platform) if tool else None
        return Demo(action, call, bbox, bbox2)

    def _step(self, intent, event, desc, why, el: Element | None = None, alts=(), bbox2=None
              ) -> ExpertStep:
        main = self._demo(event, desc, el.text if el else None,
                          self._ubox(el) if el is not None and event.point is not None else None, bbox2)
        if main.tool_call is None:
            raise AssertionError(f"expert event {event} has no {self.w.platform} tool call")
        return ExpertStep(intent, event, main, tuple(alts), why, el.id if el else None)

    def click(self, el_id: str, desc: str, why: str, intent: str = "click", alts=()) -> ExpertStep:
        el = self._el(el_id)
        return self._step(intent, Event("click", self._ucenter(el)), desc, why, el, alts)

    def back(self, why: str) -> ExpertStep:
        if self.w.platform == "desktop":
            el = self._el("close")
            alt = self._demo(Event("key", text="ctrl+w"), "Press Ctrl+W to close the window")
            return self._step("back", Event("click", self._ucenter(el)), "Close the window",
                              why, el, (alt,))
        return self._step("back", Event("back"), "Press Back", why)

    def home(self, why: str) -> ExpertStep:
        alts = ()
        if len(self.w.state.stack) == 1 and self.w.state.menu is None:
            alts = (self._demo(Event("back"), "Press Back"),)
        return self._step("home", Event("home"), "Go to the home screen", why, alts=alts)

    def open_app(self, app: str) -> ExpertStep:
        el = self._el(f"icon:{app}")
        why = f"The task needs the {app} app. Its icon is on the "
        if self.w.platform == "desktop":
            return self._step("open_app", Event("double_click", self._ucenter(el)),
                              f"Double-click the {app} icon", why + "desktop; a double-click opens it.", el)
        alt = self._demo(Event("open_app", text=app), f"Open {app}")
        return self._step("open_app", Event("click", self._ucenter(el)), f"Tap the {app} icon",
                          why + "home screen; tapping opens it.", el, (alt,))

    def scroll(self, direction: str, item: str) -> ExpertStep:
        (x1, y1, x2, y2), _ = self.w.list_geometry()
        W, H = self.w.size
        why = f"{item} is not visible in the list; it is further {direction}."
        key = "pagedown" if direction == "down" else "pageup"
        if self.w.platform == "desktop":
            alt = self._demo(Event("key", text=key), f"Press {key.capitalize()}")
            return self._step("scroll", Event("scroll", text=direction), f"Scroll {direction}",
                              why, alts=(alt,))
        h = y2 - y1
        lo = (x1 / W, (y1 + 0.6 * h) / H, x2 / W, y2 / H)           # lower 40% of the list
        hi = (x1 / W, y1 / H, x2 / W, (y1 + 0.4 * h) / H)           # upper 40%
        cx = (x1 + x2) / 2 / W
        s, e = ((y1 + 0.75 * h) / H, (y1 + 0.25 * h) / H)
        if direction == "up":
            lo, hi, s, e = hi, lo, e, s
        finger = "up" if direction == "down" else "down"
        event = Event("swipe", (round(cx, 6), round(s, 6)), (round(cx, 6), round(e, 6)))
        alt = self._demo(Event("scroll", text=direction), f"Scroll {direction}", tool=False)
        main = self._demo(event, f"Swipe {finger} on the list", None, _round_box(lo), _round_box(hi))
        return ExpertStep("scroll", event, main, (alt,), why, None)

    def terminate(self, why: str = "The task is done.") -> ExpertStep:
        return self._step("terminate", Event("terminate", text="success"), "Finish the task", why)

    # -- policy -------------------------------------------------------------------------
    def step(self) -> ExpertStep:
        w, t, st = self.w, self.w.task, self.w.state
        if t.kind != "answer" and w.goal_reached():
            return self.terminate()
        top = w.top
        if top is None or top.app != t.app:
            if st.menu is not None:
                return self._close_menu()
            if top is not None and w.platform == "mobile":
                return self.home(f"{top.app} is open but the task is in {t.app}; go home first.")
            return self.open_app(t.app)
        return getattr(self, f"_{t.kind}")()

    def _close_menu(self) -> ExpertStep:
        why = "A menu is open that the task does not need; close it."
        if self.w.platform == "desktop":
            return self._step("close_menu", Event("key", text="escape"), "Press Escape", why)
        return self._step("back", Event("back"), "Press Back", why)

    def _to_root(self) -> ExpertStep | None:
        """A step towards the app's root page with no menu, or None when there."""
        if self.w.state.menu is not None:
            return self._close_menu()
        if self.w.top.kind != "root":
            return self.back(f"This {self.w.top.kind} page is not needed; go back.")
        return None

    def _open_app(self) -> ExpertStep:
        return self._to_root() or self.terminate()

    def _toggle(self) -> ExpertStep:
        t = self.w.task
        return self._to_root() or self._toggle_click(t.setting, t.value)

    def _toggle_click(self, name: str, value: bool) -> ExpertStep:
        state = "on" if value else "off"
        why = f"{name} must be turned {state}; its switch is {'off' if value else 'on'}."
        row = self._el(f"row:{name}")
        alt = self._demo(Event("click", self._ucenter(row)), f"Click the {name} row", name,
                         self._ubox(row))
        return self.click(f"toggle:{name}", f"Turn {state} {name}", why, alts=(alt,))

    def _select(self) -> ExpertStep:
        t, menu = self.w.task, self.w.state.menu
        if menu is not None and menu.kind == "dropdown":
            return self.click(f"option:{t.value}", f"Choose {t.value}",
                              f"The Font list is open; choose {t.value}.")
        step = self._to_root()
        if step is not None:
            return step
        dd = self._el("dropdown:Font")
        alt = self._demo(Event("click", self._ucenter(dd)), f"Select {t.value} for Font", "Font",
                         self._ubox(dd), tool=False)
        alt = dataclasses.replace(alt, action=dataclasses.replace(alt.action, action_type="Select",
                                                                  value=t.value))
        return self.click("dropdown:Font", "Open the Font list",
                          f"Font is {self.w.state.font}; open its list to pick {t.value}.", alts=(alt,))

    def _app_menu(self, entry: str, why: str) -> ExpertStep:
        menu = self.w.state.menu
        if menu is not None and menu.kind == "app":
            return self.click(f"menu:{entry}", f"Click {entry}", f"The menu is open; choose {entry}.",
                              intent="menu")
        if menu is not None:
            return self._close_menu()
        label = self._el("menu_button").text
        return self.click("menu_button", f"Open the {label} menu", why, intent="menu")

    def _toggle_pref(self) -> ExpertStep:
        w, t = self.w, self.w.task
        top = w.top
        if w.state.prefs[t.app] != t.value:
            if top.kind == "prefs":
                return self._toggle_click(t.setting, t.value)
            if top.kind == "root":
                return self._app_menu("Prefs", f"{t.setting} is in {t.app}'s Prefs, under the menu.")
            return self._to_root()
        return self._to_root() or self.terminate()

    def _show_item(self) -> ExpertStep:
        """Steps to the detail page of the task's item (scroll, then click)."""
        w, t = self.w, self.w.task
        step = self._to_root()
        if step is not None:
            return step
        names = [i.name for i in w.state.items[t.app]]
        idx = names.index(t.item)
        first, last = w.visible_range(t.app)
        if idx >= last:
            return self.scroll("down", t.item)
        if idx < first:
            return self.scroll("up", t.item)
        return self.click(f"item:{t.item}", f"Open {t.item}", f"{t.item} is in the list; open it.")

    def _open_item(self) -> ExpertStep:
        return self._show_item()

    def _go_back(self) -> ExpertStep:
        return self._show_item()

    def _answer(self) -> ExpertStep:
        w, t = self.w, self.w.task
        if w.top == Page("detail", t.app, t.item) and w.state.menu is None:
            field = {"People": "Phone", "Mail": "Subject", "Files": "Size"}[t.app]
            el = self._el(f"text:{field}")
            return self._step("answer", Event("answer", text=t.value), f"Answer {t.value}",
                              f"The page shows {el.text}.")
        return self._show_item()

    def _create(self) -> ExpertStep:
        w, t, st = self.w, self.w.task, self.w.state
        top = w.top
        if top.kind == "form" and st.menu is None:
            label = T.CREATE_APPS[t.app]
            field = self._el(f"field:{label}")
            if not st.focus:
                alt = self._demo(Event("type", self._ucenter(field), text=t.item),
                                 f"Type {t.item} in {label}", label, self._ubox(field), tool=False)
                return self.click(f"field:{label}", f"Click the {label} field",
                                  f"The form is open; focus {label} to type.", alts=(alt,))
            if st.form_text == "":
                return self._step("type", Event("type", self._ucenter(field), text=t.item),
                                  f"Type {t.item}", f"{label} is focused; type {t.item}.", field)
            if st.form_text == t.item:
                alt = self._demo(Event("key", text="enter"), "Press Enter")
                return self.click("button:Save", "Click Save", f"{label} reads {t.item}; save it.",
                                  intent="submit", alts=(alt,))
            return self.back("The field holds the wrong text; discard the form.")
        if top.kind == "root":
            return self._app_menu("New", f"New entries are made from the {t.app} menu.")
        return self._to_root()

    def _delete(self) -> ExpertStep:
        w, t, st = self.w, self.w.task, self.w.state
        menu = st.menu
        if menu is not None and menu.kind == "context" and menu.item == t.item:
            return self.click("ctx:Delete", "Click Delete", f"The menu of {t.item} is open.",
                              intent="click")
        step = self._to_root()
        if step is not None:
            return step
        names = [i.name for i in st.items[t.app]]
        first, last = w.visible_range(t.app)
        idx = names.index(t.item)
        if idx >= last or idx < first:
            return self.scroll("down" if idx >= last else "up", t.item)
        el = self._el(f"item:{t.item}")
        why = f"{t.item} is in the list; open its menu to delete it."
        if w.platform == "desktop":
            return self._step("context", Event("right_click", self._ucenter(el)),
                              f"Right-click {t.item}", why, el)
        return self._step("context", Event("long_press", self._ucenter(el)),
                          f"Long-press {t.item}", why, el)


# --------------------------------------------------------------------------------------
# The other platform's convention
# --------------------------------------------------------------------------------------

def convention_event(step: ExpertStep, world: World, convention: str) -> Event:
    """The event an agent following ``convention`` ("desktop" / "mobile") performs for
    ``step``'s intent in ``world`` (same as the expert's for shared intents)."""
    if step.intent not in CONVENTION_INTENTS or convention == world.platform:
        return step.event
    el = None
    if step.element_id is not None:
        el = next(e for e in world.elements() if e.id == step.element_id)
    center = None
    if el is not None:
        cx, cy = el.center
        center = (cx / world.size[0], cy / world.size[1])
    if step.intent == "open_app":
        return Event("double_click" if convention == "desktop" else "click", center)
    if step.intent in ("back", "home"):
        if convention == "desktop":
            return Event("click", CLOSE_CORNER)
        return Event(step.intent)
    if step.intent == "scroll":
        direction = step.main.action.value if step.event.kind == "scroll" else \
            ("down" if step.event.point2[1] < step.event.point[1] else "up")
        if convention == "desktop":
            return Event("scroll", text=direction)
        (x1, y1, x2, y2), _ = world.list_geometry()
        W, H = world.size
        h = y2 - y1
        s, e = (y1 + 0.75 * h) / H, (y1 + 0.25 * h) / H
        if direction == "up":
            s, e = e, s
        return Event("swipe", ((x1 + x2) / 2 / W, s), ((x1 + x2) / 2 / W, e))
    if step.intent == "context":
        return Event("right_click" if convention == "desktop" else "long_press", center)
    raise AssertionError(step.intent)
