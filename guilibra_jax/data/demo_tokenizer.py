"""A small-vocabulary Qwen-style tokenizer for CPU demos.

Tiny models learn in minutes only with a small vocabulary. This trains a
byte-level BPE with the ``tokenizers`` library on the given texts, with Qwen2's
pre-tokenizer (every digit its own token, so coordinates tokenise as in Qwen), keeps
Qwen's special tokens (chat, vision, think, tool call) and the Qwen-VL chat template,
and saves a Hugging Face tokenizer folder that ``AutoTokenizer.from_pretrained`` loads
offline, so the same loading code serves the demo and real checkpoints.
"""

from __future__ import annotations

import os
import re
from typing import Iterable

from guilibra_jax.data import prompts as P

QWEN_PRETOKENIZE_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# Qwen's added tokens, in Qwen's order (the first is the pad token).
QWEN_SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>",
    "<tool_response>", "</tool_response>", "<think>", "</think>",
)


def build_demo_tokenizer(texts: Iterable[str], vocab_size: int, out_dir: str, *,
                         chat_template: str = P.QWEN_VL_CHAT_TEMPLATE):
    """Train a byte-level BPE of ``vocab_size`` entries (special tokens included) on
    ``texts`` and save it to ``out_dir``; returns the loaded HF tokenizer.

    Special tokens take ids 0..19 (``<|endoftext|>`` = 0 is the pad token); the model
    config of a demo model must use this tokenizer's ids for image / vision tokens.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    min_size = len(QWEN_SPECIAL_TOKENS) + 256
    if vocab_size < min_size:
        raise ValueError(f"vocab_size must be >= {min_size} (special tokens + 256 bytes), got {vocab_size}")
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(QWEN_SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        additional_special_tokens=[t for t in QWEN_SPECIAL_TOKENS if t not in ("<|endoftext|>", "<|im_end|>")],
        clean_up_tokenization_spaces=False, model_max_length=131072)
    fast.chat_template = chat_template
    os.makedirs(out_dir, exist_ok=True)
    fast.save_pretrained(out_dir)
    return AutoTokenizer.from_pretrained(out_dir)


def demo_corpus(records, family: str = "qwen2_5_vl", methods=("guilibra", "mopd"), *,
                spell_quoted: bool = False) -> list[str]:
    """Prompt + target texts of native records (both methods, both variants), a
    corpus for :func:`build_demo_tokenizer`. Image sizes come from the records.

    ``spell_quoted``: the strings quoted in each record's instruction (the names and
    passwords a typing task copies) are cut out of that record's texts, so the BPE
    learns no merges from them: a typed string is spelled from pieces that every
    record trains, not held as a rare whole-word token per name."""
    from guilibra_jax.data import samples as S
    texts = []
    for r in records:
        cut = _quoted_cutter(r.instruction) if spell_quoted else None
        add = texts.extend if cut is None else (lambda parts: texts.extend(map(cut, parts)))
        for method in methods:
            spec = S.SampleSpec(method, family)
            try:
                add(S.prompt_turns(r, spec, tuple(r.image_size)))
                for with_reasoning in (True, False):
                    add([S.render_target(r, spec, tuple(r.image_size), with_reasoning)[0]])
            except ValueError:
                continue
    return texts


def _quoted_cutter(instruction: str):
    """A function removing every case form of ``instruction``'s quoted strings from a
    text (None when it quotes nothing)."""
    from guilibra_jax.data.copy_variants import quoted_strings
    quoted = {f for q in quoted_strings(instruction or "") for f in (q, q.upper(), q.lower())}
    if not quoted:
        return None
    pattern = re.compile("|".join(map(re.escape, sorted(quoted, key=len, reverse=True))))
    return lambda text: pattern.sub("", text)
