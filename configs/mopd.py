"""UI-MOPD stage 2 (METHOD.md sections 3 and 5): a Qwen3-VL-8B student samples G = 8
tool-call responses per Uni-GUI instruction; each rollout's tokens are scored by the
teacher of its platform (two Qwen3-VL-32B teachers from ``configs/mopd_teacher_sft.py``);
K3 clamped to 10, beta 0.01, group advantages without std normalisation, clip 0.2 low /
0.28 high, lr 1e-6, KL mask off above pass rate 0.1, advantages zeroed below 0.01,
responses <= 512 tokens, one epoch.

    python -m launch.train --config=configs/mopd.py:8x8 --workdir=DIR \\
        --config.model.hf_path=/models/Qwen3-VL-8B-Thinking --config.data.train_files=/data/uni-gui \\
        --config.rl.teachers.desktop=/ckpt/teacher-desktop --config.rl.teachers.mobile=/ckpt/teacher-mobile

Layouts (``:arg``): ``8x8`` (default): the paper's 64 H100 80GB (8 hosts x 8); ``1x8``: one
host of 8 H100 80GB. ``python -m launch.plan --config=configs/mopd.py:ARG`` prints what each
needs per device.

Hardware: 8 x 8 H100 80GB (``:8x8``, the paper) or 1 x 8 H100 80GB (``:1x8``).
"""

import ml_collections as mlc

from guilibra_jax.train.config import H100_1x8, H100_8x8, base_config, hardware

ARGS = ("8x8", "1x8")


def get_config(arg="8x8"):
    if arg not in ARGS:
        raise ValueError(f"configs/mopd.py: unknown layout {arg!r}; expected one of {ARGS}")
    c = base_config()
    c.method = "mopd"
    c.model.name = "qwen3_vl_8b"
    c.model.tiny.family = "qwen3_vl"
    c.model.dtype = "bfloat16"
    c.model.remat = "dots_with_no_batch_dims_saveable"
    c.model.scan_layers = True
    c.data.format = "uni_gui"
    c.data.method = "mopd"
    c.data.max_length = 4096
    c.data.batch_size = 16
    c.rl.group_size = 8
    c.rl.temperature = 1.0
    c.rl.top_p = 1.0
    c.rl.max_new_tokens = 512
    c.rl.clip_low, c.rl.clip_high = 0.2, 0.28
    c.rl.normalize_std = False
    c.rl.kl_clamp = 10.0
    c.rl.mopd.beta, c.rl.mopd.kl_mask_tau, c.rl.mopd.pass_floor = 0.01, 0.1, 0.01
    c.rl.sngs.enabled = False
    c.rl.teachers = mlc.ConfigDict({"desktop": "", "mobile": ""})   # set both to teacher folders
    c.rl.score_chunk = 1024
    c.optim.lr = 1e-6
    c.optim.schedule = "constant"
    c.rl.teacher_model_name = "qwen3_vl_32b"   # what launch.plan assumes while rl.teachers are unset
    if arg == "8x8":
        c.hardware = hardware(*H100_8x8)
        c.mesh.fsdp, c.mesh.tensor = 16, 4
    else:
        c.hardware = hardware(*H100_1x8)
        c.mesh.fsdp, c.mesh.tensor = 8, 1
    c.train.steps = 1000
    c.train.log_every = 1
    c.train.checkpoint_every = 50
    return c
