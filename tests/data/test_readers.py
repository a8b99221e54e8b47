"""Readers on real Uni-GUI episodes, and converter round trips through the GUI-Libra formats."""
import json
import os

import numpy as np
import pytest

from guilibra_jax import actions as A
from guilibra_jax import rewards as RW
from guilibra_jax.data import images as I
from guilibra_jax.data import readers as R
from guilibra_jax.data import samples as S
from guilibra_jax.data.native import StepRecord
from launch import convert_data


def test_uni_gui_reader_on_real_episodes(uni_gui_dir):
    src = R.open_source(uni_gui_dir, "uni_gui")
    recs = [src[i] for i in range(len(src))]
    assert all(isinstance(r, StepRecord) for r in recs)
    # 20 steps, 3 desktop steps marked is_use=false stay out (but stay in later histories)
    assert len(recs) == 17 and src.skipped == {"deleted_episode": 0, "deleted_step": 0, "unused_step": 3}
    desk = [r for r in recs if r.platform == "desktop"]
    mob = [r for r in recs if r.platform == "mobile"]
    assert len(desk) == 7 and len(mob) == 10
    assert [r.target.action_type for r in desk] == ["Click", "Write", "KeyboardPress", "Write", "Write",
                                                     "KeyboardPress", "Terminate"]
    assert desk[3].step == 5 and len(desk[3].history) == 5          # history includes the unused steps
    assert desk[0].target.point == (0.018, 0.491) and desk[0].target.bbox == (0.005, 0.473, 0.031, 0.509)
    assert mob[1].target.action_type == "Swipe" and mob[1].target.value == "up"
    assert mob[1].target.bbox2 == pytest.approx((450 / 999, 331 / 999, 550 / 999, 431 / 999))
    assert mob[3].target.action_type == "NavigateBack"
    for r in recs:
        assert r.target.tool_call is not None and os.path.exists(r.image) and r.image.endswith(".jpg")
        assert I.load_image(r.image).size == tuple(r.image_size)


def test_each_rendered_target_earns_full_reward(uni_gui_dir):
    """mopd_reward of each step's own rendered tool-call target is 1.0, and the GUI-Libra
    reward of its rendered <answer> (Qwen3 norm1000 coordinates) is 1.0."""
    src = R.open_source(uni_gui_dir, "uni_gui")
    for i in range(len(src)):
        r = src[i]
        for with_reasoning in (True, False):
            text, _ = S.render_target(r, S.SampleSpec("mopd", "qwen3_vl"), (1000, 1000), with_reasoning)
            assert RW.mopd_reward(text, r.reward_target()) == 1.0, (src.where(i), text)
            gl, _ = S.render_target(r, S.SampleSpec("guilibra", "qwen3_vl"), (1000, 1000), with_reasoning)
            assert RW.guilibra_reward(gl, r.reward_target(), coord_space="norm1000").total == 1.0, gl


def _records(path):
    src = R.open_source(path, "native")
    return [src[i] for i in range(len(src))]


def _assert_same(a: StepRecord, b: StepRecord):
    """Equal records up to float rounding of geometry; images compared by pixels."""
    da, db = a.to_dict(), b.to_dict()
    ia, ib = da.pop("image"), db.pop("image")
    ta, tb = da.pop("target"), db.pop("target")
    assert da == db
    for k in ("point", "bbox", "bbox2"):
        ga, gb = ta.pop(k), tb.pop(k)
        assert (ga is None) == (gb is None), k
        if ga is not None:
            np.testing.assert_allclose(ga, gb, rtol=0, atol=1e-9)
    assert ta == tb
    np.testing.assert_array_equal(np.asarray(I.load_image(ia)), np.asarray(I.load_image(ib)))


def test_round_trip_native_guilibra_sft_native(native_dataset, tmp_path):
    sft = str(tmp_path / "sft.json")
    back = str(tmp_path / "back.jsonl")
    assert convert_data.main([f"--input={native_dataset}", "--format=native", "--to=guilibra_sft",
                              f"--output={sft}"]) == 0
    item = json.load(open(sft))[0]
    assert [c["from"] for c in item["conversations"]] == ["system", "human", "gpt"]
    assert item["conversations"][1]["value"].startswith("<image>\nPlease generate the next move")
    assert A.parse_response(item["conversations"][2]["value"]).format_ok
    assert convert_data.main([f"--input={sft}", "--format=guilibra_sft", f"--output={back}"]) == 0
    a, b = _records(native_dataset), _records(back)
    assert len(a) == len(b) == 24
    for x, y in zip(a, b):
        _assert_same(x, y)


def test_round_trip_native_guilibra_rl_native(native_dataset, tmp_path):
    rl = str(tmp_path / "rl.parquet")
    back = str(tmp_path / "back.jsonl")
    assert convert_data.convert(native_dataset, "native", rl, "guilibra_rl")["written"] == 24
    import pyarrow.parquet as pq
    row = pq.read_table(rl).slice(0, 1).to_pylist()[0]
    assert set(row) >= {"images", "system_prompt", "context", "data_source", "answer"}
    assert set(row["answer"]) == {"gt_action", "gt_bbox", "gt_point_2d", "gt_input_text", "gt_target",
                                  "image_width", "image_height"}
    convert_data.convert(rl, "guilibra_rl", back)
    a, b = _records(native_dataset), _records(back)
    assert len(a) == len(b) == 24
    for x, y in zip(a, b):
        _assert_same(x, y)


def test_plain_guilibra_rl_row_without_extra_info():
    """A release-style row (no extra_info): geometry from gt_bbox (0-1000) and gt_point_2d (0-1)."""
    import io
    from PIL import Image
    buf = io.BytesIO()
    Image.new("RGB", (40, 30)).save(buf, format="PNG")
    row = {"images": [{"bytes": buf.getvalue(), "path": None}], "system_prompt": "...NavigateHome...",
           "context": "Please generate the next move according to the UI screenshot 40x30, instruction and "
                      "previous actions.\n\nInstruction: open mail\n\nInteraction History: Step 1 Action: go home",
           "data_source": "aitw", "answer": {"gt_action": "click", "gt_bbox": [100, 200, 300, 400],
                                             "gt_point_2d": [0.2, 0.3], "gt_input_text": "no input text",
                                             "gt_target": "Mail icon", "image_width": 40, "image_height": 30}}
    d = R.guilibra_rl_to_native(row, "x[0]")
    assert d["platform"] == "mobile" and d["instruction"] == "open mail" and d["history"] == ["go home"]
    assert d["target"]["action_type"] == "click" and d["target"]["bbox"] == [0.1, 0.2, 0.3, 0.4]
    assert d["target"]["value"] is None and d["target"]["point"] == [0.2, 0.3] and d["step"] == 1


def test_sources_are_picklable_and_thread_safe(native_dataset):
    import pickle
    from concurrent.futures import ThreadPoolExecutor
    src = R.open_source(native_dataset, "native")
    src[0]  # opens the descriptor
    clone = pickle.loads(pickle.dumps(src))
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda i: clone[i % len(clone)].to_json(), range(200)))
    assert got == [src[i % len(src)].to_json() for i in range(200)]
