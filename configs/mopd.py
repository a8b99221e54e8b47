"""UI-MOPD stage 2 (docs/method.md): a Qwen3-VL-8B-Thinking student samples
G = 8 tool-call responses per Uni-GUI instruction; each rollout's tokens are scored by the
teacher of its platform (two Qwen3-VL-32B-Thinking teachers from
``configs/mopd_teacher_sft.py``). Reproduces the public release by default
(``verl/ui_mopd/runs/run_mopd.sh``, reward ``verl/ui_mopd/reward/gui_agent.py``, data
``data/mopd/generate_mix_parquet.py``) in what this config can set:

* 128 groups x G = 8 = 1,024 rollouts per update, one update per step, 3,200 steps;
  temperature 1.0, top_p 1.0, no top_k; responses <= 512 tokens, prompts <= 8,192 tokens;
* loss: token mean, clip 0.2 low / 0.28 high, dual clip 10 (``clip_ratio_c``), K3 to the
  platform teacher clamped to 10 with beta 0.01; advantages r - mean (no std);
* group filtering with resampling: rounds of 384 prompts until 128 groups with a pass
  rate in (0, 1) are kept (``rl.group_filter``), no round limit;
* the adaptive KL mask and its pass-rate floor are OFF, as in the release script
  (``rl.mopd.kl_mask="off"``; ``"paper"`` for the paper's mask);
* AdamW lr 1e-6 constant, no warmup, weight decay 0, grad-norm clip 1.0;
* reward as the release's ``gui_agent.py`` (``rl.reward.mopd_rule="release"``, tool name
  not compared);
* images resized into per-platform budgets: desktop [3,136, 13,107,200], mobile
  [40,768, 548,800] pixels; prompts open ``<think>`` as the Thinking template does.

Remaining departures from the release, and why:
* the pass-rate-aware dataloader (prompts drawn by their running pass rate) is not built:
  prompts are drawn uniformly; group filtering itself is on (``rl.group_filter``: rounds of
  384 prompts until 128 groups whose pass rate is in (0, 1) remain);
* truncated importance sampling between the rollout engine and the trainer
  (``rollout_is=token``, threshold 2) has nothing to correct here: the sampler and the
  trainer score with the same model, so the ratio is 1 up to float noise;
* the 3,072 rollouts of a round are sampled 128 at a time (``rl.generation_rows``) and scored
  16 at a time (``rl.score_rows``), where vLLM batches them continuously; the sampler's own log-probs are
  the old-policy log-probs (``rl.old_logprobs="auto"`` with top_p 1: no extra scoring pass;
  veRL recomputes them with the trainer);
* AdamW moments in float32 (the release offloads a precision-aware optimizer);
* prompts over 8,192 tokens are dropped and counted, as ``filter_overlong_prompts``.

    python -m launch.train --config=configs/mopd.py:8x8 --workdir=DIR \\
        --config.model.hf_path=/models/Qwen3-VL-8B-Thinking --config.data.train_files=/data/uni-gui \\
        --config.rl.teachers.desktop=/ckpt/teacher-desktop --config.rl.teachers.mobile=/ckpt/teacher-mobile

Layouts (``:arg``): ``8x8`` (default): the paper's 64 H100 80GB (8 hosts x 8), mesh fsdp 16 x
tensor 4; ``4x8``: 32 H100 80GB (4 hosts x 8), fsdp 16 x tensor 2. ``python -m launch.plan
--config=configs/mopd.py:ARG`` prints what each needs per device (8x8: 28.4 GiB, 4x8: 62.4 GiB
of 72 usable, ``benchmarks/results/plan-mopd-*.json``; v5p_4x4x4: 36.7 GiB per chip of 85.5 from
the TPU compiler, ``tpu-plan-mopd-qwen3_vl_8b_v5p_4x4x4.json``; v5p_2x4x4, the smallest slice
planned: 42.0 GiB per chip, ``tpu-plan-mopd-qwen3_vl_8b_v5p_2x4x4.json``). On 8x8 each update
micro-batch holds 128 rows (8 micro-batches per update) and each scoring call 128: per FSDP group
the 8 responses of one group, whose 8,192-token prompt the shared-prompt layout computes once
(1.6M instead of 8.9M tokens per update, 4.7M instead of 26.7M per round's teacher scoring). The
other layouts keep one row per FSDP group per update micro-batch and 16-row scoring calls
(planned before the shared-prompt layout and the row-local image features).

One host of 8 H100 80GB does not hold this job at the release's shapes (``:1x8`` is refused
with the figures): the plan needs 98 GiB per GPU in the update (the 32B teachers 15.8 GiB,
the student's parameters and AdamW 13.1, the update's inputs 24 GiB, mostly the pixels of
its 1,024 rollouts at up to 32,768 patches each, and one 8.7K-token row's activations); two
hosts need 72.6 GiB (fsdp 8 x tensor 2), just over the 72 usable. The smallest layout that
fits is ``4x8``.

``:served``: the student alone on 1 x 8 H100 80GB (mesh fsdp 8), the two teachers served
elsewhere (``rl.teachers`` are URLs of vLLM servers, ``guilibra_jax/served_scorer.py``: no
teacher weights on these GPUs; ``launch.plan`` counts none). Updates of 32 groups (256
rollouts, one row per GPU per micro-batch) instead of 128, so the update's inputs fit
(``launch.plan``: 54.6 GiB per GPU of 72 usable, the update's peak;
``benchmarks/results/plan-mopd-qwen3_vl_8b-served-cpu.json``); set the teachers' URLs:

    python -m launch.train --config=configs/mopd.py:served --workdir=DIR \
        --config.model.hf_path=/models/Qwen3-VL-8B-Thinking --config.data.train_files=/data/uni-gui \
        --config.rl.teachers.desktop=http://teacher-desktop:8000/v1 \
        --config.rl.teachers.mobile=http://teacher-mobile:8000/v1

(screenshot prompts go to the servers' chat API, the screenshot as we resized it: serve the
student's chat template; see served_scorer.py.)

Hardware: 8 x 8 H100 80GB (``:8x8``, the paper) or 4 x 8 H100 80GB (``:4x8``), or a
TPU v5p-128 (4x4x4, 64 chips) (``:v5p_4x4x4``: 16 TPU VMs, mesh fsdp 16 x tensor 4), or a
TPU v5p-64 (2x4x4, 32 chips) (``:v5p_2x4x4``: 8 TPU VMs, mesh fsdp 16 x tensor 2).
"""

import ml_collections as mlc

from configs.mopd_teacher_sft import PIXELS
from guilibra_jax.train.config import H100_1x8, H100_4x8, H100_8x8, V5P_2x4x4, V5P_4x4x4, base_config, hardware

ARGS = ("8x8", "4x8", "v5p_4x4x4", "v5p_2x4x4", "served")
SERVED_TEACHERS = {"desktop": "http://teacher-desktop:8000/v1", "mobile": "http://teacher-mobile:8000/v1"}


def get_config(arg="8x8"):
    if arg == "1x8":
        raise ValueError("configs/mopd.py:1x8: an 8B student with two 32B teachers does not fit one host of 8 H100 "
                         "80GB at the release's shapes (launch.plan: 98 GiB per GPU in the update, 72 usable); "
                         "use :4x8 (32 GPUs, 62.4 GiB planned) or :8x8 (64 GPUs, the paper's, 28.4 GiB planned)")
    if arg not in ARGS:
        raise ValueError(f"configs/mopd.py: unknown layout {arg!r}; expected one of {ARGS}")
    c = base_config()
    c.method = "mopd"
    c.model.name = "qwen3_vl_8b"
    c.model.tiny.family = "qwen3_vl"
    c.model.dtype = "bfloat16"
    c.model.remat = "full"        # the update at ~8.7K tokens per row needs it (launch.plan)
    c.model.scan_layers = True
    c.data.format = "uni_gui"
    c.data.method = "mopd"
    c.data.open_think = "auto"    # the Thinking student's template opens <think>
    c.data.max_length = 8192      # max_prompt_length (RL: the prompt's tokens)
    c.data.seq_buckets = (2048, 4096, 8192)
    c.data.pixels = dict(PIXELS)
    c.data.batch_size = 384       # gen_batch_size: prompts sampled per generation round
    c.rl.update_groups = 128      # train_batch_size: groups per update (x G = 1,024 rollouts)
    c.rl.group_filter.enabled = True   # algorithm.filter_groups (pass rate 0 or 1 dropped)
    c.rl.group_filter.max_rounds = 0   # max_num_gen_batches 0: no limit
    c.rl.group_size = 8
    c.rl.temperature = 1.0
    c.rl.top_p = 1.0
    c.rl.top_k = 0
    c.rl.max_new_tokens = 512
    c.rl.clip_low, c.rl.clip_high = 0.2, 0.28
    c.rl.dual_clip = 10.0
    c.rl.aggregation = "token_mean"
    c.rl.normalize_std = False
    c.rl.kl_clamp = 10.0
    c.rl.mopd.beta = 0.01
    c.rl.mopd.kl_mask = "off"     # the release script: no adaptive KL mask, no pass-rate floor
    c.rl.sngs.enabled = False
    c.rl.reward.mopd_rule, c.rl.reward.check_tool_name = "release", False
    c.rl.teachers = mlc.ConfigDict({"desktop": "", "mobile": ""})   # set both to teacher folders
    c.rl.ppo_epochs, c.rl.minibatches = 1, 1                       # ppo_mini_batch_size = train_batch_size
    c.rl.score_chunk = 1024
    c.rl.generation_rows = 128    # per call: bounds the KV cache (24 sampler calls per round)
    c.rl.score_rows = 16          # per call: one row per FSDP group (see the docstring)
    c.optim.lr = 1e-6
    c.optim.schedule = "constant"
    c.optim.warmup_steps = 0
    c.optim.weight_decay = 0.0
    c.optim.clip_norm = 1.0
    c.rl.teacher_model_name = "qwen3_vl_32b"   # what launch.plan assumes while rl.teachers are unset
    if arg == "8x8":
        c.hardware = hardware(*H100_8x8)
        c.mesh.fsdp, c.mesh.tensor = 16, 4
    elif arg == "served":        # the student alone on one host; the teachers are served elsewhere
        c.hardware = hardware(*H100_1x8)
        c.mesh.fsdp, c.mesh.tensor = 8, 1
        c.rl.teachers = mlc.ConfigDict(dict(SERVED_TEACHERS))   # placeholders: set both to your servers
        c.rl.teacher_model_name = ""
        c.rl.update_groups = 32   # 256 rollouts per update: the update's inputs fit one host
    elif arg == "v5p_4x4x4":     # 64 chips on 16 TPU VMs, the 8x8 layout (tensor 4 within a host)
        c.hardware = hardware(*V5P_4x4x4)
        c.mesh.fsdp, c.mesh.tensor = 16, 4
    elif arg == "v5p_2x4x4":     # 32 chips on 8 TPU VMs, the 4x8 layout
        c.hardware = hardware(*V5P_2x4x4)
        c.mesh.fsdp, c.mesh.tensor = 16, 2
    else:                        # 4x8: 32 GPUs on 4 hosts
        c.hardware = hardware(*H100_4x8)
        c.mesh.fsdp, c.mesh.tensor = 16, 2
    # one row per FSDP group per micro-batch (16 rows x 64 micro-batches)
    c.train.grad_accum = 1024 // c.mesh.fsdp
    if arg == "served":   # one row per GPU per micro-batch; the sampler's KV cache bounded by 64 rows
        c.train.grad_accum, c.rl.generation_rows, c.rl.score_rows = 32, 64, 64
    if arg == "8x8":   # a group's 8 responses per FSDP group: its prompt once (launch.plan: 28.4 GiB)
        c.train.grad_accum, c.rl.score_rows = 8, 128
    c.train.steps = 3200
    c.train.log_every = 1
    c.train.checkpoint_every = 16
    return c
