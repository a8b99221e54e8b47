"""GUI-Libra stage 2, conservative GRPO, with the release's defaults (METHOD.md sections
2 and 5): G = 8, temperature 1.0, top_p 0.98, lr 1e-6, clip 0.2, token-mean loss, KL
k3 ("low_var_kl", clamped to 10) with beta 0.001 added to the loss (beta > 0: the trust
region is the point), SNGS lambda_0 = 0.5, kappa = 1.5 on the group's mean reward,
reward 0.9 accuracy + 0.1 format with the release's value rule, responses <= 1500 tokens.
The frozen reference is the SFT checkpoint the policy starts from.

    python -m launch.train --config=configs/guilibra_grpo.py:qwen3_vl_8b --workdir=DIR \\
        --config.model.hf_path=/ckpt/guilibra-sft-8b --config.data.train_files='/data/rl/*.parquet'

Hardware: 1 x 8 H100 80GB (one host), every size; see ``python -m launch.plan``.
"""

from configs.guilibra_sft import RECIPES
from guilibra_jax.train.config import H100_1x8, base_config, hardware


def get_config(arg="qwen2_5_vl_3b"):
    if arg not in RECIPES:
        raise ValueError(f"configs/guilibra_grpo.py: unknown recipe {arg!r}; expected one of {sorted(RECIPES)}")
    family, fsdp, tensor = RECIPES[arg]
    c = base_config()
    c.method = "grpo"
    c.model.name = arg
    c.model.tiny.family = family
    c.model.dtype = "bfloat16"
    c.model.param_dtype = "float32"
    c.model.remat = "dots_with_no_batch_dims_saveable"
    c.model.scan_layers = True
    c.data.format = "guilibra_rl"
    c.data.method = "guilibra"
    c.data.max_length = 4096
    c.data.batch_size = 16        # prompts per step (x G = 128 rollouts)
    c.rl.group_size = 8
    c.rl.temperature = 1.0
    c.rl.top_p = 0.98
    c.rl.max_new_tokens = 1500
    c.rl.clip_low = c.rl.clip_high = 0.2
    c.rl.aggregation = "token_mean"
    c.rl.normalize_std = True
    c.rl.kl_kind, c.rl.kl_beta, c.rl.kl_clamp = "k3", 0.001, 10.0
    c.rl.sngs.enabled, c.rl.sngs.lambda0, c.rl.sngs.kappa, c.rl.sngs.signal = True, 0.5, 1.5, "mean_reward"
    c.rl.reward.w_fmt, c.rl.reward.value_rule = 0.1, "release"
    c.rl.ppo_epochs, c.rl.minibatches = 1, 2
    c.rl.score_chunk = 1024
    c.optim.lr = 1e-6
    c.optim.schedule = "constant"
    c.optim.weight_decay = 0.0
    c.optim.clip_norm = 1.0
    c.hardware = hardware(*H100_1x8)
    c.mesh.fsdp = fsdp
    c.mesh.tensor = tensor
    c.train.steps = 2500          # 40K RL states / 16 per step
    c.train.log_every = 1
    c.train.checkpoint_every = 50
    return c
