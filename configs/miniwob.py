r"""ASFT on MiniWoB++ expert demonstrations (record them first; optional [miniwob] extra).

    python -m launch.record_demos --world=miniwob --out=runs/miniwob_demos --episodes=100 --scale=2
    python -m launch.train --config=configs/miniwob.py --workdir=runs/miniwob_sft          # tiny, CPU
    python -m launch.eval --config=configs/eval_demo.py --workdir=runs/miniwob_eval \
        --config.world=miniwob --config.miniwob.scale=2 --config.online.episodes=20 \
        --config.agents='("expert","random_click","checkpoint")' \
        --config.agent_kwargs.checkpoint.workdir=runs/miniwob_sft

Recipes (``:arg``):
- ``cpu`` (default): a tiny Qwen3-VL-shaped model (text 128 wide x 2 layers, vision 64 wide
  x 2, learned vision position embeddings, interleaved M-RoPE; a 1,024-token BPE trained on
  the demos with the instructions' quoted strings left out, so names are spelled from pieces)
  on 100 demos per task recorded at ``--scale=2`` and read at ``max_pixels`` 33,600 (the
  320 x 420 screenshots resized to 160 x 192: 120 patches, 30 visual tokens), plus 10 copy
  variants of every typing step (``launch.copy_variants``) and 4,000 vision-probe screens
  (``launch.vision_probe --kind=click``, large and small boxes), direct-action samples only,
  the demo's short system turn, 7,000 steps of batch 8, lr 3e-3 cosine: 0.37 held-out macro
  success against random clicking's 0.16 on the same 700 episodes with training seed 0 (it
  learns to copy the instruction's strings), 0.26 with seed 1 (it does not), 21 minutes of
  training on a 2-core CPU (docs/study/miniwob/levers.json ``e_copy10``, ``e_copy10_s1``;
  ``make demo-miniwob`` writes every input).
- ``qwen2_5_vl_3b`` / ``qwen3_vl_4b``: a real model (set ``model.hf_path``) on demos recorded
  at ``--scale=2`` (320 x 420), GUI-Libra's own system prompt, the release's ASFT settings
  (lr 1e-5, cosine, alpha_a 2, alpha_g 4), batch 32 x 300 steps. Sized for one node of
  8 x H100 80GB (fsdp 8); a single H200 (141 GB) holds the 3B/4B with fsdp 1
  (``--config.mesh.fsdp=1 --config.data.batch_size=8 --config.train.grad_accum=4``).
  Not run here (no GPU in this task).
- ``smoke``: a few steps, for tests.
- ``rl``: stage 2, GUI-Libra's conservative GRPO on live MiniWoB++ pages (``rl.world=miniwob``,
  ``guilibra_jax/train/rl/online.py``) from the ``cpu`` run's export (``model.hf_path`` default
  ``runs/miniwob_sft/export``, or ``$GUILIBRA_MINIWOB_SFT_EXPORT``; its tokenizer comes with
  it). 4 browser workers, one live episode each: every step samples 8 responses per live
  state, rewards them with the verifier against the DOM expert's action in that state,
  steps each episode with the first response and restarts finished ones on the next train
  seed (``rl.online.tasks`` () = all 35 tasks). The reference is the SFT policy (kl_beta 0.1),
  lr 1e-4 constant, 200 steps; episodes land in ``workdir/online_episodes.jsonl``::

      python -m launch.train --config=configs/miniwob.py:rl --workdir=runs/miniwob_rl
      python -m launch.eval --config=configs/eval_demo.py --workdir=runs/miniwob_rl_eval \
          --config.world=miniwob --config.miniwob.scale=2 --config.online.episodes=20 \
          --config.agents='("random_click","checkpoint")' --config.agent_kwargs.checkpoint.workdir=runs/miniwob_rl

- ``rl_smoke``: 2 steps of a random tiny policy on 3 tasks with 2 browsers (tests; set
  ``tokenizer.path``).

``data.train_files`` / ``data.eval_files`` point at ``runs/miniwob_demos``; override both to
use another folder (the ``rl`` recipes read no records: their prompts are live pages).

Hardware: 1 x CPU (``cpu``, ``smoke``); 1 x 8 H100 80GB (the Qwen-VL sizes).
"""

import os

from configs import demo
from guilibra_jax.train.config import H100_1x8, base_config, hardware

DEMOS = "runs/miniwob_demos"
PROBES = "runs/miniwob_probes"   # launch.vision_probe --kind=click --box=large|small --out=PROBES/click_<box>
GPU = {"qwen2_5_vl_3b": "qwen2_5_vl", "qwen3_vl_4b": "qwen3_vl"}
ARGS = ("cpu", "smoke", "rl", "rl_smoke", "qwen2_5_vl_3b", "qwen3_vl_4b")
SFT_EXPORT = "runs/miniwob_sft/export"


def _demo_data(c) -> None:
    c.data.format = "native"
    c.data.train_files = (f"{DEMOS}/train.jsonl",)
    c.data.eval_files = (f"{DEMOS}/test.jsonl",)
    c.data.method = "guilibra"
    c.data.mix = "both"


def _online_rl(arg: str):
    """GRPO on live pages from the cpu recipe's model and prompt settings."""
    c = get_config("smoke" if arg == "rl_smoke" else "cpu")
    c.method = "grpo"
    c.rl.world = "miniwob"
    c.model.hf_path = os.environ.get("GUILIBRA_MINIWOB_SFT_EXPORT", SFT_EXPORT)
    c.data.mix = "direct"
    c.rl.online.workers = 4
    c.data.batch_size = 4            # = rl.online.workers: one prompt per live episode
    c.rl.online.tasks = ()           # all 35 tasks with an expert
    c.rl.online.scale = 2.0          # as the demos (read at max_pixels 33,600)
    c.rl.online.max_steps = 0        # each task's own limit (10; click-checkboxes-large 16), as launch.eval
    c.rl.group_size = 8
    c.rl.max_new_tokens = 64         # a direct answer is ~20-40 tokens of the demo BPE
    c.rl.top_p = 1.0
    c.rl.kl_beta = 0.1               # grpo_demo's trust region
    c.rl.minibatches = 2
    c.rl.reward.value_rule = "release"
    c.optim.lr = 1e-4
    c.optim.warmup_steps = 0
    c.optim.schedule = "constant"
    c.train.steps = 200
    c.train.log_every = 1
    c.train.checkpoint_every = 25
    c.train.eval_every = 0           # online success: launch.eval --config.world=miniwob (see above)
    if arg == "rl_smoke":            # a random tiny policy: set tokenizer.path
        c.model.hf_path = ""
        c.rl.online.workers = 2
        c.data.batch_size = 2
        c.rl.online.tasks = ("click-test", "click-button", "enter-text")
        c.rl.online.max_steps = 2      # every episode ends by step 2: the episode log is written
        c.rl.group_size = 4
        c.rl.max_new_tokens = 16
        c.rl.minibatches = 1
        c.train.steps = 2
        c.train.checkpoint_every = 1
        c.train.memory_plan = False
    return c


def get_config(arg="cpu"):
    if arg in ("rl", "rl_smoke"):
        return _online_rl(arg)
    if arg in ("cpu", "smoke", None):
        c = demo.get_config("smoke" if arg == "smoke" else None)   # the demo's model, optimizer, short prompt
        c.data.synthetic.enabled = False
        _demo_data(c)
        c.data.max_length = 384
        c.data.seq_buckets = (256, 384)
        c.data.patch_bucket = 1152       # 8 images x 140 patches (Qwen2.5-VL; Qwen3-VL's are 120)
        c.data.max_pixels = 160 * 210    # scale-2 demos read at 140 x 196 (Qwen2.5-VL) / 160 x 192 (Qwen3-VL)
        if arg != "smoke":
            c.data.mix = "direct"        # issue #19's runs: direct 0.14 macro at 430 steps, mixed 0.04 at 300
            c.data.train_files = (f"{DEMOS}/train.jsonl", f"{DEMOS}/train_copy.jsonl",
                                  f"{PROBES}/click_large/train.jsonl", f"{PROBES}/click_small/train.jsonl")
            c.data.synthetic.tokenizer_spell_quoted = True   # names spelled from pieces: copying is learnable
            c.model.tiny.family = "qwen3_vl"                 # the Qwen2.5-VL shape cannot locate a small box
            c.train.steps = 7000                             # copying the instruction's string appears at ~3,500
            c.train.checkpoint_every = 1750
            c.train.eval_every = 1750
            c.train.eval_samples = 96
        return c
    if arg not in GPU:
        raise ValueError(f"configs/miniwob.py: unknown recipe {arg!r}; expected cpu, smoke, rl, rl_smoke or one of {sorted(GPU)}")
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
