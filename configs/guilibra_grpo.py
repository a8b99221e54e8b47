"""GUI-Libra stage 2, conservative GRPO, reproducing the public release by default (EasyR1
fork: ``examples/gui_grpo.sh`` / ``gui_grpo_qwen3.sh`` over ``examples/config.yaml``,
``verl/trainer/core_algos.py``, ``verl/workers/actor/config.py``, reward
``examples/reward_function/r1gui.py`` / ``r1gui_qwen3vl.py``):

* 256 prompts per rollout step x G = 8 (2,048 rollouts), updated in 2 minibatches of
  128 prompts x 8 = 1,024 rollouts, one PPO epoch; temperature 1.0, top_p 0.98;
  responses <= 1,500 tokens, prompts <= 8,092 tokens;
* loss: token mean, clip 0.2 / 0.2, dual clip 3.0, KL k3 ("low_var_kl", clamped to 10)
  with beta 0.001 in the loss (beta > 0: the trust region is the point);
* advantages ``grpo_weighted_positive_negative``: (r - mean) / (unbiased std + 1e-6), then
  SNGS on the negative ones with lambda_0 = 0.5, kappa = 1.5 on the group's mean reward;
* AdamW lr 1e-6 constant, no warmup, weight decay 1e-2, grad-norm clip 1.0, vision trained;
* reward 0.9 accuracy + 0.1 format, the release's value rule (token-set F1 >= 0.5 on its
  value types, strict box for Click / LongPress) and format rule (``<think>`` for
  Qwen2.5-VL, ``<thinking>`` for Qwen3-VL; reasoning required unless the step is
  grounding-only);
* images resized into [262,144, 2,508,800] pixels;
* 2 epochs: ``train.steps`` = 312 for the 40K-step RL subset (40,000 / 256 x 2); set it
  from your data. The frozen reference is the SFT checkpoint the policy starts from.

``:paper`` after the size gives the paper's choices where they differ: population std,
no dual clip, the paper's value and format rules.

Remaining departures from the release, and why:
* AdamW moments in float32 (EasyR1 ``adamw_bf16`` keeps them in bfloat16): more memory,
  no loss of precision;
* weight decay skips biases and norm scales (``train.optimizer.decays``); EasyR1's FSDP
  AdamW decays every parameter;
* prompts over 8,092 tokens are dropped and counted (EasyR1 keeps what its truncation
  setting allows);
* the 2,048 rollouts of a step are sampled and scored 128 at a time (Qwen3-VL: sampled 64 at a
  time) (``rl.generation_rows``, ``rl.score_rows``: what bounds the KV cache on 8 devices),
  where vLLM batches them continuously;
* old log-probs are recomputed by a scoring pass (top_p 0.98 truncates the sampler's
  distribution), as EasyR1 does.

    python -m launch.train --config=configs/guilibra_grpo.py:qwen3_vl_8b --workdir=DIR \\
        --config.model.hf_path=/ckpt/guilibra-sft-8b --config.data.train_files='/data/rl/*.parquet'

Hardware: 1 x 8 H100 80GB (one host), every size; see ``python -m launch.plan``. Update
micro-batches of 32 rows (4 responses of one group per GPU: the prompt once for them, in the
shared-prompt layout); planned peaks 40.9 (3B), 56.9 (7B), 41.3 (Qwen3-VL 4B), 56.2 (8B) GiB per
GPU of 72 usable (benchmarks/results/plan-guilibra_grpo-<size>-1x8-cpu.json).
TPU variants, the same batch geometry, one row per chip per update micro-batch:
``qwen2_5_vl_7b_v5p`` on a TPU v5p-16 (2x2x2, 8 chips) (2 TPU VMs, mesh fsdp 8): the TPU compiler
plans it at 58.2 GiB per chip of 85.5 (benchmarks/results/tpu-plan-guilibra_grpo-qwen2_5_vl_7b_v5p.json;
on a v5p-64, fsdp 32: 25.8); ``qwen2_5_vl_3b_v5p`` and ``qwen3_vl_4b_v5p`` on a
TPU v5p-8 (2x2x1, 4 chips) (fsdp 4): 60.4 and 63.9 GiB (tpu-plan-guilibra_grpo-<size>_v5p.json);
``qwen3_vl_8b_v5p`` on a TPU v5p-16 (fsdp 8): 61.2 GiB (tpu-plan-guilibra_grpo-qwen3_vl_8b_v5p.json).
"""

from configs.guilibra_sft import RECIPES
from guilibra_jax.train.config import H100_1x8, V5P_2x2x1, V5P_2x2x2, base_config, hardware

# TPU variants: name -> (size, slice, fsdp, tensor); the release's batch geometry unchanged
TPU_VARIANTS = {
    "qwen2_5_vl_3b_v5p": ("qwen2_5_vl_3b", V5P_2x2x1, 4, 1),
    "qwen2_5_vl_7b_v5p": ("qwen2_5_vl_7b", V5P_2x2x2, 8, 1),   # fsdp 4 on a v5p-8: 89.6 GiB, does not fit
    "qwen3_vl_4b_v5p": ("qwen3_vl_4b", V5P_2x2x1, 4, 1),
    "qwen3_vl_8b_v5p": ("qwen3_vl_8b", V5P_2x2x2, 8, 1),
}
ARGS = ("qwen2_5_vl_3b", "qwen2_5_vl_7b", "qwen3_vl_4b", "qwen3_vl_8b", "qwen2_5_vl_3b_v5p", "qwen2_5_vl_7b_v5p",
        "qwen3_vl_4b_v5p", "qwen3_vl_8b_v5p")   # a literal: launch.recipes reads it without importing
assert set(ARGS[4:]) == set(TPU_VARIANTS)

RELEASE_PIXELS = (262144, 2508800)   # examples/config.yaml min_pixels; the scripts' data.max_pixels


def get_config(arg="qwen2_5_vl_3b"):
    name, _, variant = (arg or "qwen2_5_vl_3b").partition(":")
    if name not in ARGS or variant not in ("", "paper"):
        raise ValueError(f"configs/guilibra_grpo.py: unknown recipe {arg!r}; expected one of {list(ARGS)}, "
                         f"optionally followed by ':paper'")
    name, tpu_slice, tpu_fsdp, tpu_tensor = TPU_VARIANTS.get(name, (name, None, 0, 0))
    family, fsdp, tensor = RECIPES[name]
    c = base_config()
    c.method = "grpo"
    c.model.name = name
    c.model.tiny.family = family
    c.model.dtype = "bfloat16"
    c.model.param_dtype = "float32"
    c.model.remat = "full"        # the update at ~9.6K tokens per row needs it (launch.plan)
    c.model.scan_layers = True
    c.data.format = "guilibra_rl"
    c.data.method = "guilibra"
    c.data.max_length = 8092      # max_prompt_length (RL: the prompt's tokens)
    c.data.seq_buckets = (2048, 4096, 8092)
    c.data.min_pixels, c.data.max_pixels = RELEASE_PIXELS
    c.data.batch_size = 256       # rollout_batch_size: prompts per step (x G = 2,048 rollouts)
    c.rl.group_size = 8
    c.rl.temperature = 1.0
    c.rl.top_p = 0.98
    c.rl.max_new_tokens = 1500
    c.rl.clip_low = c.rl.clip_high = 0.2
    c.rl.aggregation = "token_mean"
    c.rl.normalize_std = True
    c.rl.std_unbiased = True
    c.rl.dual_clip = 3.0
    c.rl.kl_kind, c.rl.kl_beta, c.rl.kl_clamp = "k3", 0.001, 10.0
    c.rl.sngs.enabled, c.rl.sngs.lambda0, c.rl.sngs.kappa, c.rl.sngs.signal = True, 0.5, 1.5, "mean_reward"
    c.rl.reward.w_fmt, c.rl.reward.value_rule, c.rl.reward.format_rule = 0.1, "release", "release"
    c.rl.ppo_epochs, c.rl.minibatches = 1, 2   # global_batch_size 128 prompts: 2 updates per step
    c.rl.score_chunk = 1024
    c.rl.generation_rows = c.rl.score_rows = 128   # per call: bounds the KV cache (16 sampler calls per round)
    if family == "qwen3_vl":      # 36 layers of 8 KV heads: 128 rows of 9.6K tokens need 21 GiB of cache per GPU
        c.rl.generation_rows = 64
    if variant == "paper":
        c.rl.std_unbiased, c.rl.dual_clip = False, 0.0
        c.rl.reward.value_rule, c.rl.reward.format_rule = "paper", "paper"
    c.optim.lr = 1e-6
    c.optim.schedule = "constant"
    c.optim.warmup_steps = 0
    c.optim.weight_decay = 1e-2
    c.optim.clip_norm = 1.0
    c.hardware = hardware(*H100_1x8)
    c.mesh.fsdp = fsdp
    c.mesh.tensor = tensor
    # 32-row micro-batches of each 1,024-rollout update: per GPU 4 responses of one group, whose
    # prompt the shared-prompt layout computes once for them (launch.plan: update work 2.7x less
    # than one row per GPU and 128 micro-batches, 56.9 GiB peak at 7B)
    c.train.grad_accum = 32
    c.train.steps = 312           # 2 epochs of a 40K-step subset at 256 prompts per step
    c.train.log_every = 1
    c.train.checkpoint_every = 50
    if tpu_slice:
        c.hardware = hardware(*tpu_slice)
        c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, tpu_fsdp, tpu_tensor
        c.train.grad_accum = 1024 // tpu_fsdp   # one row per FSDP group per micro-batch
    return c
