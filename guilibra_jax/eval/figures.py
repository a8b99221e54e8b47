"""PNG figures of the studies, drawn with PIL (matplotlib is not a dependency; the
training curves of ``train.curves`` and the eval report's scatter are PIL too):

    bars(path, groups, series, values, intervals)   grouped bars with interval whiskers
    lines(path, title, curves)                      curves over training steps
"""

from __future__ import annotations

import math
from typing import Sequence

from PIL import Image, ImageDraw, ImageFont

COLORS = [(30, 90, 200), (220, 120, 0), (0, 140, 80), (160, 40, 160), (200, 40, 40), (120, 120, 120),
          (0, 160, 170), (140, 100, 40)]


def _font():
    return ImageFont.load_default()


def bars(path: str, title: str, groups: Sequence[str], series: Sequence[str],
         values: Sequence[Sequence[float | None]], intervals: Sequence[Sequence[tuple[float, float] | None]],
         y_label: str = "success rate") -> str:
    """``values[g][s]`` (0..1) as a bar per series ``s`` in each group ``g``, with the
    interval ``intervals[g][s]`` as a whisker; None draws no bar."""
    W, H = max(480, 90 + 34 * len(groups) * max(1, len(series)) + 30 * len(groups)), 380
    left, top, right, bottom = 56, 34, 16, 96
    img = Image.new("RGB", (W, H), "white")
    d = ImageDraw.Draw(img)
    f = _font()
    y = lambda v: H - bottom - v * (H - top - bottom)          # noqa: E731
    for k in range(6):
        v = k / 5
        d.line([left, y(v), W - right, y(v)], fill=(230, 230, 230))
        d.text((8, y(v) - 6), f"{v:.1f}", fill=(0, 0, 0), font=f)
    d.rectangle([left, top, W - right, H - bottom], outline=(0, 0, 0))
    d.text((left, 8), title, fill=(0, 0, 0), font=f)
    d.text((8, top - 16), y_label, fill=(0, 0, 0), font=f)
    slot = (W - left - right) / max(1, len(groups))
    bw = min(28, slot * 0.8 / max(1, len(series)))
    for g, name in enumerate(groups):
        x0 = left + g * slot + (slot - bw * len(series)) / 2
        for s in range(len(series)):
            v = values[g][s]
            if v is None:
                continue
            color = COLORS[s % len(COLORS)]
            xa, xb = x0 + s * bw + 1, x0 + (s + 1) * bw - 1
            d.rectangle([xa, y(v), xb, y(0)], fill=color)
            ci = intervals[g][s]
            if ci is not None:
                xm = (xa + xb) / 2
                d.line([xm, y(ci[0]), xm, y(ci[1])], fill=(0, 0, 0), width=1)
                d.line([xm - 4, y(ci[0]), xm + 4, y(ci[0])], fill=(0, 0, 0))
                d.line([xm - 4, y(ci[1]), xm + 4, y(ci[1])], fill=(0, 0, 0))
        label = name if len(name) <= 14 else name[:13] + "."
        d.text((left + g * slot + 4, H - bottom + 6 + 12 * (g % 2)), label, fill=(0, 0, 0), font=f)
    for s, name in enumerate(series):
        ly = H - 40 + 14 * (s // 4)
        lx = left + 130 * (s % 4)
        d.rectangle([lx, ly, lx + 10, ly + 10], fill=COLORS[s % len(COLORS)])
        d.text((lx + 14, ly - 1), name, fill=(0, 0, 0), font=f)
    img.save(path)
    return path


def lines(path: str, title: str, curves: Sequence[tuple[str, Sequence[tuple[float, float]]]],
          y_label: str = "", size: tuple[int, int] = (560, 360)) -> str:
    """Each ``(label, [(step, value), ...])`` as a line (a point when it has one value)."""
    W, H = size
    left, top, right, bottom = 64, 30, 150, 40
    img = Image.new("RGB", size, "white")
    d = ImageDraw.Draw(img)
    f = _font()
    pts = [p for _, c in curves for p in c if math.isfinite(p[1])]
    d.rectangle([left, top, W - right, H - bottom], outline=(0, 0, 0))
    d.text((left, 8), title, fill=(0, 0, 0), font=f)
    if not pts:
        d.text((left + 10, H // 2), "no data logged", fill=(120, 120, 120), font=f)
        img.save(path)
        return path
    xlo, xhi = min(p[0] for p in pts), max(p[0] for p in pts)
    ylo, yhi = min(p[1] for p in pts), max(p[1] for p in pts)
    xhi, yhi = (xhi if xhi > xlo else xlo + 1), (yhi if yhi > ylo else ylo + 1)
    sx = lambda x: left + (x - xlo) / (xhi - xlo) * (W - left - right)      # noqa: E731
    sy = lambda v: H - bottom - (v - ylo) / (yhi - ylo) * (H - top - bottom)  # noqa: E731
    for k in range(5):
        v, x = ylo + (yhi - ylo) * k / 4, xlo + (xhi - xlo) * k / 4
        d.text((4, sy(v) - 6), f"{v:.3g}", fill=(0, 0, 0), font=f)
        d.text((sx(x) - 8, H - bottom + 6), f"{x:.0f}", fill=(0, 0, 0), font=f)
    d.text(((W - right) // 2, H - 16), "step", fill=(0, 0, 0), font=f)
    if y_label:
        d.text((left + 4, top + 4), y_label, fill=(90, 90, 90), font=f)
    for i, (label, c) in enumerate(curves):
        color = COLORS[i % len(COLORS)]
        xy = [(sx(x), sy(v)) for x, v in c if math.isfinite(v)]
        if len(xy) == 1:
            d.ellipse([xy[0][0] - 3, xy[0][1] - 3, xy[0][0] + 3, xy[0][1] + 3], fill=color)
        elif xy:
            d.line(xy, fill=color, width=2)
        d.text((W - right + 8, top + 14 * i), label[:22], fill=color, font=f)
    img.save(path)
    return path
