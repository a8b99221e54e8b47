"""Datasets of realistic size on disk, in each reader format, for the data benchmarks.

A pool of distinct UI-like screenshots (1080x2400 mobile, 1920x1080 desktop; text
rows, toolbars and photo-like panels, 0.8-1.8 MB as PNG) is rendered once and its
bytes are reused, so generating many GB is I/O-bound. Records carry realistic text
(instruction, history, reasoning) and cycle through click / write / scroll actions.

Formats: ``native`` (JSONL + PNG files), ``guilibra_sft`` (one JSON array + PNG
files), ``guilibra_rl`` (parquet with the screenshots inside, row groups of
``parquet_rows.DEFAULT_ROW_GROUP_MB``), ``uni_gui`` (episode folders of 10 steps:
``task.json`` + screenshots). With ``link_images`` the PNG files of the file-based
formats are hard links to the pool (same bytes, almost no disk).
"""

from __future__ import annotations

import io
import json
import os
from typing import Iterator

import numpy as np
from PIL import Image, ImageDraw, ImageFont

FORMATS = ("guilibra_rl", "guilibra_sft", "native", "uni_gui")
MOBILE, DESKTOP = (1080, 2400), (1920, 1080)
_WORDS = ("settings display brightness wifi network battery storage apps notifications sound privacy "
          "location security accounts google system about phone search recent open close save cancel "
          "share edit delete calendar meeting inbox compose reply archive photos album camera").split()


def screenshot_png(size: tuple[int, int], seed: int) -> bytes:
    """A UI-like screenshot as PNG bytes: bands of text lines, toolbars and photo panels."""
    rng = np.random.default_rng(seed)
    w, h = size
    img = Image.new("RGB", size, tuple(int(c) for c in rng.integers(225, 256, 3)))
    d = ImageDraw.Draw(img)
    fonts = [ImageFont.load_default(size=s) for s in (22, 28, 36, 48)]
    y = 0
    while y < h:
        kind, bh = rng.random(), int(rng.integers(h // 30, h // 8))
        if kind < 0.3:      # photo: smooth colour field with sensor noise
            x0, x1 = int(rng.integers(0, w // 3)), int(rng.integers(2 * w // 3, w))
            gy, gx = np.mgrid[0:bh, 0:x1 - x0]
            base = np.stack([np.sin(gx / rng.uniform(20, 200) + c) * 60 + np.cos(gy / rng.uniform(20, 200)) * 60
                             + 128 for c in range(3)], -1) + rng.normal(0, 10, (bh, x1 - x0, 3))
            img.paste(Image.fromarray(np.clip(base, 0, 255).astype(np.uint8)), (x0, y))
        elif kind < 0.45:   # toolbar with a label
            d.rectangle([0, y, w, y + bh], fill=tuple(int(c) for c in rng.integers(0, 256, 3)))
            d.text((int(rng.integers(10, w // 4)), y + bh // 4), " ".join(rng.choice(_WORDS, 3)),
                   fill=(255, 255, 255), font=fonts[2])
        else:               # list rows of text
            f = fonts[int(rng.integers(0, 4))]
            for ly in range(y, y + bh, int(f.size) + 10):
                d.text((int(rng.integers(10, 60)), ly), " ".join(rng.choice(_WORDS, int(rng.integers(2, 9)))).capitalize(),
                       fill=tuple(int(c) for c in rng.integers(0, 90, 3)), font=f)
        y += bh + int(rng.integers(4, 30))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def make_pool(folder: str, n: int = 24) -> list[dict]:
    """``n`` distinct screenshots (half mobile, half desktop) as PNG files in ``folder``
    (kept between runs); each entry: path, bytes, size, platform."""
    os.makedirs(folder, exist_ok=True)
    pool = []
    for k in range(n):
        platform = "mobile" if k % 2 == 0 else "desktop"
        size = MOBILE if platform == "mobile" else DESKTOP
        path = os.path.join(folder, f"pool{k:03d}_{platform}.png")
        if not os.path.exists(path):
            data = screenshot_png(size, 1000 + k)
            with open(path + ".tmp", "wb") as f:
                f.write(data)
            os.replace(path + ".tmp", path)
        pool.append({"path": path, "bytes": os.path.getsize(path), "size": size, "platform": platform})
    return pool


def rows_for(target_bytes: int, pool: list[dict]) -> int:
    """Rows whose screenshots add up to about ``target_bytes``."""
    return max(1, int(target_bytes // np.mean([p["bytes"] for p in pool])))


def record(i: int, image, pool_item: dict) -> dict:
    """A native record dict with realistic text; step ``i % 10`` of trajectory ``i // 10``."""
    rng = np.random.default_rng(i)
    step = i % 10
    words = lambda n: " ".join(rng.choice(_WORDS, n))  # noqa: E731
    kind = i % 3
    point = [round(float(rng.uniform(0.05, 0.95)), 4), round(float(rng.uniform(0.05, 0.95)), 4)]
    target = {"action_type": "Click", "action_description": f"tap the {words(2)} button", "value": None,
              "point": point, "bbox": [max(0.0, point[0] - 0.04), max(0.0, point[1] - 0.02),
                                       min(1.0, point[0] + 0.04), min(1.0, point[1] + 0.02)],
              "action_target": words(2)}
    if kind == 1:
        target.update(action_type="Write", value=words(3), action_description=f"type {words(3)}")
    elif kind == 2:
        target.update(action_type="Scroll", value="down", point=None, bbox=None, action_target=None,
                      action_description="scroll down the list")
    return {"trajectory_id": f"traj{i // 10}", "step": step, "platform": pool_item["platform"],
            "instruction": f"In the {words(1)} app, open {words(2)} and change the {words(2)} to {words(1)}",
            "history": [f"Step {k + 1}: tap the {words(2)} entry" for k in range(step)],
            "image": image, "image_size": list(pool_item["size"]), "target": target,
            "reasoning": " ".join(f"The screen shows {words(6)}; the {words(2)} entry leads on." for _ in range(6)),
            "alternatives": [], "source": ["aitw", "mind2web", "androidcontrol", "omniact"][i % 4], "split": "train"}


def _image_file(pool_item: dict, dst: str, link: bool) -> None:
    if link:
        os.link(pool_item["path"], dst)
    else:
        with open(pool_item["path"], "rb") as f, open(dst, "wb") as g:
            g.write(f.read())


def write_native(folder: str, rows: int, pool: list[dict], link: bool) -> str:
    os.makedirs(os.path.join(folder, "img"), exist_ok=True)
    path = os.path.join(folder, "data.jsonl")
    with open(path, "w") as f:
        for i in range(rows):
            p = pool[i % len(pool)]
            name = f"img/{i:07d}.png"
            _image_file(p, os.path.join(folder, name), link)
            f.write(json.dumps(record(i, name, p)) + "\n")
    return path


def write_guilibra_sft(folder: str, rows: int, pool: list[dict], link: bool) -> str:
    from guilibra_jax.data import writers as W
    from guilibra_jax.data.native import record_from_dict
    os.makedirs(os.path.join(folder, "img"), exist_ok=True)
    path = os.path.join(folder, "sft.json")
    with open(path, "w") as f:
        f.write("[\n")
        for i in range(rows):
            p = pool[i % len(pool)]
            name = f"img/{i:07d}.png"
            _image_file(p, os.path.join(folder, name), link)
            r = record_from_dict(record(i, name, p))
            f.write(("" if i == 0 else ",\n") + json.dumps(W.sft_item(r, name), ensure_ascii=False))
        f.write("\n]\n")
    return path


def write_guilibra_rl(folder: str, rows: int, pool: list[dict]) -> str:
    from guilibra_jax.data import writers as W
    from guilibra_jax.data.native import record_from_dict
    os.makedirs(folder, exist_ok=True)
    data = []
    for p in pool:
        with open(p["path"], "rb") as f:
            data.append(f.read())

    def records() -> Iterator:
        for i in range(rows):
            k = i % len(pool)
            yield record_from_dict(record(i, {"bytes": data[k]}, pool[k]))

    path = os.path.join(folder, "rl.parquet")
    W.native_to_guilibra_rl(records(), path)
    return path


def write_uni_gui(folder: str, rows: int, pool: list[dict], link: bool) -> str:
    """Episodes of 10 steps, each with its own task.json (Uni-GUI layout, tool-call plans)."""
    episodes = (rows + 9) // 10
    mobile = [p for p in pool if p["platform"] == "mobile"]
    desktop = [p for p in pool if p["platform"] == "desktop"]
    for e in range(episodes):
        is_mobile = e % 2 == 0
        shots = mobile if is_mobile else desktop
        d = os.path.join(folder, f"ep{e:06d}")
        os.makedirs(d, exist_ok=True)
        steps = []
        for k in range(min(10, rows - 10 * e)):
            i = 10 * e + k
            p = shots[i % len(shots)]
            _image_file(p, os.path.join(d, f"screenshot_step{k}.png"), link)
            r = record(i, "", p)
            scale = 999 if is_mobile else 1000
            x, y = (int(c * scale) for c in (r["target"]["point"] or [0.5, 0.5]))
            plan = {"name": "mobile_use" if is_mobile else "computer_use",
                    "arguments": {"action": "click" if is_mobile else "left_click", "coordinate": [x, y]}}
            steps.append({"step": k + 1, "query": r["instruction"], "thought": r["reasoning"],
                          "action": r["target"]["action_description"], "pixel": list(p["size"]), "plan": plan,
                          "bbox": [[max(0, x - 30), max(0, y - 20)], [min(scale, x + 30), min(scale, y + 20)]],
                          "screenshot": f"screenshot_step{k}.png", "is_use": True, "is_delete": False,
                          "train_test": "train", "raw_thought": r["reasoning"][:200]})
        task = {"task": "Bench", "app": "settings", "screen_resolution": list(shots[0]["size"]),
                "query": steps[0]["query"], "episode_id": f"ep{e:06d}", "is_delete": False,
                "device": "mobile" if is_mobile else "computer", "data": steps}
        with open(os.path.join(d, "task.json"), "w") as f:
            json.dump(task, f)
    return folder


def generate(fmt: str, folder: str, rows: int, pool: list[dict], link_images: bool) -> str:
    """Write ``rows`` records of format ``fmt`` under ``folder``; returns the reader's input."""
    if fmt == "native":
        return write_native(folder, rows, pool, link_images)
    if fmt == "guilibra_sft":
        return write_guilibra_sft(folder, rows, pool, link_images)
    if fmt == "guilibra_rl":
        return write_guilibra_rl(folder, rows, pool)
    if fmt == "uni_gui":
        return write_uni_gui(folder, rows, pool, link_images)
    raise ValueError(f"unknown format {fmt!r}; expected one of {FORMATS}")


def disk_bytes(folder: str) -> int:
    """Bytes the files under ``folder`` add on disk (hard links to the pool left out)."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            st = os.lstat(os.path.join(root, name))
            if st.st_nlink == 1:
                total += st.st_blocks * 512
    return total


def nominal_bytes(folder: str) -> int:
    """Bytes of the files under ``folder`` counting each hard link (the dataset's size)."""
    return sum(os.lstat(os.path.join(r, n)).st_size for r, _, fs in os.walk(folder) for n in fs)
