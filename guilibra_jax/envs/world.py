"""The world's state, its layout per platform, and how primitive events change it.

Navigation is one stack of pages for the open app (empty: the desktop / home screen).
Desktop draws the top page as a window (title bar, red close button, a "File" menu
bar on the app's root window) to the right of a column of desktop icons; mobile draws
it full screen under a status bar and an app bar (with a "Menu" button on the root
page). Sub-pages (detail, form, prefs) are child windows on desktop and pushed
screens on mobile, so "go back" is closing a window on desktop and the Back key on
mobile.

What each platform accepts (anything else is a no-op that leaves the state as is):

    event         desktop                                mobile
    click         icon: select it; else press element    icon: open the app; else press
    double_click  icon: open the app; else as click      (no-op: not a touch gesture here)
    right_click   list item: context menu                (no-op)
    long_press    (no-op)                                list item: context menu
    scroll        active list (or the list under point)  same (a semantic scroll)
    swipe         (no-op: dragging does nothing)         vertical swipe on the list scrolls
    key           enter: submit form; ctrl+w: close      enter: submit form
                  window; escape: close menu;
                  pagedown/pageup: scroll
    back / home   (no-op: no system keys)                pop page (root -> home) / home
    open_app      (no-op: no launcher)                   open the app by name
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from guilibra_jax.envs import tasks as T
from guilibra_jax.envs.adapter import Event
from guilibra_jax.envs.ui import Element, draw

DEFAULT_SCREEN_SIZE = {"desktop": (128, 96), "mobile": (96, 128)}
REALISTIC_SCREEN_SIZE = {"desktop": (1920, 1080), "mobile": (1080, 2400)}
_BASE = DEFAULT_SCREEN_SIZE
ROW = 13            # list / settings row height, design units
PAGE_KINDS = ("root", "detail", "form", "prefs")


@dataclasses.dataclass(frozen=True)
class Page:
    kind: str                 # root | detail | form | prefs
    app: str
    item: str | None = None   # detail: the item shown


@dataclasses.dataclass
class Menu:
    kind: str                 # app | context | dropdown
    items: tuple[str, ...]
    anchor: tuple[int, int, int, int]
    item: str | None = None   # context: the list item it acts on


@dataclasses.dataclass
class State:
    """Everything that changes during an episode (deep-copied from the task's content)."""

    items: dict[str, list[T.Item]]
    settings: dict[str, bool]
    font: str
    prefs: dict[str, bool]
    stack: list[Page]
    scroll: dict[str, int]                # list app -> first visible row
    menu: Menu | None = None
    focus: bool = False                   # form field focused
    form_text: str = ""
    selected_icon: str | None = None      # desktop single-click selection
    answer: str | None = None
    terminated: str | None = None         # terminate status


def initial_state(task: T.Task) -> State:
    c = task.content
    st = State(items={a: list(v) for a, v in c.items.items()}, settings=dict(c.settings),
               font=c.font, prefs=dict(c.prefs), stack=[], scroll={a: 0 for a in T.LIST_APPS})
    if task.start in ("app", "other"):
        st.stack = [Page("root", task.start_app)]
    elif task.start == "detail":
        st.stack = [Page("root", task.app), Page("detail", task.app, task.start_item)]
    return st


class World:
    """State + layout + event handling for one platform and screen size."""

    def __init__(self, platform: str, task: T.Task, screen_size: tuple[int, int]):
        if platform not in _BASE:
            raise ValueError(f"unknown platform {platform!r}; expected one of {sorted(_BASE)}")
        self.platform = platform
        self.task = task
        self.size = (int(screen_size[0]), int(screen_size[1]))
        bw, bh = _BASE[platform]
        self.s = min(self.size[0] / bw, self.size[1] / bh)
        self.font_size = max(6, round(9 * self.s))
        self.state = initial_state(task)
        self._elements: list[Element] | None = None

    # -- geometry helpers ---------------------------------------------------------------
    def _u(self, v: float) -> int:
        return int(round(v * self.s))

    @property
    def top(self) -> Page | None:
        return self.state.stack[-1] if self.state.stack else None

    def list_geometry(self) -> tuple[tuple[int, int, int, int], int] | None:
        """(content box, visible rows) of the top page when it is a list, else None."""
        top = self.top
        if top is None or top.kind != "root" or top.app not in T.LIST_APPS:
            return None
        box = self._content_box()
        rows = max(1, (box[3] - box[1]) // self._u(ROW))
        return box, rows

    def visible_range(self, app: str) -> tuple[int, int]:
        geo = self.list_geometry()
        rows = geo[1] if geo else 0
        first = self.state.scroll[app]
        return first, min(len(self.state.items[app]), first + rows)

    def _content_box(self) -> tuple[int, int, int, int]:
        W, H, u = self.size[0], self.size[1], self._u
        top = self.top
        if self.platform == "desktop":
            y = u(2) + u(12)
            if top is not None and top.kind == "root" and top.app in T.LIST_APPS:
                y += u(11)
            return u(37) + u(1), y + u(1), W - u(3), H - u(3)
        return 0, u(24), W, H

    # -- layout -------------------------------------------------------------------------
    def elements(self) -> list[Element]:
        if self._elements is None:
            self._elements = self._layout()
        return self._elements

    def _layout(self) -> list[Element]:
        W, H, u = self.size[0], self.size[1], self._u
        els: list[Element] = []
        top = self.top
        if self.platform == "desktop":
            els.append(Element("desktop", "desktop_bg", "", (0, 0, W, H)))
            for i, app in enumerate(T.APPS):
                y = u(3) + i * u(17)
                els.append(Element(f"icon:{app}", "icon", app, (u(2), y, u(35), y + u(14)),
                                   state=self.state.selected_icon == app))
            if top is not None:
                wx1, wy1, wx2, wy2 = u(37), u(2), W - u(2), H - u(2)
                els.append(Element("window", "window", "", (wx1, wy1, wx2, wy2)))
                els.append(Element("titlebar", "titlebar", self._title(top), (wx1, wy1, wx2, wy1 + u(12))))
                els.append(Element("close", "close", "x", (wx2 - u(11), wy1 + u(1), wx2 - u(1), wy1 + u(11))))
                if top.kind == "root" and top.app in T.LIST_APPS:
                    els.append(Element("menubar", "menubar", "", (wx1, wy1 + u(12), wx2, wy1 + u(23))))
                    els.append(Element("menu_button", "menu_button", "File",
                                       (wx1 + u(1), wy1 + u(13), wx1 + u(25), wy1 + u(22))))
        else:
            els.append(Element("screen", "mobile_bg", "", (0, 0, W, H)))
            els.append(Element("status", "status", "12:00", (0, 0, W, u(9))))
            if top is None:
                cw = (W - u(6)) // 2
                for i, app in enumerate(T.APPS):
                    x = u(2) + (i % 2) * (cw + u(2))
                    y = u(14) + (i // 2) * u(26)
                    els.append(Element(f"icon:{app}", "icon", app, (x, y, x + cw, y + u(22))))
            else:
                els.append(Element("appbar", "appbar", self._title(top), (0, u(9), W, u(23))))
                if top.kind == "root" and top.app in T.LIST_APPS:
                    els.append(Element("menu_button", "menu_button", "Menu",
                                       (W - u(30), u(10), W - u(2), u(22))))
        if top is not None:
            els.extend(self._content(top))
        if self.state.menu is not None:
            els.extend(self._menu_elements(self.state.menu))
        return els

    def _title(self, page: Page) -> str:
        return {"root": page.app, "detail": page.item or "", "form": "New",
                "prefs": "Prefs"}[page.kind]

    def _rows(self, n: int) -> list[tuple[int, int, int, int]]:
        x1, y1, x2, y2 = self._content_box()
        h = self._u(ROW)
        return [(x1, y1 + i * h, x2, y1 + (i + 1) * h) for i in range(n)]

    def _toggle_row(self, name: str, on: bool, row) -> list[Element]:
        x1, y1, x2, y2 = row
        u = self._u
        return [Element(f"row:{name}", "toggle_row", name, (x1, y1, x2 - u(20), y2 - u(1))),
                Element(f"toggle:{name}", "toggle", "on" if on else "off",
                        (x2 - u(19), y1 + u(2), x2 - u(2), y2 - u(3)), state=on)]

    def _content(self, page: Page) -> list[Element]:
        u, st = self._u, self.state
        x1, y1, x2, y2 = self._content_box()
        els: list[Element] = []
        if page.kind == "root" and page.app == "Settings":
            rows = self._rows(len(T.SETTINGS_TOGGLES) + 1)
            for name, row in zip(T.SETTINGS_TOGGLES, rows):
                els += self._toggle_row(name, st.settings[name], row)
            rx1, ry1, rx2, ry2 = rows[-1]
            els.append(Element("label:Font", "label", "Font", (rx1, ry1, rx2 - u(40), ry2)))
            els.append(Element("dropdown:Font", "dropdown", f"{st.font} v",
                               (rx2 - u(40), ry1 + u(1), rx2 - u(2), ry2 - u(1))))
        elif page.kind == "root":
            box, rows = self.list_geometry()
            els.append(Element(f"list:{page.app}", "list", "", box))
            items = st.items[page.app]
            first = st.scroll[page.app]
            for row, item in zip(self._rows(rows), items[first:first + rows]):
                rx1, ry1, rx2, ry2 = row
                els.append(Element(f"item:{item.name}", "list_item", item.name, (rx1, ry1, rx2 - u(5), ry2)))
            if len(items) > rows:
                span = y2 - y1
                t = y1 + span * first // len(items)
                b = y1 + span * min(len(items), first + rows) // len(items)
                els.append(Element("scrollbar", "scrollbar", "", (x2 - u(4), t, x2 - u(1), b)))
        elif page.kind == "detail":
            item = next((i for i in st.items[page.app] if i.name == page.item), None)
            for k, (key, val) in enumerate(item.fields if item else ()):
                els.append(Element(f"text:{key}", "text", f"{key}: {val}",
                                   (x1, y1 + k * u(ROW), x2, y1 + (k + 1) * u(ROW))))
        elif page.kind == "prefs":
            name = T.PREFS[page.app]
            els += self._toggle_row(name, st.prefs[page.app], self._rows(1)[0])
        elif page.kind == "form":
            label = T.CREATE_APPS[page.app]
            els.append(Element(f"label:{label}", "label", label, (x1, y1, x2, y1 + u(ROW))))
            fy = y1 + u(ROW)
            els.append(Element(f"field:{label}", "field", st.form_text,
                               (x1 + u(2), fy, x2 - u(2), fy + u(13)), state=st.focus))
            by = fy + u(17)
            els.append(Element("button:Save", "button", "Save", (x2 - u(34), by, x2 - u(2), by + u(13))))
        return els

    def _menu_elements(self, menu: Menu) -> list[Element]:
        W, H, u = self.size[0], self.size[1], self._u
        ax1, ay1, ax2, ay2 = menu.anchor
        h, w = u(12), max(u(36), ax2 - ax1) if menu.kind == "dropdown" else u(40)
        n = len(menu.items)
        x = min(ax1, W - w - u(1))
        y = ay2 if ay2 + n * h <= H else max(0, ay1 - n * h)
        role = "option" if menu.kind == "dropdown" else "menu_item"
        prefix = {"app": "menu", "context": "ctx", "dropdown": "option"}[menu.kind]
        els = [Element(f"{prefix}_menu", "menu", "", (x, y, x + w, y + n * h))]
        for k, name in enumerate(menu.items):
            els.append(Element(f"{prefix}:{name}", role, name, (x, y + k * h, x + w, y + (k + 1) * h)))
        return els

    def screenshot(self):
        return draw(self.elements(), self.size, self.font_size)

    def screenshot_fn(self):
        """A function drawing the current screen later (the element list is immutable)."""
        els, size, fs = self.elements(), self.size, self.font_size
        return lambda: draw(els, size, fs)

    # -- events -------------------------------------------------------------------------
    def hit(self, point: tuple[float, float] | None) -> Element | None:
        """Top-most interactive element under a unit-space point."""
        if point is None:
            return None
        x, y = point[0] * self.size[0], point[1] * self.size[1]
        for e in reversed(self.elements()):
            if e.interactive and e.contains(x, y):
                return e
            if e.role == "menu" and e.contains(x, y):
                return None
        return None

    def apply(self, event: Event) -> bool:
        """Apply one event; True when it changed the state."""
        before = repr(self.state)
        handler: Callable[[Event], None] | None = getattr(self, f"_on_{event.kind}", None)
        if handler is not None:
            handler(event)
        self._elements = None
        return repr(self.state) != before

    def _close_menu(self) -> bool:
        if self.state.menu is not None:
            self.state.menu = None
            return True
        return False

    def _push(self, page: Page) -> None:
        self.state.stack.append(page)
        self.state.menu, self.state.focus, self.state.form_text = None, False, ""

    def _pop(self) -> None:
        if self.state.stack:
            self.state.stack.pop()
        self.state.menu, self.state.focus, self.state.form_text = None, False, ""

    def _open_app(self, app: str) -> None:
        self.state.stack = []
        self.state.selected_icon = None
        self._push(Page("root", app))

    def _on_click(self, ev: Event) -> None:
        el, st = self.hit(ev.point), self.state
        if st.menu is not None and (el is None or el.role not in ("menu_item", "option")):
            st.menu = None                      # a click outside an open menu only closes it
            return
        if el is None:
            st.focus, st.selected_icon = False, None
            return
        kind, _, name = el.id.partition(":")
        if el.role == "icon":
            if self.platform == "desktop":
                st.selected_icon = name
            else:
                self._open_app(name)
            return
        st.selected_icon = None
        top = self.top
        if el.role == "close":
            self._pop()
        elif el.role == "menu_button":
            items = ("New", "Prefs") if top.app in T.CREATE_APPS else ("Prefs",)
            st.menu = Menu("app", items, el.box)
        elif el.role == "menu_item" and kind == "menu":
            st.menu = None
            self._push(Page("form" if name == "New" else "prefs", top.app))
        elif el.role == "menu_item" and kind == "ctx":
            item, st.menu = st.menu.item, None
            if name == "Open":
                self._push(Page("detail", top.app, item))
            else:
                self._delete(top.app, item)
        elif el.role == "option":
            st.font, st.menu = name, None
        elif el.role == "dropdown":
            st.menu = Menu("dropdown", T.FONT_OPTIONS, el.box)
        elif el.role == "list_item":
            self._push(Page("detail", top.app, name))
        elif el.role in ("toggle", "toggle_row"):
            if top.kind == "prefs":
                st.prefs[top.app] = not st.prefs[top.app]
            else:
                st.settings[name] = not st.settings[name]
        elif el.role == "field":
            st.focus = True
        elif el.role == "button":
            self._submit()

    def _delete(self, app: str, name: str) -> None:
        self.state.items[app] = [i for i in self.state.items[app] if i.name != name]
        self._clamp_scroll(app)

    def _submit(self) -> None:
        st, top = self.state, self.top
        if top is None or top.kind != "form" or not st.form_text.strip():
            return
        text = st.form_text.strip()
        label = T.CREATE_APPS[top.app]
        fields = ((label, text),) + ((("Phone", "none"),) if top.app == "People" else (("Text", ""),))
        st.items[top.app].append(T.Item(text, fields))
        self._pop()

    def _on_double_click(self, ev: Event) -> None:
        if self.platform != "desktop":
            return
        el = self.hit(ev.point)
        if el is not None and el.role == "icon" and self.state.menu is None:
            self._open_app(el.id.partition(":")[2])
        else:
            self._on_click(ev)

    def _context(self, ev: Event) -> None:
        el, st = self.hit(ev.point), self.state
        if st.menu is not None:
            st.menu = None
            return
        if el is not None and el.role == "list_item" and self.top.app in T.DELETE_APPS:
            st.menu = Menu("context", ("Open", "Delete"), el.box, item=el.id.partition(":")[2])

    def _on_right_click(self, ev: Event) -> None:
        if self.platform == "desktop":
            self._context(ev)

    def _on_long_press(self, ev: Event) -> None:
        if self.platform == "mobile":
            self._context(ev)

    def _on_type(self, ev: Event) -> None:
        if self.state.focus and self.top is not None and self.top.kind == "form":
            self.state.form_text += ev.text or ""

    def _on_select(self, ev: Event) -> None:
        menu = self.state.menu
        if menu is not None and menu.kind == "dropdown":
            match = [o for o in menu.items if o.lower() == (ev.text or "").strip().lower()]
            if match:
                self.state.font = match[0]
            self.state.menu = None

    def _on_key(self, ev: Event) -> None:
        key = ev.text or ""
        if key == "enter":
            if self.state.focus:
                self._submit()
            return
        if self.platform != "desktop":
            return
        if key == "escape":
            self._close_menu()
        elif key == "ctrl+w" and self.state.stack:
            self._pop()
        elif key in ("pagedown", "pageup"):
            self._scroll_list("down" if key == "pagedown" else "up")

    def _scroll_list(self, direction: str) -> None:
        geo = self.list_geometry()
        if geo is None or direction not in ("up", "down") or self.state.menu is not None:
            return
        app = self.top.app
        step = max(1, geo[1] - 1)
        self.state.scroll[app] += step if direction == "down" else -step
        self._clamp_scroll(app)

    def _clamp_scroll(self, app: str) -> None:
        geo = self.list_geometry()
        rows = geo[1] if geo else 1
        top = max(0, len(self.state.items[app]) - rows)
        self.state.scroll[app] = min(max(0, self.state.scroll[app]), top)

    def _on_scroll(self, ev: Event) -> None:
        geo = self.list_geometry()
        if geo is None:
            return
        if ev.point is not None:
            x, y = ev.point[0] * self.size[0], ev.point[1] * self.size[1]
            x1, y1, x2, y2 = geo[0]
            if not (x1 <= x < x2 and y1 <= y < y2):
                return
        self._scroll_list(ev.text or "")

    def _on_swipe(self, ev: Event) -> None:
        geo = self.list_geometry()
        if self.platform != "mobile" or geo is None or ev.point is None or ev.point2 is None:
            return
        (x1, y1, x2, y2), _ = geo
        sx, sy = ev.point[0] * self.size[0], ev.point[1] * self.size[1]
        ex, ey = ev.point2[0] * self.size[0], ev.point2[1] * self.size[1]
        dy, dx = ey - sy, ex - sx
        if not (x1 <= sx < x2 and y1 <= sy < y2) or abs(dy) <= abs(dx) or abs(dy) < 0.1 * (y2 - y1):
            return
        self._scroll_list("down" if dy < 0 else "up")   # finger up reveals what is below

    def _on_back(self, ev: Event) -> None:
        if self.platform == "mobile" and not self._close_menu():
            self._pop()

    def _on_home(self, ev: Event) -> None:
        if self.platform == "mobile":
            self.state.stack, self.state.menu = [], None
            self.state.focus, self.state.form_text = False, ""

    def _on_open_app(self, ev: Event) -> None:
        if self.platform != "mobile":
            return
        app = next((a for a in T.APPS if a.lower() == (ev.text or "").strip().lower()), None)
        if app is not None:
            self._open_app(app)

    def _on_answer(self, ev: Event) -> None:
        self.state.answer = ev.text or ""

    def _on_terminate(self, ev: Event) -> None:
        self.state.terminated = ev.text or "success"

    # -- goal ---------------------------------------------------------------------------
    def goal_reached(self) -> bool:
        t, st, top = self.task, self.state, self.top
        if t.kind == "open_app":
            return len(st.stack) == 1 and top == Page("root", t.app)
        if t.kind == "toggle":
            return st.settings[t.setting] == t.value
        if t.kind == "select":
            return st.font == t.value
        if t.kind == "toggle_pref":
            return st.prefs[t.app] == t.value and len(st.stack) == 1 and top == Page("root", t.app)
        if t.kind in ("open_item", "go_back"):
            return top == Page("detail", t.app, t.item)
        if t.kind == "answer":
            return st.answer is not None and _norm(st.answer) == _norm(t.value)
        if t.kind == "create":
            return any(i.name == t.item for i in st.items[t.app])
        if t.kind == "delete":
            names = [i.name for i in st.items[t.app]]
            original = [i.name for i in t.content.items[t.app] if i.name != t.item]
            return t.item not in names and all(n in names for n in original)
        raise AssertionError(t.kind)


def _norm(text: str) -> str:
    return " ".join(str(text).lower().replace(".", " ").split())
