"""``curation_report.json`` / ``.md`` and the match-frequency histogram (PIL, as
``train.curves`` draws: matplotlib is not a dependency)."""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

from PIL import Image, ImageDraw, ImageFont

SIZE = (560, 320)
MARGIN = (56, 36, 20, 48)     # left, top, right, bottom
KEPT, REMOVED, AXIS = (30, 90, 200), (210, 60, 40), (0, 0, 0)


def frequency_counts(freqs: Sequence[float], k: int) -> list[int]:
    """Counts of match frequencies in K + 1 bins (m / K for m = 0..K, nearest bin)."""
    counts = [0] * (k + 1)
    for f in freqs:
        counts[min(k, max(0, int(round(f * k))))] += 1
    return counts


def histogram_png(path: str, freqs: Sequence[float], k: int, threshold: float) -> str:
    """Bars of :func:`frequency_counts`, removed bins (below ``threshold``) in red, the
    threshold dashed."""
    counts = frequency_counts(freqs, k)
    img = Image.new("RGB", SIZE, "white")
    d = ImageDraw.Draw(img)
    font = ImageFont.load_default()
    left, top, right, bottom = MARGIN
    x0, y0, x1, y1 = left, top, SIZE[0] - right, SIZE[1] - bottom
    d.rectangle([x0, y0, x1, y1], outline=AXIS)
    d.text((x0, 8), f"match frequency over K = {k} samples ({len(freqs)} steps); threshold {threshold:g}",
           fill=AXIS, font=font)
    top_count = max(counts + [1])
    slot = (x1 - x0) / (k + 1)
    for m, c in enumerate(counts):
        bx0, bx1 = x0 + m * slot + slot * 0.15, x0 + (m + 1) * slot - slot * 0.15
        by0 = y1 - (y1 - y0 - 14) * c / top_count
        color = REMOVED if m / k < threshold - 1e-12 else KEPT
        if c:
            d.rectangle([bx0, by0, bx1, y1], fill=color)
        d.text((bx0, by0 - 12), str(c), fill=AXIS, font=font)
        d.text((bx0, y1 + 6), f"{m / k:.2f}", fill=AXIS, font=font)
    tx = x0 + (threshold * k + 0.5) * slot          # bar m is centred on value m / k
    for yy in range(int(y0), int(y1), 8):
        d.line([tx, yy, tx, yy + 4], fill=AXIS, width=1)
    d.text(((x0 + x1) // 2 - 60, y1 + 24), "matches / samples", fill=AXIS, font=font)
    for j in range(5):
        v = top_count * j / 4
        yy = y1 - (y1 - y0 - 14) * j / 4
        d.text((6, yy - 6), f"{v:.0f}" if top_count >= 8 else f"{v:.1f}", fill=AXIS, font=font)
    d.text((x1 - 110, 22), "kept", fill=KEPT, font=font)
    d.text((x1 - 70, 22), "removed", fill=REMOVED, font=font)
    img.save(path)
    return path


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _table(rows: list[tuple], header: tuple) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return out


def markdown(report: dict[str, Any]) -> str:
    """The report as Markdown (counts per stage and reason, throughput, examples)."""
    lines = ["# Curation report", ""]
    inp = report["inputs"]
    lines += [f"Input: {inp['records']} records ({inp['format']}: {', '.join(map(str, inp['inputs']))}).", ""]
    rows = []
    for name, st in report["stages"].items():
        rows.append((name, st["in"], st["out"], st["in"] - st["out"],
                     ", ".join(f"{k} {v}" for k, v in sorted(st.get("removed_by_reason", {}).items())) or "-"))
    lines += _table(rows, ("stage", "in", "out", "removed", "removed by reason")) + [""]
    for name, st in report["stages"].items():
        lines.append(f"## {name}")
        lines.append("")
        if st.get("kept_by_reason"):
            lines.append("Kept by reason: " + ", ".join(f"{k} {v}" for k, v in sorted(st["kept_by_reason"].items())))
        for key in ("samples", "threshold", "mean_frequency", "boxes_set", "verdicts", "sampler"):
            if key in st:
                lines.append(f"{key.replace('_', ' ').capitalize()}: {st[key]}")
        t = st.get("throughput")
        if t:
            lines.append(f"This run: {t['prompts']} prompts, {t['responses']} responses in {t['seconds']:.1f} s "
                         f"({t['responses_per_s']:.2f} responses/s, {t['prompts_per_s']:.2f} steps/s).")
        if name == "consistency" and report.get("histogram_png"):
            lines += ["", f"![match frequency]({os.path.basename(report['histogram_png'])})"]
        if name == "rebalance":
            for which in ("before", "after_rebalance", "final"):
                dist = st["distribution"][which]
                lines.append(f"- {which}: n={dist['n']}, platform {dist['platform']}, step {dist['step']}")
        lines.append("")
    fv = report.get("filter_vs_injected")
    if fv:
        lines += ["## Filter against the injected label errors", ""]
        rows = [(name, s["records"], s["corrupted"], s["removed"], _pct(s["precision"]), _pct(s["recall"]),
                 _pct(s["clean_kept"]), ", ".join(f"{k} {_pct(v)}" for k, v in s["recall_by_kind"].items()))
                for name, s in fv.items()]
        lines += _table(rows, ("stages", "records", "corrupted", "removed", "precision", "recall", "clean kept",
                               "recall by kind")) + [""]
    if report.get("endpoint_requests"):
        lines += ["Endpoint requests by outcome (all stages): " + ", ".join(
            f"{k} {v}" for k, v in sorted(report["endpoint_requests"].items())), ""]
    lines += ["## Outputs", ""]
    for name, out in report["outputs"].items():
        lines.append(f"- {name}: {out['records']} records: {', '.join(out['files'])}")
    lines.append("")
    if report.get("examples"):
        lines += ["## Examples of removed steps", ""]
        for stage, items in report["examples"].items():
            for ex in items:
                lines.append(f"- **{stage} / {ex['reason']}** `{ex['where']}`: {ex['instruction'][:120]}")
                lines.append(f"  - label: `{ex['label']}`")
                for k in ("freq", "box", "target"):
                    if ex.get(k) is not None:
                        lines.append(f"  - {k}: {ex[k]}")
                for r in ex.get("responses", [])[:1]:
                    lines.append(f"  - response: `{r[:300]}`")
        lines.append("")
    return "\n".join(lines)


def write_report(workdir: str, report: dict[str, Any]) -> tuple[str, str]:
    jpath, mpath = os.path.join(workdir, "curation_report.json"), os.path.join(workdir, "curation_report.md")
    with open(jpath, "w") as f:
        json.dump(report, f, indent=1, default=str)
    with open(mpath, "w") as f:
        f.write(markdown(report))
    return jpath, mpath
