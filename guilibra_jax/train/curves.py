"""Training curves of a run as a PNG, drawn with PIL from ``metrics.jsonl``:

    write_curves(workdir)  ->  workdir/curves.png

Left: the training loss per logged step. Right: held-out greedy step accuracy
(``eval/step_acc``, per platform when logged) with the best constant-action baseline
dashed, or, for RL runs without a held-out eval, the rollout reward. The trainer calls
it when a run ends (``train.curves``); a run's figures are these files.
"""

from __future__ import annotations

import json
import math
import os
from typing import Sequence

from PIL import Image, ImageDraw, ImageFont

COLORS = [(30, 90, 200), (220, 120, 0), (0, 140, 80), (160, 40, 160), (120, 120, 120)]
PANEL = (420, 300)
MARGIN = (56, 28, 16, 40)       # left, top, right, bottom


def read_metrics(path: str) -> list[dict]:
    rows = []
    with open(path) as f:
        for line in f:
            if line.strip():
                rows.append(json.loads(line))
    return rows


def series(rows: Sequence[dict], key: str) -> list[tuple[float, float]]:
    """(step, value) of ``key``, the last value per step (a resumed run logs again)."""
    out: dict[int, float] = {}
    for r in rows:
        v = r.get(key)
        if isinstance(v, (int, float)) and math.isfinite(v):
            out[int(r["step"])] = float(v)
    return sorted(out.items())


def _panel(title: str, lines: list[tuple[str, list[tuple[float, float]], tuple, bool]],
           y_range: tuple[float, float] | None = None) -> Image.Image:
    img = Image.new("RGB", PANEL, "white")
    d = ImageDraw.Draw(img)
    font = ImageFont.load_default()
    left, top, right, bottom = MARGIN
    x0, y0, x1, y1 = left, top, PANEL[0] - right, PANEL[1] - bottom
    d.rectangle([x0, y0, x1, y1], outline=(0, 0, 0))
    d.text((x0, 6), title, fill=(0, 0, 0), font=font)
    points = [p for _, pts, _, _ in lines for p in pts]
    if not points:
        d.text((x0 + 10, (y0 + y1) // 2), "no data logged", fill=(120, 120, 120), font=font)
        return img
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    xlo, xhi = min(xs), max(xs)
    ylo, yhi = y_range or (min(ys), max(ys))
    if xhi == xlo:
        xhi = xlo + 1
    if yhi == ylo:
        yhi = ylo + 1
    sx = lambda x: x0 + (x - xlo) / (xhi - xlo) * (x1 - x0)          # noqa: E731
    sy = lambda y: y1 - (y - ylo) / (yhi - ylo) * (y1 - y0)          # noqa: E731
    for k in range(5):
        yv = ylo + (yhi - ylo) * k / 4
        d.line([x0 - 4, sy(yv), x0, sy(yv)], fill=(0, 0, 0))
        d.text((4, sy(yv) - 6), f"{yv:.3g}", fill=(0, 0, 0), font=font)
        xv = xlo + (xhi - xlo) * k / 4
        d.line([sx(xv), y1, sx(xv), y1 + 4], fill=(0, 0, 0))
        d.text((sx(xv) - 10, y1 + 6), f"{xv:.0f}", fill=(0, 0, 0), font=font)
    d.text(((x0 + x1) // 2 - 12, y1 + 20), "step", fill=(0, 0, 0), font=font)
    for i, (label, pts, color, dashed) in enumerate(lines):
        xy = [(sx(x), sy(y)) for x, y in pts]
        if len(xy) == 1:
            d.ellipse([xy[0][0] - 3, xy[0][1] - 3, xy[0][0] + 3, xy[0][1] + 3], fill=color)
        elif dashed:
            for a, b in zip(xy, xy[1:]):
                n = max(1, int(math.dist(a, b) // 6))
                for j in range(0, n, 2):
                    t0, t1 = j / n, min(j + 1, n) / n
                    d.line([(a[0] + (b[0] - a[0]) * t0, a[1] + (b[1] - a[1]) * t0),
                            (a[0] + (b[0] - a[0]) * t1, a[1] + (b[1] - a[1]) * t1)], fill=color, width=2)
        else:
            d.line(xy, fill=color, width=2)
        d.text((x1 - 150, y0 + 6 + 13 * i), label, fill=color, font=font)
    return img


def write_curves(workdir: str, out: str | None = None) -> str | None:
    """Draw ``workdir/metrics.jsonl`` into ``out`` (default ``workdir/curves.png``);
    None when there is no metrics file."""
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.exists(path):
        return None
    rows = read_metrics(path)
    loss = series(rows, "loss")
    left = _panel("training loss", [("loss", loss, COLORS[0], False)])
    acc_keys = [k for k in sorted({k for r in rows for k in r}) if k.startswith("eval/") and k.endswith("/step_acc")]
    right_lines = [("held-out step acc", series(rows, "eval/step_acc"), COLORS[0], False)]
    right_lines += [(k[len("eval/"):-len("/step_acc")], series(rows, k), COLORS[1 + i % 3], False)
                    for i, k in enumerate(acc_keys)]
    baseline = series(rows, "eval/constant_baseline_step_acc")
    if baseline and loss:
        right_lines.append(("constant baseline", [(loss[0][0], baseline[-1][1]), (loss[-1][0], baseline[-1][1])],
                            COLORS[4], True))
    if any(pts for _, pts, _, _ in right_lines):
        right = _panel("held-out greedy step accuracy", right_lines, (0.0, 1.0))
    else:
        right = _panel("rollout reward", [("reward", series(rows, "reward_mean"),
                                           COLORS[2], False)])
    img = Image.new("RGB", (2 * PANEL[0], PANEL[1]), "white")
    img.paste(left, (0, 0))
    img.paste(right, (PANEL[0], 0))
    out = out or os.path.join(workdir, "curves.png")
    img.save(out)
    return out
