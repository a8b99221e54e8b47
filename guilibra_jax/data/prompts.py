"""Prompt and target text per method (GUI-Libra, UI-MOPD) and model family, and the
Qwen chat template.

Everything here is plain text; :mod:`guilibra_jax.data.tokenize` turns it into ids and
segments. The user turn marks the screenshot with :data:`IMAGE_PLACEHOLDER`, which the
tokenizer step replaces with ``<|vision_start|><|image_pad|>*n<|vision_end|>``.

Decisions where the releases are silent (see the data README in the module docstring
of :mod:`guilibra_jax.data`):
* GUI-Libra's ``{W}x{H}`` is the size of the image the model sees (the smart-resized
  one), the frame Qwen2.5-VL's pixel coordinates live in; history steps count from 1;
  an empty history is written ``None``; the screenshot comes first in the user turn.
* UI-MOPD's system turn is Qwen3's tool-calling system prompt (``# Tools`` block, as
  the Qwen3 chat template renders it) with a ``computer_use`` / ``mobile_use``
  function schema announcing a 1000x1000 / 999x999 screen.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Sequence

from guilibra_jax import actions as A
from guilibra_jax import choices as CH

IMAGE_PLACEHOLDER = "<image>"
METHODS = CH.TARGET_FORMATS   # the target formats (config key data.method)

GUILIBRA_SYSTEM_HEADER = (
    "You are a GUI agent. You are given a task and a screenshot of the screen. You need to "
    "perform a series of actions to complete the task. You need to choose actions from the "
    "the following list:\n")

GUILIBRA_USER_TEMPLATE = (
    "Please generate the next move according to the UI screenshot {width}x{height}, instruction "
    "and previous actions.\n\nInstruction: {instruction}\n\nInteraction History: {history}")

MOPD_MOBILE_USER_TEMPLATE = (
    "The user query: {instruction}.\nTask progress (You have done the following operation on the "
    "current device): {history}.\n" + IMAGE_PLACEHOLDER)
MOPD_DESKTOP_USER_TEMPLATE = (
    IMAGE_PLACEHOLDER + "\n\nPlease generate the next move according to the UI screenshot, "
    "instruction and previous actions.\n\nInstruction: {instruction}\n\nPrevious actions:\n{history}")

DEFAULT_SYSTEM = "You are a helpful assistant."

# Qwen2-VL / Qwen2.5-VL chat template (list contents with image entries); the demo
# tokenizer ships it, and tests use it as an independent reference.
QWEN_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture "
    "{{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}Video "
    "{{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


# --------------------------------------------------------------------------------------
# GUI-Libra
# --------------------------------------------------------------------------------------

def guilibra_platform(platform: str) -> str:
    """GUI-Libra's action space for a native platform: mobile -> mobile, else web."""
    return "mobile" if platform == "mobile" else "web"


def guilibra_system_prompt(platform: str) -> str:
    return GUILIBRA_SYSTEM_HEADER + A.action_space_prompt(guilibra_platform(platform))


def system_prompt(method: str, platform: str, template: str | None = None) -> str:
    """The system turn of ``method`` for ``platform``: the method's own prompt, or
    ``template`` with ``{platform}`` (the native platform) and ``{actions}`` (the
    GUI-Libra action types of the platform, comma-separated) filled in. A short
    template keeps CPU demos fast (GUI-Libra's own prompt is ~300 tokens)."""
    if not template:
        return guilibra_system_prompt(platform) if method == "guilibra" else mopd_system_prompt(platform)
    names = ", ".join(A.PLATFORM_ACTION_TYPES[guilibra_platform(platform)])
    try:
        return template.format(platform=platform, actions=names)
    except (KeyError, IndexError, ValueError) as e:
        raise ValueError(f"data.system_prompt template {template!r} is invalid ({e!r}); it may use "
                         f"{{platform}} and {{actions}} only") from None


def guilibra_history(history: Sequence[str]) -> str:
    if not history:
        return "None"
    return "\n".join(f"Step {i} Action: {h}" for i, h in enumerate(history, 1))


def guilibra_user_text(instruction: str, history: Sequence[str], size: tuple[int, int],
                       with_image: bool = True) -> str:
    """User turn; ``size`` = (width, height) stated to the model."""
    text = GUILIBRA_USER_TEMPLATE.format(width=int(size[0]), height=int(size[1]),
                                         instruction=instruction, history=guilibra_history(history))
    return (IMAGE_PLACEHOLDER + "\n" + text) if with_image else text


_GL_SIZE_RE = re.compile(r"UI screenshot (\d+)\s*x\s*(\d+)")
_GL_BODY_RE = re.compile(r"Instruction:\s*(.*?)\n\nInteraction History:\s*(.*)\Z", re.DOTALL)
_GL_STEP_RE = re.compile(r"^Step \d+ Action:\s?(.*)$", re.MULTILINE)


def parse_guilibra_user_text(text: str) -> tuple[str, list[str], tuple[int, int] | None]:
    """(instruction, history, stated (width, height) or None) of a GUI-Libra user turn.
    Raises ValueError when the turn has no ``Instruction:`` / ``Interaction History:``."""
    text = text.replace(IMAGE_PLACEHOLDER, "").strip()
    m = _GL_BODY_RE.search(text)
    if m is None:
        raise ValueError("user turn misses 'Instruction: ...\\n\\nInteraction History: ...'")
    instruction, hist = m.group(1).strip(), m.group(2).strip()
    history = [] if hist in ("", "None") else _GL_STEP_RE.findall(hist)
    if hist not in ("", "None") and not history:
        history = [line.strip() for line in hist.splitlines() if line.strip()]
    s = _GL_SIZE_RE.search(text)
    return instruction, history, (int(s.group(1)), int(s.group(2))) if s else None


def platform_from_guilibra_system(system: str) -> str:
    """"mobile" when the system prompt lists mobile-only actions, else "web"."""
    return "mobile" if ("NavigateHome" in system or "OpenApp" in system or "LongPress" in system) else "web"


# --------------------------------------------------------------------------------------
# UI-MOPD (Qwen3-VL tool calls)
# --------------------------------------------------------------------------------------

def tool_schema(tool: str) -> dict[str, Any]:
    """The function schema of ``computer_use`` or ``mobile_use`` shown in the system prompt."""
    size = A.TOOL_SCREEN_SIZE[tool]
    if tool == "computer_use":
        desc = ("Use a mouse and keyboard to interact with a computer, and take screenshots.\n"
                f"* The screen's resolution is {size}x{size}.\n"
                "* Click on the centre of elements; coordinates are [x, y] on that screen.")
        props: dict[str, Any] = {
            "action": {"type": "string", "enum": sorted(A.COMPUTER_USE_ACTIONS)},
            "keys": {"type": "array", "description": "Keys for action=key."},
            "text": {"type": "string", "description": "Text for action=type or answer."},
            "coordinate": {"type": "array", "description": "[x, y] for clicks, mouse_move, drag, scroll."},
            "pixels": {"type": "number", "description": "Scroll amount; positive scrolls up or right."},
            "time": {"type": "number", "description": "Seconds for action=wait."},
            "status": {"type": "string", "enum": list(A.TERMINATE_STATUSES)},
        }
    elif tool == "mobile_use":
        desc = ("Use a touchscreen to interact with a mobile device, and take screenshots.\n"
                f"* The screen's resolution is {size}x{size}.\n"
                "* Tap on the centre of elements; coordinates are [x, y] on that screen.")
        props = {
            "action": {"type": "string", "enum": sorted(A.MOBILE_USE_ACTIONS)},
            "coordinate": {"type": "array", "description": "[x, y] for click, long_press, swipe start."},
            "coordinate2": {"type": "array", "description": "[x, y] swipe end."},
            "text": {"type": "string", "description": "Text for type, answer, ask_user."},
            "button": {"type": "string", "enum": list(A.SYSTEM_BUTTONS)},
            "time": {"type": "number", "description": "Seconds for wait and long_press."},
            "status": {"type": "string", "enum": list(A.TERMINATE_STATUSES)},
        }
    else:
        raise ValueError(f"unknown tool {tool!r}; expected one of {sorted(A.TOOL_ACTIONS)}")
    return {"type": "function", "function": {
        "name": tool, "description": desc,
        "parameters": {"type": "object", "properties": props, "required": ["action"]}}}


def mopd_tool(platform: str) -> str:
    return "mobile_use" if platform == "mobile" else "computer_use"


def mopd_system_prompt(platform: str, system: str = DEFAULT_SYSTEM) -> str:
    """Qwen3's tool system turn (what its chat template renders for ``tools=[schema]``)."""
    schema = json.dumps(tool_schema(mopd_tool(platform)), ensure_ascii=False)
    return (f"{system}\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
            f"{schema}\n</tools>\n\nFor each function call, return a json object with function name and "
            "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


def mopd_user_text(platform: str, instruction: str, history: Sequence[str]) -> str:
    if platform == "mobile":
        hist = " ".join(f"Step {i}: {h};" for i, h in enumerate(history, 1)) if history else "None"
        return MOPD_MOBILE_USER_TEMPLATE.format(instruction=instruction.rstrip("."), history=hist)
    hist = "\n".join(f"Step {i}: {h}" for i, h in enumerate(history, 1)) if history else "None"
    return MOPD_DESKTOP_USER_TEMPLATE.format(instruction=instruction, history=hist)


# --------------------------------------------------------------------------------------
# Chat template
# --------------------------------------------------------------------------------------

ASSISTANT_START = "<|im_start|>assistant\n"
THINK_OPEN = "<think>\n"
OPEN_THINK_SETTINGS = CH.OPEN_THINK


def chat_prompt_text(system: str, user: str, generation_prefix: str = "") -> str:
    """Qwen chat text of a system + user turn, ending with the generation prompt:
    ``<|im_start|>assistant\\n`` and ``generation_prefix`` (``<think>\\n`` for
    Qwen3-VL-*-Thinking chat templates)."""
    return (f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
            + ASSISTANT_START + generation_prefix)


def chat_template_of(tokenizer: Any) -> str | None:
    """The tokenizer's chat template, or the one its folder keeps for the processor
    (``chat_template.jinja`` / ``chat_template.json``, as Qwen3-VL checkpoints ship it)."""
    template = getattr(tokenizer, "chat_template", None)
    if template:
        return template
    folder = getattr(tokenizer, "name_or_path", "") or ""
    if not os.path.isdir(folder):
        return None
    jinja, js = os.path.join(folder, "chat_template.jinja"), os.path.join(folder, "chat_template.json")
    if os.path.exists(jinja):
        with open(jinja) as f:
            return f.read()
    if os.path.exists(js):
        with open(js) as f:
            return json.load(f).get("chat_template")
    return None


def template_generation_prefix(tokenizer: Any) -> str:
    """What the tokenizer's chat template writes after ``<|im_start|>assistant\\n`` with
    ``add_generation_prompt=True``: ``"<think>\\n"`` for Qwen3-VL-*-Thinking, ``""`` for
    Instruct models (and for a tokenizer without a chat template)."""
    template = chat_template_of(tokenizer)
    if not template:
        return ""
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False,
                                             add_generation_prompt=True, chat_template=template)
    except Exception:  # noqa: BLE001 - a template that cannot render a plain turn opens nothing
        return ""
    i = text.rfind(ASSISTANT_START)
    return text[i + len(ASSISTANT_START):] if i >= 0 else ""


def generation_prefix(setting: str, tokenizer: Any = None) -> str:
    """The text the prompt ends with after the assistant header, for ``data.open_think``:
    "auto" (the tokenizer's chat template decides: :func:`template_generation_prefix`),
    "on" (``<think>\\n``, as the Thinking templates), "off" (nothing)."""
    if setting == "on":
        return THINK_OPEN
    if setting == "off":
        return ""
    if setting == "auto":
        return template_generation_prefix(tokenizer) if tokenizer is not None else ""
    raise ValueError(f"data.open_think = {setting!r} is invalid: expected one of {OPEN_THINK_SETTINGS}")


def opens_think(prefix: str) -> bool:
    """Whether a generation prefix leaves a think block open (the response then starts
    inside it and lacks ``<think>``)."""
    return prefix.lstrip().startswith("<think>") and "</think>" not in prefix


_LEADING_THINK_RE = re.compile(r"\A\s*<(think|thinking)>(.*?)</\1>\s*", re.DOTALL)


def continue_open_think(target: str) -> str:
    """A rendered target rewritten for a prompt that already opened ``<think>``, as the
    Thinking chat templates render an assistant turn after their generation prompt:
    ``reasoning.strip("\\n") + "\\n</think>\\n\\n" + rest.lstrip("\\n")``; a target without
    a think block (a direct-action sample) gets the empty one, ``"\\n</think>\\n\\n" + rest``."""
    m = _LEADING_THINK_RE.match(target)
    reasoning, rest = (m.group(2), target[m.end():]) if m else ("", target)
    return reasoning.strip("\n") + "\n</think>\n\n" + rest.lstrip("\n")


TARGET_END = "<|im_end|>"


def vision_block(n_image_pads: int = 1) -> str:
    return "<|vision_start|>" + "<|image_pad|>" * n_image_pads + "<|vision_end|>"
