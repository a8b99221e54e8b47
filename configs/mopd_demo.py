"""UI-MOPD on the synthetic world, on CPU, in three runs (``make demo-mopd``):

    teacher_desktop   ASFT on desktop tool-call data only -> runs/mopd_demo/teacher_desktop
    teacher_mobile    ASFT on mobile data only            -> runs/mopd_demo/teacher_mobile
    student           MOPD: starts from the desktop teacher (it knows desktop conventions
                      only) and samples on both platforms; each rollout is scored by its
                      platform's teacher (K3, adaptive KL mask) next to the task reward.
    smoke             a few MOPD steps of a tiny random student with two random teachers
                      (random:1, random:2): no earlier run needed (tests).

All three share the desktop teacher's tokenizer. ``--config.rl.teachers.*`` and
``--config.model.hf_path`` point elsewhere when the runs live elsewhere (``ROOT`` below).

Hardware: 1 x CPU.
"""

import ml_collections as mlc

from configs import demo

ROOT = "runs/mopd_demo"
ARGS = ("teacher_desktop", "teacher_mobile", "student", "smoke")


def get_config(arg="student"):
    if arg not in ARGS:
        raise ValueError(f"configs/mopd_demo.py: unknown argument {arg!r}; expected one of {ARGS}")
    c = demo.get_config()
    c.data.method = "mopd"
    c.data.mix = "direct"
    # UI-MOPD's system turn (the tool schema) is ~330 demo tokens: like GUI-Libra's, too long
    # for a tiny model to learn past in minutes; the short turn names the platform.
    c.data.system_prompt = "GUI agent on a {platform}. Answer with one tool call."
    if arg.startswith("teacher"):
        platform = arg.split("_")[1]
        c.data.synthetic.platforms = (platform,)
        if platform == "mobile":
            c.tokenizer.path = f"{ROOT}/teacher_desktop/tokenizer"
        c.train.eval_every = 0
        return c
    c.method = "mopd"
    c.model.hf_path = f"{ROOT}/teacher_desktop/export"
    c.tokenizer.path = f"{ROOT}/teacher_desktop/tokenizer"
    c.rl.teachers = mlc.ConfigDict({"desktop": f"{ROOT}/teacher_desktop", "mobile": f"{ROOT}/teacher_mobile"})
    c.rl.mopd.kl_mask = "paper"
    c.data.batch_size = 4
    c.data.seq_buckets = (160, 256)  # prompts are 83-165 tokens, 99% within 160 (was 256 slots)
    c.rl.group_size = 8
    c.rl.max_new_tokens = 96
    c.rl.top_p = 1.0
    c.rl.normalize_std = False
    c.rl.clip_low, c.rl.clip_high = 0.2, 0.28
    c.rl.mopd.beta = 1.0           # the tiny teachers are the point here; the paper's 0.01 is for 8B/32B
    c.rl.sngs.enabled = False
    c.rl.minibatches = 2
    c.optim.lr = 5e-5              # 2e-4 with beta 0.5 swung and collapsed after ~120 steps (measured)
    c.optim.warmup_steps = 0
    c.optim.schedule = "constant"
    c.train.steps = 100
    c.train.log_every = 1
    c.train.checkpoint_every = 50
    c.train.eval_every = 0
    if arg == "smoke":   # needs no earlier run: a tiny random student and two random teachers that differ
        c.model.hf_path = c.tokenizer.path = ""
        c.rl.teachers = mlc.ConfigDict({"desktop": "random:1", "mobile": "random:2"})
        c.data.synthetic.tasks = 12
        c.data.batch_size = 4
        c.rl.group_size = 4
        c.rl.max_new_tokens = 16
        c.rl.minibatches = 1
        c.train.steps = 3
        c.train.checkpoint_every = 2
        c.train.progress = False
        c.train.memory_plan = False
    return c
