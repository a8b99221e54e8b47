"""`python -m launch.train` for the stage-2 trainers: a GRPO run (rewards that vary within
groups: tests/train/varied_reward_train.py) killed with -9 during an
asynchronous save (and, in the slow test, at 3 random moments) and re-run ends with
parameters bitwise equal to the uninterrupted run's, rollouts and losses included, each
rerun saying which step it resumed from; a MOPD run routes to two teachers loaded from a
training workdir and from a Hugging Face export."""
import json
import os
import subprocess
import sys

import pytest

import chaos

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GRPO = ["--config=configs/grpo_demo.py:smoke", "--config.data.synthetic.tasks=8", "--config.train.steps=4",
        "--config.train.checkpoint_every=1"]


def launch(workdir, args, wait=True):
    cmd = [sys.executable, "-m", "launch.train", f"--workdir={workdir}", *args]
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    if not wait:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def rows(workdir):
    """step -> the last logged row of that step."""
    return {row["step"]: row for row in chaos.metric_rows(workdir)}


@pytest.fixture(scope="module")
def grpo_reference(tmp_path_factory, compile_cache):
    full = str(tmp_path_factory.mktemp("grpo_full"))
    assert chaos.resumed_from(chaos.run_to_end(full, GRPO, compile_cache, module=chaos.VARIED_REWARD)) == 0
    return full


def _assert_same_run(full, killed, notes=()):
    chaos.assert_bitwise_equal_exports(full, killed, list(notes))
    ref, resumed = rows(full), rows(killed)
    assert sorted(ref) == [1, 2, 3, 4]
    for step in ref:
        assert ref[step]["advantage_abs_mean"] > 0, ref[step]      # rewards vary within groups
        for key in ("reward_mean", "reward_group_std", "advantage_abs_mean", "response_length", "loss", "kl",
                    "grad_norm"):
            assert resumed[step][key] == ref[step][key], (step, key, list(notes))


def test_grpo_kill_9_during_an_async_save_then_rerun_is_bitwise_exact(grpo_reference, compile_cache, tmp_path):
    killed = str(tmp_path / "killed")
    cut = chaos.kill_during_save(killed, GRPO, compile_cache, min_step=2, module=chaos.VARIED_REWARD)
    assert chaos.unfinished_saves(killed) and max(chaos.complete_steps(killed)) == cut - 1
    out = chaos.run_to_end(killed, GRPO, compile_cache, module=chaos.VARIED_REWARD)
    chaos.check_resume(out, cut - 1, "rerun after a kill during the save of step %d" % cut)
    assert not chaos.unfinished_saves(killed)
    _assert_same_run(grpo_reference, killed)


@pytest.mark.slow
def test_grpo_killed_at_three_random_moments_ends_bitwise_exact(grpo_reference, compile_cache, tmp_path):
    killed = str(tmp_path / "chaos")
    notes = chaos.chaos_run(killed, GRPO, compile_cache, chaos.SEED, kills=3, steps=4, module=chaos.VARIED_REWARD)
    _assert_same_run(grpo_reference, killed, notes)


def test_mopd_routes_rollouts_to_two_teachers(tmp_path):
    # Two teachers that differ (a trained workdir, a random model); which rollout each scores is
    # checked exactly in test_learning.py (a routing swap fails there).
    teacher = str(tmp_path / "teacher")
    launch(teacher, ["--config=configs/demo.py:smoke", "--config.data.method=mopd", "--config.data.synthetic.tasks=8",
                     "--config.train.steps=2"])
    student = str(tmp_path / "student")
    launch(student, ["--config=configs/grpo_demo.py:smoke", "--config.method=mopd", "--config.data.method=mopd",
                     "--config.data.synthetic.tasks=8", "--config.train.steps=2", "--config.rl.top_p=1.0",
                     "--config.train.memory_plan=True",
                     f"--config.tokenizer.path={teacher}/tokenizer",
                     f"--config.rl.teachers={{'desktop': '{teacher}', 'mobile': 'random:7'}}"])
    got = rows(student)
    assert sorted(got) == [1, 2]
    for row in got.values():
        assert {"desktop/reward_mean", "mobile/reward_mean", "kl_mask_on_fraction", "kl"} <= set(row)
        assert -1.0 <= row["reward_mean"] <= 1.0
        # each teacher's KL on its own rows; their token-weighted mean is the step's KL
        per = {p: (row[f"{p}/kl"], row[f"{p}/kl_tokens"]) for p in ("desktop", "mobile") if f"{p}/kl" in row}
        assert per and not any(k.startswith("kl_teacher_") or k.startswith("kl_tokens_teacher_") for k in row)
        total = sum(n for _, n in per.values())
        assert sum(kl * n for kl, n in per.values()) / total == pytest.approx(row["kl"], rel=1e-5)
    plan = json.load(open(os.path.join(student, "memory_plan.json")))   # compiled on this run's devices
    gib = plan["per_device_gib"]
    assert gib["frozen_desktop"] > 0 and gib["frozen_mobile"] > 0 and gib["policy_params"] > 0
    assert {"update", "sampler", "score_desktop", "score_mobile"} <= set(plan["programs"])   # top_p 1:
    assert "score_policy" not in plan["programs"]            # old log-probs are the sampler's (rl.old_logprobs)
    assert plan["programs"]["update"]["temp"] > 0 and plan["fits"] is None   # CPU: device memory unknown
