"""Release-exact data options: per-platform pixel budgets (UI-MOPD's data prep resizes
mobile and desktop screenshots differently) and Qwen3-VL-*-Thinking prompts that open
the think block (their chat template ends the generation prompt with ``<think>\\n``)."""
import copy
import json

import numpy as np
import pytest

from guilibra_jax import actions as A
from guilibra_jax.data import images as I
from guilibra_jax.data import pipeline as PL
from guilibra_jax.data import prompts as P
from guilibra_jax.data import tokenize as T
from guilibra_jax.train import data_source as DS
from data_fixtures import make_native_dataset

N_PADS = 7
# A Thinking-style template: the Qwen-VL template with the Qwen3-VL-*-Thinking generation prompt.
GEN = "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
THINKING_TEMPLATE = P.QWEN_VL_CHAT_TEMPLATE.replace(GEN, "{% if add_generation_prompt %}<|im_start|>assistant\n"
                                                         "<think>\n{% endif %}")


@pytest.fixture(scope="module")
def thinking_tok(qwen_tok):
    assert GEN in P.QWEN_VL_CHAT_TEMPLATE
    tok = copy.deepcopy(qwen_tok)
    tok.chat_template = THINKING_TEMPLATE
    return tok


# ----------------------------------------------------------------------------- pixel budgets

def test_pixel_budget_per_platform_with_fallbacks():
    b = I.PixelBudgets.from_config(1000, 9000, {"mobile": (40768, 548800), "desktop": (3136, 0)})
    assert b.bounds("mobile") == (40768, 548800)      # UI-MOPD's mobile budget
    assert b.bounds("desktop") == (3136, 9000)        # 0: data.max_pixels
    assert b.bounds("web") == (1000, 9000)            # unlisted: data.min_pixels / max_pixels
    assert I.PixelBudgets.from_config(0, 0, {}).bounds("mobile") == (None, None)   # family default
    with pytest.raises(ValueError, match="data.pixels.mobile"):
        I.PixelBudgets.from_config(0, 0, {"mobile": (10, 5)})


def test_loader_resizes_each_platform_to_its_budget_and_eval_agrees(tmp_path, qwen_tok, qwen25_config):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize
    path = make_native_dataset(str(tmp_path), 12, size=(96, 64))       # mobile and web records
    cfg = dict(inputs=path, format="native", batch_size=12, max_pixels=64 * 64, patch_bucket=64,
               seq_buckets=(2048,), seed=0, num_epochs=1, pixels={"mobile": (100_000, 200_000)})
    batch = next(PL.make_rl_loader(cfg, qwen_tok, qwen25_config, shard_index=0, shard_count=1))
    # transformers' own smart_resize is the reference: (h, w) for 64 x 96 under each budget
    want = {"mobile": smart_resize(64, 96, 28, 100_000, 200_000), "web": smart_resize(64, 96, 28, 56 * 56, 64 * 64)}
    assert want["mobile"] == (280, 392) and want["web"] == (28, 56)      # by hand: ceil/floor of 64, 96 * beta
    seen = set()
    for platform, rs in zip(batch["platform"], batch["resized_size"]):
        assert tuple(rs) == want[platform][::-1]
        seen.add(platform)
    assert seen == {"mobile", "web"}
    # the evaluator / eval agent's resize function answers the same per platform
    from guilibra_jax.train.config import base_config
    run = base_config()
    run.data.max_pixels = 64 * 64
    run.data.pixels = {"mobile": (100_000, 200_000)}
    _, resized = DS._family_coords(qwen25_config, run.data)
    assert resized((96, 64), "mobile") == (392, 280) and resized((96, 64), "web") == (56, 28)


# ----------------------------------------------------------------------------- Thinking templates

def test_generation_prefix_is_read_from_the_chat_template(qwen_tok, thinking_tok):
    assert P.generation_prefix("auto", thinking_tok) == "<think>\n" and P.opens_think("<think>\n")
    assert P.generation_prefix("auto", qwen_tok) == ""          # Qwen3's own template, thinking on: nothing
    assert P.generation_prefix("on", qwen_tok) == "<think>\n" and P.generation_prefix("off", thinking_tok) == ""
    assert not P.opens_think("<think>\n\n</think>\n\n")         # a closed (empty) think block opens nothing


@pytest.mark.parametrize("method", ["guilibra", "mopd"])
def test_thinking_prompt_equals_apply_chat_template(thinking_tok, method):
    if method == "guilibra":
        system = P.guilibra_system_prompt("mobile")
        user = P.guilibra_user_text("Open the clock app", ["Open app drawer"], (1092, 2408))
    else:
        system = P.mopd_system_prompt("mobile")
        user = P.mopd_user_text("mobile", "Open the clock app", ["Open app drawer"])
    prefix = P.generation_prefix("auto", thinking_tok)
    ours = T.encode_prompt(thinking_tok, system, user, [N_PADS], generation_prefix=prefix)
    before, after = user.split(P.IMAGE_PLACEHOLDER, 1)
    content = ([{"type": "text", "text": before}] if before else []) + [{"type": "image"}] + \
        ([{"type": "text", "text": after}] if after else [])
    ref = list(thinking_tok.apply_chat_template(
        [{"role": "system", "content": system}, {"role": "user", "content": content}],
        add_generation_prompt=True, tokenize=True, return_dict=False))
    k = ref.index(151655)
    ref = ref[:k] + [151655] * N_PADS + ref[k + 1:]
    assert ours.tolist() == ref
    assert thinking_tok.decode(ours[-5:].tolist()).endswith("<|im_start|>assistant\n<think>\n")


def test_thinking_targets_continue_the_open_think_block(tmp_path, thinking_tok, qwen25_config):
    path = make_native_dataset(str(tmp_path), 4)
    cfg = dict(inputs=path, format="native", batch_size=2, max_pixels=64 * 64, patch_bucket=64,
               seq_buckets=(2048,), seed=0, num_epochs=1, shuffle=False, mix="both", open_think="auto")
    b = next(PL.make_sft_loader(cfg, thinking_tok, qwen25_config, shard_index=0, shard_count=1))
    think_ids = thinking_tok.encode("<think>\n")
    for r in range(2):
        real = b["segment_ids"][r] > 0
        ids, seg = b["input_ids"][r][real], b["loss_segments"][r][real]
        start = int(np.argmax(seg > 0)) + 1            # first target token (loss_segments are shifted)
        assert ids[start - len(think_ids):start].tolist() == think_ids      # the prompt opened it
        target = thinking_tok.decode(ids[start:].tolist())
        reasoning = thinking_tok.decode(ids[start:][seg[start - 1:-1] == T.REASONING].tolist())
        assert "<think>" not in target and target.count("</think>") == 1
        if target.startswith("\n</think>"):           # the direct-action twin: the template's empty block
            assert target.startswith("\n</think>\n\n<answer>") and reasoning == "\n</think>"
        else:                                          # reasoning\n</think>\n\n<answer>...
            assert reasoning.endswith("\n</think>") and target.startswith(reasoning + "\n\n<answer>")
        answer = target.split("</think>\n\n", 1)[1]
        parsed = A.parse_response(target.replace("<|im_end|>", ""), think_opened=True)
        assert parsed.format_ok and answer.startswith("<answer>")
    rl = next(PL.make_rl_loader(cfg, thinking_tok, qwen25_config, shard_index=0, shard_count=1))
    for r in range(2):
        prompt = rl["prompt_ids"][r][rl["prompt_mask"][r] > 0]
        assert prompt[-len(think_ids):].tolist() == think_ids


def test_mopd_target_continues_the_open_think_block(qwen_tok):
    call = A.ToolCall("mobile_use", {"action": "click", "coordinate": [10, 20]})
    text = A.render_tool_call_response(call, "Tap it.", "tap", "Tap.")
    cont = P.continue_open_think(text)
    # The Thinking template's assistant turn after "<think>\n": reasoning.strip + "\n</think>\n\n" + content
    assert cont == "Tap it.\n</think>\n\nThought: Tap.\nAction: tap\n<tool_call>\n" + \
        json.dumps(call.to_json_dict()) + "\n</tool_call>"
    ids, segs = T.encode_target(qwen_tok, cont, think_opened=True)
    assert qwen_tok.decode(ids[segs == T.REASONING].tolist()) == "Tap it.\n</think>"
    assert qwen_tok.decode(ids[segs == T.GROUNDING].tolist()) == "1020"
    assert A.parse_tool_call_response(cont, think_opened=True).format_ok


def test_guilibra_rl_is_grounding_reaches_the_reward_target():
    from guilibra_jax.data import native as N
    from guilibra_jax.data import readers as R
    row = {"images": [{"bytes": b"png"}], "context": "Instruction: go\n\nInteraction History: None",
           "answer": {"gt_action": "click", "gt_bbox": [100, 100, 300, 300], "gt_input_text": "no input text",
                      "image_width": 100, "image_height": 50, "is_grounding": True}}
    rec = N.record_from_dict(R.guilibra_rl_to_native(row, "rl.parquet:0"), "rl.parquet:0")
    assert rec.target.is_grounding and rec.reward_target().is_grounding
    assert rec.target.to_dict()["is_grounding"] is True
    row["answer"].pop("is_grounding")
    rec = N.record_from_dict(R.guilibra_rl_to_native(row, "rl.parquet:0"), "rl.parquet:0")
    assert not rec.reward_target().is_grounding and "is_grounding" not in rec.target.to_dict()


def test_thinking_template_kept_for_the_processor_is_found(tmp_path, qwen_tok):
    from transformers import AutoTokenizer
    tok = copy.deepcopy(qwen_tok)
    tok.chat_template = None
    tok.save_pretrained(tmp_path)
    for name in ("chat_template.jinja",):
        if (tmp_path / name).exists():
            (tmp_path / name).unlink()
    (tmp_path / "chat_template.json").write_text(json.dumps({"chat_template": THINKING_TEMPLATE}))
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert P.generation_prefix("auto", loaded) == "<think>\n"
