"""`python -m launch.train` with the release options set from the command line: RL
rebalancing (data.rebalance) shapes the prompts a GRPO run draws, recorded in the
workdir's data_info.json."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from test_rl_launch import GRPO, launch, rows  # noqa: E402


def test_grpo_run_draws_a_rebalanced_prompt_set(tmp_path):
    wd = str(tmp_path / "rebalanced")
    launch(wd, [*GRPO, "--config.train.steps=2", "--config.data.rebalance.step_keep=(0.0, 0.5)",
                "--config.data.rebalance.max_share={'mobile': 0.25}", "--config.rl.dual_clip=3.0",
                "--config.rl.std_unbiased=True", "--config.rl.reward.format_rule=release"])
    info = json.load(open(os.path.join(wd, "data_info.json")))
    before, after = info["rebalance"]["before"], info["rebalance"]["after"]
    # the synthetic export holds both platforms and first steps; the rebalanced index has no
    # step-0 record (keep 0.0), fewer step-1 records, and mobile at no more than a quarter
    assert before["step"]["0"] > 0 and before["platform"]["mobile"] / before["n"] > 0.25
    assert "0" not in after["step"] and after["step"].get("1", 0) < before["step"]["1"]
    assert after["platform"].get("mobile", 0) <= 0.25 * after["n"] + 1e-9 and after["n"] == info["samples"]
    assert sorted(rows(wd)) == [1, 2]
