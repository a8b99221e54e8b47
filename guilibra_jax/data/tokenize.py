"""Tokenise a prompt + target with per-token loss segments.

Segments (per target token; prompt and padding are 0):
    1 REASONING  the think block, its tags included (``<think>...</think>`` or ``<thinking>``)
    2 ACTION     the rest of the target: answer JSON / Action line / tool call, ``<|im_end|>``
    3 GROUNDING  only the number characters of ``point_2d`` (GUI-Libra, when the action
                 has a point) or of ``coordinate`` / ``coordinate2`` (tool calls)

The prompt and the target are tokenised separately (the prompt ids are then exactly
what generation starts from); inside the target, each token takes the highest segment
among the characters it covers (grounding > action > reasoning), found through the
fast tokenizer's offsets. With Qwen's tokenizer every digit is its own token, so
grounding is exactly the coordinate digits; a tokenizer that merges a digit with a
bracket makes that token grounding.

With ``weighting="release"`` (``loss.weighting``) target segments also carry the flags
IN_ANSWER (4) and AFTER_POINT (8) of GUI-Libra's released weighting
(:func:`target_weight_flags`); ``segment & PART_MASK`` is the part above either way.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Sequence

import numpy as np

from guilibra_jax import choices as CH
from guilibra_jax.data import prompts as P

PROMPT, REASONING, ACTION, GROUNDING = 0, 1, 2, 3
SEGMENT_NAMES = {PROMPT: "prompt", REASONING: "reasoning", ACTION: "action", GROUNDING: "grounding"}
# Release-weighting flags OR-ed onto target segments (weighting "release" only; the low two
# bits keep the part above). GUI-Libra's SFT code (SFT/src/aguvis/dataset.py, use_action_weight)
# multiplies the weight of tokens inside <answer> by action_weight and of every token after
# "point_2d": by 2 x action_weight (see target_weight_flags).
IN_ANSWER, AFTER_POINT = 4, 8
PART_MASK = 3
WEIGHTINGS = CH.WEIGHTINGS   # the ASFT weightings (guilibra_jax/choices.py)

_THINK_SPAN_RE = re.compile(r"\A\s*(<(think|thinking)>.*?</\2>)", re.DOTALL)
_OPENED_THINK_SPAN_RE = re.compile(r"\A(.*?</(think|thinking)>)", re.DOTALL)
_NUM = r"(-?\d+(?:\.\d+)?)"
_POINT_RE = re.compile(r'"point_2d":\s*\[\s*' + _NUM + r"\s*,\s*" + _NUM + r"\s*\]")
_COORD_RE = re.compile(r'"coordinate2?":\s*\[\s*' + _NUM + r"\s*,\s*" + _NUM + r"\s*\]")


_ANSWER_OPEN, _ANSWER_CLOSE, _POINT_KEY = "<answer", "</answer>", '"point_2d":'


def target_weight_flags(target: str) -> np.ndarray:
    """[len(target)] int8 character flags of GUI-Libra's released ASFT weighting:
    IN_ANSWER from the ``>`` of the first ``<answer>`` up to the following ``</answer>``
    (exclusive), AFTER_POINT from just after the first ``"point_2d":`` to the end.

    The release finds these spans as token patterns (``tok("<answer>")[:-1]``,
    ``tok("</answer>")[:-1]``, ``tok('"point_2d":')[1:]``) in the whole tokenised sequence;
    on its pretty-printed answers (``<answer>\\n{...}\\n</answer>``) that is this span, token
    for token. Here the spans are found in the target's characters, so they hold however
    the tokenizer merges neighbours: with Qwen's BPE and a compact answer, ``]}</answer>``
    tokenises as ``]}</`` + ``answer`` + ``>``, where the release's pattern for
    ``</answer>`` finds nothing and its x2 silently vanishes. A token takes every flag
    that one of its characters carries."""
    flags = np.zeros(len(target), np.int8)
    a = target.find(_ANSWER_OPEN + ">")
    if a >= 0:
        e = target.find(_ANSWER_CLOSE, a)
        if e >= 0:
            flags[a + len(_ANSWER_OPEN):e] |= IN_ANSWER
    g = target.find(_POINT_KEY)
    if g >= 0:
        flags[g + len(_POINT_KEY):] |= AFTER_POINT
    return flags


def target_char_segments(target: str, *, grounded: bool = True, think_opened: bool = False) -> np.ndarray:
    """Segment id of every character of a target text (see module doc). ``grounded``
    False (an action without a point) leaves point_2d numbers in ACTION. ``think_opened``:
    the prompt opened the think block, so the target's reasoning runs from its start to
    the first closing tag (included)."""
    seg = np.full(len(target), ACTION, np.int8)
    m = _THINK_SPAN_RE.match(target)
    if m is None and think_opened:
        m = _OPENED_THINK_SPAN_RE.match(target)
    if m:
        seg[m.start(1):m.end(1)] = REASONING
    body_start = m.end() if m else 0
    if grounded:
        for rx in (_POINT_RE, _COORD_RE):
            for mm in rx.finditer(target, body_start):
                for g in (1, 2):
                    seg[mm.start(g):mm.end(g)] = GROUNDING
    return seg


@dataclasses.dataclass(frozen=True)
class SpecialIds:
    """Ids of the chat / vision tokens in one tokenizer."""

    image_pad: int
    vision_start: int
    vision_end: int
    im_start: int
    im_end: int
    pad: int

    @classmethod
    def of(cls, tokenizer: Any) -> "SpecialIds":
        def tid(tok: str) -> int:
            i = tokenizer.convert_tokens_to_ids(tok)
            if i is None or (tokenizer.unk_token_id is not None and i == tokenizer.unk_token_id):
                raise ValueError(f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no token {tok!r}; "
                                 "a Qwen-VL tokenizer (or build_demo_tokenizer) is needed")
            return int(i)
        pad = tokenizer.pad_token_id
        return cls(image_pad=tid("<|image_pad|>"), vision_start=tid("<|vision_start|>"),
                   vision_end=tid("<|vision_end|>"), im_start=tid("<|im_start|>"), im_end=tid("<|im_end|>"),
                   pad=int(pad) if pad is not None else tid("<|endoftext|>"))

    def check_model(self, model_config: Any) -> None:
        """Raise when the model config's vision token ids differ from the tokenizer's."""
        pairs = [("image_token_id", self.image_pad), ("vision_start_token_id", self.vision_start),
                 ("vision_end_token_id", self.vision_end)]
        bad = [(k, getattr(model_config, k), v) for k, v in pairs if getattr(model_config, k) != v]
        if bad:
            raise ValueError("model config and tokenizer disagree on token ids: "
                             + ", ".join(f"{k}: config {a} vs tokenizer {b}" for k, a, b in bad))


def encode_prompt(tokenizer: Any, system: str, user: str, image_tokens: Sequence[int],
                  ids: SpecialIds | None = None, generation_prefix: str = "") -> np.ndarray:
    """Token ids of the chat prompt (generation prompt and ``generation_prefix``
    included) with each ``<image>`` placeholder of ``user`` expanded to
    ``image_tokens[k]`` pads."""
    ids = ids or SpecialIds.of(tokenizer)
    n_ph = user.count(P.IMAGE_PLACEHOLDER)
    if n_ph != len(image_tokens):
        raise ValueError(f"user turn has {n_ph} {P.IMAGE_PLACEHOLDER} placeholders but "
                         f"{len(image_tokens)} images")
    text = P.chat_prompt_text(system, user.replace(P.IMAGE_PLACEHOLDER, P.vision_block(1)), generation_prefix)
    raw = tokenizer(text, add_special_tokens=False)["input_ids"]
    out: list[int] = []
    k = 0
    for t in raw:
        if t == ids.image_pad:
            out.extend([ids.image_pad] * int(image_tokens[k]))
            k += 1
        else:
            out.append(t)
    if k != len(image_tokens):
        raise ValueError(f"tokenised prompt holds {k} <|image_pad|> tokens, expected {len(image_tokens)}")
    return np.asarray(out, np.int32)


def encode_target(tokenizer: Any, target: str, *, grounded: bool = True, add_end: bool = True,
                  think_opened: bool = False, weighting: str = "paper") -> tuple[np.ndarray, np.ndarray]:
    """(ids [n] int32, segments [n] int8) of a target text (+ ``<|im_end|>``); with
    ``weighting`` "release" the segments also carry :func:`target_weight_flags`."""
    if weighting not in WEIGHTINGS:
        raise ValueError(f"loss.weighting = {weighting!r} is invalid: expected one of {WEIGHTINGS}")
    text = target + (P.TARGET_END if add_end else "")
    char_seg = target_char_segments(text, grounded=grounded, think_opened=think_opened)
    flags = target_weight_flags(text) if weighting == "release" else None
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    tok_ids = np.asarray(enc["input_ids"], np.int32)
    segs = np.empty(len(tok_ids), np.int8)
    last, last_flags = ACTION, 0
    for i, (s, e) in enumerate(enc["offset_mapping"]):
        if e > s:
            last = int(char_seg[s:e].max())
            last_flags = int(np.bitwise_or.reduce(flags[s:e])) if flags is not None else 0
        segs[i] = last | last_flags
    return tok_ids, segs


@dataclasses.dataclass
class EncodedText:
    """One sample's token ids and per-token segments (0 on the prompt)."""

    input_ids: np.ndarray   # [L] int32
    segments: np.ndarray    # [L] int8, segment of each token
    prompt_len: int


def encode_sample(tokenizer: Any, system: str, user: str, target: str, image_tokens: Sequence[int], *,
                  grounded: bool = True, ids: SpecialIds | None = None,
                  generation_prefix: str = "", weighting: str = "paper") -> EncodedText:
    """Prompt (ending with ``generation_prefix``) and target of one sample; a prefix that
    opens the think block makes the target's reasoning start at its first token.
    ``weighting`` "release" ORs :func:`target_weight_flags` onto the target segments."""
    p = encode_prompt(tokenizer, system, user, image_tokens, ids, generation_prefix)
    t, s = encode_target(tokenizer, target, grounded=grounded, think_opened=P.opens_think(generation_prefix),
                         weighting=weighting)
    return EncodedText(np.concatenate([p, t]), np.concatenate([np.zeros(len(p), np.int8), s]), len(p))
