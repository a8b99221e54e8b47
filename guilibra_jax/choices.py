"""The enumerations of the config, defined once: the config's rules (``train/config.py``)
and the modules that act on a value (losses, models, readers, rewards, advantages)
import them from here. No heavy imports: the config is validated before jax starts."""

METHODS = ("sft", "grpo", "mopd")                     # ASFT | GUI-Libra's GRPO | UI-MOPD
FAMILIES = ("qwen2_5_vl", "qwen3_vl")
REMATS = ("none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable", "nothing_saveable")
DTYPE_NAMES = ("float32", "bfloat16", "float16")
DATA_FORMATS = ("native", "guilibra_sft", "guilibra_rl", "uni_gui")
PLATFORMS = ("desktop", "mobile")                     # of the synthetic world
TARGET_FORMATS = ("guilibra", "mopd")                 # <think> + <answer> JSON | Qwen3-VL tool calls
NORMALIZATIONS = ("sample", "token")                  # ASFT: per-sample weighted mean | Σ w·nll / Σ w
WEIGHTINGS = ("paper", "release")                     # ASFT token weights
KL_KINDS = ("k1", "k2", "k3")
AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum")
KL_MASKS = ("off", "paper", "release")                # UI-MOPD's adaptive KL mask
REWARD_RULES = ("paper", "release")                   # GRPO value / format rules
MOPD_REWARD_RULES = ("strict", "release")
MOPD_ESTIMATORS = ("k3", "logratio_advantage", "full_kl")   # UI-MOPD's distillation term
SNGS_SIGNALS = ("mean_reward", "success_rate")
SCHEDULES = ("cosine", "linear", "constant")
OLD_LOGPROBS = ("auto", "sampler", "recompute")
OPEN_THINK = ("auto", "on", "off")
WANDB_MODES = ("online", "offline", "disabled")
REBALANCE_KEYS = ("platform", "source")               # the record field naming a domain
RL_WORLDS = ("", "miniwob", "synthetic")              # where RL prompts come from: the dataset | live episodes
ONLINE_PLAYS = ("first", "greedy")                    # the response a live episode executes
QUANTIZE = ("int8", "nf4")                            # model.quantize: QLoRA's frozen base (quantize.py)
# The decoder's attention and MLP projections: the usual LoRA targets (regexes over '/'-joined parameter paths).
LORA_TEXT_TARGETS = (r"^language_model/layers/(\d+/)?(self_attn/[qkvo]_proj|mlp/(gate|up|down)_proj)/kernel$",)
