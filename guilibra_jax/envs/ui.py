"""Screen elements and their drawing (PIL only).

A screen is a list of :class:`Element` in drawing order (the last one is on top).
Layout (``world.py``) produces the list; :func:`draw` turns it into a screenshot and
hit-testing reads the same list, so what is drawn is exactly what can be clicked.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from PIL import Image, ImageDraw, ImageFont

Box = tuple[int, int, int, int]  # x1, y1, x2, y2 in pixels, x2/y2 exclusive

INTERACTIVE_ROLES = frozenset({"icon", "close", "menu_button", "menu_item", "list_item", "toggle",
                               "toggle_row", "dropdown", "option", "field", "button"})

# High-contrast palette.
_APP_COLORS = {"Mail": (30, 90, 200), "Notes": (200, 130, 0), "Files": (90, 60, 160),
               "People": (0, 130, 90), "Settings": (90, 90, 90)}
_BLACK, _WHITE = (0, 0, 0), (255, 255, 255)
_STYLE = {
    "desktop_bg": ((0, 110, 120), None, None),
    "mobile_bg": (_WHITE, None, None),
    "status": ((30, 30, 30), None, _WHITE),
    "window": (_WHITE, _BLACK, None),
    "titlebar": ((20, 40, 110), None, _WHITE),
    "appbar": ((20, 40, 110), None, _WHITE),
    "close": ((200, 30, 30), None, _WHITE),
    "menubar": ((220, 220, 220), None, None),
    "menu_button": ((220, 220, 220), _BLACK, _BLACK),
    "menu": ((245, 245, 200), _BLACK, None),
    "menu_item": ((245, 245, 200), None, _BLACK),
    "list_item": (_WHITE, (170, 170, 170), _BLACK),
    "scrollbar": ((150, 150, 150), None, None),
    "toggle_row": (_WHITE, None, _BLACK),
    "dropdown": ((235, 235, 255), _BLACK, _BLACK),
    "option": ((235, 235, 255), _BLACK, _BLACK),
    "field": (_WHITE, _BLACK, _BLACK),
    "button": ((20, 100, 220), None, _WHITE),
    "text": (None, None, _BLACK),
    "label": (None, None, (60, 60, 60)),
    "list": (None, None, None),
}


@dataclasses.dataclass(frozen=True)
class Element:
    """One thing on screen. ``id`` is stable across steps (e.g. "icon:Mail",
    "item:Kim", "toggle:Wi-Fi"); ``state`` carries on/off for toggles, selected for
    icons, focused for fields."""

    id: str
    role: str
    text: str
    box: Box
    state: Any = None

    @property
    def interactive(self) -> bool:
        return self.role in INTERACTIVE_ROLES

    @property
    def center(self) -> tuple[float, float]:
        return (self.box[0] + self.box[2]) / 2.0, (self.box[1] + self.box[3]) / 2.0

    def contains(self, x: float, y: float) -> bool:
        return self.box[0] <= x < self.box[2] and self.box[1] <= y < self.box[3]

    def unit_box(self, size: tuple[int, int]) -> tuple[float, float, float, float]:
        w, h = size
        return (self.box[0] / w, self.box[1] / h, self.box[2] / w, self.box[3] / h)

    def to_dict(self, size: tuple[int, int]) -> dict[str, Any]:
        return {"id": self.id, "role": self.role, "text": self.text, "box": list(self.box),
                "box_unit": [round(v, 6) for v in self.unit_box(size)], "state": self.state}


@functools.lru_cache(maxsize=64)
def font(size: int) -> ImageFont.FreeTypeFont:
    """Pillow's bundled font (deterministic for a Pillow version)."""
    return ImageFont.load_default(size=max(6, size))


@functools.lru_cache(maxsize=4096)
def _text_image(text: str, size: int, color: tuple[int, int, int], max_width: int
                ) -> tuple[Image.Image, int, int]:
    """(RGBA image of ``text``, width, height), shrunk until it fits ``max_width``."""
    f = font(size)
    l, t, r, b = f.getbbox(text)
    while r - l > max_width and size > 6:
        size -= 1
        f = font(size)
        l, t, r, b = f.getbbox(text)
    img = Image.new("RGBA", (max(1, r - l), max(1, b - t)), color + (0,))
    ImageDraw.Draw(img).text((-l, -t), text, fill=color + (255,), font=f)
    return img, r - l, b - t


def _text(img: Image.Image, box: Box, text: str, color, size: int, align: str = "left"):
    if not text:
        return
    x1, y1, x2, y2 = box
    pad = max(1, size // 5)
    timg, w, h = _text_image(text, size, tuple(color), x2 - x1 - 2 * pad)
    x = x1 + pad if align == "left" else (x1 + x2 - w) // 2
    y = (y1 + y2 - h) // 2
    img.paste(timg, (int(x), int(y)), timg)


def draw(elements: list[Element], size: tuple[int, int], font_size: int) -> Image.Image:
    img = Image.new("RGB", size, _WHITE)
    d = ImageDraw.Draw(img)
    for e in elements:
        if e.role == "icon":
            fill = _APP_COLORS.get(e.text, (60, 60, 60))
            d.rectangle(e.box, fill=fill, outline=(255, 220, 0) if e.state else None,
                        width=max(1, font_size // 5))
            _text(img, e.box, e.text, _WHITE, font_size, "center")
            continue
        if e.role == "toggle":
            on = bool(e.state)
            d.rectangle(e.box, fill=(0, 160, 60) if on else (170, 170, 170))
            x1, y1, x2, y2 = e.box
            knob_w = max(2, (x2 - x1) // 2)
            kx = x2 - knob_w if on else x1
            d.rectangle((kx, y1, kx + knob_w - 1, y2 - 1), fill=_WHITE, outline=_BLACK)
            continue
        fill, outline, color = _STYLE.get(e.role, (None, None, _BLACK))
        x1, y1, x2, y2 = e.box
        if fill is not None or outline is not None:
            d.rectangle((x1, y1, x2 - 1, y2 - 1), fill=fill, outline=outline)
        if e.role == "field" and e.state:           # focused: thick border and caret
            d.rectangle((x1, y1, x2 - 1, y2 - 1), outline=(20, 100, 220), width=max(2, font_size // 5))
        text = e.text + ("|" if e.role == "field" and e.state else "")
        align = "center" if e.role in ("close", "button", "menu_button") else "left"
        if color is not None:
            _text(img, e.box, text, color, font_size, align)
    return img
