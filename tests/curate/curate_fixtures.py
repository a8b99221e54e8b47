"""Helpers of the curation tests (imported by conftest.py and the tests)."""
import json
import os
import types

from configs import curate
from guilibra_jax.curate import run as CRUN


def make_world(base: str, tasks: int = 24, corrupt_fraction: float = 0.4, fmt: str = "native"):
    """The synthetic world's held-out steps as SFT-like records (no boxes), a share of them
    corrupted (``prepare_synthetic``, as ``configs/curate.py:demo`` makes them); ``clean``
    holds the true labels (for the oracle), ``corrupted`` maps index -> kind."""
    cfg = curate.get_config("oracle")
    cfg.data.synthetic.update(tasks=tasks, split_fraction=0.5, corrupt_fraction=corrupt_fraction, strip_reasoning=0.3,
                              format=fmt)
    info = CRUN.prepare_synthetic(cfg, base)
    return types.SimpleNamespace(base=base, input=info["input"], clean=info["clean"], corrupted=info["corrupted"],
                                 format=fmt, known_errors=os.path.join(base, "data", "corruption.json"))


def oracle_config(world, **sections):
    """configs/curate.py:oracle over a prepared world's input (no export of its own)."""
    cfg = curate.get_config("oracle")
    cfg.data.synthetic.enabled = False
    cfg.data.inputs = (world.input,)
    cfg.data.format = world.format
    cfg.oracle.clean = world.clean
    cfg.data.known_errors = world.known_errors
    for key, value in sections.items():
        cfg[key] = value
    return cfg


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def tree_bytes(root):
    """{relative path: bytes} of every file under ``root``."""
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = fh.read()
    return out
