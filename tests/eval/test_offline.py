"""Offline step metrics against hand-computed values, and partial verifiability."""

import json

import pytest

from guilibra_jax import actions as A
from guilibra_jax.data import native as N
from guilibra_jax.envs.export import export_dataset, load_records
from guilibra_jax.eval.agents import make_agent, responses_for_records
from guilibra_jax.eval.offline import evaluate_offline


def _rec(platform, target, alts=(), k=0):
    return N.StepRecord(trajectory_id=f"t{k}", step=0, platform=platform, instruction="x", history=(),
                        image="x.png", image_size=(100, 200), target=target, alternatives=tuple(alts))


def _gl(action_type, value=None, point=None):
    return A.render_response(A.Action(action_type, "d", value, point))


def _hand_made():
    T = N.StepTarget
    records = [
        _rec("desktop", T("Click", point=(0.2, 0.2), bbox=(0.1, 0.1, 0.3, 0.3)), [T("KeyboardPress", value="enter")], 1),
        _rec("desktop", T("Scroll", value="down"), [T("KeyboardPress", value="pagedown")], 2),
        _rec("mobile", T("Write", value="milk", point=(0.5, 0.55), bbox=(0.0, 0.5, 1.0, 0.6)), (), 3),
        _rec("mobile", T("NavigateBack"), (), 4),
        _rec("mobile", T("Swipe", value="up", point=(0.5, 0.8), bbox=(0, 0.6, 1, 1), bbox2=(0, 0, 1, 0.4)),
             [T("Scroll", value="down")], 5),
        _rec("desktop", T("Click", value="double", point=(0.1, 0.1), bbox=(0.0, 0.0, 0.2, 0.2)), (), 6),
        _rec("desktop", T("Click", point=(0.55, 0.55), bbox=(0.5, 0.5, 0.6, 0.6)), (), 7),
    ]
    responses = [
        _gl("Click", point=(200, 200)),                                   # right
        _gl("KeyboardPress", "PageDown"),                                 # wrong, = alternative
        A.render_tool_call_response(A.ToolCall("mobile_use", {"action": "type", "text": "Milk"})),  # right
        _gl("Click", point=(500, 500)),                                   # wrong type
        _gl("Scroll", "down"),                                            # wrong, = alternative
        _gl("Click", point=(100, 100)),                                   # right place, not a double click
        "I would click the button",                                       # unparseable
    ]
    return records, responses


def test_metrics_equal_hand_computed_values():
    m = evaluate_offline(*_hand_made())
    o = m["overall"]
    assert o["n"] == 7 and o["parse_rate"] == pytest.approx(6 / 7)
    assert o["action_type_accuracy"] == pytest.approx(3 / 7)
    assert (o["grounding_accuracy"], o["n_grounding"]) == (pytest.approx(0.5), 4)
    assert o["step_success"] == pytest.approx(2 / 7)
    assert o["step_success_any"] == pytest.approx(4 / 7)
    assert (o["n_wrong"], o["alternative_match_rate"]) == (5, pytest.approx(2 / 5))
    d, mo = m["by_platform"]["desktop"], m["by_platform"]["mobile"]
    assert (d["action_type_accuracy"], d["step_success"], d["grounding_accuracy"]) == \
        (pytest.approx(2 / 4), pytest.approx(1 / 4), pytest.approx(2 / 3))
    assert d["alternative_match_rate"] == pytest.approx(1 / 3)
    assert (mo["action_type_accuracy"], mo["step_success"], mo["grounding_accuracy"]) == \
        (pytest.approx(1 / 3), pytest.approx(1 / 3), 0.0)
    assert mo["alternative_match_rate"] == pytest.approx(1 / 2)
    assert m["by_action_type"]["Click"]["step_success"] == pytest.approx(1 / 3)
    assert m["by_action_type"]["Write"]["grounding_accuracy"] is None
    assert m["by_platform_action_type"]["mobile/Swipe"]["alternative_match_rate"] == 1.0


def test_coordinate_spaces_of_guilibra_responses():
    T = N.StepTarget
    rec = _rec("desktop", T("Click", point=(0.2, 0.2), bbox=(0.1, 0.1, 0.3, 0.3)))
    assert evaluate_offline([rec], [_gl("Click", point=(20, 40))], "pixels")["overall"]["step_success"] == 1
    assert evaluate_offline([rec], [_gl("Click", point=(20, 40))], "norm1000")["overall"]["step_success"] == 0
    assert evaluate_offline([rec], [_gl("Click", point=(28, 28))], "resized_pixels",
                            resized_size=lambda size: (140, 140))["overall"]["step_success"] == 1


@pytest.fixture(scope="module")
def world_records(tmp_path_factory):
    out = tmp_path_factory.mktemp("ds")
    export_dataset(str(out), ("desktop", "mobile"), n_tasks=16, seed=2, split_fraction=0.5)
    return load_records(str(out / "train.jsonl")) + load_records(str(out / "test.jsonl")), str(out)


@pytest.mark.parametrize("fmt", ["guilibra", "tool_call"])
def test_expert_responses_score_perfectly(world_records, fmt):
    records, base = world_records
    responses = responses_for_records(make_agent("expert", fmt=fmt), records, base)
    o = evaluate_offline(records, responses)["overall"]
    assert o["step_success"] == o["action_type_accuracy"] == o["grounding_accuracy"] == 1.0


def test_alternatives_are_misses_but_counted_in_the_alternative_match_rate(world_records):
    records, _ = world_records
    recs, responses = [], []
    for r in records:
        for alt in r.alternatives:
            recs.append(r)
            responses.append(A.render_response(alt.action("norm1000")))
    assert len(recs) > 20
    o = evaluate_offline(recs, responses)["overall"]
    assert o["step_success"] == 0.0
    assert o["alternative_match_rate"] == 1.0 and o["step_success_any"] == 1.0


def test_random_agent_responses_from_records_alone(world_records):
    records, base = world_records
    responses = responses_for_records(make_agent("random", seed=0), records, base)
    o = evaluate_offline(records, responses)["overall"]
    assert o["parse_rate"] == 1.0 and o["step_success"] < 0.1
