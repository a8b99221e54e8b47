"""GUI-Libra ASFT recipes reproducing the public release by default (``SFT/scripts/
train_qwen2_5.sh`` / ``train_qwen3.sh``, ``SFT/train.py``, ``SFT/src/aguvis/``):

* lr 1e-5, cosine with 1% warmup, AdamW (0.9, 0.999), weight decay 0, grad-norm clip 1.0,
  global batch 256 (4 per GPU x 8 accumulation x 8 GPUs), 1 epoch, vision tower trained;
* reasoning and direct-action samples 1:1 (the ``mixnoreasoning`` data configs);
* Qwen2.5-VL (3B, 7B): ``use_action_weight=True, action_weight=2``: the release's weighting
  (``loss.weighting="release"``: x2 inside ``<answer>``, x4 from ``"point_2d":`` on, so x8
  on the coordinates) normalised by the token sum (``loss.normalize="token"``);
* Qwen3-VL (4B, 8B): ``use_action_weight=False``: plain token-mean cross-entropy
  (alpha_action = alpha_grounding = 1), coordinates in 0-1000;
* images resized into [3,136, 5,720,064] pixels (``SFT/train.py`` DataArguments).

``:paper`` after the size (e.g. ``qwen3_vl_8b:paper``) gives the paper's ASFT instead:
alpha_a = 2, alpha_g = 4 on reasoning / action / coordinate-digit tokens, per-sample
normalisation.

Remaining departures from the release, and why:
* normalisation: "token" divides by the weight sum of the whole global batch; the release
  divides per device micro-batch of 4 samples and averages those (its HF Trainer loss).
  The two agree when every micro-batch carries the same weight sum;
* the answer JSON is ours (``actions.render_answer_json``: compact, keys in a fixed order);
  the weight spans are found on characters, so they cover the same tokens as the release's
  token patterns do on its pretty-printed answers (see ``data.tokenize.target_weight_flags``);
* samples longer than ``data.max_length`` (24,576, the release's model_max_length) are
  dropped and counted, not truncated; no GUI-Libra sample comes near it;
* one image resize (transformers' PIL path) where the release resizes twice (qwen_vl_utils,
  then the processor): the sizes agree, the pixel values differ by resampling noise;
* ``train.steps`` = 636 is one epoch of GUI-Libra-81K mixed 1:1 (about 163K samples / 256);
  set it from your data size, and ``optim.warmup_steps`` to 1% of it;
* length-grouped sampling (``group_by_modality_length``) is replaced by length buckets.

    python -m launch.train --config=configs/guilibra_sft.py:qwen2_5_vl_3b --workdir=DIR \\
        --config.model.hf_path=/models/Qwen2.5-VL-3B-Instruct --config.data.train_files=...

Hardware: 1 x 8 H100 80GB (one host), every size; ``python -m launch.plan --config=configs/guilibra_sft.py:ARG``
prints the per-device memory.

QLoRA (``qwen2_5_vl_7b_qlora``): the 7B on 1 x H100 80GB, rank-16 adapters over an nf4 base
(``model.quantize``), bfloat16 weights, one row per micro-batch x 16, samples up to 8,192
tokens: planned at 66.2 GiB of 72 usable; the same with a bfloat16 base (plain LoRA) needs
74.9 (benchmarks/results/plan-guilibra_sft-qwen2_5_vl_7b_qlora-1x1-cpu.json and
plan-guilibra_sft-qwen2_5_vl_7b-lora16-bf16-1x1-cpu.json).

TPU variants (``SIZE_v5p``; ``launch.plan`` compiles them with the TPU compiler, libtpu needed):
``qwen2_5_vl_3b_v5p`` on a TPU v5p-8 (2x2x1, 4 chips): FSDP over the 4 chips, one row per chip
per micro-batch (data.batch_size 4 x train.grad_accum 64 = 256 rows per step); the TPU compiler
plans it at 53.7 GiB per chip of 85.5 usable at the release's 24,576 tokens and 5.7-megapixel
images (benchmarks/results/tpu-plan-guilibra_sft-qwen2_5_vl_3b_v5p.json; with tensor 4 and one
row per micro-batch it needs 88.0 GiB). ``qwen2_5_vl_7b_v5p`` on a TPU v5p-16 (2x2x2, 8 chips):
tensor parallelism over the 4 chips of a TPU VM (mesh.tensor = 4), FSDP over the VMs, one row
per FSDP group per micro-batch; the TPU compiler plans it at 67.6 GiB per chip of 85.5
(benchmarks/results/tpu-plan-guilibra_sft-qwen2_5_vl_7b_v5p.json). ``qwen3_vl_4b_v5p`` on a TPU v5p-8
as the 3B: 60.1 GiB per chip (tpu-plan-guilibra_sft-qwen3_vl_4b_v5p.json); ``qwen3_vl_8b_v5p`` on a
TPU v5p-16 as the 7B: 69.3 GiB (tpu-plan-guilibra_sft-qwen3_vl_8b_v5p.json).
"""

from guilibra_jax.train.config import H100_1x8, V5P_2x2x1, V5P_2x2x2, base_config, hardware

RECIPES = {
    # name: (family, fsdp, tensor)
    "qwen2_5_vl_3b": ("qwen2_5_vl", 8, 1),
    "qwen2_5_vl_7b": ("qwen2_5_vl", 8, 1),
    "qwen3_vl_4b": ("qwen3_vl", 8, 1),
    "qwen3_vl_8b": ("qwen3_vl", 8, 1),
}
# TPU variants: name -> (size, slice); see the module docstring
TPU_VARIANTS = {   # name: (size, slice, mesh.tensor)
    "qwen2_5_vl_3b_v5p": ("qwen2_5_vl_3b", V5P_2x2x1, 1),   # fsdp 4: one row per chip (tensor 4 needs 88 GiB)
    "qwen2_5_vl_7b_v5p": ("qwen2_5_vl_7b", V5P_2x2x2, 4),
    "qwen3_vl_4b_v5p": ("qwen3_vl_4b", V5P_2x2x1, 1),       # as the 3B: fsdp 4, one row per chip
    "qwen3_vl_8b_v5p": ("qwen3_vl_8b", V5P_2x2x2, 4),       # as the 7B: fsdp 2 x tensor 4
}
ARGS = ("qwen2_5_vl_3b", "qwen2_5_vl_7b", "qwen3_vl_4b", "qwen3_vl_8b", "qwen2_5_vl_3b_v5p", "qwen2_5_vl_7b_v5p",
        "qwen3_vl_4b_v5p", "qwen3_vl_8b_v5p", "qwen2_5_vl_7b_qlora")   # a literal: launch.recipes reads it
assert set(ARGS[4:8]) == set(TPU_VARIANTS)
QLORA = {"qwen2_5_vl_7b_qlora": "qwen2_5_vl_7b"}   # QLoRA on one GPU (see the module docstring)
H100_1x1 = ("1 x H100 80GB", 1, 1, 80)
STEPS = 636                       # one epoch: ~81K steps x 2 samples (1:1 mix) / 256 per step
RELEASE_PIXELS = (3136, 5720064)  # SFT/train.py: min_pixels, max_pixels of the processor


def parse_arg(arg):
    """``size`` or ``size:paper`` -> (size, variant)."""
    name, _, variant = (arg or "qwen2_5_vl_3b").partition(":")
    if name not in ARGS or variant not in ("", "paper"):
        raise ValueError(f"configs/guilibra_sft.py: unknown recipe {arg!r}; expected one of {list(ARGS)}, "
                         f"optionally followed by ':paper'")
    return name, variant or "release"


def get_config(arg="qwen2_5_vl_3b"):
    name, variant = parse_arg(arg)
    qlora = name in QLORA
    name = QLORA.get(name, name)
    name, tpu_slice, tpu_tensor = TPU_VARIANTS.get(name, (name, None, 1))
    family, fsdp, tensor = RECIPES[name]
    c = base_config()
    c.model.name = name           # real sizes; set model.hf_path to load the checkpoint's weights
    c.model.dtype = "bfloat16"
    c.model.param_dtype = "float32"
    c.model.remat = "full"        # the release's gradient checkpointing; what lets 24,576 tokens fit
    c.model.scan_layers = True
    c.model.tiny.family = family
    c.data.method = "guilibra"
    c.data.mix = "both"
    c.data.max_length = 24576
    c.data.seq_buckets = (4096, 8192, 16384, 24576)
    c.data.min_pixels, c.data.max_pixels = RELEASE_PIXELS
    c.data.batch_size = 8         # rows per micro-batch over all processes: 1 per GPU on 8 GPUs
    c.data.workers = 8
    c.train.grad_accum = 32       # x 32 micro-batches = the release's global batch of 256 per step
    if variant == "paper":
        c.loss.alpha_action, c.loss.alpha_grounding = 2.0, 4.0
        c.loss.normalize, c.loss.weighting = "sample", "paper"
    elif family == "qwen2_5_vl":
        c.loss.alpha_action, c.loss.alpha_grounding = 2.0, 4.0    # action_weight 2, its x2 after point_2d
        c.loss.normalize, c.loss.weighting = "token", "release"
    else:
        c.loss.alpha_action, c.loss.alpha_grounding = 1.0, 1.0    # use_action_weight=False
        c.loss.normalize, c.loss.weighting = "token", "paper"
    c.optim.lr = 1e-5
    c.optim.schedule = "cosine"
    c.optim.warmup_steps = 7      # warmup_ratio 0.01 of 636 steps, rounded up as transformers does
    c.optim.weight_decay = 0.0
    c.optim.clip_norm = 1.0
    c.hardware = hardware(*H100_1x8)
    c.mesh.data = -1
    c.mesh.fsdp = fsdp
    c.mesh.tensor = tensor
    c.train.steps = STEPS
    c.train.log_every = 10
    c.train.checkpoint_every = 100
    if tpu_slice:
        on_tpu_slice(c, tpu_slice, step_rows=256, tensor=tpu_tensor)
    if qlora:
        on_one_gpu_qlora(c)
    return c


def on_one_gpu_qlora(c):
    """QLoRA on one H100 80GB: rank-16 adapters (alpha 32) on the decoder's projections over an
    nf4 base, weights in bfloat16, lr 2e-4 (QLoRA's for 7B), one row per micro-batch x 16
    (a global batch of 16: all 16 micro-batches' inputs sit on the device at once), samples up
    to 8,192 tokens (24,576 does not fit one GPU)."""
    c.hardware = hardware(*H100_1x1)
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, 1, 1
    c.model.lora.rank, c.model.lora.alpha = 16, 32.0
    c.model.quantize = "nf4"
    c.model.param_dtype = "bfloat16"
    c.data.batch_size, c.train.grad_accum = 1, 16
    c.data.max_length, c.data.seq_buckets = 8192, (4096, 8192)
    c.data.workers = 2
    c.optim.lr = 2e-4


def on_tpu_slice(c, tpu_slice, step_rows: int, tensor: int = 1):
    """A TPU slice's variant: its hardware, the weights over every chip (mesh.fsdp x
    mesh.tensor), one row per chip per micro-batch, ``step_rows`` rows per optimizer step."""
    c.hardware = hardware(*tpu_slice)
    chips = c.hardware.hosts * c.hardware.devices_per_host
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, chips // tensor, tensor
    c.data.batch_size = chips // tensor
    c.train.grad_accum = step_rows // c.data.batch_size
