"""MiniWoB++ page elements: ``core.getDOMInfo()`` flattened into the world's element dicts.

Each element: ``{"id": ref, "role": tag (lower case; inputs as "input_text",
"input_checkbox", ...), "text", "box" (x1, y1, x2, y2 in screenshot pixels), "box_unit"
(the same in [0, 1] of the screenshot), "css" (x1, y1, x2, y2 in CSS pixels), "state"
({"value", "focused"}), "html_id", "classes"}``. Only elements that overlap the task region
are kept; text nodes are elements of role "t". Pure functions: no browser needed.
"""

from __future__ import annotations

from typing import Any, Iterator

from guilibra_jax.envs.miniwob.browser import TASK_HEIGHT, TASK_WIDTH

CONTAINER_IDS = frozenset({"wrap", "area"})


def _classes(raw: Any) -> str:
    if isinstance(raw, dict):                 # SVG elements: {"animVal", "baseVal"}
        return str(raw.get("baseVal") or "")
    return str(raw or "")


def walk(node: dict | None, depth: int = 0) -> Iterator[tuple[dict, int]]:
    if not node:
        return
    yield node, depth
    for child in node.get("children") or ():
        yield from walk(child, depth + 1)


def clip_box(left: float, top: float, width: float, height: float) -> tuple[float, float, float, float] | None:
    """The CSS box clipped to the task region, or None when they do not overlap."""
    x1, y1 = max(0.0, left), max(0.0, top)
    x2, y2 = min(float(TASK_WIDTH), left + width), min(float(TASK_HEIGHT), top + height)
    if x2 <= x1 or y2 <= y1:
        return None
    return x1, y1, x2, y2


def flatten(root: dict | None, scale: float) -> list[dict]:
    """Visible elements of the task region, in document order (body and containers dropped)."""
    out = []
    for node, depth in walk(root):
        tag = str(node.get("tag") or "").lower()
        if tag == "body":
            continue
        css = clip_box(float(node["left"]), float(node["top"]), float(node["width"]), float(node["height"]))
        if css is None:
            continue
        box = tuple(round(c * scale, 2) for c in css)
        unit = (css[0] / TASK_WIDTH, css[1] / TASK_HEIGHT, css[2] / TASK_WIDTH, css[3] / TASK_HEIGHT)
        out.append({"id": node.get("ref"), "role": tag, "text": str(node.get("text") or ""),
                    "box": box, "box_unit": tuple(round(u, 6) for u in unit), "css": css,
                    "state": {"value": node.get("value"), "focused": bool(node.get("focused"))},
                    "html_id": str(node.get("id") or ""), "classes": _classes(node.get("classes")),
                    "depth": depth})
    return out
