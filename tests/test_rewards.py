"""GUI-Libra and UI-MOPD verifier rewards against hand-computed values."""
import json
import math

import pytest
from hypothesis import given, settings, strategies as st

from guilibra_jax import actions as A
from guilibra_jax import rewards as R


def answer(action_type, value="None", point=(-100, -100), think="why", desc="d"):
    body = {"action_type": action_type, "action_description": desc, "value": value, "point_2d": list(point)}
    return (f"<think>{think}</think>" if think is not None else "") + f"<answer>{json.dumps(body)}</answer>"


# ---- building blocks -------------------------------------------------------------------

def test_word_f1_hand_values():
    assert R.word_f1("the red car", "the red car") == 1.0
    # pred 4 words, gold 2, overlap 2: P = 0.5, R = 1 -> F1 = 2/3
    assert math.isclose(R.word_f1("red car is fast", "Red car"), 2 / 3)
    assert R.word_f1("", "") == 1.0 and R.word_f1("a", "") == 0.0 and R.word_f1(None, "x") == 0.0
    # multiset vs set: "a a b" vs "a b": multiset overlap 2 -> P=2/3, R=1 -> 0.8; set -> 1.0
    assert math.isclose(R.word_f1("a a b", "a b"), 0.8)
    assert R.word_f1("a a b", "a b", use_set=True) == 1.0


def test_point_in_box_border_and_garbage():
    box = (0.1, 0.1, 0.3, 0.3)
    assert R.point_in_box((0.2, 0.2), box)
    assert R.point_in_box((0.1, 0.2), box) and not R.point_in_box((0.1, 0.2), box, strict=True)
    assert not R.point_in_box((0.31, 0.2), box)
    assert not R.point_in_box(None, box) and not R.point_in_box((0.2, 0.2), None)
    assert not R.point_in_box((float("nan"), 0.2), box)


def test_value_rules_differ_where_the_release_says():
    # F1 exactly 0.5: "open settings app now" vs "settings": P=1/4, R=1 -> 0.4 (fails both F1 rules),
    # but the release accepts a single-word gold contained in the prediction.
    assert not R.value_match("open settings app now", "settings", rule="paper")
    assert R.value_match("open settings app now", "settings", rule="release")
    # F1 == 0.5 exactly: pred "a b", gold "a c": P=1/2, R=1/2 -> 0.5: paper needs > 0.5.
    assert not R.value_match("a b", "a c", rule="paper")
    assert R.value_match("a b", "a c", rule="release")
    with pytest.raises(ValueError, match="unknown value rule"):
        R.value_match("a", "a", rule="fuzzy")


# ---- GUI-Libra reward ------------------------------------------------------------------

CLICK = R.Target("Click", point=(0.5, 0.5), bbox=(0.4, 0.4, 0.6, 0.6), image_size=(1000, 1000))


@pytest.mark.parametrize("text,expected", [
    # format, action_type, value, grounding -> total = 0.1*fmt + 0.9*acc
    (answer("Click", point=(500, 500)), (1, 1, 1, 1)),
    (answer("Click", point=(700, 500)), (1, 1, 1, 0)),
    (answer("LongPress", point=(500, 500)), (1, 0, 1, 1)),
    (answer("tap", point=(450, 550), think=None), (1, 1, 1, 1)),
    ("I click " + answer("Click", point=(500, 500)), (0, 1, 1, 1)),
    ("<answer>broken", (0, 0, 0, 0)),
])
def test_guilibra_click_breakdown(text, expected):
    r = R.guilibra_reward(text, CLICK, coord_space="norm1000")
    fmt, act, val, g = expected
    acc = act * val * g
    assert (r.format, r.action_type, r.value, r.grounding, r.accuracy) == (fmt, act, val, g, acc)
    assert math.isclose(r.total, 0.1 * fmt + 0.9 * acc)


def test_guilibra_point_only_target_uses_normalised_distance():
    t = R.Target("Click", point=(0.5, 0.5), image_size=(1000, 1000))
    assert R.guilibra_reward(answer("Click", point=(530, 540)), t).grounding == 1.0  # d = 0.05
    assert R.guilibra_reward(answer("Click", point=(540, 540)), t).grounding == 0.0  # d = 0.0566


@pytest.mark.parametrize("point,d", [((700, 500), 0.1), ((800, 700), math.hypot(0.2, 0.1)), ((600, 650), 0.05),
                                     ((0, 0), math.hypot(0.4, 0.4))])
def test_shaped_grounding_is_a_gaussian_of_the_distance_to_the_box(point, d):
    """rl.reward.grounding_sigma: a miss earns 0.5 exp(-d^2 / 2 sigma^2), d measured by hand
    from the point to CLICK's box [0.4, 0.6]^2; the pass (accuracy 1) stays a hit only, and
    sigma 0 is the paper's binary reward."""
    text = answer("Click", point=point)
    r = R.guilibra_reward(text, CLICK, coord_space="norm1000", grounding_sigma=0.1)
    assert math.isclose(r.grounding, 0.5 * math.exp(-0.5 * (d / 0.1) ** 2), rel_tol=1e-9)
    assert r.accuracy == r.grounding < 0.5 and math.isclose(r.total, 0.1 + 0.9 * r.grounding)
    assert R.guilibra_reward(text, CLICK, coord_space="norm1000").grounding == 0.0
    hit = R.guilibra_reward(answer("Click", point=(450, 590)), CLICK, coord_space="norm1000", grounding_sigma=0.1)
    assert hit.accuracy == 1.0
    wrong_type = R.guilibra_reward(answer("LongPress", point=point), CLICK, coord_space="norm1000",
                                   grounding_sigma=0.1)
    assert wrong_type.accuracy == 0.0                       # shaping never rescues a wrong action type


def test_shaped_grounding_on_a_point_only_target_starts_at_the_tolerance():
    t = R.Target("Click", point=(0.5, 0.5), image_size=(1000, 1000))
    assert R.guilibra_reward(answer("Click", point=(530, 540)), t, grounding_sigma=0.1).grounding == 1.0
    r = R.guilibra_reward(answer("Click", point=(600, 500)), t, grounding_sigma=0.1)   # 0.1 from the point
    assert math.isclose(r.grounding, 0.5 * math.exp(-0.5 * (0.05 / 0.1) ** 2), rel_tol=1e-9)


def test_guilibra_resized_pixel_space_for_qwen2_5():
    image = (1080, 2400)
    resized = A.resized_size_for(image, "qwen2_5_vl")
    t = R.Target("Click", bbox=(0.2, 0.2, 0.3, 0.3), image_size=image)
    inside = A.from_unit((0.25, 0.25), "resized_pixels", resized_size=resized)
    outside = A.from_unit((0.35, 0.25), "resized_pixels", resized_size=resized)
    kw = dict(coord_space="resized_pixels", resized_size=resized)
    assert R.guilibra_reward(answer("Click", point=inside), t, **kw).accuracy == 1.0
    assert R.guilibra_reward(answer("Click", point=outside), t, **kw).accuracy == 0.0
    # the same numbers read as 0-1000 coordinates land elsewhere
    assert R.guilibra_reward(answer("Click", point=inside), t, coord_space="norm1000").grounding == 0.0


@pytest.mark.parametrize("target,text,acc", [
    (R.Target("Write", value="John Smith", bbox=(0, 0, 0.5, 0.5)), answer("Write", "john smith", (100, 100)), 1),
    (R.Target("Write", value="John Smith", bbox=(0, 0, 0.5, 0.5)), answer("Write", "Jane Doe", (100, 100)), 0),
    (R.Target("Write", value="John Smith", bbox=(0, 0, 0.5, 0.5)), answer("Write", "John Smith", (900, 900)), 0),
    (R.Target("Write", value="hello"), answer("Write", "hello"), 1),  # no geometry: r_g = 1
    (R.Target("Scroll", value="down"), answer("Scroll", "down"), 1),
    (R.Target("Scroll", value="down"), answer("Scroll", "up"), 0),
    (R.Target("Swipe", value="up"), answer("Swipe", "up"), 1),
    (R.Target("NavigateBack"), answer("NavigateBack"), 1),
    (R.Target("NavigateBack"), answer("NavigateHome"), 0),
    (R.Target("NavigateHome"), answer("navigate_home"), 1),
    (R.Target("Answer", value="42 apples"), answer("Answer", "42 apples"), 1),
    (R.Target("Wait", value="2"), answer("Wait", "2"), 1),
    (R.Target("OpenApp", value="Settings"), answer("OpenAPP", "settings"), 1),
    (R.Target("Terminate", value="success"), answer("Terminate", "success"), 1),
    (R.Target("KeyboardPress", value="enter"), answer("KeyboardPress", "Enter"), 1),
    (R.Target("KeyboardPress", value="enter"), answer("KeyboardPress", "tab"), 0),
    (R.Target("Select", value="Blue", bbox=(0.2, 0.2, 0.4, 0.4)), answer("Select", "Blue", (300, 300)), 1),
    (R.Target("LongPress", bbox=(0.2, 0.2, 0.4, 0.4)), answer("LongPress", point=(300, 300)), 1),
    (R.Target("LongPress", bbox=(0.2, 0.2, 0.4, 0.4)), answer("LongPress"), 0),  # point missing
])
def test_guilibra_accuracy_every_action_type(target, text, acc):
    assert R.guilibra_reward(text, target).accuracy == acc


def test_release_rule_ignores_keyboard_value_and_write_geometry():
    t = R.Target("KeyboardPress", value="enter")
    assert R.guilibra_reward(answer("KeyboardPress", "tab"), t, value_rule="release").accuracy == 1.0
    w = R.Target("Write", value="hi", bbox=(0, 0, 0.1, 0.1))
    assert R.guilibra_reward(answer("Write", "hi", (900, 900)), w, value_rule="release").accuracy == 1.0
    assert R.guilibra_reward(answer("Write", "hi", (900, 900)), w, value_rule="paper").accuracy == 0.0


def test_alternatives_get_full_credit():
    t = R.Target("Click", bbox=(0.8, 0.8, 0.9, 0.9),
                 alternatives=(R.Target("KeyboardPress", value="enter"),))
    assert R.guilibra_reward(answer("KeyboardPress", "enter"), t).accuracy == 1.0
    assert R.guilibra_reward(answer("KeyboardPress", "esc"), t).accuracy == 0.0


def test_target_validates_itself():
    with pytest.raises(ValueError, match="canonical"):
        R.Target("tap")
    with pytest.raises(ValueError, match="bbox"):
        R.Target("Click", bbox=(0.5, 0.5, 0.1, 0.1))


# ---- UI-MOPD reward --------------------------------------------------------------------

def tool(name, **args):
    return A.ToolCall(name, args)


def resp(call):
    return A.render_tool_call_response(call, "why", "do it")


MOBILE_CLICK = R.Target("Click", bbox=(776 / 999, 788 / 999, 924 / 999, 854 / 999),
                        tool_call=tool("mobile_use", action="click", coordinate=[850, 821]))


@pytest.mark.parametrize("target,pred,expected", [
    (MOBILE_CLICK, tool("mobile_use", action="click", coordinate=[800, 800]), 1.0),
    (MOBILE_CLICK, tool("mobile_use", action="click", coordinate=[100, 800]), -0.5),
    (MOBILE_CLICK, tool("mobile_use", action="long_press", coordinate=[800, 800]), -0.5),
    (R.Target("Swipe", bbox=(0.45, 0.71, 0.55, 0.81), bbox2=(0.45, 0.33, 0.55, 0.43),
              tool_call=tool("mobile_use", action="swipe", coordinate=[500, 762], coordinate2=[500, 381])),
     tool("mobile_use", action="swipe", coordinate=[480, 760], coordinate2=[520, 400]), 1.0),
    (R.Target("Swipe", bbox=(0.45, 0.71, 0.55, 0.81), bbox2=(0.45, 0.33, 0.55, 0.43),
              tool_call=tool("mobile_use", action="swipe", coordinate=[500, 762], coordinate2=[500, 381])),
     tool("mobile_use", action="swipe", coordinate=[480, 760], coordinate2=[520, 900]), -0.5),
    (R.Target("Write", value="cd x", tool_call=tool("computer_use", action="type", text="cd ~/Desktop/pp")),
     tool("computer_use", action="type", text="CD ~/desktop/PP"), 1.0),
    (R.Target("Write", tool_call=tool("computer_use", action="type", text="cd ~/Desktop/pp")),
     tool("computer_use", action="type", text="cd ~/Desktop"), -0.5),
    (R.Target("KeyboardPress", tool_call=tool("computer_use", action="key", keys=["ctrl", "u"])),
     tool("computer_use", action="key", keys=["U", "Ctrl"]), 1.0),
    (R.Target("KeyboardPress", tool_call=tool("computer_use", action="key", keys=["ctrl", "u"])),
     tool("computer_use", action="key", keys=["ctrl"]), -0.5),
    (R.Target("Scroll", bbox=(0, 0, 1, 1), tool_call=tool("computer_use", action="scroll", coordinate=[500, 500], pixels=-300)),
     tool("computer_use", action="scroll", coordinate=[200, 200], pixels=-50), 1.0),
    (R.Target("Scroll", bbox=(0, 0, 1, 1), tool_call=tool("computer_use", action="scroll", coordinate=[500, 500], pixels=-300)),
     tool("computer_use", action="scroll", coordinate=[200, 200], pixels=50), -0.5),
    (R.Target("NavigateBack", tool_call=tool("mobile_use", action="system_button", button="Back")),
     tool("mobile_use", action="system_button", button="back"), 1.0),
    (R.Target("NavigateBack", tool_call=tool("mobile_use", action="system_button", button="Back")),
     tool("mobile_use", action="system_button", button="Home"), -0.5),
    (R.Target("Terminate", tool_call=tool("computer_use", action="terminate", status="success")),
     tool("computer_use", action="terminate", status="failure"), -0.5),
    (R.Target("Wait", tool_call=tool("mobile_use", action="wait", time=2)),
     tool("mobile_use", action="wait", time=5), 1.0),
    # no bbox: coordinates must equal the label's
    (R.Target("Click", tool_call=tool("computer_use", action="left_click", coordinate=[18, 491])),
     tool("computer_use", action="left_click", coordinate=[18, 491]), 1.0),
    (R.Target("Click", tool_call=tool("computer_use", action="left_click", coordinate=[18, 491])),
     tool("computer_use", action="left_click", coordinate=[19, 491]), -0.5),
    # the other platform's tool is a partial match at best
    (MOBILE_CLICK, tool("computer_use", action="left_click", coordinate=[800, 800]), -0.5),
])
def test_mopd_reward_per_action(target, pred, expected):
    assert R.mopd_reward(resp(pred), target) == expected


def test_mopd_reward_unparseable_and_alternative():
    assert R.mopd_reward("no call here", MOBILE_CLICK) == -1.0
    assert R.mopd_reward('<tool_call>{"name": "mobile_use", "arguments": {"action": "fly"}}</tool_call>',
                         MOBILE_CLICK) == -1.0
    alt = R.Target("NavigateBack", tool_call=tool("mobile_use", action="system_button", button="Back"))
    t = R.Target("Click", bbox=(0, 0, 0.1, 0.1), tool_call=tool("mobile_use", action="click", coordinate=[5, 5]),
                 alternatives=(alt,))
    assert R.mopd_reward(resp(tool("mobile_use", action="system_button", button="Back")), t) == 1.0
    with pytest.raises(ValueError, match="tool_call"):
        R.mopd_reward("x", R.Target("Click"))


def test_mopd_reward_on_real_uni_gui_labels(uni_gui_steps):
    for target in uni_gui_steps:
        assert R.mopd_reward(resp(target.tool_call), target) == 1.0


@pytest.fixture
def uni_gui_steps():
    import pathlib
    root = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "uni-gui"
    if not root.exists():
        pytest.skip(f"real Uni-GUI fixtures not found at {root} (they live in the team's shared/ folder)")
    out = []
    for task in sorted(root.glob("*/*/task.json")):
        data = json.loads(task.read_text())
        for step in data["data"]:
            plan = step["plan"]
            size = A.TOOL_SCREEN_SIZE[plan["name"]]
            box = lambda b: None if not b else (b[0][0] / size, b[0][1] / size, b[1][0] / size, b[1][1] / size)
            out.append(R.Target("Click", bbox=box(step.get("bbox")), bbox2=box(step.get("bbox2")),
                                tool_call=A.ToolCall(plan["name"], plan["arguments"])))
    assert len(out) == 20
    return out


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_rewards_never_raise_and_stay_in_range(text):
    r = R.guilibra_reward(text, CLICK)
    for v in (r.format, r.action_type, r.value, r.grounding, r.accuracy):
        assert v in (0.0, 1.0)
    assert 0.0 <= r.total <= 1.0
    assert R.mopd_reward(text, MOBILE_CLICK) in (1.0, -0.5, -1.0)


def test_the_trainers_reward_phase_reads_rl_reward_grounding_sigma():
    from types import SimpleNamespace
    import numpy as np
    from guilibra_jax.train import config as run_config
    from guilibra_jax.train.rl import phases as PH
    c = run_config.base_config()
    ro = SimpleNamespace(texts=[answer("Click", point=(700, 500))], targets=[CLICK], valid=np.array([True]),
                         resized_size=[None])
    s = SimpleNamespace(rl=c.rl, method="grpo", model_config=SimpleNamespace(family="qwen3_vl"), think_opened=False)
    assert PH.reward(s, ro).parts["grounding"][0] == 0.0
    c.rl.reward.grounding_sigma = 0.1
    scored = PH.reward(s, ro)
    assert math.isclose(scored.parts["grounding"][0], 0.5 * math.exp(-0.5), rel_tol=1e-6) and not scored.success[0]
