"""GUI-Libra ASFT recipes with the release's hyperparameters (METHOD.md section 5):
lr 1e-5, global batch 256, cosine, 1 epoch, vision tower trained, reasoning and
direct-action data 1:1, alpha_a = 2, alpha_g = 4 (the paper's per-sample normalisation;
``--config.loss.normalize=token`` gives the release's global token mean).

    python -m launch.train --config=configs/guilibra_sft.py:qwen2_5_vl_3b --workdir=DIR \\
        --config.model.hf_path=/models/Qwen2.5-VL-3B-Instruct --config.data.train_files=...

Hardware: 1 x 8 H100 80GB (one host), every size; ``python -m launch.plan --config=configs/guilibra_sft.py:ARG``
prints the per-device memory.
"""

from guilibra_jax.train.config import H100_1x8, base_config, hardware

RECIPES = {
    # name: (family, fsdp, tensor)
    "qwen2_5_vl_3b": ("qwen2_5_vl", 8, 1),
    "qwen2_5_vl_7b": ("qwen2_5_vl", 8, 1),
    "qwen3_vl_4b": ("qwen3_vl", 8, 1),
    "qwen3_vl_8b": ("qwen3_vl", 8, 1),
}


def get_config(arg="qwen2_5_vl_3b"):
    if arg not in RECIPES:
        raise ValueError(f"configs/guilibra_sft.py: unknown recipe {arg!r}; expected one of {sorted(RECIPES)}")
    family, fsdp, tensor = RECIPES[arg]
    c = base_config()
    c.model.name = arg            # real sizes; set model.hf_path to load the checkpoint's weights
    c.model.dtype = "bfloat16"
    c.model.param_dtype = "float32"
    c.model.remat = "dots_with_no_batch_dims_saveable"
    c.model.scan_layers = True
    c.model.tiny.family = family
    c.data.method = "guilibra"
    c.data.mix = "both"
    c.data.max_length = 8192
    c.data.seq_buckets = (2048, 4096, 8192)
    c.data.batch_size = 32        # per process; x grad_accum x processes = global 256 on 8 hosts
    c.data.workers = 8
    c.loss.alpha_action = 2.0
    c.loss.alpha_grounding = 4.0
    c.loss.normalize = "sample"
    c.optim.lr = 1e-5
    c.optim.schedule = "cosine"
    c.optim.warmup_steps = 20
    c.optim.weight_decay = 0.0
    c.optim.clip_norm = 1.0
    c.hardware = hardware(*H100_1x8)
    c.mesh.data = -1
    c.mesh.fsdp = fsdp
    c.mesh.tensor = tensor
    c.train.steps = 320           # ~81K filtered steps x 2 (mix) / 256 per step / 2 ≈ one epoch
    c.train.grad_accum = 1
    c.train.log_every = 10
    c.train.checkpoint_every = 100
    return c
