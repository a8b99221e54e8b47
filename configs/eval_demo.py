r"""Offline + online evaluation of the built-in agents on the synthetic world.

    python -m launch.eval --config=configs/eval_demo.py --workdir=DIR
    python -m launch.eval --config=configs/eval_demo.py:smoke --workdir=DIR   # seconds

A trained checkpoint is the ``checkpoint`` agent (:mod:`guilibra_jax.eval.model_agent`):
list it in ``agents`` and point it at a training workdir (latest checkpoint, or
``step``) or at a Hugging Face folder::

    python -m launch.eval --config=configs/eval_demo.py --workdir=runs/eval \
        --config.agents='("expert","checkpoint")' --config.agent_kwargs.checkpoint.workdir=runs/demo
    python -m launch.eval --config=configs/eval_demo.py --workdir=runs/eval_hf \
        --config.agents='("checkpoint",)' --config.agent_kwargs.checkpoint.hf_path=runs/demo/export \
        --config.agent_kwargs.checkpoint.run_config=runs/demo

Several checkpoints of one run: ``agent_kwargs.checkpoint.steps`` is ``all`` (every
complete checkpoint in the workdir's ``checkpoints/``) or a tuple of steps
(``...checkpoint.steps='(100,200,300)'``). Each step is its own entry
``checkpoint@<step>`` (``offline_checkpoint@200.json``, ...), and the report joins them
in step order; other agents listed stay separate points. The model is built (and
generate compiled) once; only the parameters change from step to step::

    python -m launch.eval --config=configs/eval_demo.py --workdir=runs/eval_sweep \
        --config.agents='("expert","checkpoint")' --config.agent_kwargs.checkpoint.workdir=runs/demo \
        --config.agent_kwargs.checkpoint.steps=all

The model is prompted exactly as in training and scored in its own format and
coordinate space (from its run config; ``coord_space`` / ``response_format`` below are
for the built-in agents). The world must look like the training data: screen sizes 0
give the same small defaults the trainer's synthetic data uses, and ``data.seed`` /
``data.split_fraction`` should equal the run's ``data.synthetic.seed`` /
``test_fraction`` so that evaluated tasks were held out of training. An HF folder has
no run config: ``run_config`` names the training workdir it was exported from (or set
the run's ``method`` / ``system_prompt`` / ``min_pixels`` / ``max_pixels`` one by one).

A served model (``vllm serve runs/demo/export``, SGLang, a hosted API) is the ``endpoint``
agent (:mod:`guilibra_jax.eval.endpoint_agent`)::

    python -m launch.eval --config=configs/eval_demo.py --workdir=runs/eval_served \
        --config.agents='("endpoint",)' --config.agent_kwargs.endpoint.url=http://localhost:8000/v1 \
        --config.agent_kwargs.endpoint.export=runs/demo/export

MiniWoB++ in headless Chromium (``pip install -e .[miniwob]``, Chromium + chromedriver)::

    python -m launch.eval --config=configs/eval_demo.py --workdir=runs/eval_miniwob \
        --config.world=miniwob --config.miniwob.tasks='("click-button","enter-text")' \
        --config.online.episodes=10 --config.agents='("expert","random_click")'

Other agents join by registering a factory (``guilibra_jax.eval.agents.register_agent``)
and listing its name in ``agents``, with its keyword arguments under
``agent_kwargs.<name>``.
"""

import ml_collections as mlc


def get_config(arg=None):
    c = mlc.ConfigDict()
    c.world = "synthetic"        # synthetic | miniwob (pip install -e .[miniwob] + Chromium; online only)
    # world=miniwob: tasks () = every task with an expert; online.episodes held-out seeds per task
    c.miniwob = mlc.ConfigDict(dict(tasks=(), scale=1.0, max_steps=0))
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
    c.agent_kwargs = mlc.ConfigDict(dict(
        expert={}, random=dict(seed=0), convention={},
        # used only when "checkpoint" is in agents; set exactly one of workdir / hf_path.
        # step -1: the latest; steps: ("all",) or a tuple of steps, one entry each (workdir only;
        # () = just `step`); run_config: hf_path's training workdir; "" / 0: the run config's
        checkpoint=dict(workdir="", hf_path="", step=-1, steps=(), run_config="", max_new_tokens=256,
                        temperature=0.0, batch_size=8, method="", system_prompt="", min_pixels=0, max_pixels=0,
                        max_length=0, dtype=""),
        # used only when "endpoint" is in agents: an OpenAI-compatible server (vLLM serve, SGLang, hosted).
        # export: our export folder (its run_config.json and family); else run_config / family / method / ...
        endpoint=dict(url="", model="", api_key_env="OPENAI_API_KEY", export="", run_config="", family="",
                      method="", system_prompt="", min_pixels=0, max_pixels=0, temperature=0.0, max_tokens=256,
                      timeout=120.0, retries=3, backoff=1.0, concurrency=8),
    ))
    if arg == "smoke":
        c.data.n_tasks = 8
        c.online.episodes = 4
        c.online.max_steps = 10
    elif arg:
        raise ValueError(f"configs/eval_demo.py: unknown argument {arg!r}; expected 'smoke' or none")
    return c
