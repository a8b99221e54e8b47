r"""GUI-Libra's data curation with our own sampler (docs/method.md): re-prediction
consistency, box verification, reasoning augmentation and RL rebalancing, resumable.

    python -m launch.curate --config=configs/curate.py --workdir=runs/curate \
        --config.data.inputs='("/data/sft/*.json",)' --config.data.format=guilibra_sft \
        --config.model.path=runs/sft3b
    # reasoning written by a served model instead of the checkpoint:
    python -m launch.curate --config=configs/curate.py --workdir=runs/curate ... \
        --config.generator.url=http://localhost:8000/v1 --config.generator.family=qwen2_5_vl
    # the synthetic demo: held-out world steps with injected label errors; the report
    # scores the filter against them (box check by the world's own boxes: the demo model
    # never learned to output boxes)
    python -m launch.curate --config=configs/curate.py:demo --workdir=runs/curate_demo \
        --config.model.path=runs/demo
    python -m launch.curate --config=configs/curate.py:oracle --workdir=/tmp/c   # seconds, no model

Arguments: "" (your data), "demo", "oracle" (every stage answered by the synthetic
world's labels: a smoke run of the whole pipeline). Re-running the same command
continues a killed run. Samplers per stage: model (``model.path``: a training workdir or
a Hugging Face folder, prompted as in its training run), endpoint (``generator.*``: an
OpenAI-compatible server), oracle (synthetic data only).
"""

import ml_collections as mlc

from guilibra_jax.curate.prompts import BOX_TEMPLATE

ARGS = ("", "demo", "oracle")


def get_config(arg=None):
    c = mlc.ConfigDict()
    c.data = mlc.ConfigDict(dict(
        inputs=(),               # files, folders or globs in `format`
        format="native",         # native | guilibra_sft | guilibra_rl | uni_gui
        image_root="", include_unused=False,
        limit=0,                 # curate only the first N records (0: all)
        known_errors="",         # JSON {record index: kind} of labels known to be wrong: the report scores the filter
        read_threads=4,
        # the synthetic world as input, with known label errors (demo, tests)
        synthetic=dict(enabled=False, platforms=("desktop", "mobile"), tasks=60, seed=0, split_fraction=0.2,
                       split="test", format="native", corrupt_fraction=0.3,
                       corrupt_kinds=("shift_point", "wrong_type"), min_shift=0.25, strip_reasoning=0.0),
    ))
    c.stages = ("consistency", "box", "reasoning", "rebalance")
    c.batch_size = 8             # records per block and process (the model's prompt rows per call)
    c.seed = 0
    # the checkpoint the "model" sampler uses: a training workdir (latest checkpoint, or step) or an HF folder
    c.model = mlc.ConfigDict(dict(path="", step=-1, run_config="", dtype="", max_prompt_tokens=0))
    # 1. re-prediction consistency: keep steps whose K samples match the label at least `threshold` of the time
    c.consistency = mlc.ConfigDict(dict(sampler="model", samples=8, threshold=0.3, temperature=1.0, top_p=0.98,
                                        max_new_tokens=256))
    # 2. box verification: the label's point must lie inside the predicted box of its action_target
    c.box = mlc.ConfigDict(dict(sampler="model", samples=1, temperature=0.0, max_new_tokens=64, prompt=BOX_TEMPLATE,
                                target_fallback="action_description",   # or "none": steps without a target pass
                                on_unparsed="drop",                     # a step whose box cannot be read
                                replace_existing=False))                # a record's own bbox wins unless True
    # 3. reasoning for steps without it; auto = the endpoint when generator.url is set, else the model
    c.reasoning = mlc.ConfigDict(dict(sampler="auto", tries=2, temperature=0.7, top_p=0.95, max_new_tokens=512,
                                      only_missing=True))
    c.generator = mlc.ConfigDict(dict(url="", model="", api_key_env="OPENAI_API_KEY", timeout=120.0, retries=3,
                                      backoff=1.0, concurrency=8, family="qwen2_5_vl", method="guilibra",
                                      min_pixels=0, max_pixels=0, system_prompt="", send_seed=False))
    # 4. the RL subset: keep probability per step ("step:p,..."), largest share per domain ("mobile:0.5"), cap
    c.rebalance = mlc.ConfigDict(dict(step_keep="0:0.5,1:0.75", max_share="", domain_key="platform",
                                      target_size=0))
    c.reward = mlc.ConfigDict(dict(value_rule="paper", point_tolerance=0.05))   # what a "match" is
    # the "oracle" sampler: clean labels (a native JSONL; "" = the synthetic world's), right with `accuracy`
    c.oracle = mlc.ConfigDict(dict(clean="", accuracy=0.8, family="qwen2_5_vl", delay_s=0.0))
    c.output = mlc.ConfigDict(dict(examples=3, noreason_twin=False))
    c.mesh = mlc.ConfigDict(dict(data=-1, fsdp=1, tensor=1))
    c.distributed = mlc.ConfigDict(dict(coordinator_address="", num_processes=0, process_id=-1,
                                        local_device_ids=""))
    if arg in ("demo", "oracle"):
        c.data.synthetic.enabled = True
        c.data.synthetic.strip_reasoning = 0.25
        c.box.sampler = "oracle"
        if arg == "oracle":
            c.consistency.sampler = c.reasoning.sampler = "oracle"
        else:
            c.reasoning.tries = 1
    elif arg:
        raise ValueError(f"configs/curate.py: unknown argument {arg!r}; expected one of {ARGS[1:]} or none")
    return c
