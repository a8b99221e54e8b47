"""Offline + online evaluation of the built-in agents on the synthetic world.

    python -m launch.eval --config=configs/eval_demo.py --workdir=DIR
    python -m launch.eval --config=configs/eval_demo.py:smoke --workdir=DIR   # seconds

A trained checkpoint joins by registering an agent factory
(``guilibra_jax.eval.agents.register_agent``) and listing its name in ``agents``, with
its keyword arguments under ``agent_kwargs.<name>``.
"""

import ml_collections as mlc


def get_config(arg=None):
    c = mlc.ConfigDict()
    c.platforms = ("desktop", "mobile")
    c.screen_width = 0           # 0 (both): each platform's small default (128x96 / 96x128)
    c.screen_height = 0
    c.data = mlc.ConfigDict(dict(
        dir="",                  # "" = export the world's dataset into WORKDIR/data
        split="test",            # the split evaluated offline
        n_tasks=40, seed=0, split_fraction=0.2,   # used when exporting
    ))
    c.online = mlc.ConfigDict(dict(episodes=20, max_steps=15, save_trajectories=True))
    c.response_format = "guilibra"   # guilibra | tool_call: what the built-in agents write
    c.coord_space = "norm1000"       # GUI-Libra point_2d space: norm1000 | pixels | unit | resized_pixels
    c.resize = mlc.ConfigDict(dict(family="qwen2_5_vl", min_pixels=0, max_pixels=0))  # resized_pixels only
    c.agents = ("expert", "random", "convention")
    c.agent_kwargs = mlc.ConfigDict(dict(expert={}, random=dict(seed=0), convention={}))
    if arg == "smoke":
        c.data.n_tasks = 8
        c.online.episodes = 4
        c.online.max_steps = 10
    elif arg:
        raise ValueError(f"configs/eval_demo.py: unknown argument {arg!r}; expected 'smoke' or none")
    return c
