"""Pure parts of the curation: box answers read in each family's coordinate space, the
reasoning prompt and the verdict on a generated response, the resumable stage log, the
corruption kinds and the filter scores."""
import json
import os

import numpy as np
import pytest

from guilibra_jax import actions as A
from guilibra_jax.curate import corrupt as CR
from guilibra_jax.curate import prompts as CP
from guilibra_jax.curate import stages as ST
from guilibra_jax.curate.stage_log import StageLog
from guilibra_jax.data.native import StepRecord, StepTarget

QWEN25 = CP.Frame("resized_pixels", (280, 560))
QWEN3 = CP.Frame("norm1000", (256, 512))


def _record(point=(0.25, 0.5), action_type="Click", value=None, target="Send button"):
    return StepRecord("t-1", 2, "mobile", "send the mail", ("Open Mail", "Type hi"), "x.png", (1080, 2160),
                      StepTarget(action_type, "tap send", value, point, action_target=target))


@pytest.mark.parametrize("frame, text, want", [
    (QWEN25, '```json\n[{"bbox_2d": [28, 56, 140, 280], "label": "send"}]\n```', (0.1, 0.1, 0.5, 0.5)),
    (QWEN3, '{"bbox_2d": [100, 100, 500, 500]}', (0.1, 0.1, 0.5, 0.5)),
    (QWEN3, "the box is [100, 250, 300, 750].", (0.1, 0.25, 0.3, 0.75)),
    (QWEN3, "<|box_start|>(100,250),(300,750)<|box_end|>", (0.1, 0.25, 0.3, 0.75)),
    (QWEN3, '{"bbox_2d": [-50, 900, 500, 1200]}', (0.0, 0.9, 0.5, 1.0)),       # clipped to the image
])
def test_box_answers_are_read_in_the_frame_and_returned_in_unit_space(frame, text, want):
    np.testing.assert_allclose(CP.parse_box(text, frame), want, atol=1e-9)


@pytest.mark.parametrize("text", [None, "", "no box here", '{"bbox_2d": [300, 100, 200, 400]}',
                                  '{"bbox_2d": [10, 10, 10, 40]}', '{"bbox_2d": [1100, 10, 1200, 40]}',
                                  '{"point_2d": [10, 20]}'])
def test_what_is_not_a_box_is_none(text):
    assert CP.parse_box(text, QWEN3) is None


@pytest.mark.parametrize("frame", [QWEN25, QWEN3])
def test_rendered_boxes_read_back(frame):
    box = (0.1, 0.2, 0.55, 0.9)
    np.testing.assert_allclose(CP.parse_box(CP.render_box(box, frame), frame), box, atol=1.0 / frame.resized[0])


def test_box_prompt_names_the_target_and_the_frame():
    r = _record()
    p25 = CP.box_prompt(r, CP.box_target_text(r), QWEN25)
    assert '"Send button"' in p25.user and "280x560" in p25.user and p25.user.startswith("<image>\n")
    assert "0 to 1000" in CP.box_prompt(r, "Send button", QWEN3).user
    assert CP.box_target_text(_record(target=None)) == "tap send"
    assert CP.box_target_text(_record(target="None"), fallback="none") is None
    with pytest.raises(ValueError, match="box.prompt"):
        CP.box_prompt(r, "x", QWEN3, template="{nope}")


def test_reasoning_prompt_shows_the_gold_action_in_the_frame():
    p = CP.reasoning_prompt(_record(), "guilibra", QWEN25)
    gold = json.loads(p.user.split("Correct next action: ")[1])
    assert gold["point_2d"] == [70, 280] and gold["action_type"] == "Click"     # 0.25 * 280, 0.5 * 560
    assert "Step 2 Action: Type hi" in p.user and "<answer>" in p.system and "mobile" in p.system
    with pytest.raises(ValueError, match="tool_call"):
        CP.reasoning_prompt(_record(), "mopd", QWEN3)


def test_reasoning_verdicts_follow_the_verifier():
    r, frame, rw = _record(), QWEN25, {}
    right = A.render_response(A.Action("Click", "tap", None, (72.0, 279.0)), "I see the send button.")
    near_miss = A.render_response(A.Action("Click", "tap", None, (200.0, 279.0)), "I tap elsewhere.")
    no_think = A.render_response(A.Action("Click", "tap", None, (72.0, 279.0)))
    assert ST.classify_reasoning(right, None, r, "guilibra", frame, rw) == ("accepted", "I see the send button.")
    assert ST.classify_reasoning(near_miss, None, r, "guilibra", frame, rw) == ("contradicts_label", None)
    assert ST.classify_reasoning(no_think, None, r, "guilibra", frame, rw) == ("no_reasoning", None)
    assert ST.classify_reasoning("I would click it", None, r, "guilibra", frame, rw) == ("unparsed", None)
    assert ST.classify_reasoning(None, "timeout", r, "guilibra", frame, rw) == ("failed:timeout", None)


def test_label_match_is_the_verifier_accuracy_in_the_frame():
    r = _record()
    hit = A.render_response(A.Action("Click", "", None, (70.0, 280.0)))         # the label, in resized pixels
    assert ST.label_match(hit, r, "guilibra", QWEN25)
    assert not ST.label_match(hit, r, "guilibra", QWEN3)                        # same numbers read as 0-1000
    write = _record(action_type="Write", value="hello there", point=None)
    assert ST.label_match(A.render_response(A.Action("Write", "", "hello there")), write, "guilibra", QWEN3)
    assert not ST.label_match(A.render_response(A.Action("Write", "", "bye")), write, "guilibra", QWEN3)


def test_stage_log_resumes_from_complete_lines_and_keeps_the_last_row_per_id(tmp_path):
    path = str(tmp_path / "s.jsonl")
    log = StageLog(path, big=("reasoning",))
    log.append([{"id": 0, "reason": "a", "reasoning": "long text 0"}, {"id": 1, "reason": "b", "reasoning": None}])
    log.append([{"id": 1, "reason": "c", "reasoning": "long text 1"}])
    with open(path, "ab") as f:
        f.write(b'{"id": 2, "reason": "torn')                     # a kill in the middle of a write
    again = StageLog(path, big=("reasoning",))
    assert sorted(again.rows) == [0, 1] and again.torn_lines == 1
    assert again.get(1) == {"id": 1, "reason": "c"}                 # big fields stay on disk
    assert again.full(1)["reasoning"] == "long text 1" and again.full(0)["reasoning"] == "long text 0"
    again.append([{"id": 2, "reason": "d", "reasoning": "x"}])       # appends after the cut, not after the tear
    third = StageLog(path)
    assert sorted(third.rows) == [0, 1, 2] and third.torn_lines == 0 and third.get(2)["reason"] == "d"
    other = StageLog(path)
    other.append([{"id": 9, "reason": "e"}], write=False)           # another process: in memory only
    assert 9 in other and 9 not in StageLog(path)


def test_corruptions_change_the_label_as_named():
    rng = np.random.default_rng(0)
    t = StepTarget("Click", "tap", None, (0.9, 0.9), bbox=(0.8, 0.8, 1.0, 1.0))
    for _ in range(50):
        s = CR.shift_point(t, rng, 0.25)
        assert np.hypot(s.point[0] - 0.9, s.point[1] - 0.9) >= 0.25 and all(0.02 <= c <= 0.98 for c in s.point)
        w = CR.wrong_type(t, "desktop", rng)
        assert w.action_type != "Click" and w.action_type in A.WEB_ACTION_TYPES
        assert (w.point is not None) == (w.action_type in ("Click", "LongPress", "Select"))
    records = [_record(point=None if i % 3 == 0 else (0.5, 0.5)) for i in range(30)]
    out, kinds = CR.corrupt(records, 0.5, seed=1)
    assert len(kinds) == 15 and all(records[i].target.point is not None for i, k in kinds.items() if k == "shift_point")
    assert all(out[i] == records[i] for i in range(30) if i not in kinds)


def test_filter_scores_count_removed_against_corrupted():
    s = CR.filter_scores(removed={1, 2, 3, 7}, corrupted={1: "a", 2: "b", 5: "a"}, ids=range(10))
    assert s["precision"] == 0.5 and s["recall"] == pytest.approx(2 / 3)
    assert s["clean_kept"] == pytest.approx(5 / 7) and s["recall_by_kind"] == {"a": 0.5, "b": 1.0}


def test_rebalance_mappings_parse_and_bad_ones_name_the_key():
    assert ST.parse_mapping("0:0.5, 1:0.75", "k", int) == {0: 0.5, 1: 0.75}
    assert ST.parse_mapping("", "k") == {}
    from guilibra_jax.errors import ConfigError
    with pytest.raises(ConfigError, match="rebalance.step_keep"):
        ST.parse_mapping("0=0.5", "rebalance.step_keep", int)
