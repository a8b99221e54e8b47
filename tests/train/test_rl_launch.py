"""`python -m launch.train` for the stage-2 trainers: a GRPO run killed with -9 and
re-run repeats the uninterrupted run (rollouts included), and a MOPD run routes to two
teachers loaded from a training workdir and from a Hugging Face export."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GRPO = ["--config=configs/grpo_demo.py:smoke", "--config.data.synthetic.tasks=8", "--config.train.steps=4",
        "--config.train.checkpoint_every=1", "--config.train.async_checkpoints=False"]


def launch(workdir, args, wait=True):
    cmd = [sys.executable, "-m", "launch.train", f"--workdir={workdir}", *args]
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    if not wait:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def wait_for_step(workdir, step, proc, timeout=600):
    path = os.path.join(workdir, "metrics.jsonl")
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise AssertionError(f"run ended early: {proc.stdout.read()[-3000:]}")
        if os.path.exists(path) and any(json.loads(l)["step"] >= step for l in open(path) if l.strip()):
            return
        time.sleep(0.2)
    raise TimeoutError(f"step {step} never logged")


def rows(workdir):
    """step -> the last logged row of that step."""
    out = {}
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        for line in f:
            row = json.loads(line)
            out[row["step"]] = row
    return out


def test_grpo_kill_9_then_rerun_matches_uninterrupted(tmp_path):
    full = str(tmp_path / "full")
    launch(full, GRPO)
    killed = str(tmp_path / "killed")
    proc = launch(killed, GRPO, wait=False)
    wait_for_step(killed, 2, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = sorted(int(d) for d in os.listdir(os.path.join(killed, "checkpoints")) if d.isdigit())
    assert done and max(done) < 4
    launch(killed, GRPO)
    ref, resumed = rows(full), rows(killed)
    assert sorted(ref) == [1, 2, 3, 4]
    for step in range(max(done) + 1, 5):
        for key in ("reward_mean", "response_length", "loss", "kl", "grad_norm"):
            np.testing.assert_allclose(resumed[step][key], ref[step][key], rtol=1e-5, atol=1e-7,
                                       err_msg=f"step {step} {key}")
    assert os.path.exists(os.path.join(full, "export", "model.safetensors"))


def test_mopd_routes_rollouts_to_two_teachers(tmp_path):
    teacher = str(tmp_path / "teacher")
    launch(teacher, ["--config=configs/demo.py:smoke", "--config.data.method=mopd", "--config.data.synthetic.tasks=8",
                     "--config.train.steps=2"])
    student = str(tmp_path / "student")
    launch(student, ["--config=configs/grpo_demo.py:smoke", "--config.method=mopd", "--config.data.method=mopd",
                     "--config.data.synthetic.tasks=8", "--config.train.steps=2", "--config.rl.top_p=1.0",
                     "--config.train.memory_plan=True",
                     f"--config.tokenizer.path={teacher}/tokenizer",
                     f"--config.rl.teachers={{'desktop': '{teacher}', 'mobile': '{teacher}/export'}}"])
    got = rows(student)
    assert sorted(got) == [1, 2]
    for row in got.values():
        assert {"desktop/reward_mean", "mobile/reward_mean", "kl_mask_on_fraction", "kl"} <= set(row)
        assert -1.0 <= row["reward_mean"] <= 1.0
    plan = json.load(open(os.path.join(student, "memory_plan.json")))   # compiled on this run's devices
    gib = plan["per_device_gib"]
    assert gib["frozen_desktop"] > 0 and gib["frozen_mobile"] > 0 and gib["policy_params"] > 0
    assert {"update", "sampler", "score_policy", "score_desktop", "score_mobile"} <= set(plan["programs"])
    assert plan["programs"]["update"]["temp"] > 0 and plan["fits"] is None   # CPU: device memory unknown
