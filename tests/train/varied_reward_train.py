"""``python -m launch.train`` with the rollout reward replaced by one that varies within a
group for any policy, so that stage-2 runs of a random tiny policy (whose GUI-Libra / UI-MOPD
rewards are all equal: its text never parses) have non-zero advantages and group statistics
to compare across process layouts and resumes (tests only):

    python -m tests.train.varied_reward_train --config=... --workdir=...

reward = (first response token id mod 3) / 2 for a valid row (0, 0.5 or 1; success at 1),
0 for an invalid one: a function of the sampled tokens, which every layout samples alike.
"""
from benchmarks.rl_step import token_reward
from guilibra_jax.train.rl import phases as PH

PH.reward = token_reward

if __name__ == "__main__":
    from launch import cli
    from launch.train import main
    cli.run(main)
