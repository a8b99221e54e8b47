r"""ASFT on MiniWoB++ expert demonstrations (record them first; optional [miniwob] extra).

    python -m launch.record_demos --world=miniwob --out=runs/miniwob_demos --episodes=30
    python -m launch.train --config=configs/miniwob.py --workdir=runs/miniwob_sft          # tiny, CPU
    python -m launch.eval --config=configs/eval_demo.py --workdir=runs/miniwob_eval \
        --config.world=miniwob --config.online.episodes=10 \
        --config.agents='("expert","random_click","checkpoint")' \
        --config.agent_kwargs.checkpoint.workdir=runs/miniwob_sft

Recipes (``:arg``):
- ``cpu`` (default): the demo's tiny Qwen2.5-VL-shaped model (text 128 wide x 2 layers,
  vision 64 wide x 2, a 1,024-token BPE trained on the demos), screenshots at scale 1
  (160 x 210, ``max_pixels`` 33,600: 140 patches, 35 visual tokens), the demo's short
  system turn, 1,200 steps of batch 8, lr 3e-3. Fits a 2-core CPU in tens of minutes.
- ``qwen2_5_vl_3b`` / ``qwen3_vl_4b``: a real model (set ``model.hf_path``) on demos recorded
  at ``--scale=2`` (320 x 420), GUI-Libra's own system prompt, the release's ASFT settings
  (lr 1e-5, cosine, alpha_a 2, alpha_g 4), batch 32 x 300 steps. Sized for one node of
  8 x H100 80GB (fsdp 8); a single H200 (141 GB) holds the 3B/4B with fsdp 1
  (``--config.mesh.fsdp=1 --config.data.batch_size=8 --config.train.grad_accum=4``).
  Not run here (no GPU in this task).
- ``smoke``: a few steps, for tests.

``data.train_files`` / ``data.eval_files`` point at ``runs/miniwob_demos``; override both to
use another folder. Online RL in the browser (``envs.miniwob.pool``) comes with the RL loop.

Hardware: 1 x CPU (``cpu``, ``smoke``); 1 x 8 H100 80GB (the Qwen-VL sizes).
"""

from configs import demo
from guilibra_jax.train.config import H100_1x8, base_config, hardware

DEMOS = "runs/miniwob_demos"
GPU = {"qwen2_5_vl_3b": "qwen2_5_vl", "qwen3_vl_4b": "qwen3_vl"}
ARGS = ("cpu", "smoke", "qwen2_5_vl_3b", "qwen3_vl_4b")


def _demo_data(c) -> None:
    c.data.format = "native"
    c.data.train_files = (f"{DEMOS}/train.jsonl",)
    c.data.eval_files = (f"{DEMOS}/test.jsonl",)
    c.data.method = "guilibra"
    c.data.mix = "both"


def get_config(arg="cpu"):
    if arg in ("cpu", "smoke", None):
        c = demo.get_config("smoke" if arg == "smoke" else None)   # the demo's model, optimizer, short prompt
        c.data.synthetic.enabled = False
        _demo_data(c)
        c.data.max_length = 384
        c.data.seq_buckets = (256, 384)
        c.data.patch_bucket = 1152       # 8 images x 140 patches
        c.data.max_pixels = 160 * 210    # the task region at scale 1, unshrunk
        if arg != "smoke":
            c.train.checkpoint_every = 200
            c.train.eval_every = 600
            c.train.eval_samples = 96
        return c
    if arg not in GPU:
        raise ValueError(f"configs/miniwob.py: unknown recipe {arg!r}; expected cpu, smoke or one of {sorted(GPU)}")
    c = base_config()
    _demo_data(c)
    c.model.name = arg                   # set model.hf_path to the checkpoint folder
    c.model.tiny.family = GPU[arg]
    c.model.dtype = "bfloat16"
    c.model.remat = "dots_with_no_batch_dims_saveable"
    c.model.scan_layers = True
    c.data.max_pixels = 320 * 420        # demos recorded with --scale=2
    c.data.max_length = 2048
    c.data.seq_buckets = (1024, 2048)
    c.data.batch_size = 32
    c.data.workers = 8
    c.optim.lr = 1e-5
    c.optim.schedule = "cosine"
    c.optim.warmup_steps = 20
    c.hardware = hardware(*H100_1x8)
    c.mesh.fsdp = 8
    c.train.steps = 300
    c.train.checkpoint_every = 100
    c.train.eval_every = 100
    return c
