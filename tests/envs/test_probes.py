"""Vision probes (guilibra_jax/envs/probes.py): each record's answer is what its screenshot shows."""

import random
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from guilibra_jax import rewards as R
from guilibra_jax.data.bad_records import Dropped
from guilibra_jax.data.readers import open_source
from guilibra_jax.envs import probes as P


def _records(out):
    src = open_source([str(out / "train.jsonl"), str(out / "test.jsonl")], "native")
    records = [src[i] for i in range(len(src))]
    assert not [r for r in records if isinstance(r, Dropped)]
    return records


def _box_pixels(record):
    image = np.asarray(Image.open(record.image).convert("RGB"))
    h, w, _ = image.shape
    x1, y1, x2, y2 = record.target.bbox if record.target.bbox else (0, 0, 1, 1)
    return image, (round(x1 * w), round(y1 * h), round(x2 * w), round(y2 * h))


@pytest.mark.parametrize("kind,box", [("color", "small"), ("place", "large"), ("click", "small"), ("page", "small")])
def test_every_answer_is_what_the_screenshot_shows(tmp_path, kind, box):
    counts = P.write_probe(str(tmp_path), kind, box, train=12, test=4, seed=1)
    assert counts == {"train": 12, "test": 4}
    records = _records(tmp_path)
    assert [r.split for r in records] == ["train"] * 12 + ["test"] * 4
    assert {r.instruction for r in records} == {P.INSTRUCTIONS[kind]}
    for r in records:
        image, _ = _box_pixels(r)
        colors = {tuple(c) for c in image.reshape(-1, 3)}
        drawn = [name for name, rgb in P.COLORS.items() if rgb in colors]
        assert len(drawn) == 1, r.trajectory_id          # one box, one color
        if kind == "click":
            x1, y1, x2, y2 = r.target.bbox
            # the box's pixels are exactly its bbox: a click at the target point is correct
            mask = np.all(image == P.COLORS[drawn[0]], axis=-1)
            ys, xs = np.nonzero(mask)
            assert (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1) == tuple(
                round(v * s) for v, s in zip((x1, y1, x2, y2), (320, 420, 320, 420)))
            assert R.guilibra_reward(
                '<answer>{"action_type": "Click", "action_description": "", "value": "None", "point_2d": '
                f'[{round(r.target.point[0] * 320)}, {round(r.target.point[1] * 420)}]}}</answer>',
                r.reward_target(), coord_space="resized_pixels", resized_size=(320, 420)).accuracy == 1.0
        elif kind == "place":
            mask = np.all(image == P.COLORS[drawn[0]], axis=-1)
            ys, xs = np.nonzero(mask)
            cx, cy = (xs.min() + xs.max() + 1) / 2 / 320, (ys.min() + ys.max() + 1) / 2 / 420
            assert r.target.value == ("top" if cy < (P.BAR / 420 + 1) / 2 else "bottom") + " " + (
                "left" if cx < 0.5 else "right")
        else:
            assert r.target.value == drawn[0]
            if kind == "page":
                assert np.mean(np.all(image == P.COLORS[drawn[0]], axis=-1)) == 1.0
    # answers vary, so a constant answer cannot pass the probe
    assert len({r.target.value or r.target.point for r in records}) > 1


def test_a_probe_written_to_a_relative_folder_reads_from_any_working_directory(tmp_path, monkeypatch):
    """`make demo-miniwob` writes --out=runs/miniwob_probes/...: the records' image paths are
    relative to the folder (the readers resolve them from the JSONL's folder), not to the cwd."""
    monkeypatch.chdir(tmp_path)
    P.write_probe("runs/probe", "click", "small", train=3, test=1, seed=0)
    monkeypatch.chdir("/")
    records = _records(tmp_path / "runs" / "probe")
    assert len(records) == 4 and all(Image.open(r.image).size == P.PAGE for r in records)


def test_label_probe_names_the_button_whose_pixels_show_its_word(tmp_path):
    from PIL import ImageDraw, ImageFont
    P.write_probe(str(tmp_path), "label", train=10, test=2, seed=2)
    records = _records(tmp_path)
    font = ImageFont.load_default(size=P.FONT_PX)
    for r in records:
        word = r.target.action_description.split('"')[1]
        assert r.instruction == f'Click the "{word}" button.' and word in P.WORDS
        image, (x1, y1, x2, y2) = _box_pixels(r)
        assert (x2 - x1, y2 - y1) == P.BUTTON
        # the target's pixels are exactly a button drawn with the instruction's word
        button = Image.new("RGB", P.BUTTON, "white")
        draw = ImageDraw.Draw(button)
        draw.rectangle([0, 0, P.BUTTON[0] - 1, P.BUTTON[1] - 1], fill=(215, 215, 215), outline=(120, 120, 120))
        draw.text((P.BUTTON[0] / 2, P.BUTTON[1] / 2), word, fill=(0, 0, 0), font=font, anchor="mm")
        assert np.array_equal(image[y1:y2, x1:x2], np.asarray(button)), r.trajectory_id
        # two other buttons with other words: clicking a button at random is right 1 time in 3
        gray = np.all(image == (215, 215, 215), axis=-1)
        assert gray.sum() > 2.5 * gray[y1:y2, x1:x2].sum()
    assert len({r.instruction for r in records}) > 1


def test_the_launcher_writes_a_probe_and_bad_kinds_are_named(tmp_path):
    out = subprocess.run([sys.executable, "-m", "launch.vision_probe", "--kind=place", "--box=small",
                          f"--out={tmp_path}", "--train=3", "--test=2"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert len(_records(tmp_path)) == 5
    with pytest.raises(ValueError, match="probe kind 'colour'"):
        P.draw_probe(random.Random(0), "colour", "small")
    with pytest.raises(ValueError, match="probe box 'tiny'"):
        P.draw_probe(random.Random(0), "color", "tiny")
