"""Soak: a long run recompiles nothing after warm-up and holds its host memory flat.

Each run is ``python -m launch.train`` in its own process on the demo world with
variable-length data (several sequence buckets), logging every step; the checks read the
``sys/*`` columns the harness writes (``train/run_health.py``):

* ``sys/lowerings`` (programs lowered in the process) stops growing once every program
  has run once (the first eval, the first checkpoint, each sequence bucket's first batch:
  a step may lower programs only when its bucket, ``sys/seq_length``, is new);
* ``sys/host_rss_mib`` grows less than 5% between 10% and 100% of the run (long form; its
  first eval and checkpoint fall before 10%: compiling them is warm-up, not growth);
* the checkpoint folder holds ``train.keep_checkpoints`` steps, the newest; every step
  has its metrics row.

The default suite runs the short form (ASFT 40 steps, GRPO 8 steps). The long form
(ASFT 3,000 steps, GRPO 300 steps; about 15 and 20 minutes on 2 cores) is slow-marked:

    .venv/bin/python -m pytest -m slow tests/train/test_soak.py -s
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(workdir: str, args: list[str], cache_dir: str, timeout: float) -> list[dict]:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "launch.train", f"--workdir={workdir}", *args,
           f"--config.train.compilation_cache_dir={cache_dir}"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def _train_rows(rows: list[dict]) -> dict[int, dict]:
    """step -> the step's training row (eval rows are separate rows without ``loss``)."""
    return {r["step"]: r for r in rows if "loss" in r}


def check_soak(rows: list[dict], workdir: str, steps: int, warm: int, keep: int, rss_growth: float | None) -> dict:
    """The soak checks; returns the figures the closing note quotes."""
    train = _train_rows(rows)
    assert sorted(train) == list(range(1, steps + 1)), "a step has no metrics row"
    # A step may lower new programs only when its sequence bucket (``sys/seq_length``, ASFT)
    # appears for the first time: a rare bucket's first batch can come late in the run.
    seen, grew = {train[s].get("sys/seq_length") for s in range(1, warm + 1)}, []
    for s in range(warm + 1, steps + 1):
        length = train[s].get("sys/seq_length")
        first = length is not None and length not in seen
        if train[s]["sys/lowerings"] != train[s - 1]["sys/lowerings"]:
            assert first, (f"recompiled after warm-up (step {warm}) at step {s}, whose sequence bucket "
                           f"{length} had been seen: lowerings {train[s - 1]['sys/lowerings']} -> "
                           f"{train[s]['sys/lowerings']}")
            grew.append(s)
        seen.add(length)
    after = [train[warm]["sys/lowerings"], train[steps]["sys/lowerings"]]
    rss = {s: train[s]["sys/host_rss_mib"] for s in train}
    s10 = max(1, steps // 10)
    growth = rss[steps] / rss[s10] - 1
    if rss_growth is not None:
        assert growth < rss_growth, f"host RSS grew {growth:.1%} from step {s10} ({rss[s10]:.0f} MiB) to {steps}"
    kept = sorted(int(d) for d in os.listdir(os.path.join(workdir, "checkpoints")) if d.isdigit())
    assert len(kept) == keep and kept[-1] == steps, f"checkpoints kept: {kept}"
    return {"steps": steps, "lowerings_at_warm": after[0], "lowerings_at_end": after[-1], "new_bucket_steps": grew,
            "rss_mib_at_10pct": rss[s10], "rss_mib_at_end": rss[steps], "rss_growth": growth}


SFT = ["--config=configs/demo.py:smoke", "--config.data.synthetic.tasks=48", "--config.data.seq_buckets=(160,208,256)",
       "--config.train.log_every=1", "--config.train.keep_checkpoints=2", "--config.train.eval_samples=16"]
GRPO = ["--config=configs/grpo_demo.py:smoke", "--config.data.synthetic.tasks=48", "--config.train.log_every=1",
        "--config.train.keep_checkpoints=2", "--config.train.eval_samples=8"]


def _report(name: str, figures: dict) -> None:
    print(f"soak {name}: {json.dumps(figures)}")


def test_asft_recompiles_nothing_after_warm_up(tmp_path, compile_cache):
    steps = 40
    rows = _run(str(tmp_path), SFT + [f"--config.train.steps={steps}", "--config.train.eval_every=10",
                                      "--config.train.checkpoint_every=10"], compile_cache, 900)
    _report("asft", check_soak(rows, str(tmp_path), steps, warm=15, keep=2, rss_growth=None))


def test_grpo_recompiles_nothing_after_warm_up(tmp_path, compile_cache):
    steps = 8
    rows = _run(str(tmp_path), GRPO + [f"--config.train.steps={steps}", "--config.train.eval_every=3",
                                       "--config.train.checkpoint_every=3"], compile_cache, 900)
    _report("grpo", check_soak(rows, str(tmp_path), steps, warm=5, keep=2, rss_growth=None))


@pytest.mark.slow
def test_asft_soak_3000_steps(tmp_path, compile_cache):
    steps = 3000
    rows = _run(str(tmp_path), SFT + [f"--config.train.steps={steps}", "--config.train.eval_every=250",
                                      "--config.train.checkpoint_every=250", "--config.train.progress=False"],
                compile_cache, 5400)
    _report("asft", check_soak(rows, str(tmp_path), steps, warm=300, keep=2, rss_growth=0.05))


@pytest.mark.slow
def test_grpo_soak_300_steps(tmp_path, compile_cache):
    steps = 300
    rows = _run(str(tmp_path), GRPO + [f"--config.train.steps={steps}", "--config.train.eval_every=25",
                                       "--config.train.checkpoint_every=25", "--config.train.progress=False"],
                compile_cache, 5400)
    _report("grpo", check_soak(rows, str(tmp_path), steps, warm=30, keep=2, rss_growth=0.05))


def test_the_lowering_count_sees_a_new_shape_and_not_a_repeated_one():
    import jax
    import numpy as np

    from guilibra_jax.train import run_health
    run_health.watch()
    f = jax.jit(lambda x: x * 2 + 1)
    start = run_health.row()["sys/lowerings"]
    f(np.ones(3, np.float32)).block_until_ready()
    f(np.ones(3, np.float32)).block_until_ready()
    assert run_health.row()["sys/lowerings"] == start + 1
    f(np.ones(5, np.float32)).block_until_ready()
    assert run_health.row()["sys/lowerings"] == start + 2
    assert run_health.row()["sys/host_rss_mib"] > 10
