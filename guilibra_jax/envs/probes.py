"""Vision probes: one-step screenshots whose answer only the picture holds.

Each probe draws a white 320 x 420 page (MiniWoB++'s size at scale 2, under a pale
instruction bar) with one colored box, or three labelled buttons, and asks about it:

    kind    instruction                      answer
    color   "Answer with the box's color."   Answer, value: red | green | blue | yellow
    place   "Answer with the box's place."   Answer, value: top|bottom left|right (box center)
    click   "Click the box."                 Click at the box (its bbox is the target)
    page    "Answer with the page's color."  the whole page is the box (the control)
    label   'Click the "GO" button.'         Click at the named one of three gray buttons
                                             labelled with short words (20 px text)

``box`` sets the box's size: ``small`` (60-140 x 30-60 px, about 1-2 of the 30-35 visual
tokens the ``configs/miniwob.py`` recipes read: a MiniWoB++ button) or ``large``
(150-220 x 130-200 px); ``label``'s buttons are 80 x 40 px whatever ``box`` says. The
instruction never names the answer, so a model that does not read the screenshot scores
at most the best constant answer (the training run's ``eval/constant_baseline_step_acc``).
Telling the two apart is the probe's purpose: a plumbing defect (images not reaching the
model) fails even ``page``; a model that reads only the screen's overall statistics passes
``page`` and ``large`` and fails ``small``; one that finds buttons but cannot read them
scores about 1/3 on ``label``.
"""

from __future__ import annotations

import os
import random

from PIL import Image, ImageDraw

from guilibra_jax.data.native import StepRecord, StepTarget

KINDS = ("color", "place", "click", "page", "label")
BOXES = {"small": ((60, 140), (30, 60)), "large": ((150, 220), (130, 200))}
COLORS = {"red": (220, 40, 40), "green": (40, 180, 60), "blue": (40, 80, 220), "yellow": (230, 200, 30)}
PAGE = (320, 420)
BAR = 90          # the instruction bar's height, px (MiniWoB++ puts the task text there)
INSTRUCTIONS = {"color": "Answer with the box's color.", "place": "Answer with the box's place.",
                "click": "Click the box.", "page": "Answer with the page's color."}
WORDS = ("ONE", "TWO", "GO", "NO", "YES", "OK", "UP", "ADD", "END", "SET")
BUTTON = (80, 40)   # label probe: button size, px
FONT_PX = 20


def _page() -> tuple[Image.Image, ImageDraw.ImageDraw]:
    """A blank probe page under its instruction bar, and a pen on it."""
    image = Image.new("RGB", PAGE, "white")
    draw = ImageDraw.Draw(image)
    draw.rectangle([0, 0, PAGE[0] - 1, BAR], fill=(255, 255, 225))
    return image, draw


def draw_probe(rng: random.Random, kind: str, box: str) -> tuple[Image.Image, tuple[float, float, float, float], str]:
    """(image, the box in unit space (x1, y1, x2, y2), its color) of one probe screen."""
    if kind not in KINDS or kind == "label":
        raise ValueError(f"probe kind {kind!r}: expected one of {[k for k in KINDS if k != 'label']} "
                         f"(label screens: draw_label_probe)")
    if box not in BOXES:
        raise ValueError(f"probe box {box!r}: expected one of {sorted(BOXES)}")
    width, height = PAGE
    color = rng.choice(sorted(COLORS))
    if kind == "page":
        x0, y0, w, h = 0, 0, width, height
    else:
        (wlo, whi), (hlo, hhi) = BOXES[box]
        w, h = rng.randint(wlo, whi), rng.randint(hlo, hhi)
        x0, y0 = rng.randint(0, width - w), rng.randint(BAR + 10, height - h)
    image, draw = _page()
    draw.rectangle([x0, y0, x0 + w - 1, y0 + h - 1], fill=COLORS[color])
    return image, (x0 / width, y0 / height, (x0 + w) / width, (y0 + h) / height), color


def draw_label_probe(rng: random.Random) -> tuple[Image.Image, tuple[float, float, float, float], str]:
    """(image, the named button in unit space, its word) of one label screen: three gray
    buttons with distinct words at places that do not overlap."""
    from PIL import ImageFont
    width, height = PAGE
    (bw, bh), boxes = BUTTON, []
    while len(boxes) < 3:
        x0, y0 = rng.randint(0, width - bw), rng.randint(BAR + 10, height - bh)
        if all(x0 + bw + 4 <= a or a + bw + 4 <= x0 or y0 + bh + 4 <= b or b + bh + 4 <= y0 for a, b in boxes):
            boxes.append((x0, y0))
    words = rng.sample(WORDS, 3)
    image, draw = _page()
    font = ImageFont.load_default(size=FONT_PX)
    for (x0, y0), word in zip(boxes, words):
        draw.rectangle([x0, y0, x0 + bw - 1, y0 + bh - 1], fill=(215, 215, 215), outline=(120, 120, 120))
        draw.text((x0 + bw / 2, y0 + bh / 2), word, fill=(0, 0, 0), font=font, anchor="mm")
    k = rng.randrange(3)
    (x0, y0), word = boxes[k], words[k]
    return image, (x0 / width, y0 / height, (x0 + bw) / width, (y0 + bh) / height), word


def _center(bbox: tuple[float, float, float, float]) -> tuple[float, float]:
    return (bbox[0] + bbox[2]) / 2, (bbox[1] + bbox[3]) / 2


def place_of(bbox: tuple[float, float, float, float]) -> str:
    """"top left" ... "bottom right": the quadrant of the box's center below the bar."""
    cx, cy = _center(bbox)
    middle = (BAR / PAGE[1] + 1) / 2
    return ("top" if cy < middle else "bottom") + " " + ("left" if cx < 0.5 else "right")


def probe_record(rng: random.Random, kind: str, box: str, index: int, split: str, image_path: str
                 ) -> tuple[StepRecord, Image.Image]:
    """One probe step (native record) and its screenshot, to be saved at ``image_path``."""
    if kind == "label":
        image, bbox, word = draw_label_probe(rng)
        target = StepTarget("Click", f'Click the "{word}" button', None, _center(bbox), bbox,
                            action_target=f'the "{word}" button')
        record = StepRecord(f"probe-label-{split}-{index}", 0, "web", f'Click the "{word}" button.', (), image_path,
                            PAGE, target, f'Three buttons; the one labelled "{word}" is the one to click.',
                            source="probe-label", split=split)
        return record, image
    image, bbox, color = draw_probe(rng, kind, box)
    if kind == "click":
        target = StepTarget("Click", "Click the box", None, _center(bbox), bbox, action_target="the box")
        reasoning = "There is one box, so I click it."
    else:
        value = place_of(bbox) if kind == "place" else color
        target = StepTarget("Answer", "Answer", value)
        reasoning = f"I look at the {'page' if kind == 'page' else 'box'}."
    record = StepRecord(f"probe-{kind}-{box}-{split}-{index}", 0, "web", INSTRUCTIONS[kind], (), image_path,
                        PAGE, target, reasoning, source=f"probe-{kind}-{box}", split=split)
    return record, image


def write_probe(out: str, kind: str, box: str = "small", train: int = 2000, test: int = 200, seed: int = 0
                ) -> dict[str, int]:
    """Write ``out``/train.jsonl and test.jsonl (native records) with their screenshots in
    ``out``/images (each record's image path relative to ``out``, so the folder reads the
    same from any working directory and after a move); returns the counts. Train and test
    screens come from one stream (``seed``), so no test screen repeats a training one but by
    chance."""
    from guilibra_jax.data.writers import write_native
    os.makedirs(os.path.join(out, "images"), exist_ok=True)
    rng = random.Random(f"{seed}-{kind}-{box}")
    counts = {}
    for split, n in (("train", train), ("test", test)):
        records = []
        for i in range(n):
            name = os.path.join("images", f"{kind}-{box}-{split}-{i}.png")   # readers resolve it from out
            record, image = probe_record(rng, kind, box, i, split, name)
            image.save(os.path.join(out, name))
            records.append(record)
        counts[split] = write_native(records, os.path.join(out, f"{split}.jsonl"))
    return counts
