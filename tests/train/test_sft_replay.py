"""``rl.sft_replay``: ASFT steps on the training files interleaved with the RL rounds.

- a real GRPO run replays on the rounds it should, its ASFT loss on the replayed
  demonstrations falls (the replay step descends the SFT objective on the RL run's
  optimizer), and its memory plan compiles the replay step;
- a run resumed from its step-2 checkpoint ends bitwise equal to the uninterrupted one
  (the replay's iterator is checkpointed with the prompts');
- a checkpoint of a run with replay resumed without it (and the reverse), or replay
  without training records, is a one-line error naming the key.
"""
import json
import os
import shutil

import pytest
from safetensors.numpy import load_file

from guilibra_jax.errors import ConfigError

STEPS = 4


def _config(every=1):
    from configs import grpo_demo
    c = grpo_demo.get_config("smoke")
    c.rl.sft_replay.every = every
    c.optim.lr = 3e-3                 # the tiny random model's SFT loss falls visibly in a few steps
    c.train.steps = STEPS
    c.train.checkpoint_every = 2
    c.train.tensorboard = c.train.curves = False
    c.train.memory_plan = True
    return c


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from guilibra_jax.train.run import train
    workdir = str(tmp_path_factory.mktemp("replay") / "run")
    train(_config(), workdir)
    return workdir


def _rows(workdir):
    return [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl")) if '"step"' in line]


def test_every_round_replays_and_the_sft_loss_falls(run_dir):
    rows = {r["step"]: r for r in _rows(run_dir) if "kl" in r}
    assert sorted(rows) == list(range(1, STEPS + 1))
    for r in rows.values():
        assert r["sft_replay/update_ok"] == 1.0 and r["sft_replay/loss_tokens"] > 0, r
    first, last = rows[1]["sft_replay/loss"], rows[STEPS]["sft_replay/loss"]
    assert last < first - 0.5, (first, last)
    plan = json.load(open(os.path.join(run_dir, "memory_plan.json")))
    assert plan["programs"]["sft_replay"]["flops"] > 0


def test_replay_every_2_rounds_only_on_those_rounds(tmp_path):
    from guilibra_jax.train.run import train
    c = _config(every=2)
    c.train.steps, c.train.export, c.train.memory_plan = 3, False, False
    train(c, str(tmp_path / "run"))
    replayed = sorted(r["step"] for r in _rows(str(tmp_path / "run")) if "sft_replay/loss" in r)
    assert replayed == [2]


def test_a_run_resumed_from_its_step_2_checkpoint_ends_bitwise_equal(run_dir, tmp_path):
    import numpy as np
    from guilibra_jax.train.run import train
    resumed = str(tmp_path / "resumed")
    shutil.copytree(run_dir, resumed)
    for gone in (f"checkpoints/{STEPS}", "export"):
        shutil.rmtree(os.path.join(resumed, gone))
    train(_config(), resumed)
    want = load_file(os.path.join(run_dir, "export", "model.safetensors"))
    got = load_file(os.path.join(resumed, "export", "model.safetensors"))
    assert set(want) == set(got)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


@pytest.mark.parametrize("every", [0, 1])
def test_resuming_across_a_replay_switch_names_the_key(run_dir, tmp_path, every):
    """The step-2 checkpoint of a run with replay, resumed without it; and a checkpoint
    without replay resumed with it."""
    from guilibra_jax.train.run import train
    workdir = str(tmp_path / "run")
    if every == 0:
        shutil.copytree(run_dir, workdir)
        shutil.rmtree(os.path.join(workdir, f"checkpoints/{STEPS}"))
    else:
        c = _config(every=0)
        c.train.steps, c.train.export, c.train.memory_plan = 2, False, False
        train(c, workdir)
    c = _config(every=every)
    c.train.memory_plan = False
    with pytest.raises(ConfigError, match=r"rl\.sft_replay\.every"):
        train(c, workdir)


def test_replay_without_training_records_names_the_key(tmp_path):
    from guilibra_jax.train.rl.replay import open_replay
    c = _config()
    c.data.synthetic.enabled = False
    c.data.train_files = ()
    with pytest.raises(ConfigError, match=r"rl\.sft_replay\.every.*data\.train_files"):
        open_replay(c, None, None, str(tmp_path))
