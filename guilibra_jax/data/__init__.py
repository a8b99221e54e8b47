"""Trajectory data: readers -> native step records -> samples -> grain batches.

Modules (each does one thing):
    native        the native JSONL step format (StepRecord, record_from_dict, RecordError)
    readers       GUI-Libra SFT JSON, GUI-Libra RL parquet, Uni-GUI episodes, native JSONL
    writers       native JSONL, native -> GUI-Libra SFT / RL (the converter round-trips)
    jsonl         byte-offset index + os.pread random access
    images        image loading, Qwen2.5-VL / Qwen3-VL preprocessing (HF-exact, numpy/PIL)
    prompts       system / user / target text per method and family, Qwen chat text
    tokenize      prompt + target ids with loss segments (0 prompt, 1 reasoning, 2 action, 3 grounding)
    samples       record -> Sample (or a Dropped marker)
    mixing        reasoning / direct mix, RL rebalancing, per-process shards
    collate       fixed-shape SFT and RL batches (M-RoPE positions, vision metadata, packing)
    bad_records   Dropped markers, BadRecordLog, the bad-fraction threshold
    pipeline      DataConfig, make_sft_loader, make_rl_loader (grain)
    demo_tokenizer  small-vocabulary Qwen-style BPE for CPU demos

The main entry points are re-exported lazily (importing this package stays cheap).
"""

_EXPORTS = {
    "DataConfig": "pipeline", "make_sft_loader": "pipeline", "make_rl_loader": "pipeline",
    "DataIterator": "pipeline", "BadRecordLog": "bad_records", "Dropped": "bad_records",
    "TooManyBadRecords": "bad_records", "open_source": "readers", "build_demo_tokenizer": "demo_tokenizer",
    "StepRecord": "native", "StepTarget": "native", "record_from_dict": "native", "RecordError": "native",
    "preprocess_image": "images", "processor_config": "images",
}


def __getattr__(name):
    if name in _EXPORTS:
        import importlib
        return getattr(importlib.import_module(f"guilibra_jax.data.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'guilibra_jax.data' has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
