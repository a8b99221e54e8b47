"""Plans recipes on fake CPU devices in a fresh process and prints one JSON line per recipe.

    python tests/plan_worker.py --devices=8 --recipes=configs/guilibra_sft.py:qwen2_5_vl_3b,... [--tiny] [--tpu]

``--tiny`` keeps each recipe's mesh, batch geometry, method, remat and dtypes but swaps in
the tiny model of its family and short sequences, so the same planning code runs in seconds;
without it the recipe is planned at its real size (minutes per recipe on a CPU). ``--tpu``
compiles for the recipe's ``hardware.topology`` with the TPU compiler (libtpu) instead.
"""

import argparse
import atexit
import json
import os
import shutil
import sys
import tempfile


def shrink(c, tokenizer_dir: str):
    """The recipe at tiny size (same mesh, batch geometry, method and switches)."""
    c.model.name = "tiny"
    c.model.hf_path = ""
    c.tokenizer.path = tokenizer_dir
    c.data.max_length = 256
    c.data.seq_buckets = (256,)
    c.data.min_pixels, c.data.max_pixels = 56 * 56, 112 * 112
    if "pixels" in c.data:
        c.data.pixels = {}
    c.data.patch_bucket = 64
    c.rl.max_new_tokens = 16
    c.rl.teacher_model_name = ""
    if "://" not in c.rl.reference:   # a served reference (a URL) stays: nothing of it is planned
        c.rl.reference = ""
    if c.method == "mopd":   # teachers from earlier runs: random ones of the same (tiny) architecture; served ones stay
        c.rl.teachers = {label: spec if "://" in spec else f"random:{i + 1}"
                         for i, (label, spec) in enumerate(c.rl.teachers.items())}
    return c


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", type=int, required=True)
    ap.add_argument("--recipes", required=True)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--tpu", action="store_true", help="compile for each recipe's hardware.topology (libtpu)")
    args = ap.parse_args()
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={args.devices}"
    os.environ["JAX_PLATFORMS"] = "cpu"
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import importlib

    from guilibra_jax.train import config as run_config
    from guilibra_jax.train import data_source
    from guilibra_jax.train import recipe_plan as PLAN

    tokenizer_dir = ""
    if args.tiny:   # one demo tokenizer (Qwen special tokens, small vocabulary) for every recipe
        work = tempfile.mkdtemp(prefix="plan-tok-")
        atexit.register(shutil.rmtree, work, ignore_errors=True)
        demo = importlib.import_module("configs.demo").get_config("smoke")
        data_source.prepare_tokenizer(demo, work)
        tokenizer_dir = os.path.join(work, "tokenizer")
    for spec in args.recipes.split(","):
        path, _, arg = spec.partition(":")
        module = importlib.import_module(path[:-3].replace("/", "."))
        c = module.get_config(arg) if arg else module.get_config()
        if args.tiny:
            c = shrink(c, tokenizer_dir)
        run_config.validate(c, planning=True)
        hw = c.hardware
        if args.tpu:
            from guilibra_jax.train import tpu_topology as TT
            topo = TT.topology(hw.topology)
            report = PLAN.plan_config(c, len(topo.devices), topo.hosts, None, topology=topo)
            print(json.dumps({"recipe": spec, "report": report}), flush=True)
            continue
        report = PLAN.plan_config(c, args.devices, hw.hosts, hw.device_memory_gib or None)
        print(json.dumps({"recipe": spec, "report": report}), flush=True)


if __name__ == "__main__":
    main()
