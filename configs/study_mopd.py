"""UI-MOPD's comparison table on the synthetic world under the paper's conditions, as the
stages of ``launch.study``:

    python -m launch.study --study=mopd --workdir=runs/study_mopd [--smoke]

    base             ASFT from scratch on a small mixed set (both platforms alike, few tasks,
                     few steps): some ability on both, as the paper's Qwen3-VL-8B has
    teacher_desktop  the base fine-tuned on desktop data only (student-sized specialist: merged)
    teacher_mobile   the base fine-tuned on mobile data only (student-sized specialist: merged)
    mixed_sft        the base fine-tuned on both platforms' data, the specialists' two budgets
    base_wide, teacher_desktop_wide, teacher_mobile_wide
                     the same three at the teachers' width (``WIDE``: 2x hidden and MLP,
                     1.67M parameters to the student's 0.68M, 2.4x; the paper's teachers are
                     32B for an 8B student, 4x): the MOPD teachers
    merge_average    weight average of the two student-sized specialists (launch.merge)
    merge_ties       TIES merge of them against the base (launch.merge)
    mopd_long        UI-MOPD from the base, each rollout scored by its platform's wide teacher,
                     with the estimator, learning rate and switches established by the
                     distillation study (``MOPD``); ``2 * MIXED_STEPS`` steps
    eval_<model>     held-out offline step accuracy and online success (launch.eval), at least
                     80 episodes per platform: ``mopd`` is mopd_long at ``MIXED_STEPS`` (the
                     optimizer steps and prompts mixed_sft got), ``mopd_2x`` its final model

Data in Uni-GUI's proportions: about 95K self-collected desktop steps against 17K mobile
(5.6:1, before the OpenCUA / OpenMobile additions), here ``MIX`` = 480 desktop tasks to 96
mobile (5:1) for the specialists, mixed SFT and the MOPD prompts; a specialist's steps follow
its data (same epochs). The base is trained on both platforms alike (a general model).

Every student-sized model has the student's architecture (merging needs it); all share the
base's tokenizer. One stage alone: ``python -m launch.train --config=configs/study_mopd.py:<stage>
--workdir=runs/study_mopd/<stage>`` (paths below ``ROOT``; the study passes its workdir).
The earlier setup (equal data, student-sized teachers, MOPD at lr 5e-5 for 150 steps) is
``earlier_config`` (the distillation study still builds on its base and specialists); its
results: docs/study/mopd/report.md, "Earlier setup".
Hardware: 1 x CPU (2 cores: about an hour for the whole study).
"""

import os

import ml_collections as mlc

from configs import demo, eval_demo, mopd_demo

ROOT = "runs/study_mopd"
ARGS = ("base", "teacher_desktop", "teacher_mobile", "mixed_sft", "base_wide", "teacher_desktop_wide",
        "teacher_mobile_wide", "mopd_long")   # a literal: launch.recipes reads it
MOPD_ARMS = ("mopd", "mopd_2x")    # evaluated models: mopd_long at MIXED_STEPS and at its end
MOPD_RUNS = ("mopd_long",)
TEACHERS = ("teacher_desktop_wide", "teacher_mobile_wide")
MODELS = ("base", "teacher_desktop", "teacher_mobile", *TEACHERS, "mixed_sft", "merge_average", "merge_ties",
          *MOPD_ARMS)
PLATFORMS = ("desktop", "mobile")
# UI-MOPD's Table (docs/method.md): online success rate (%) on OSWorld (desktop) and
# MobileWorld (mobile); Qwen3-VL-8B student, 32B teachers.
PAPER = {"base": (33.9, 7.7), "mixed_sft": (35.0, 6.4), "merge_average": (36.5, 6.8), "merge_ties": (36.8, 0.0),
         "mopd": (38.2, 12.0), "teachers": (46.3, 16.2)}
# The base: 60 tasks x 250 steps left it at 0.05 / 0.00 online (2/40, 0/40; offline 0.30 / 0.34):
# no ability to improve from on mobile. Twice the tasks and steps, still well below a specialist.
BASE_TASKS = 120
BASE_STEPS = 500
SPECIALIST_STEPS = 600       # the earlier setup's specialists (equal data: 480 tasks each)
MIX = {"desktop": 480, "mobile": 96}            # Uni-GUI: ~95K desktop / ~17K mobile steps
STEPS = {"desktop": 600, "mobile": 120}         # each specialist's steps, in proportion to its data
MIXED_STEPS = sum(STEPS.values())               # mixed SFT: both budgets (and MOPD's matched budget)
WIDE = {"hidden": 256, "intermediate": 512, "heads": 8}   # the teachers (student: 128 / 256 / 4)
# UI-MOPD from the distillation study (docs/study/distill): its sweep chose the full_kl estimator
# at lr 1e-3 on training rollouts; the KL on every row (the paper's mask followed the task's pass
# rate and left half the rows undistilled) and the teachers' coefficient 1 (the tiny teachers are
# the point; the paper's 0.01 is for 8B / 32B models).
MOPD = dict(estimator="full_kl", lr=1e-3, beta=1.0, kl_mask="off", task_reward=False)
MOPD_PROMPTS = 8             # prompts per step = mixed SFT's samples per step (data.batch_size 8)
MOPD_GROUP = 4
EVAL_EPISODES = 80           # online episodes per platform (held-out task seeds; the issue: at least 80)
EARLIER_ARGS = ("base", "teacher_desktop", "teacher_mobile", "mixed_sft", "mopd", "mopd_release", "mopd_lr2e4")
EARLIER_EVAL_EPISODES = 40


def _sft(stage: str, root: str, smoke: bool, earlier: bool = False) -> mlc.ConfigDict:
    c = mopd_demo.get_config("teacher_desktop")      # UI-MOPD's tool-call format, the short system turn
    c.tokenizer.path = ""
    c.data.synthetic.platforms = PLATFORMS
    c.train.eval_every = 0
    c.train.checkpoint_every = 100
    wide = stage.endswith("_wide")
    name = stage[:-len("_wide")] if wide else stage
    if wide:                                         # the teachers' width, the base's tokenizer
        for k, v in WIDE.items():
            c.model.tiny[k] = v
        c.tokenizer.path = f"{root}/base/tokenizer"
    if name == "base":                               # brief, small, mixed: some ability on both platforms
        c.data.synthetic.tasks = BASE_TASKS
        c.train.steps = BASE_STEPS
    else:                                            # fine-tuning the base (of the same width)
        c.model.hf_path = f"{root}/{'base_wide' if wide else 'base'}/export"
        c.optim.lr = 1e-3
        if earlier:                                  # equal data: 480 tasks per platform, 600 steps each
            c.data.synthetic.tasks = 480
            c.train.steps = SPECIALIST_STEPS * (1 if name.startswith("teacher_") else 2)
        else:
            c.data.synthetic.tasks = MIX["desktop"]
            c.data.synthetic.platform_tasks = dict(MIX)
            c.train.steps = MIXED_STEPS
        if name.startswith("teacher_"):
            platform = name.split("_", 1)[1]
            c.data.synthetic.platforms = (platform,)
            if not earlier:
                c.data.synthetic.platform_tasks = {platform: MIX[platform]}
                c.train.steps = STEPS[platform]
    if smoke:
        c.data.synthetic.tasks = 12
        c.data.synthetic.platform_tasks = {}
        c.train.steps = 2
        c.train.checkpoint_every = 1
    return c


def get_config(arg: str = "base", root: str = ROOT, smoke: bool = False) -> mlc.ConfigDict:
    if arg not in ARGS:
        raise ValueError(f"configs/study_mopd.py: unknown argument {arg!r}; expected one of {ARGS}")
    if arg != "mopd_long":
        return finish(_sft(arg, root, smoke), root, smoke)
    c = _student(root, smoke)
    c.rl.teachers = mlc.ConfigDict({p: f"{root}/teacher_{p}_wide/export" for p in PLATFORMS})
    c.rl.mopd.estimator = MOPD["estimator"]
    c.rl.mopd.beta = MOPD["beta"]
    c.rl.mopd.kl_mask = MOPD["kl_mask"]
    c.rl.mopd.task_reward = MOPD["task_reward"]
    c.optim.lr = MOPD["lr"]
    if not smoke:
        c.data.synthetic.tasks = MIX["desktop"]
        c.data.synthetic.platform_tasks = dict(MIX)
        c.data.batch_size = MOPD_PROMPTS
        c.rl.group_size = MOPD_GROUP
        c.rl.minibatches = 1                         # one optimizer step per step, as mixed SFT's
        c.train.steps = 2 * MIXED_STEPS
        c.train.checkpoint_every = MIXED_STEPS // 3
        c.train.keep_checkpoints = 100               # mopd = the checkpoint at MIXED_STEPS
    else:
        c.train.checkpoint_every = 1
        c.train.keep_checkpoints = 100
    return finish(c, root, smoke)


def _student(root: str, smoke: bool) -> mlc.ConfigDict:
    """UI-MOPD's student: the base (not a specialist), the demo's MOPD settings."""
    c = mopd_demo.get_config("student")
    c.model.hf_path = f"{root}/base/export"
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
    return c


def earlier_config(arg: str = "base", root: str = ROOT, smoke: bool = False) -> mlc.ConfigDict:
    """The earlier setup's stages (``EARLIER_ARGS``; equal data, student-sized teachers, MOPD
    at 5e-5 for 150 steps), which the distillation study builds on."""
    if arg not in EARLIER_ARGS:
        raise ValueError(f"configs/study_mopd.py: unknown earlier stage {arg!r}; expected one of {EARLIER_ARGS}")
    if arg not in EARLIER_ARGS[4:]:
        return finish(_sft(arg, root, smoke, earlier=True), root, smoke)
    c = _student(root, smoke)
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


def eval_config(path: str, smoke: bool = False, sweep: bool = False, step: int | None = None) -> mlc.ConfigDict:
    """launch.eval of the Hugging Face folder ``path`` (``sweep``: every checkpoint of
    the training workdir ``path``; ``step``: its checkpoint of that step) on held-out task
    seeds of the training world (dataset seed and split as the runs')."""
    c = eval_demo.get_config()
    d = demo.get_config().data.synthetic
    c.data.seed, c.data.split_fraction = d.seed, d.test_fraction
    c.data.n_tasks = 200                             # 40 held-out tasks per platform for offline steps
    c.agents = ("checkpoint",)
    if sweep:
        c.agent_kwargs.checkpoint.workdir = path
        c.agent_kwargs.checkpoint.steps = ("all",)
    elif step is not None:
        c.agent_kwargs.checkpoint.workdir = path
        c.agent_kwargs.checkpoint.step = step
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
    stages = [dict(name=a, kind="train", config=get_config(a, root, smoke)) for a in ARGS[:-1]]
    teachers = [f"{root}/teacher_{p}" for p in PLATFORMS]
    stages += [dict(name="merge_average", kind="merge", method="average", inputs=teachers),
               dict(name="merge_ties", kind="merge", method="ties", inputs=teachers, base=f"{root}/base",
                    density=0.2)]
    stages.append(dict(name="mopd_long", kind="train", config=get_config("mopd_long", root, smoke)))

    def evaluated(m):
        if m.startswith("merge_"):
            return eval_config(f"{root}/{m}", smoke)
        if m == "mopd":                              # mixed SFT's budget: mopd_long's checkpoint there
            return eval_config(f"{root}/mopd_long", smoke, step=1 if smoke else MIXED_STEPS)
        return eval_config(f"{root}/{'mopd_long' if m == 'mopd_2x' else m}/export", smoke)
    stages += [dict(name=f"eval_{m}", kind="eval", model=m, config=evaluated(m)) for m in MODELS]
    return stages
