"""Record -> training sample: decode the screenshot, preprocess it, render prompt and
target for a method and model family, tokenise with segments.

A :class:`Sample` is what the batching stage consumes; any failure becomes a
:class:`bad_records.Dropped` marker instead (never an exception in a worker).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import numpy as np

from guilibra_jax import actions as A
from guilibra_jax.data import bad_records as B
from guilibra_jax.data import images as I
from guilibra_jax.data import prompts as P
from guilibra_jax.data import tokenize as T
from guilibra_jax.data.native import StepRecord

REASONING_VARIANT, DIRECT_VARIANT = 0, 1


@dataclasses.dataclass(frozen=True)
class SampleSpec:
    """How records become text. method: "guilibra" (``<answer>`` JSON) or "mopd" (tool
    calls); family: the model family (think tag, coordinate space, image processor)."""

    method: Literal["guilibra", "mopd"] = "guilibra"
    family: Literal["qwen2_5_vl", "qwen3_vl"] = "qwen2_5_vl"
    include_action_target: bool = False
    system_prompt: str | None = None   # None: the method's own; else a template (P.system_prompt)
    generation_prefix: str = ""        # after the assistant header: "<think>\n" for Thinking templates
    weighting: str = "paper"           # loss.weighting: "release" adds the release's weight flags

    def __post_init__(self):
        if self.method not in P.METHODS:
            raise ValueError(f"unknown method {self.method!r}; expected one of {P.METHODS}")
        if self.family not in A.THINK_TAG:
            raise ValueError(f"unknown family {self.family!r}; expected one of {sorted(A.THINK_TAG)}")
        if self.system_prompt:
            P.system_prompt(self.method, "mobile", self.system_prompt)  # fails early on a bad template


@dataclasses.dataclass
class Sample:
    input_ids: np.ndarray          # [L] int32, prompt + target
    segments: np.ndarray           # [L] int8, loss segment of each token (0 prompt)
    prompt_len: int
    pixel_values: np.ndarray       # [N, patch_dim] float32
    grid_thw: np.ndarray           # [3] int64
    platform: str
    where: str
    reward_target: Any = None      # rewards.Target
    resized_size: tuple[int, int] = (0, 0)   # (w, h) of the image the model sees
    image_size: tuple[int, int] = (0, 0)


def prompt_turns(record: StepRecord, spec: SampleSpec, resized_size: tuple[int, int]) -> tuple[str, str]:
    """(system, user) text of a record; the user turn holds one ``<image>``."""
    system = P.system_prompt(spec.method, record.platform, spec.system_prompt)
    if spec.method == "guilibra":
        return system, P.guilibra_user_text(record.instruction, record.history, resized_size)
    return system, P.mopd_user_text(record.platform, record.instruction, record.history)


def render_target(record: StepRecord, spec: SampleSpec, resized_size: tuple[int, int],
                  with_reasoning: bool) -> tuple[str, bool]:
    """(target text, grounded) of a record; the reasoning variant needs ``record.reasoning``."""
    reasoning = record.reasoning if with_reasoning else None
    if spec.method == "guilibra":
        space = A.FAMILY_COORD_SPACE[spec.family]
        action = record.target.action(space, image_size=record.image_size, resized_size=resized_size)
        text = A.render_response(action, reasoning, spec.family, include_target=spec.include_action_target)
        return text, action.point_2d is not None
    call = record.target.tool_call
    if call is None:
        raise ValueError("missing field target.tool_call: method 'mopd' needs a tool-call label")
    thought = record.thought if record.platform == "mobile" else None
    text = A.render_tool_call_response(call, reasoning, record.target.action_description or None, thought)
    return text, True


def continue_prefix(target: str, spec: SampleSpec) -> str:
    """The target as it follows the prompt's generation prefix: unchanged, or (a prefix
    that opened ``<think>``) rewritten by :func:`prompts.continue_open_think`."""
    return P.continue_open_think(target) if P.opens_think(spec.generation_prefix) else target


def make_sample(record: StepRecord | B.Dropped, variant: int, spec: SampleSpec, tokenizer: Any,
                img_cfg: "I.ImageProcessorConfig | I.PlatformImageConfigs", ids: T.SpecialIds | None = None,
                max_length: int | None = None, where: str | None = None,
                prompt_only_length: bool = False) -> Sample | B.Dropped:
    """One training sample of ``record`` (``variant``: reasoning or direct twin);
    ``where`` (file and index) labels a dropped record. ``img_cfg``: one processor config,
    or one per platform (:class:`images.PlatformImageConfigs`). ``max_length`` bounds the
    prompt + target tokens, or (``prompt_only_length``: an RL prompt, as the releases'
    max_prompt_length) the prompt's alone."""
    if isinstance(record, B.Dropped):
        return record
    where = where or f"{record.trajectory_id}:{record.step}"
    try:
        image = I.load_image(record.image)
    except I.ImageLoadError as e:
        return B.Dropped(B.UNREADABLE_IMAGE, where, str(e))
    img_cfg = I.config_for(img_cfg, record.platform)
    pixel_values, grid = I.preprocess_image(image, img_cfg)
    resized = (int(grid[2]) * img_cfg.patch_size, int(grid[1]) * img_cfg.patch_size)
    n_img = int(np.prod(grid)) // img_cfg.merge_size ** 2
    try:
        system, user = prompt_turns(record, spec, resized)
        target, grounded = render_target(record, spec, resized, variant == REASONING_VARIANT)
    except ValueError as e:
        return B.Dropped(B.classify_record_error(str(e)), where, str(e))
    enc = T.encode_sample(tokenizer, system, user, continue_prefix(target, spec), [n_img], grounded=grounded,
                          ids=ids, generation_prefix=spec.generation_prefix, weighting=spec.weighting)
    n = enc.prompt_len if prompt_only_length else len(enc.input_ids)
    if max_length is not None and n > max_length:
        what = "prompt tokens" if prompt_only_length else "tokens"
        return B.Dropped("too_long", where, f"{n} {what} > max_length {max_length}", bad=False)
    return Sample(enc.input_ids, enc.segments, enc.prompt_len, pixel_values, grid, record.platform, where,
                  record.reward_target(), resized, tuple(image.size))
