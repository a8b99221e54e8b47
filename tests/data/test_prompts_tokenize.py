"""Prompts tokenise exactly as the tokenizer's own chat template renders them (real
Qwen3 tokenizer files), and loss segments sit where the spec says, checked by hand."""
import numpy as np
import pytest

from guilibra_jax import actions as A
from guilibra_jax.data import prompts as P
from guilibra_jax.data import tokenize as T

N_PADS = 7


def _user_string(user):
    return user.replace(P.IMAGE_PLACEHOLDER, P.vision_block(N_PADS))


def test_guilibra_prompt_equals_apply_chat_template(qwen_tok):
    system = P.guilibra_system_prompt("mobile")
    user = P.guilibra_user_text("Open the clock app", ["Open app drawer", "Scroll down"], (1092, 2408))
    ours = T.encode_prompt(qwen_tok, system, user, [N_PADS])
    ref = qwen_tok.apply_chat_template(
        [{"role": "system", "content": system}, {"role": "user", "content": _user_string(user)}],
        add_generation_prompt=True, tokenize=True, return_dict=False)
    assert ours.tolist() == list(ref)
    assert (ours == 151655).sum() == N_PADS and ours[-3:].tolist() == qwen_tok.encode("<|im_start|>assistant\n")


@pytest.mark.parametrize("platform", ["desktop", "mobile"])
def test_mopd_prompt_equals_apply_chat_template_with_tools(qwen_tok, platform):
    user = P.mopd_user_text(platform, "Open the terminal", ["Click the dock icon"])
    ours = T.encode_prompt(qwen_tok, P.mopd_system_prompt(platform), user, [N_PADS])
    ref = qwen_tok.apply_chat_template(
        [{"role": "system", "content": P.DEFAULT_SYSTEM}, {"role": "user", "content": _user_string(user)}],
        tools=[P.tool_schema(P.mopd_tool(platform))], add_generation_prompt=True, tokenize=True,
        return_dict=False)
    assert ours.tolist() == list(ref)


def test_full_sequence_equals_qwen_vl_template_with_image_entries(qwen_tok):
    """Prompt + target (+ the template's trailing newline) equals the Qwen-VL template's
    rendering of a conversation with a list-content image entry, pads expanded."""
    system = P.guilibra_system_prompt("web")
    user = P.guilibra_user_text("Buy socks", [], (1288, 728))
    target = A.render_response(A.Action("Click", "click buy", None, (640, 300)), "The buy button.", "qwen2_5_vl")
    enc = T.encode_sample(qwen_tok, system, user, target, [N_PADS])
    text_after_image = user.split(P.IMAGE_PLACEHOLDER, 1)[1]
    msgs = [{"role": "system", "content": system},
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text_after_image}]},
            {"role": "assistant", "content": target}]
    ref = list(qwen_tok.apply_chat_template(msgs, chat_template=P.QWEN_VL_CHAT_TEMPLATE, tokenize=True,
                                            return_dict=False))
    k = ref.index(151655)
    ref = ref[:k] + [151655] * N_PADS + ref[k + 1:]
    assert enc.input_ids.tolist() + qwen_tok.encode("\n") == ref


def _by_segment(tok, text, grounded=True):
    ids, segs = T.encode_target(tok, text, grounded=grounded)
    return {s: tok.decode(ids[segs == s].tolist()) for s in (1, 2, 3)}, ids, segs


def test_guilibra_segments_hand_checked(qwen_tok):
    target = ('<think>The OK button at 512, 30 confirms.</think><answer>{"action_type": "Click", '
              '"action_description": "tap OK", "value": "None", "point_2d": [512, 30]}</answer>')
    parts, ids, segs = _by_segment(qwen_tok, target)
    assert parts[1] == "<think>The OK button at 512, 30 confirms.</think>"   # numbers in reasoning stay reasoning
    assert parts[3] == "51230"                                               # only the five coordinate digits
    assert [qwen_tok.decode([i]) for i in ids[segs == 3]] == ["5", "1", "2", "3", "0"]
    assert parts[2] == ('<answer>{"action_type": "Click", "action_description": "tap OK", "value": "None", '
                        '"point_2d": [, ]}</answer><|im_end|>')
    # reasoning is a prefix: no reasoning token after the first action token
    first_action = int(np.argmax(segs == 2))
    assert (segs[:first_action] == 1).all() and not (segs[first_action:] == 1).any()


def test_no_grounding_without_point_and_no_reasoning_in_direct_twin(qwen_tok):
    direct = A.render_response(A.Action("Scroll", "scroll down", "down", None), None, "qwen3_vl")
    parts, _, segs = _by_segment(qwen_tok, direct, grounded=False)
    assert set(segs.tolist()) == {2} and '"point_2d": [-100, -100]' in parts[2]


def test_tool_call_segments_hand_checked(qwen_tok):
    call = A.ToolCall("mobile_use", {"action": "swipe", "coordinate": [500, 762], "coordinate2": [500, 381]})
    text = A.render_tool_call_response(call, "Swipe up to see 3 more rows.", "Swipe up", thought="Scroll the list")
    parts, _, _ = _by_segment(qwen_tok, text)
    assert parts[1] == "<think>\nSwipe up to see 3 more rows.\n</think>"
    assert parts[3] == "500762500381"
    assert parts[2].startswith("\nThought: Scroll the list\nAction: Swipe up\n<tool_call>\n")
    assert parts[2].endswith('"coordinate": [, ], "coordinate2": [, ]}}\n</tool_call><|im_end|>')


def test_straddling_token_takes_higher_segment():
    """A tokenizer that merges '</thinking>' with '<answer>' or digits with brackets:
    the straddling token goes to the higher segment (grounding > action > reasoning)."""
    class CharPairs:
        def __call__(self, text, add_special_tokens=False, return_offsets_mapping=False):
            spans = [(i, min(i + 2, len(text))) for i in range(0, len(text), 2)]
            return {"input_ids": list(range(len(spans))), "offset_mapping": spans}
    text = '<thinking>ab</thinking><answer>{"point_2d": [7, 8]}</answer>'
    ids, segs = T.encode_target(CharPairs(), text, add_end=False)
    char = T.target_char_segments(text)
    for (s, e), seg in zip([(i, i + 2) for i in range(0, len(text), 2)], segs):
        assert seg == char[s:e].max()
    assert (segs == 3).sum() == 2
