"""UI-MOPD stage 1: one teacher per platform, SFT'd on that platform's data only, in
Qwen3-VL tool-call format (METHOD.md section 3). Arg: desktop | mobile.

    python -m launch.train --config=configs/mopd_teacher_sft.py:mobile --workdir=DIR \\
        --config.model.hf_path=/models/Qwen3-VL-32B-Thinking --config.data.train_files=/data/uni-gui/mobile

Hardware: 1 x 8 H100 80GB (one host, as the release).
"""

from guilibra_jax.train.config import H100_1x8, base_config, hardware


def get_config(arg="desktop"):
    if arg not in ("desktop", "mobile"):
        raise ValueError(f"configs/mopd_teacher_sft.py: platform must be desktop or mobile, got {arg!r}")
    c = base_config()
    c.model.name = "qwen3_vl_32b"
    c.model.tiny.family = "qwen3_vl"
    c.model.dtype = "bfloat16"
    c.model.remat = "dots_with_no_batch_dims_saveable"
    c.model.scan_layers = True
    c.data.format = "uni_gui"
    c.data.method = "mopd"
    c.data.mix = "reasoning"      # tool-call targets keep their <think> block
    c.data.max_length = 8192
    c.data.seq_buckets = (4096, 8192)
    c.data.batch_size = 16
    c.data.workers = 8
    c.loss.alpha_action = 1.0     # plain SFT for teachers (token-weighted CE)
    c.loss.alpha_grounding = 1.0
    c.loss.normalize = "token"
    c.optim.lr = 1e-5
    c.optim.warmup_steps = 20
    c.hardware = hardware(*H100_1x8)   # the release: 1 node x 8 GPUs
    c.mesh.fsdp = 8
    c.mesh.tensor = 1
    c.train.steps = 1000
    return c
