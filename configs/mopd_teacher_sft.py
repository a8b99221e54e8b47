"""UI-MOPD stage 1: one teacher per platform, SFT'd on that platform's data only, in
Qwen3-VL tool-call format (docs/method.md). Arg: desktop | mobile. Reproduces the
public release by default (``verl/ui_mopd/runs/run_sft_32B_Thinking.sh``,
``data/sft/generate_{desktop,mobile}_sft_parquet.py``):

* Qwen3-VL-32B-Thinking, plain token-mean cross-entropy on the assistant turn (alpha 1 / 1);
  every target keeps its reasoning, rendered as the Thinking chat template renders it
  after its ``<think>\\n`` generation prompt (``data.open_think="auto"`` reads the template);
* lr 1e-6, cosine to 0 with 10% warmup, AdamW (0.9, 0.999), weight decay 0.01, grad-norm
  clip 1.0, global batch 32, 1 epoch, sequences <= 16,384 tokens;
* images resized into the data prep's per-platform budget: desktop [3,136, 13,107,200],
  mobile [40,768, 548,800] pixels (``data.pixels``).

Remaining departures from the release, and why:
* ``train.steps`` must be set to one epoch of your data (ceil(records / 32)); 1,000 is a
  placeholder, and ``optim.warmup_steps`` (100) should stay 10% of it: the step count is
  not known before the data is read;
* the run script also gives the processor min 3,136 / max 6,553,600 pixels; whether that
  second bound re-resizes the desktop images after the data's own budget depends on the
  transformers version the release ran, so we keep the data prep's budgets;
* sequences over 16,384 tokens are dropped and counted (the release raises on them:
  ``truncation=error``).

    python -m launch.train --config=configs/mopd_teacher_sft.py:mobile --workdir=DIR \\
        --config.model.hf_path=/models/Qwen3-VL-32B-Thinking --config.data.train_files=/data/uni-gui/mobile

Memory (``python -m launch.plan``, ``benchmarks/results/plan-mopd_teacher_sft-qwen3_vl_32b-8x8-cpu.json``):
the release trains each 32B teacher on one host of 8 GPUs with Megatron tensor parallel 4,
full recompute, and gradients and optimizer state offloaded to host memory (a CPU
optimizer), which this framework does not do. Without offload the float32 master weights
and AdamW moments alone are 47 GiB per GPU over 8, so this recipe is sized for 8 x 8 H100
80GB: FSDP over 32 groups x tensor parallel 2, one 16,384-token row per FSDP group (32 rows:
the release's global batch, no accumulation), MLPs in chunks of 4,096 positions
(``model.mlp_chunk``); planned on 64 fake CPU devices at 60.9 GiB per GPU of 72 usable
(parameters 2.1, AdamW 4.2, step 54.6). 4 x 8 (fsdp 16 x tensor 2, 2 micro-batches of 16
rows) plans at 74.8 and fsdp 32 at 75.6: over by 3-4 GiB on the CPU compiler, whose plan
keeps a float32 copy of the bfloat16 residual stream (20 GiB here) that a GPU does not make.

Hardware: 8 x 8 H100 80GB (the release: 1 x 8 with host offload).

TPU variant (``desktop_v5p`` / ``mobile_v5p``; ``launch.plan`` compiles it with the TPU compiler,
libtpu needed): a TPU v5p-64 (2x4x4, 32 chips) (8 TPU VMs), FSDP over 16 groups x tensor
parallel 2 within a VM, one 16,384-token row per FSDP group and 2 micro-batches (the same 32
rows per step): the TPU compiler plans 57.2 GiB per chip of 85.5 usable
(``benchmarks/results/tpu-plan-mopd_teacher_sft-qwen3_vl_32b_v5p_2x4x4.json``). The next smaller
slice, a v5p-32 (16 chips), does not fit: 87.3 GiB at fsdp 8 x tensor 2 and 88.3 at fsdp 4 x
tensor 4 (the float32 master weights and AdamW moments alone are 23.7 GiB per chip there).
"""

from guilibra_jax.train.config import H100_8x8, V5P_2x4x4, base_config, hardware

PIXELS = {"desktop": (3136, 13107200), "mobile": (40768, 548800)}   # data/sft/generate_*_sft_parquet.py
ARGS = ("desktop", "mobile", "desktop_v5p", "mobile_v5p")   # a literal: launch.recipes reads it


def get_config(arg="desktop"):
    if arg not in ARGS:
        raise ValueError(f"configs/mopd_teacher_sft.py: unknown recipe {arg!r}; expected one of {list(ARGS)} "
                         f"(a platform, optionally on a TPU v5p-64)")
    arg, _, tpu = arg.partition("_")
    c = base_config()
    c.model.name = "qwen3_vl_32b"
    c.model.tiny.family = "qwen3_vl"
    c.model.dtype = "bfloat16"
    c.model.remat = "full"        # the release's gradient checkpointing
    c.model.scan_layers = True
    c.data.format = "uni_gui"
    c.data.method = "mopd"
    c.data.mix = "reasoning"      # tool-call targets keep their <think> block
    c.data.open_think = "auto"    # Thinking templates open <think> in the prompt
    c.data.max_length = 16384
    c.data.seq_buckets = (4096, 8192, 16384)
    c.data.pixels = dict(PIXELS)
    c.data.batch_size = 32        # train_batch_size 32: one row per FSDP group (2 GPUs), one micro-batch
    c.train.grad_accum = 1
    c.data.workers = 8
    c.loss.alpha_action = 1.0     # plain SFT for teachers (token-weighted CE)
    c.loss.alpha_grounding = 1.0
    c.loss.normalize = "token"
    c.loss.weighting = "paper"
    c.optim.lr = 1e-6
    c.optim.schedule = "cosine"
    c.optim.end_lr_fraction = 0.0
    c.optim.warmup_steps = 100    # lr_warmup_steps_ratio 0.1 of train.steps
    c.optim.weight_decay = 0.01
    c.optim.b1, c.optim.b2 = 0.9, 0.999
    c.optim.clip_norm = 1.0
    c.model.mlp_chunk = 4096      # [16,384, 25,600] MLP buffers in chunks (launch.plan: 29 -> 20 GiB at 2 layers)
    c.hardware = hardware(*H100_8x8)   # the release: 1 node x 8 GPUs with host offload (see above)
    c.mesh.fsdp = 32
    c.mesh.tensor = 2
    c.train.steps = 1000          # placeholder: one epoch = ceil(records / 32)
    if tpu:                       # TPU v5p-64: fsdp 16 x tensor 2, 16 rows x 2 micro-batches
        c.hardware = hardware(*V5P_2x4x4)
        c.mesh.fsdp, c.mesh.tensor = 16, 2
        c.data.batch_size, c.train.grad_accum = 16, 2
    return c
