"""GRPO on the synthetic world raises the rollout reward from an SFT start (slow: about 7
minutes on 2 cores; the bandit test in test_rl.py covers the same update cheaply).

    python -m pytest -m slow tests/train/test_rl_world.py
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def launch(workdir, *args):
    cmd = [sys.executable, "-m", "launch.train", f"--workdir={workdir}", *args]
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]


@pytest.mark.slow
def test_grpo_raises_the_reward_from_an_sft_start(tmp_path):
    sft, grpo = str(tmp_path / "sft"), str(tmp_path / "grpo")
    # A deliberately short SFT (400 steps, 240 tasks): a start with room to improve.
    launch(sft, "--config=configs/demo.py", "--config.data.synthetic.tasks=240", "--config.train.steps=400",
           "--config.train.eval_every=0", "--config.train.progress=False")
    launch(grpo, "--config=configs/grpo_demo.py", f"--config.model.hf_path={sft}/export",
           "--config.data.synthetic.tasks=240", "--config.optim.lr=5e-4", "--config.train.eval_every=0",
           "--config.train.progress=False")
    rows = [json.loads(l) for l in open(os.path.join(grpo, "metrics.jsonl"))]
    reward = [r["reward_mean"] for r in rows if "reward_mean" in r]
    kl = [r["kl"] for r in rows if "kl" in r]
    assert len(reward) == 50
    first, last = np.mean(reward[:10]), np.mean(reward[-10:])
    assert last > first + 0.05, (first, last, reward)
    assert max(kl) < 0.5  # the trust region holds (beta = 0.1)
