"""Action vocabularies, the two response parsers, rendering and coordinate spaces."""
import json
import math

import pytest
from hypothesis import given, settings, strategies as st

from guilibra_jax import actions as A


def test_vocabularies_have_the_papers_sizes():
    assert len(A.GUILIBRA_ACTION_TYPES) == 13 and len(set(A.GUILIBRA_ACTION_TYPES)) == 13
    assert len(A.MOBILE_ACTION_TYPES) == 11 and len(A.WEB_ACTION_TYPES) == 6
    assert set(A.MOBILE_ACTION_TYPES) | set(A.WEB_ACTION_TYPES) == set(A.GUILIBRA_ACTION_TYPES)
    # one prompt line per action, in the release's form
    web = A.action_space_prompt("web")
    assert web.count("action_type: ") == 6
    assert "action_type: Click, action_target: Element description, value: None, point_2d: [x, y]" in web
    with pytest.raises(ValueError, match="desktop"):
        A.action_space_prompt("desktop")


@pytest.mark.parametrize("alias,canonical", [
    ("type", "Write"), ("tap", "Click"), ("CLICK", "Click"), ("long_press", "LongPress"),
    ("navigate_back", "NavigateBack"), ("open_app", "OpenApp"), ("OpenAPP", "OpenApp"),
    ("keyboard_press", "KeyboardPress"), ("status", "Terminate"), ("input_text", "Write"),
])
def test_aliases_normalise(alias, canonical):
    assert A.normalize_action_type(alias) == canonical


def test_unknown_and_non_string_action_types_are_none():
    for bad in ("teleport", "", None, 3, ["Click"]):
        assert A.normalize_action_type(bad) is None


ALL_EXAMPLES = [
    A.Action("Click", "click OK", None, (120, 340), "OK button"),
    A.Action("Write", "type the name", "John Smith", (50, 60)),
    A.Action("Write", "type at focus", "hello", None),
    A.Action("Terminate", "done", "success"),
    A.Action("Swipe", "swipe up", "up", (500, 800)),
    A.Action("Scroll", "scroll down", "down"),
    A.Action("NavigateHome", "go home"),
    A.Action("Answer", "answer", "42 apples"),
    A.Action("Wait", "wait", "2"),
    A.Action("OpenApp", "open settings", "Settings"),
    A.Action("NavigateBack", "back"),
    A.Action("KeyboardPress", "press enter", "enter"),
    A.Action("LongPress", "hold icon", None, (10.5, 20)),
    A.Action("Select", "choose blue", "Blue", (300, 400)),
]


@pytest.mark.parametrize("action", ALL_EXAMPLES, ids=lambda a: f"{a.action_type}-{a.value}")
@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
@pytest.mark.parametrize("reasoning", [None, "The button is visible, so I click it."])
def test_render_then_parse_round_trips_every_action_type(action, family, reasoning):
    text = A.render_response(action, reasoning, family=family)
    tag = "think" if family == "qwen2_5_vl" else "thinking"
    assert text.startswith(f"<{tag}>" if reasoning else "<answer>")
    parsed = A.parse_response(text)
    assert parsed.format_ok, parsed.error
    assert parsed.reasoning == reasoning
    assert parsed.action == A.Action(action.action_type, action.action_description, action.value,
                                     action.point_2d, None)


def test_render_matches_the_release_json_layout():
    text = A.render_response(A.Action("Click", "tap OK", None, (12, 34)), "r")
    assert text == ('<think>r</think><answer>{"action_type": "Click", "action_description": "tap OK", '
                    '"value": "None", "point_2d": [12, 34]}</answer>')
    assert A.render_response(A.Action("NavigateBack", "back"), None).endswith('"point_2d": [-100, -100]}</answer>')


def _answer(d, think="ok"):
    return f"<think>{think}</think><answer>{json.dumps(d)}</answer>"


GOOD = {"action_type": "click", "action_description": "x", "value": "None", "point_2d": [1, 2]}


@pytest.mark.parametrize("text,why", [
    ("", "no <answer>"),
    ("<think>hmm</think>", "no <answer>"),
    ("<answer>{not json}</answer>", "not valid JSON"),
    ("<answer>[1, 2]</answer>", "not an object"),
    (_answer({**GOOD, "action_type": "Fly"}), "unknown action_type"),
    (_answer({k: v for k, v in GOOD.items() if k != "value"}), "misses keys"),
    (_answer({**GOOD, "extra": 1}), "unexpected keys"),
    ('<answer>{"action_type": "Click", "action_description": "", "value": null, "point_2d": [NaN, 1]}</answer>',
     "not valid JSON"),
    (_answer({**GOOD, "point_2d": [1e300, 5]}), "not finite"),
    (_answer({**GOOD, "point_2d": [1, 2, 3]}), "point_2d"),
    (_answer({**GOOD, "point_2d": [True, 2]}), "not a number"),
    (_answer(GOOD) + " trailing words", "outside"),
    ("prefix " + _answer(GOOD), "outside"),
    (_answer(GOOD, think="a <think>nested</think> b"), "outside"),
    (_answer(GOOD) + _answer(GOOD, think="x"), "outside"),
    ("<think>unclosed <answer>" + json.dumps(GOOD) + "</answer>", "outside"),
])
def test_malformed_responses_fail_format_with_a_reason(text, why):
    parsed = A.parse_response(text)
    assert not parsed.format_ok
    assert why in parsed.error


def test_lenient_action_recovery_when_format_is_off():
    parsed = A.parse_response(_answer({**GOOD, "extra": 1}))
    assert not parsed.format_ok and parsed.action.action_type == "Click" and parsed.action.point_2d == (1, 2)


def test_thinking_tag_unicode_and_not_applicable_point():
    d = {"action_type": "Write", "action_description": "输入", "value": "héllo wörld 😀",
         "point_2d": [-100, -100], "action_target": "search box"}
    parsed = A.parse_response(f"<thinking>思考</thinking>\n<answer>{json.dumps(d, ensure_ascii=False)}</answer>")
    assert parsed.format_ok
    assert parsed.reasoning == "思考"
    assert parsed.action.value == "héllo wörld 😀" and parsed.action.point_2d is None
    assert parsed.action.action_target == "search box"


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_parsers_never_raise_on_arbitrary_text(text):
    parsed = A.parse_response(text)
    assert isinstance(parsed.format_ok, bool)
    tc = A.parse_tool_call_response(text)
    assert isinstance(tc.format_ok, bool)


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.floats() | st.integers() | st.text(),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=12), c, max_size=5),
                    max_leaves=12))
def test_parsers_never_raise_on_arbitrary_json_payloads(payload):
    try:
        body = json.dumps(payload)
    except ValueError:
        return
    for d in (payload, {**GOOD, "point_2d": payload}, {**GOOD, "value": payload}):
        A.parse_response(f"<answer>{json.dumps(d)}</answer>")
        A.parse_tool_call_response(f"<tool_call>{json.dumps({'name': 'mobile_use', 'arguments': d if isinstance(d, dict) else {}})}</tool_call>")
    A.parse_tool_call_response(f"<tool_call>{body}</tool_call>")


# ---- UI-MOPD tool calls ---------------------------------------------------------------

TOOL_EXAMPLES = [
    A.ToolCall("computer_use", {"action": "left_click", "coordinate": [18, 491]}),
    A.ToolCall("computer_use", {"action": "double_click", "coordinate": [500, 500]}),
    A.ToolCall("computer_use", {"action": "type", "text": "cd ~/Desktop/pp"}),
    A.ToolCall("computer_use", {"action": "key", "keys": ["ctrl", "u"]}),
    A.ToolCall("computer_use", {"action": "scroll", "coordinate": [400, 400], "pixels": -300}),
    A.ToolCall("computer_use", {"action": "terminate", "status": "success"}),
    A.ToolCall("mobile_use", {"action": "swipe", "coordinate": [500, 762], "coordinate2": [500, 381]}),
    A.ToolCall("mobile_use", {"action": "system_button", "button": "Back"}),
    A.ToolCall("mobile_use", {"action": "long_press", "coordinate": [10, 20], "time": 2}),
    A.ToolCall("mobile_use", {"action": "wait", "time": 1.5}),
]


@pytest.mark.parametrize("call", TOOL_EXAMPLES, ids=lambda c: f"{c.name}-{c.action}")
@pytest.mark.parametrize("thought", [None, "I see the home screen."])
def test_tool_call_render_parse_round_trip(call, thought):
    text = A.render_tool_call_response(call, "reasoning here", "Do the thing", thought=thought)
    assert text.startswith("<think>\nreasoning here\n</think>\n")
    assert text.endswith("\n</tool_call>")
    parsed = A.parse_tool_call_response(text)
    assert parsed.format_ok, parsed.error
    assert parsed.call == call and parsed.reasoning == "reasoning here"
    assert parsed.action_text == "Do the thing" and parsed.thought == thought


@pytest.mark.parametrize("text,why", [
    ("Action: click\n", "no <tool_call>"),
    ("<tool_call>{bad}</tool_call>", "not valid JSON"),
    ('<tool_call>{"name": "browser_use", "arguments": {"action": "click"}}</tool_call>', "unknown tool"),
    ('<tool_call>{"name": "mobile_use", "arguments": {"action": "left_click", "coordinate": [1, 2]}}</tool_call>',
     "unknown mobile_use action"),
    ('<tool_call>{"name": "mobile_use", "arguments": {"action": "click"}}</tool_call>', "misses argument"),
    ('<tool_call>{"name": "computer_use", "arguments": {"action": "key", "keys": "enter"}}</tool_call>', "keys"),
    ('<tool_call>{"name": "mobile_use", "arguments": {"action": "click", "coordinate": [1, 2]}}</tool_call> more',
     "after"),
])
def test_malformed_tool_calls_fail_format(text, why):
    parsed = A.parse_tool_call_response(text)
    assert not parsed.format_ok and why in parsed.error


def test_render_refuses_invalid_tool_call():
    with pytest.raises(ValueError, match="misses argument 'text'"):
        A.render_tool_call_response(A.ToolCall("mobile_use", {"action": "type"}))


# ---- coordinates ----------------------------------------------------------------------

@pytest.mark.parametrize("h,w", [(2400, 1080), (1080, 1920), (100, 100), (28, 5000), (3, 7), (4000, 4000),
                                 (56, 56), (1000, 999)])
@pytest.mark.parametrize("factor,min_px,max_px", [(28, 56 * 56, 28 * 28 * 1280), (32, 64 * 64, 32 * 32 * 768),
                                                  (28, 3136, 200_000)])
def test_smart_resize_equals_transformers(h, w, factor, min_px, max_px):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as hf_smart_resize
    assert A.smart_resize(h, w, factor, min_px, max_px) == hf_smart_resize(h, w, factor, min_px, max_px)


def test_smart_resize_rejects_extreme_aspect():
    with pytest.raises(ValueError, match="aspect ratio"):
        A.smart_resize(10, 5000)


def test_coordinate_conversions_round_trip_between_families():
    image = (1080, 2400)
    resized = A.resized_size_for(image, "qwen2_5_vl")
    assert resized[0] % 28 == 0 and resized[1] % 28 == 0
    unit = (0.25, 0.8)
    px = A.from_unit(unit, "resized_pixels", resized_size=resized)
    n1000 = A.from_unit(unit, "norm1000")
    assert n1000 == (250.0, 800.0)
    back = A.to_unit(px, "resized_pixels", resized_size=resized)
    assert math.isclose(back[0], unit[0], abs_tol=1 / resized[0]) and math.isclose(back[1], unit[1], abs_tol=1 / resized[1])
    assert A.to_unit((540, 1200), "pixels", image_size=image) == (0.5, 0.5)
    with pytest.raises(ValueError, match="resized_size"):
        A.to_unit((1, 1), "resized_pixels")
    with pytest.raises(ValueError, match="unknown coordinate space"):
        A.to_unit((1, 1), "inches")
