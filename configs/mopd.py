"""UI-MOPD stage 2 (METHOD.md sections 3 and 5): a Qwen3-VL-8B-Thinking student samples
G = 8 tool-call responses per Uni-GUI instruction; each rollout's tokens are scored by the
teacher of its platform (two Qwen3-VL-32B-Thinking teachers from
``configs/mopd_teacher_sft.py``). Reproduces the public release by default
(``verl/ui_mopd/runs/run_mopd.sh``, reward ``verl/ui_mopd/reward/gui_agent.py``, data
``data/mopd/generate_mix_parquet.py``) in what this config can set:

* 128 prompts x G = 8 = 1,024 rollouts per update, one update per step, 3,200 steps;
  temperature 1.0, top_p 1.0, no top_k; responses <= 512 tokens, prompts <= 8,192 tokens;
* loss: token mean, clip 0.2 low / 0.28 high, dual clip 10 (``clip_ratio_c``), K3 to the
  platform teacher clamped to 10 with beta 0.01; advantages r - mean (no std);
* the adaptive KL mask and its pass-rate floor are OFF, as in the release script (the
  paper's mask: ``rl.mopd.kl_mask``, see below);
* AdamW lr 1e-6 constant, no warmup, weight decay 0, grad-norm clip 1.0;
* reward as the release's ``gui_agent.py`` (``rl.reward.mopd_rule="release"``, tool name
  not compared);
* images resized into per-platform budgets: desktop [3,136, 13,107,200], mobile
  [40,768, 548,800] pixels; prompts open ``<think>`` as the Thinking template does.

Remaining departures from the release, and why:
* group filtering with resampling (``algorithm.filter_groups``: groups whose pass rate is
  0 or 1 dropped, more prompts drawn until 128 groups remain, generation batch 384) and
  the pass-rate-aware dataloader are the RL loop's (keys ``rl.group_filter.*``); until the
  loop has them a step updates on every group of its 128 prompts;
* the KL-mask switch ``rl.mopd.kl_mask`` is the RL loop's; until it exists the loop applies
  the mask with ``rl.mopd.kl_mask_tau`` / ``pass_floor``, so this recipe sets tau = 1.0
  (no group is above it) and pass_floor = 0.0 (nothing zeroed): the release's behaviour;
* truncated importance sampling between the rollout engine and the trainer
  (``rollout_is=token``, threshold 2) has nothing to correct here: the sampler and the
  trainer score with the same model, so the ratio is 1 up to float noise;
* AdamW moments in float32 (the release offloads a precision-aware optimizer);
* prompts over 8,192 tokens are dropped and counted, as ``filter_overlong_prompts``.

    python -m launch.train --config=configs/mopd.py --workdir=DIR \\
        --config.model.hf_path=/models/Qwen3-VL-8B-Thinking --config.data.train_files=/data/uni-gui \\
        --config.rl.teachers.desktop=/ckpt/teacher-desktop --config.rl.teachers.mobile=/ckpt/teacher-mobile
"""

import ml_collections as mlc

from configs.mopd_teacher_sft import PIXELS
from guilibra_jax.train.config import base_config


def get_config(arg=None):
    if arg:
        raise ValueError(f"configs/mopd.py takes no argument, got {arg!r}")
    c = base_config()
    c.method = "mopd"
    c.model.name = "qwen3_vl_8b"
    c.model.tiny.family = "qwen3_vl"
    c.model.dtype = "bfloat16"
    c.model.remat = "dots_with_no_batch_dims_saveable"
    c.model.scan_layers = True
    c.data.format = "uni_gui"
    c.data.method = "mopd"
    c.data.open_think = "auto"    # the Thinking student's template opens <think>
    c.data.max_length = 8192      # max_prompt_length (RL: the prompt's tokens)
    c.data.seq_buckets = (2048, 4096, 8192)
    c.data.pixels = dict(PIXELS)
    c.data.batch_size = 128       # train_batch_size: prompts per update (x G = 1,024 rollouts)
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
    c.rl.mopd.kl_mask_tau, c.rl.mopd.pass_floor = 1.0, 0.0   # mask and floor off (release script)
    c.rl.sngs.enabled = False
    c.rl.reward.mopd_rule, c.rl.reward.check_tool_name = "release", False
    c.rl.teachers = mlc.ConfigDict({"desktop": "", "mobile": ""})   # set both to teacher folders
    c.rl.ppo_epochs, c.rl.minibatches = 1, 1                       # ppo_mini_batch_size = train_batch_size
    c.rl.score_chunk = 1024
    c.optim.lr = 1e-6
    c.optim.schedule = "constant"
    c.optim.warmup_steps = 0
    c.optim.weight_decay = 0.0
    c.optim.clip_norm = 1.0
    c.mesh.fsdp = 8
    c.mesh.tensor = 4
    c.train.grad_accum = 8        # 128-row micro-batches of each 1,024-rollout update
    c.train.steps = 3200
    c.train.log_every = 1
    c.train.checkpoint_every = 16
    return c
