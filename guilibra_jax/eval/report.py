"""Report: offline step accuracy against online success across checkpoints.

    write_report(workdir, entries)  ->  workdir/report.json, workdir/report.png

``entries`` is a list (in checkpoint order) of ``{"name": str, "offline": metrics of
:func:`eval.offline.evaluate_offline`, "online": results of
:func:`eval.online.evaluate_online`}``, each optionally with ``"series": str``. Entries
of one series are checkpoints of one run, in order; entries without one form a single
series with ``connect=True`` and are unrelated points with ``connect=False`` (agents).
The JSON keeps the summaries (not the per-episode list), each entry's series, the
series' entry names in order, one point per (entry, platform) with x = offline step
success and y = online success rate, and the Pearson correlation over all points. The
PNG draws the points (one colour per platform, lines joining a series in order) with PIL.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Sequence

from PIL import Image, ImageDraw, ImageFont

PLATFORM_COLORS = {"desktop": (30, 90, 200), "mobile": (220, 120, 0), "web": (0, 140, 80)}
DEFAULT_SERIES = "checkpoints"      # the series of entries without one, with connect=True


def entry_series(entry: dict[str, Any], connect: bool = True) -> str | None:
    """The series ``entry`` is joined in: its own, else one for all (``connect``), else none."""
    return entry.get("series") or (DEFAULT_SERIES if connect else None)


def report_points(entries: Sequence[dict[str, Any]], connect: bool = True) -> list[dict[str, Any]]:
    points = []
    for e in entries:
        off, on = e["offline"]["by_platform"], e["online"]["by_platform"]
        for p in sorted(set(off) & set(on)):
            x, y = off[p]["step_success"], on[p]["success_rate"]
            if x is not None and y is not None:
                points.append({"name": e["name"], "series": entry_series(e, connect), "platform": p,
                               "offline_step_success": x,
                               "offline_action_type_accuracy": off[p]["action_type_accuracy"],
                               "online_success": y})
    return points


def pearson(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    n = len(xs)
    if n < 3:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sx = math.sqrt(sum((x - mx) ** 2 for x in xs))
    sy = math.sqrt(sum((y - my) ** 2 for y in ys))
    if sx == 0 or sy == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / (sx * sy)


def build_report(entries: Sequence[dict[str, Any]], connect: bool = True) -> dict[str, Any]:
    points = report_points(entries, connect)
    series: dict[str, list[str]] = {}
    for e in entries:
        if (s := entry_series(e, connect)) is not None:
            series.setdefault(s, []).append(e["name"])
    return {
        "checkpoints": [{"name": e["name"], "series": entry_series(e, connect),
                         "offline": {k: e["offline"][k] for k in ("overall", "by_platform", "by_action_type")},
                         "online": {k: e["online"][k] for k in ("overall", "by_platform")}}
                        for e in entries],
        "series": series,
        "points": points,
        "pearson_offline_vs_online": pearson([p["offline_step_success"] for p in points],
                                             [p["online_success"] for p in points]),
    }


def plot_points(points: Sequence[dict[str, Any]], path: str, size: tuple[int, int] = (560, 420),
                title: str = "offline step success vs online success") -> None:
    """Scatter of the points; a line joins a platform's points of one series in order
    (checkpoints of one run; points without a series stand alone)."""
    W, H = size
    left, right, top, bottom = 56, 130, 30, 44
    img = Image.new("RGB", size, (255, 255, 255))
    d = ImageDraw.Draw(img)
    f = ImageFont.load_default(size=12)

    def xy(x: float, y: float) -> tuple[float, float]:
        return left + x * (W - left - right), H - bottom - y * (H - top - bottom)
    for k in range(5):
        v = k / 4
        x0, y0 = xy(v, 0)
        d.line([xy(v, 0), xy(v, 1)], fill=(225, 225, 225))
        d.line([xy(0, v), xy(1, v)], fill=(225, 225, 225))
        d.text((x0 - 10, H - bottom + 6), f"{v:.2f}", fill=(0, 0, 0), font=f)
        d.text((8, xy(0, v)[1] - 7), f"{v:.2f}", fill=(0, 0, 0), font=f)
    d.line([xy(0, 0), xy(1, 1)], fill=(190, 190, 190))                  # y = x
    d.rectangle([xy(0, 1), xy(1, 0)], outline=(0, 0, 0))
    d.text((left, 8), title, fill=(0, 0, 0), font=f)
    d.text((left + 60, H - 18), "offline step success", fill=(0, 0, 0), font=f)
    d.text((W - right + 10, top + 150), "y: online success", fill=(0, 0, 0), font=f)
    platforms = sorted({p["platform"] for p in points})
    for k, plat in enumerate(platforms):
        color = PLATFORM_COLORS.get(plat, (120, 120, 120))
        pts = [p for p in points if p["platform"] == plat]
        coords = [xy(p["offline_step_success"], p["online_success"]) for p in pts]
        for s in dict.fromkeys(p["series"] for p in pts if p["series"] is not None):
            line = [c for p, c in zip(pts, coords) if p["series"] == s]
            if len(line) > 1:
                d.line(line, fill=color, width=1)
        for p, (cx, cy) in zip(pts, coords):
            d.ellipse([cx - 4, cy - 4, cx + 4, cy + 4], fill=color)
            d.text((cx + 6, cy - 6), p["name"][:18], fill=color, font=f)
        ly = top + 60 + 18 * k
        d.ellipse([W - right + 10, ly, W - right + 18, ly + 8], fill=color)
        d.text((W - right + 24, ly - 3), plat, fill=(0, 0, 0), font=f)
    img.save(path)


def write_report(workdir: str, entries: Sequence[dict[str, Any]], connect: bool = True
                 ) -> tuple[str, str]:
    os.makedirs(workdir, exist_ok=True)
    report = build_report(entries, connect)
    json_path = os.path.join(workdir, "report.json")
    png_path = os.path.join(workdir, "report.png")
    with open(json_path, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    plot_points(report["points"], png_path)
    return json_path, png_path
