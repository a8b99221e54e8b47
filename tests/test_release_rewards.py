"""Rewards under the releases' rules, on rows computed by hand from the releases' code.

UI-MOPD: ``EliSpectre/UI-MOPD`` ``verl/ui_mopd/reward/gui_agent.py`` (``parse_tool_call``,
``MOBILE_REWARD_FUNCS`` / ``DESKTOP_REWARD_FUNCS``, ``_compute_single``, ``compute_score``).
"""
import json

import pytest

from guilibra_jax import actions as A
from guilibra_jax import rewards as R

M, D = "mobile_use", "computer_use"


def call(name, **args):
    return A.ToolCall(name, args)


def resp(name, think="ok", **args):
    body = json.dumps({"name": name, "arguments": args})
    return f"<think>\n{think}\n</think>\nAction: act\n<tool_call>\n{body}\n</tool_call>"


def box(x1, y1, x2, y2, size):
    return (x1 / size, y1 / size, x2 / size, y2 / size)


CLICK = R.Target("Click", tool_call=call(M, action="click", coordinate=[500, 500]), bbox=box(400, 400, 600, 600, 999))
TYPE_D = R.Target("Write", "hello", tool_call=call(D, action="type", text="hello"))
ASK = R.Target("Answer", "Which city?", tool_call=call(M, action="ask_user", text="Which city?"))
ANSWER_D = R.Target("Answer", "42", tool_call=call(D, action="answer", text="42"))
SCROLL_NOBOX = R.Target("Scroll", "down", tool_call=call(D, action="scroll", pixels=-5))
BUTTON = R.Target("NavigateBack", tool_call=call(M, action="system_button", button="Back"))
WAIT = R.Target("Wait", tool_call=call(M, action="wait", time=2))
KEY = R.Target("KeyboardPress", "enter", tool_call=call(D, action="key", keys=["enter"]))
ASK_OR_CLICK = R.Target("Answer", "Which city?", tool_call=ASK.tool_call, alternatives=(CLICK,))

# (label, response, release reward, strict reward): the release's value worked by hand.
ROWS = {
    # reward_click: action match (1) + coordinate in bbox (1) -> 2/2 -> 1.0
    "click_in_box": (CLICK, resp(M, action="click", coordinate=[450, 550]), 1.0, 1.0),
    # parses, unknown action "tap": action mismatch, point still in box -> 1/2 -> -0.5 (strict: -1, unknown action)
    "unknown_action": (CLICK, resp(M, action="tap", coordinate=[450, 550]), -0.5, -1.0),
    # click without coordinate: action 1, "coordinate" not in predict -> 1/2 -> -0.5 (strict: schema -> -1)
    "missing_argument": (CLICK, resp(M, action="click"), -0.5, -1.0),
    # desktop type label, mobile_use prediction: the release compares actions only -> 2/2 -> 1.0
    "other_tool_name": (TYPE_D, resp(M, action="type", text=" Hello "), 1.0, -0.5),
    # ask_user is not in MOBILE_REWARD_FUNCS: "Unknown action" -> -1.0 whatever the prediction
    "ask_user_label": (ASK, resp(M, action="ask_user", text="Which city?"), -1.0, 1.0),
    # answer is not in DESKTOP_REWARD_FUNCS -> -1.0
    "desktop_answer_label": (ANSWER_D, resp(D, action="answer", text="42"), -1.0, 1.0),
    # reward_scroll, no bbox and no label coordinate: the point is never earned -> 2/3 -> -0.5
    "scroll_label_without_box": (SCROLL_NOBOX, resp(D, action="scroll", coordinate=[500, 500], pixels=-3), -0.5, 1.0),
    "scroll_label_without_box_no_coord": (SCROLL_NOBOX, resp(D, action="scroll", pixels=-3), -0.5, 1.0),
    # reward_system_button compares "back" == "Back": False -> 1/2 -> -0.5 (strict: case-insensitive)
    "button_case": (BUTTON, resp(M, action="system_button", button="back"), -0.5, 1.0),
    # reward_wait: action alone -> 1.0 even without "time" (strict: schema -> -1)
    "wait_without_time": (WAIT, resp(M, action="wait"), 1.0, -1.0),
    # no <tool_call> -> parse_tool_call None -> -1.0
    "unparseable": (CLICK, "<think>\nhm\n</think>\nAction: tap it", -1.0, -1.0),
    # coordinate 5 against a bbox: len(5) raises in position_in_bbox -> compute_score's except -> -1.0
    "release_raises_on_int_coordinate": (CLICK, resp(M, action="click", coordinate=5), -1.0, -1.0),
    # keys [1]: 1 .lower() raises in reward_key -> -1.0
    "release_raises_on_int_key": (KEY, resp(D, action="key", keys=[1]), -1.0, -1.0),
    # parse_tool_call searches the whole text: a call inside the think block is read
    "call_inside_think": (CLICK, '<think><tool_call>{"name": "mobile_use", "arguments": {"action": "click", '
                                 '"coordinate": [450, 550]}}</tool_call></think>', 1.0, -1.0),
    # Plan B: the main label (ask_user) gives -1.0 != 1.0; the other label scores 1.0 -> 1.0
    "alternative_rescues_unknown_label": (ASK_OR_CLICK, resp(M, action="click", coordinate=[450, 550]), 1.0, 1.0),
    # click outside the box: 1/2 -> -0.5
    "click_outside": (CLICK, resp(M, action="click", coordinate=[100, 100]), -0.5, -0.5),
}


@pytest.mark.parametrize("name", sorted(ROWS))
def test_mopd_reward_release_rule_matches_hand_rows(name):
    target, text, release, strict = ROWS[name]
    assert R.mopd_reward(text, target, rule="release") == release
    assert R.mopd_reward(text, target, rule="strict") == strict


def test_tool_name_check_is_an_option_under_both_rules():
    _, text, _, _ = ROWS["other_tool_name"]
    assert R.mopd_reward(text, TYPE_D, rule="release", check_tool_name=True) == -0.5
    assert R.mopd_reward(text, TYPE_D, rule="strict", check_tool_name=False) == 1.0


def test_box_edges_are_inclusive_on_the_tools_own_coordinates():
    # position_in_bbox: min_x <= x <= max_x on the raw 0-999 coordinates and the raw box
    assert R.mopd_reward(resp(M, action="click", coordinate=[600, 400]), CLICK, rule="release") == 1.0
    assert R.mopd_reward(resp(M, action="click", coordinate=[601, 400]), CLICK, rule="release") == -0.5


def test_think_opened_response_lacks_the_opening_tag():
    text = resp(M, action="click", coordinate=[450, 550])[len("<think>\n"):]   # as a Thinking model writes it
    assert R.mopd_reward(text, CLICK, rule="strict") == 1.0     # the call after </think> still parses
    parsed = A.parse_tool_call_response(text, think_opened=True)
    assert parsed.format_ok and parsed.reasoning == "ok"
    assert A.parse_tool_call_response(text).reasoning is None    # without the flag the reasoning is lost
    answer = A.render_answer_json(A.Action("Click", "tap", None, (10.0, 20.0)))
    gl = f"look\n</think>\n\n<answer>{answer}</answer>"
    assert A.parse_response(gl, think_opened=True).format_ok
    assert A.parse_response(gl, think_opened=True).reasoning == "look"
    assert not A.parse_response(gl).format_ok                     # text outside the answer block


# ----------------------------------------------------------------------------- GUI-Libra format
# EasyR1 examples/reward_function/r1gui.py (<think>, Qwen2.5-VL) and r1gui_qwen3vl.py (<thinking>,
# Qwen3-VL): r1gui_format_reward, then compute_score zeroes it for a non-grounding step without
# reasoning and a grounding step with reasoning.

def ans(point="[12, 34]", **extra):
    d = {"action_type": "Click", "action_description": "tap ok", "value": "None"}
    d.update(extra)
    body = json.dumps(d)[:-1] + f', "point_2d": {point}}}'
    return f"<answer>{body}</answer>"


T_CLICK = R.Target("Click", point=(0.1, 0.1), image_size=(100, 100))
T_GROUND = R.Target("Click", point=(0.1, 0.1), image_size=(100, 100), is_grounding=True)

# (text, think_tag, target, release format, paper format)
FORMAT_ROWS = {
    "reasoning_then_answer": ("<think>look</think>" + ans(), "think", T_CLICK, 1.0, 1.0),
    "no_reasoning_non_grounding_step": (ans(), "think", T_CLICK, 0.0, 1.0),
    "no_reasoning_grounding_step": (ans(), "think", T_GROUND, 1.0, 1.0),
    "reasoning_on_grounding_step": ("<think>look</think>" + ans(), "think", T_GROUND, 0.0, 1.0),
    "float_point": ("<think>look</think>" + ans("[12.5, 34]"), "think", T_CLICK, 0.0, 1.0),
    "point_none_string": ("<think>look</think>" + ans('"None"'), "think", T_CLICK, 1.0, 1.0),
    "bool_point_is_an_int_in_python": ("<think>look</think>" + ans("[true, 3]"), "think", T_CLICK, 1.0, 0.0),
    "thinking_tag_for_qwen2_5": ("<thinking>look</thinking>" + ans(), "think", T_CLICK, 0.0, 1.0),
    "thinking_tag_for_qwen3": ("<thinking>look</thinking>" + ans(), "thinking", T_CLICK, 1.0, 1.0),
    "think_tag_for_qwen3": ("<think>look</think>" + ans(), "thinking", T_CLICK, 0.0, 1.0),
    "unknown_action_type": ("<think>look</think>" + ans(action_type="Fly"), "think", T_CLICK, 1.0, 0.0),
    "extra_key": ("<think>look</think>" + ans(foo="x"), "think", T_CLICK, 1.0, 0.0),
    "null_value": ("<think>look</think>" + ans(value=None), "think", T_CLICK, 0.0, 1.0),
    "text_after_answer": ("<think>look</think>" + ans() + " ok", "think", T_CLICK, 0.0, 0.0),
    "one_trailing_newline": ("<think>look</think>" + ans() + "\n", "think", T_CLICK, 1.0, 1.0),
    "leading_space": (" <think>look</think>" + ans(), "think", T_CLICK, 0.0, 1.0),
    "newline_between_blocks": ("<think>look</think>\n" + ans(), "think", T_CLICK, 1.0, 1.0),
    "not_json": ("<think>look</think><answer>{'action_type': 'Click'}</answer>", "think", T_CLICK, 0.0, 0.0),
}


@pytest.mark.parametrize("name", sorted(FORMAT_ROWS))
def test_guilibra_release_format_matches_hand_rows(name):
    text, tag, target, release, paper = FORMAT_ROWS[name]
    assert R.guilibra_reward(text, target, coord_space="pixels", format_rule="release", think_tag=tag).format == release
    assert R.guilibra_reward(text, target, coord_space="pixels").format == paper


def test_release_total_weighs_format_and_accuracy():
    # overall = (1 - 0.1) * accuracy + 0.1 * format: a correct click without reasoning on a
    # non-grounding step keeps its accuracy but loses the format point
    r = R.guilibra_reward(ans("[10, 10]"), T_CLICK, coord_space="pixels", format_rule="release")
    assert (r.accuracy, r.format) == (1.0, 0.0) and abs(r.total - 0.9) < 1e-12
    opened = R.guilibra_reward("look</think>" + ans("[10, 10]"), T_CLICK, coord_space="pixels",
                               format_rule="release", think_opened=True)
    assert (opened.accuracy, opened.format) == (1.0, 1.0)
