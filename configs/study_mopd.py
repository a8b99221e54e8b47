"""UI-MOPD's comparison table on the synthetic world, as the stages of ``launch.study``:

    python -m launch.study --study=mopd --workdir=runs/study_mopd [--smoke]

    base             ASFT from scratch on a small mixed set (both platforms, few tasks, few
                     steps): some ability on both, as the paper's Qwen3-VL-8B has
    teacher_desktop  the base fine-tuned on desktop data only (the desktop specialist)
    teacher_mobile   the base fine-tuned on mobile data only (the mobile specialist)
    mixed_sft        the base fine-tuned on both platforms' data, as many samples as the two
                     specialists saw together (the same budget)
    merge_average    weight average of the two specialists (launch.merge)
    merge_ties       TIES merge of the specialists against the base (launch.merge)
    mopd             the base trained with UI-MOPD: on-policy rollouts on both platforms, each
                     scored by its platform's specialist (K3, paper KL mask) and the task reward
    mopd_release     the same with the release's switches: group filtering on (groups of pass
                     rate 0 or 1 dropped, more prompts sampled), no KL mask (run_mopd.sh)
    mopd_lr2e4       ``mopd`` at 4x the learning rate (2e-4): the two arms above gained little
                     in 150 steps at 5e-5 (is the student under-trained?)
    eval_<model>     held-out offline step accuracy and online success (launch.eval)

Every model has the student's architecture (merging needs it); all share the base's
tokenizer. One stage alone: ``python -m launch.train --config=configs/study_mopd.py:<stage>
--workdir=runs/study_mopd/<stage>`` (paths below ``ROOT``; the study passes its workdir).
Hardware: 1 x CPU (2 cores: under an hour for the whole study).
"""

import os

import ml_collections as mlc

from configs import demo, eval_demo, mopd_demo

ROOT = "runs/study_mopd"
ARGS = ("base", "teacher_desktop", "teacher_mobile", "mixed_sft", "mopd", "mopd_release", "mopd_lr2e4")  # a literal:
MOPD_ARMS = ARGS[4:]                                                                  # launch.recipes reads it
MODELS = ("base", "teacher_desktop", "teacher_mobile", "mixed_sft", "merge_average", "merge_ties", *MOPD_ARMS)
PLATFORMS = ("desktop", "mobile")
# UI-MOPD's Table (docs/method.md): online success rate (%) on OSWorld (desktop) and
# MobileWorld (mobile); Qwen3-VL-8B student, 32B teachers.
PAPER = {"base": (33.9, 7.7), "mixed_sft": (35.0, 6.4), "merge_average": (36.5, 6.8), "merge_ties": (36.8, 0.0),
         "mopd": (38.2, 12.0), "teachers": (46.3, 16.2)}
# The base: 60 tasks x 250 steps left it at 0.05 / 0.00 online (2/40, 0/40; offline 0.30 / 0.34):
# no ability to improve from on mobile. Twice the tasks and steps, still well below a specialist.
BASE_TASKS = 120
BASE_STEPS = 500
SPECIALIST_STEPS = 600
EVAL_EPISODES = 40          # online episodes per platform (held-out task seeds)


def _sft(stage: str, root: str, smoke: bool) -> mlc.ConfigDict:
    c = mopd_demo.get_config("teacher_desktop")      # UI-MOPD's tool-call format, the short system turn
    c.tokenizer.path = ""
    c.data.synthetic.platforms = PLATFORMS
    c.train.eval_every = 0
    c.train.checkpoint_every = 100
    if stage == "base":                              # brief, small, mixed: some ability on both platforms
        c.data.synthetic.tasks = BASE_TASKS
        c.train.steps = BASE_STEPS
    else:                                            # fine-tuning the base
        c.model.hf_path = f"{root}/base/export"
        c.data.synthetic.tasks = 480
        c.optim.lr = 1e-3
        c.train.steps = SPECIALIST_STEPS
        if stage.startswith("teacher_"):
            c.data.synthetic.platforms = (stage.split("_", 1)[1],)
        else:                                        # mixed: the specialists' two budgets together
            c.train.steps = 2 * SPECIALIST_STEPS
    if smoke:
        c.data.synthetic.tasks = 12
        c.train.steps = 2
        c.train.checkpoint_every = 1
    return c


def get_config(arg: str = "base", root: str = ROOT, smoke: bool = False) -> mlc.ConfigDict:
    if arg not in ARGS:
        raise ValueError(f"configs/study_mopd.py: unknown argument {arg!r}; expected one of {ARGS}")
    if arg not in MOPD_ARMS:
        c = _sft(arg, root, smoke)
    else:
        c = mopd_demo.get_config("student")
        c.model.hf_path = f"{root}/base/export"      # the paper's student: the base, not a specialist
        c.tokenizer.path = ""
        c.rl.teachers = mlc.ConfigDict({p: f"{root}/teacher_{p}/export" for p in PLATFORMS})
        c.train.steps = 150
        c.train.checkpoint_every = 50
        if smoke:
            c.data.synthetic.tasks = 12
            c.data.batch_size = 2
            c.rl.group_size = 4
            c.rl.max_new_tokens = 16
            c.rl.minibatches = 1
            c.train.steps = 2
            c.train.checkpoint_every = 1
        if arg == "mopd_release":     # configs/mopd.py's switches at the study's scale: rounds of 2x the
            c.rl.mopd.kl_mask = "off"                 # update's prompts (release: 384 for 128), at most
            c.rl.group_filter.enabled = True          # 3 rounds a step (release: no limit) to bound CPU time
            c.rl.group_filter.max_rounds = 3
            c.rl.update_groups = c.data.batch_size
            c.data.batch_size *= 2
        if arg == "mopd_lr2e4":
            c.optim.lr = 2e-4
    return finish(c, root, smoke)


def finish(c: mlc.ConfigDict, root: str, smoke: bool) -> mlc.ConfigDict:
    """What every study stage shares: the smoke run's quiet, one-layer settings and one
    compilation cache for the whole study (stages of one shape compile once;
    ``JAX_COMPILATION_CACHE_DIR``, when set, as the trainer's "auto" honours it)."""
    if smoke:
        c.train.progress = False
        c.train.memory_plan = False
        c.train.log_every = 1
        c.optim.warmup_steps = 0
        c.model.tiny.layers = c.model.tiny.vision_depth = 1
    c.train.compilation_cache_dir = os.environ.get("JAX_COMPILATION_CACHE_DIR") or f"{root}/compilation_cache"
    return c


def eval_config(path: str, smoke: bool = False, sweep: bool = False) -> mlc.ConfigDict:
    """launch.eval of the Hugging Face folder ``path`` (``sweep``: every checkpoint of
    the training workdir ``path``) on held-out task seeds of the training world (dataset
    seed and split as the runs')."""
    c = eval_demo.get_config()
    d = demo.get_config().data.synthetic
    c.data.seed, c.data.split_fraction = d.seed, d.test_fraction
    c.data.n_tasks = 200                             # 40 held-out tasks per platform for offline steps
    c.agents = ("checkpoint",)
    if sweep:
        c.agent_kwargs.checkpoint.workdir = path
        c.agent_kwargs.checkpoint.steps = ("all",)
    else:
        c.agent_kwargs.checkpoint.hf_path = path
    c.agent_kwargs.checkpoint.max_new_tokens = 96
    c.agent_kwargs.checkpoint.batch_size = 16
    c.online.episodes = EVAL_EPISODES
    c.online.save_trajectories = False
    if smoke:
        c.data.n_tasks = 10
        c.online.episodes = 2
        c.online.max_steps = 2
        c.agent_kwargs.checkpoint.max_new_tokens = 8
    return c


def plan(root: str = ROOT, smoke: bool = False) -> list[dict]:
    """The study's stages in order: (name, kind, what it runs)."""
    stages = [dict(name=a, kind="train", config=get_config(a, root, smoke)) for a in ARGS[:4]]
    teachers = [f"{root}/teacher_{p}" for p in PLATFORMS]
    stages += [dict(name="merge_average", kind="merge", method="average", inputs=teachers),
               dict(name="merge_ties", kind="merge", method="ties", inputs=teachers, base=f"{root}/base",
                    density=0.2)]
    stages += [dict(name=a, kind="train", config=get_config(a, root, smoke)) for a in MOPD_ARMS]
    stages += [dict(name=f"eval_{m}", kind="eval", model=m,
                    config=eval_config(f"{root}/{m}" if m.startswith("merge_") else f"{root}/{m}/export", smoke))
               for m in MODELS]
    return stages
