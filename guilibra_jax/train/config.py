"""The run config: defaults every recipe starts from, and validation that runs before
anything heavy. Recipes in ``configs/`` call :func:`base_config` and override."""

from __future__ import annotations

import dataclasses
import json
import math
import os

import ml_collections as mlc

from guilibra_jax.errors import ConfigError  # noqa: F401 (raised through config_checks)
from guilibra_jax.train import config_checks as K

FAMILIES = ("qwen2_5_vl", "qwen3_vl")
REMATS = ("none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable", "nothing_saveable")


METHODS = ("sft", "grpo", "mopd")
KL_KINDS = ("k1", "k2", "k3")
AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum")


def base_config() -> mlc.ConfigDict:
    c = mlc.ConfigDict()
    c.method = "sft"         # sft (ASFT) | grpo (GUI-Libra stage 2) | mopd (UI-MOPD stage 2)
    c.model = mlc.ConfigDict(dict(
        hf_path="",          # local Hugging Face folder; "" = random init from `name`
        name="tiny",         # "tiny" or a named real size (qwen2_5_vl_3b, qwen3_vl_8b, ...)
        dtype="bfloat16",    # compute dtype
        param_dtype="float32",  # master weights (and optimizer state)
        remat="none", scan_layers=False, seed=0,
        attention_block=1024,  # flash-attention tile; sequences longer than it attend blockwise
        mlp_chunk=0,           # MLPs of rows longer than this run in chunks of it (0: whole rows)
        tiny=dict(family="qwen2_5_vl", hidden=128, intermediate=256, layers=2, heads=4, kv_heads=2,
                  vision_depth=2, vision_hidden=64, vision_intermediate=128, vision_heads=4, tie=True,
                  mrope_section=()),
    ))
    c.tokenizer = mlc.ConfigDict(dict(path=""))  # "" = the model folder's tokenizer
    c.data = mlc.ConfigDict(dict(
        format="native",     # native | guilibra_sft | guilibra_rl | uni_gui
        train_files=(),      # files, folders or globs
        eval_files=(),       # held-out records for the periodic offline eval (native)
        image_root="",       # guilibra_sft: folder relative image paths start from
        method="guilibra",   # guilibra (<answer> JSON) | mopd (tool calls): the target format
        system_prompt="",    # "" = the method's own system turn; else a template that may use
                             # {platform} and {actions} (a short one keeps CPU demos fast)
        mix="both",          # both (each step as reasoning + direct-action sample: 1:1) |
                             # reasoning | direct | a probability of keeping the reasoning, e.g. "0.5"
        max_length=4096,     # longer samples are filtered (counted, never silently); RL: the prompt's
                             # length (the releases' max_prompt_length)
        seq_buckets=(),      # padded lengths; () = one bucket of max_length (no recompiles)
        patch_bucket=2048,   # pixel rows per batch rounded up to a multiple of this
        min_pixels=0, max_pixels=0,  # image processor bounds; 0 = the family's default
        pixels={},           # per platform (min, max) pixel bounds, e.g. {"mobile": (40768, 548800)};
                             # 0 or an unlisted platform: min_pixels / max_pixels (data.images.PixelBudgets)
        open_think="auto",   # prompts end with "<think>\n" as Qwen3-VL-*-Thinking templates do:
                             # auto (the tokenizer's chat template decides) | on | off
        batch_size=8, seed=0, workers=0, pack=False,
        rebalance=dict(      # GUI-Libra's RL subset (data.mixing.rebalance), applied before the mix:
            step_keep=(),    # keep probability per step index, e.g. (0.3, 0.6): step 0 kept with 0.3,
                             # step 1 with 0.6, later steps always; () = off
            max_share={},    # largest share a domain may hold, e.g. {"mobile": 0.5}; {} = off
            key="platform"), # the record field naming the domain: platform | source
        max_bad_fraction=0.05,
        synthetic=dict(enabled=False, platforms=("desktop", "mobile"), tasks=200, seed=0,
                       test_fraction=0.2, tokenizer_vocab=1024),
    ))
    c.loss = mlc.ConfigDict(dict(
        alpha_action=2.0, alpha_grounding=4.0,
        normalize="sample",  # sample (the paper: per-sample weighted mean) | token (Σ w·nll / Σ w, the release's)
        weighting="paper",   # paper: reasoning 1 / action alpha_action / coordinate digits alpha_grounding |
                             # release: x alpha_action inside <answer>, x alpha_grounding from "point_2d": on
    ))
    c.loss.logits_chunk = 128  # loss positions per row per LM-head chunk (guilibra_jax/head_loss.py)
    c.optim = mlc.ConfigDict(dict(
        lr=1e-5, warmup_steps=0, schedule="cosine", end_lr_fraction=0.0, weight_decay=0.0,
        b1=0.9, b2=0.999, eps=1e-8, clip_norm=1.0,
        lr_multipliers={}, freeze=(),  # path regex -> lr factor; path regexes not trained
    ))
    c.rl = mlc.ConfigDict(dict(
        group_size=8,        # G responses per prompt; data.batch_size prompts per step and process
        temperature=1.0, top_p=0.98, top_k=0, max_new_tokens=256,
        ppo_epochs=1, minibatches=1,   # optimizer updates per rollout = ppo_epochs * minibatches
        clip_low=0.2, clip_high=0.2, aggregation="token_mean",
        normalize_std=True,  # group advantages (r - mean) / std; False: r - mean (UI-MOPD)
        std_unbiased=False,  # that std divides by G - 1 (torch.std; GUI-Libra's EasyR1) instead of G
        dual_clip=0.0,       # dual-clip PPO constant c > 1 capping -A*ratio for A < 0 (EasyR1 3.0,
                             # UI-MOPD's veRL run 10.0); 0 = off
        kl_beta=0.001, kl_kind="k3", kl_clamp=10.0,   # GRPO's trust region; beta > 0 by design
        reference="",        # GRPO: frozen reference (HF folder or training workdir); "" = start policy
        sngs=dict(enabled=True, lambda0=0.5, kappa=1.5, signal="mean_reward"),  # or success_rate
        reward=dict(w_fmt=0.1, value_rule="paper", point_tolerance=0.05,
                    format_rule="paper",    # GRPO format reward: paper (parses) | release (r1gui.py)
                    mopd_rule="strict",     # MOPD reward: strict (ours) | release (gui_agent.py)
                    check_tool_name=True),  # MOPD: the type point needs the label's tool name too
        teachers={},         # MOPD: platform label -> HF folder, training workdir or random:<seed> ("*": any other)
        teacher_model_name="",  # architecture of unset teachers for launch.plan (a named size); "" = the policy's
        # MOPD's adaptive KL mask and pass-rate floor: off (the UI-MOPD release script) | paper (the
        # paper's method) | release (the release's off-by-default use_kl_loss_mask path); see train/advantages.py
        mopd=dict(beta=0.01, kl_mask_tau=0.1, pass_floor=0.01, kl_mask="paper"),
        update_groups=0,     # groups (prompts) per update over all processes; 0 = every prompt of the round
        # DAPO-style dynamic sampling (UI-MOPD release: on): drop groups whose pass rate is 0 or 1 and
        # sample more rounds of data.batch_size prompts until update_groups groups are kept; at most
        # max_rounds rounds (0 = no limit, the release), then the update is completed with dropped groups
        # that carry no loss (logged as group_filter/short_groups)
        group_filter=dict(enabled=False, max_rounds=10),
        score_chunk=0,       # vocabulary projection over T-chunks of this size when scoring (0 = off)
        # old-policy log-probs of the PPO ratio: auto (the sampler's own when sampling is not top-p /
        # top-k truncated: one scoring pass less per step) | sampler | recompute (a scoring pass)
        old_logprobs="auto",
        # rows (responses) per sampler / scoring call over all processes; a round's rows
        # (data.batch_size x rl.group_size) go through in calls of this size, so the KV cache and
        # the scoring activations are bounded by it (0 = a whole round in one call)
        generation_rows=0, score_rows=0,
        # sample each prompt's G rows from one prefill (vision tower + prompt, KV cache shared by
        # the group); False: the prompt is prefilled once per row (the same tokens, G x the work)
        share_prefill=True,
        # Where prompts come from: "" = the dataset (data.train_files / data.synthetic); "miniwob" = live
        # MiniWoB++ pages in headless Chromium (GRPO on on-policy states, labelled by the DOM experts;
        # train/online.py; optional [miniwob] extra). data.batch_size = rl.online.workers x processes.
        world="",
        online=dict(workers=2,     # browser processes per process (one live episode, one prompt each)
                    tasks=(),      # task names; () = every task with an expert (envs.miniwob.TASKS)
                    scale=1.0,     # device pixels per CSS pixel (1: 160 x 210 screenshots)
                    max_steps=0),  # an episode ends (failed) after this many actions; 0 = the task's
                                   # own limit (envs.miniwob.env: 10, click-checkboxes-large 16)
    ))
    c.mesh = mlc.ConfigDict(dict(data=-1, fsdp=1, tensor=1))
    # What the recipe is sized for: launch.plan's defaults (devices = hosts * devices_per_host,
    # device_memory_gib; 0 = unknown, e.g. a CPU). The mesh must divide hosts * devices_per_host.
    # topology: a TPU slice ("v5p:2x2x2"): launch.plan then compiles for it with the TPU compiler.
    c.hardware = mlc.ConfigDict(dict(name="1 x CPU", hosts=1, devices_per_host=1, device_memory_gib=0.0,
                                     topology=""))
    c.train = mlc.ConfigDict(dict(
        steps=100, grad_accum=1, log_every=10, checkpoint_every=100, keep_checkpoints=2,
        async_checkpoints=True, eval_every=0, eval_samples=64, eval_max_new_tokens=96,
        export=True, export_dir="",  # Hugging Face export at the end; "" = workdir/export
        tensorboard=mlc.FieldReference("auto", field_type=object),  # "auto" (if tensorboardX) | True | False
        progress=True,
        wandb=dict(project="", entity="", name="", mode="online", tags=()),  # project "" = off; mode offline: no network
        profile_steps=(),    # (start, stop): jax.profiler trace of steps start..stop-1 into workdir/profile
        compilation_cache_dir="auto",  # persistent XLA cache: "auto" = workdir/compilation_cache, "" = off, or a path
        curves=True,         # training curves (loss, held-out accuracy) as workdir/curves.png at the end
        max_skipped_updates=10,  # stop after this many consecutive non-finite updates (0 = never)
        memory_plan=True,    # compile the run's programs ahead of time and write memory_plan.json
        allow_config_change=False,  # a rerun may change the run's config (recorded in config_history.jsonl)
    ))
    c.print_only = False     # launch.train: print the resolved, validated config (and memory plan) and exit
    c.distributed = mlc.ConfigDict(dict(coordinator_address="", num_processes=0, process_id=-1,
                                        local_device_ids=""))
    return c


def hardware(name: str, hosts: int, devices_per_host: int, device_memory_gib: float,
             topology: str = "") -> mlc.ConfigDict:
    """A recipe's ``hardware`` entry, e.g. ``hardware("1 x 8 H100 80GB", 1, 8, 80)``; a TPU
    slice names its ``topology`` (``hardware(*V5P_2x2x2)``)."""
    return mlc.ConfigDict(dict(name=name, hosts=hosts, devices_per_host=devices_per_host,
                               device_memory_gib=float(device_memory_gib), topology=topology))


H100_1x8 = ("1 x 8 H100 80GB", 1, 8, 80)
H100_4x8 = ("4 x 8 H100 80GB", 4, 8, 80)
H100_8x8 = ("8 x 8 H100 80GB", 8, 8, 80)
# Cloud TPU v5p slices (4 chips per TPU VM host, 95 GB HBM per chip; cloud.google.com/tpu/docs/v5p)
V5P_2x2x1 = ("TPU v5p-8 (2x2x1, 4 chips)", 1, 4, 95, "v5p:2x2x1")
V5P_2x2x2 = ("TPU v5p-16 (2x2x2, 8 chips)", 2, 4, 95, "v5p:2x2x2")
V5P_2x4x4 = ("TPU v5p-64 (2x4x4, 32 chips)", 8, 4, 95, "v5p:2x4x4")
V5P_4x4x4 = ("TPU v5p-128 (4x4x4, 64 chips)", 16, 4, 95, "v5p:4x4x4")


def load_run_config(workdir: str) -> mlc.ConfigDict:
    """The resolved config a training workdir holds (``config.json``, or that file's path)
    over today's defaults, so runs written before a key existed still load."""
    path = workdir if workdir.endswith(".json") else os.path.join(workdir, "config.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} not found: is {workdir!r} a training workdir "
                                f"(python -m launch.train writes config.json there)?")
    with open(path) as f:
        return mlc.ConfigDict(_merged(base_config().to_dict(), json.load(f)))


def _merged(defaults: dict, loaded: dict) -> dict:
    out = dict(defaults)
    for k, v in loaded.items():
        both = isinstance(v, dict) and isinstance(defaults.get(k), dict)
        out[k] = _merged(defaults[k], v) if both else v
    return out


# ----------------------------------------------------------------------------- validation
# One rule per key: full key -> check of its type and range (guilibra_jax.train.config_checks).
# Adding a key to base_config? Add its line here (tests/train/test_config_validation.py
# fails for a key without a rule). Rules that involve several keys are CROSS_CHECKS below.
SYNTHETIC_PLATFORMS = ("desktop", "mobile")  # = guilibra_jax.envs.adapter.PLATFORMS (not imported: heavy)
DEMO_MIN_VOCAB = 276                         # = len(demo_tokenizer.QWEN_SPECIAL_TOKENS) + 256 bytes
DTYPE_NAMES = ("float32", "bfloat16", "float16")
DATA_FORMATS = ("native", "guilibra_sft", "guilibra_rl", "uni_gui")

RULES: dict[str, K.Check] = {
    "method": K.one_of(*METHODS),
    "model.hf_path": K.folder_or_empty("a Hugging Face checkpoint: config.json + *.safetensors"),
    "model.name": K.Check(lambda v: isinstance(v, str) and v != "", "'tiny' or a named size such as qwen2_5_vl_3b"),
    "model.dtype": K.one_of(*DTYPE_NAMES),
    "model.param_dtype": K.one_of(*DTYPE_NAMES),
    "model.remat": K.one_of(*REMATS),
    "model.scan_layers": K.boolean(),
    "model.attention_block": K.integer(1),
    "model.mlp_chunk": K.integer(0, note="(0 = whole rows)"),
    "model.seed": K.integer(0),
    "model.tiny.family": K.one_of(*FAMILIES),
    "model.tiny.hidden": K.integer(1),
    "model.tiny.intermediate": K.integer(1),
    "model.tiny.layers": K.integer(1),
    "model.tiny.heads": K.integer(1),
    "model.tiny.kv_heads": K.integer(1),
    "model.tiny.vision_depth": K.integer(1),
    "model.tiny.vision_hidden": K.integer(1),
    "model.tiny.vision_intermediate": K.integer(1),
    "model.tiny.vision_heads": K.integer(1),
    "model.tiny.tie": K.boolean(),
    "model.tiny.mrope_section": K.integers(1, lengths=(0, 3), note="(t, h, w) sizes summing to head_dim / 2"),
    "tokenizer.path": K.folder_or_empty("a tokenizer folder; '' = the model folder's"),
    "data.format": K.one_of(*DATA_FORMATS),
    "data.train_files": K.strings("files, folders or globs"),
    "data.eval_files": K.strings("files, folders or globs"),
    "data.image_root": K.folder_or_empty("the folder relative image paths start from"),
    "data.method": K.one_of("guilibra", "mopd"),
    "data.system_prompt": K.template(("platform", "actions")),
    "data.mix": K.probability_or("both", "reasoning", "direct"),
    "data.max_length": K.integer(1),
    "data.seq_buckets": K.integers(1, note="padded lengths; () = one bucket of data.max_length"),
    "data.patch_bucket": K.Check(lambda v: isinstance(v, int) and v >= 4 and v % 4 == 0,
                                 "a positive multiple of 4 (2 x 2 patches merge into one token)"),
    "data.min_pixels": K.integer(0, note="(0 = the family's default)"),
    "data.max_pixels": K.integer(0, note="(0 = the family's default)"),
    "data.pixels": K.Check(lambda v: hasattr(v, "items") and all(
        isinstance(k, str) and isinstance(p, (tuple, list)) and len(p) == 2 and all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in p) and not (p[0] and p[1] and p[0] > p[1])
        for k, p in v.items()), "platform -> (min, max) pixel counts with 0 <= min <= max (0: data.min_pixels / "
        "data.max_pixels)"),
    "data.open_think": K.one_of("auto", "on", "off"),
    "data.rebalance.step_keep": K.Check(lambda v: isinstance(v, (tuple, list)) and all(
        K._is_number(p) and 0.0 <= p <= 1.0 for p in v), "keep probabilities in [0, 1], one per step index"),
    "data.rebalance.max_share": K.Check(lambda v: hasattr(v, "items") and all(
        K._is_number(x) and 0.0 < x < 1.0 for x in v.values()), "domain -> a share in (0, 1)"),
    "data.rebalance.key": K.one_of("platform", "source"),
    "data.batch_size": K.integer(1),
    "data.seed": K.integer(0),
    "data.workers": K.integer(0),
    "data.pack": K.boolean(),
    "data.max_bad_fraction": K.number(0, 1),
    "data.synthetic.enabled": K.boolean(),
    "data.synthetic.platforms": K.Check(lambda v: isinstance(v, (tuple, list)) and len(v) > 0 and all(
        p in SYNTHETIC_PLATFORMS for p in v), f"a non-empty tuple from {SYNTHETIC_PLATFORMS}"),
    "data.synthetic.tasks": K.integer(1),
    "data.synthetic.seed": K.integer(0),
    "data.synthetic.test_fraction": K.number(0, 1, hi_open=True),
    "data.synthetic.tokenizer_vocab": K.integer(DEMO_MIN_VOCAB, note="(Qwen's special tokens + 256 bytes)"),
    "loss.alpha_action": K.number(0),
    "loss.alpha_grounding": K.number(0),
    "loss.normalize": K.one_of("sample", "token"),
    "loss.weighting": K.one_of("paper", "release"),
    "loss.logits_chunk": K.integer(1, note="(loss positions per row per LM-head chunk)"),
    "optim.lr": K.number(0, lo_open=True),
    "optim.warmup_steps": K.integer(0),
    "optim.schedule": K.one_of("cosine", "linear", "constant"),
    "optim.end_lr_fraction": K.number(0, 1),
    "optim.weight_decay": K.number(0),
    "optim.b1": K.number(0, 1, hi_open=True),
    "optim.b2": K.number(0, 1, hi_open=True),
    "optim.eps": K.number(0, lo_open=True),
    "optim.clip_norm": K.number(0, note="(0 = no clipping)"),
    "optim.lr_multipliers": K.regex_to_number(0.0),
    "optim.freeze": K.regexes("parameter paths not trained"),
    "rl.group_size": K.integer(2, note="(group-relative advantages)"),
    "rl.temperature": K.number(0, lo_open=True, note="(on-policy sampling)"),
    "rl.top_p": K.number(0, 1, lo_open=True),
    "rl.top_k": K.integer(0, note="(0 = off)"),
    "rl.max_new_tokens": K.integer(1),
    "rl.ppo_epochs": K.integer(1),
    "rl.minibatches": K.integer(1),
    "rl.clip_low": K.number(0, 1, hi_open=True),
    "rl.clip_high": K.number(0),
    "rl.aggregation": K.one_of(*AGGREGATIONS),
    "rl.normalize_std": K.boolean(),
    "rl.std_unbiased": K.boolean(),
    "rl.dual_clip": K.Check(lambda v: K._is_number(v) and (v == 0 or v > 1.0),
                            "0 (off) or a constant > 1 (the releases use 3.0 and 10.0)"),
    "rl.kl_beta": K.number(0, note="(the conservative recipe uses > 0)"),
    "rl.kl_kind": K.one_of(*KL_KINDS),
    "rl.kl_clamp": K.number(0, note="(0 = no clamp)"),
    "rl.reference": K.text("an HF folder, training workdir or random:<seed>; '' = the starting policy"),
    "rl.sngs.enabled": K.boolean(),
    "rl.sngs.lambda0": K.number(0, 1),
    "rl.sngs.kappa": K.number(0),
    "rl.sngs.signal": K.one_of("mean_reward", "success_rate"),
    "rl.reward.w_fmt": K.number(0, 1),
    "rl.reward.value_rule": K.one_of("paper", "release"),
    "rl.reward.point_tolerance": K.number(0),
    "rl.reward.format_rule": K.one_of("paper", "release"),
    "rl.reward.mopd_rule": K.one_of("strict", "release"),
    "rl.reward.check_tool_name": K.boolean(),
    "rl.teachers": K.mapping_of_text("platform label -> teacher folder or random:<seed>; '*' = any other"),
    "rl.teacher_model_name": K.text("a named size for launch.plan; '' = the policy's"),
    "rl.mopd.beta": K.number(0),
    "rl.mopd.kl_mask_tau": K.number(0, 1),
    "rl.mopd.pass_floor": K.number(0, 1),
    "rl.mopd.kl_mask": K.one_of("off", "paper", "release"),
    "rl.update_groups": K.integer(0, note="(0 = every prompt of a round)"),
    "rl.group_filter.enabled": K.boolean(),
    "rl.group_filter.max_rounds": K.integer(0, note="(0 = no limit)"),
    "rl.score_chunk": K.integer(0, note="(0 = off)"),
    "rl.old_logprobs": K.one_of("auto", "sampler", "recompute"),
    "rl.generation_rows": K.integer(0, note="(0 = a whole round per call)"),
    "rl.score_rows": K.integer(0, note="(0 = a whole round per call)"),
    "rl.share_prefill": K.boolean(),
    "rl.world": K.one_of("", "miniwob"),
    "rl.online.workers": K.integer(1, note="(browser processes per process)"),
    "rl.online.tasks": K.strings("MiniWoB++ task names with an expert; () = all of envs.miniwob.TASKS"),
    "rl.online.scale": K.number(0, lo_open=True, note="(device pixels per CSS pixel)"),
    "rl.online.max_steps": K.integer(0, note="(0 = the task's own limit)"),
    "mesh.data": K.Check(lambda v: isinstance(v, int) and (v >= 1 or v == -1), "a positive size or -1"),
    "mesh.fsdp": K.Check(lambda v: isinstance(v, int) and (v >= 1 or v == -1), "a positive size or -1"),
    "mesh.tensor": K.Check(lambda v: isinstance(v, int) and (v >= 1 or v == -1), "a positive size or -1"),
    "train.steps": K.integer(1),
    "train.grad_accum": K.integer(1),
    "train.log_every": K.integer(1),
    "train.checkpoint_every": K.integer(1),
    "train.keep_checkpoints": K.integer(1),
    "train.async_checkpoints": K.boolean(),
    "train.eval_every": K.integer(0, note="(0 = no periodic eval)"),
    "train.eval_samples": K.integer(1),
    "train.eval_max_new_tokens": K.integer(1),
    "train.export": K.boolean(),
    "train.export_dir": K.text("'' = workdir/export"),
    "train.tensorboard": K.Check(lambda v: v == "auto" or isinstance(v, bool),
                                 "'auto' (when tensorboardX is installed), True or False"),
    "train.progress": K.boolean(),
    "train.max_skipped_updates": K.integer(0, note="(0 = never stop)"),
    "train.memory_plan": K.boolean(),
    "train.allow_config_change": K.boolean(),
    "train.wandb.project": K.text("'' = off"),
    "train.wandb.entity": K.text(),
    "train.wandb.name": K.text(),
    "train.wandb.mode": K.one_of("online", "offline", "disabled"),
    "train.wandb.tags": K.strings(),
    "train.profile_steps": K.Check(lambda v: isinstance(v, (tuple, list)) and (len(v) == 0 or (
        len(v) == 2 and all(K._is_int(x) for x in v) and 1 <= v[0] < v[1])), "() or (start, stop) with 1 <= start < stop"),
    "train.compilation_cache_dir": K.text("'auto', '' (off) or a folder"),
    "train.curves": K.boolean(),
    "print_only": K.boolean(),
    "hardware.name": K.text(),
    "hardware.hosts": K.integer(1),
    "hardware.devices_per_host": K.integer(1),
    "hardware.device_memory_gib": K.number(0, note="(0 = unknown)"),
    "hardware.topology": K.text("a TPU slice such as 'v5p:2x2x2', or '' for none"),
    "distributed.coordinator_address": K.host_port(),
    "distributed.num_processes": K.integer(0),
    "distributed.process_id": K.integer(-1),
    "distributed.local_device_ids": K.device_ids(),
}

_fail = K.fail
# Folders that may not exist yet when a recipe is planned (launch.plan): recipes that start
# from an earlier run's export are planned before that run.
PLANNED_PATHS = ("model.hf_path", "tokenizer.path", "data.image_root")


@dataclasses.dataclass(frozen=True)
class Known:
    """What the cross-key checks may rely on: the device and process counts once jax
    has started (None before), and ``planning`` (launch.plan: data files and frozen-model
    folders may still be unset)."""

    devices: int | None = None
    processes: int | None = None
    planning: bool = False


def _check_model(c, _known: Known) -> None:
    t = c.model.tiny
    if c.model.hf_path or c.model.name != "tiny":
        return
    if t.hidden % t.heads:
        _fail("model.tiny.heads", t.heads, f"a divisor of model.tiny.hidden = {t.hidden}")
    if (t.hidden // t.heads) % 2:
        _fail("model.tiny.heads", t.heads, f"an even head size model.tiny.hidden / heads (now {t.hidden / t.heads})")
    if t.heads % t.kv_heads:
        _fail("model.tiny.kv_heads", t.kv_heads, f"a divisor of model.tiny.heads = {t.heads}")
    if t.vision_hidden % t.vision_heads:
        _fail("model.tiny.vision_heads", t.vision_heads, f"a divisor of model.tiny.vision_hidden = {t.vision_hidden}")
    half = t.hidden // t.heads // 2
    if t.mrope_section and sum(t.mrope_section) != half:
        _fail("model.tiny.mrope_section", tuple(t.mrope_section), f"3 sizes summing to head_dim / 2 = {half}")


def _check_data(c, known: Known) -> None:
    d = c.data
    online_tokenizer = c.rl.world and (c.model.hf_path or c.tokenizer.path)   # no records needed
    if not d.synthetic.enabled and not known.planning and not online_tokenizer:
        if not d.train_files:
            _fail("data.train_files", d.train_files, "at least one file (or data.synthetic.enabled=True)")
        missing = K.missing_inputs(d.train_files)
        if missing:
            _fail("data.train_files", missing[0], "existing files, folders or globs that match something")
        missing = K.missing_inputs(d.eval_files)
        if missing:
            _fail("data.eval_files", missing[0], "existing files, folders or globs that match something")
    if d.seq_buckets and max(d.seq_buckets) != d.max_length:
        _fail("data.seq_buckets", tuple(d.seq_buckets), f"buckets <= data.max_length = {d.max_length}, the largest "
              f"equal to it (longer samples are filtered, a sample must fit a bucket)")
    if d.max_pixels and d.min_pixels > d.max_pixels:
        _fail("data.min_pixels", d.min_pixels, f"<= data.max_pixels = {d.max_pixels}")
    if (c.train.eval_every > 0 and c.method != "mopd" and not d.synthetic.enabled and not d.eval_files
            and not known.planning):
        _fail("data.eval_files", d.eval_files, "held-out files for train.eval_every > 0 (or train.eval_every=0)")


def _mesh_sizes(c, devices: int | None) -> dict[str, int | None]:
    """Axis -> size, -1 resolved when the device count is known (else None)."""
    sizes = {a: c.mesh[a] for a in ("data", "fsdp", "tensor")}
    known = 1
    for v in sizes.values():
        known *= v if v != -1 else 1
    for a, v in sizes.items():
        if v == -1:
            sizes[a] = devices // known if devices and devices % known == 0 else None
    return sizes


def _check_mesh_and_batch(c, known: Known) -> None:
    axes, devices = ("data", "fsdp", "tensor"), known.devices
    if sum(c.mesh[a] == -1 for a in axes) > 1:
        _fail("mesh", {a: c.mesh[a] for a in axes}, "at most one axis of size -1 (the rest of the devices)")
    if devices:
        fixed = 1
        for a in axes:
            fixed *= c.mesh[a] if c.mesh[a] != -1 else 1
        total = fixed if -1 not in [c.mesh[a] for a in axes] else None
        if (total is not None and total != devices) or devices % fixed:
            _fail("mesh", {a: c.mesh[a] for a in axes}, f"axis sizes whose product divides the {devices} devices "
                  f"(equals it unless one axis is -1)")
    sizes = _mesh_sizes(c, devices)
    # Rows are split over the data-parallel axes (data x fsdp); a size not known yet
    # (-1 without a device count) checks what is known.
    dp = (sizes["data"] or 1) * (sizes["fsdp"] or 1)
    procs = known.processes or max(c.distributed.num_processes, 1)
    if c.data.batch_size % procs:  # data.batch_size is the batch over all processes
        _fail("data.batch_size", c.data.batch_size, f"a multiple of the process count {procs} (the batch over all "
              f"processes)")
    if c.method == "sft":
        if c.data.batch_size % dp:
            _fail("data.batch_size", c.data.batch_size, f"a multiple of the data-parallel size mesh.data x "
                  f"mesh.fsdp = {dp}")
        return
    rl = c.rl
    if rl.update_groups and not rl.group_filter.enabled and rl.update_groups != c.data.batch_size:
        _fail("rl.update_groups", rl.update_groups, f"0 or data.batch_size = {c.data.batch_size} without "
              f"rl.group_filter (each step updates on the groups of one round)")
    rows = (rl.update_groups or c.data.batch_size) * rl.group_size
    if rows % (rl.minibatches * c.train.grad_accum):
        _fail("rl.minibatches", rl.minibatches, f"a divisor of (rl.update_groups or data.batch_size) * "
              f"rl.group_size = {rows} together with train.grad_accum = {c.train.grad_accum}")
    round_rows = c.data.batch_size * rl.group_size
    for key in ("generation_rows", "score_rows"):
        n = rl[key]
        unit = math.lcm(procs, dp)
        if n and (round_rows % n or n % unit):
            _fail(f"rl.{key}", n, f"0 or a divisor of data.batch_size x rl.group_size = {round_rows} that is a "
                  f"multiple of {unit} (the processes, {procs}, and the data-parallel devices, {dp})")
    n = rl.generation_rows   # sampler calls hold whole groups on each process (their prefill is shared)
    if n and n % (procs * rl.group_size):
        _fail("rl.generation_rows", n, f"0 or a multiple of rl.group_size x processes = {rl.group_size} x {procs} "
              f"(each sampler call holds whole groups of every process)")
    micro = rows // (rl.minibatches * c.train.grad_accum)
    if micro % dp:
        _fail("data.batch_size", c.data.batch_size, f"update micro-batches ((rl.update_groups or data.batch_size) "
              f"* rl.group_size / (rl.minibatches * train.grad_accum) = {micro} rows) divisible by mesh.data x "
              f"mesh.fsdp = {dp}")


def check_teachers(teachers, platforms) -> None:
    """Every platform of the data has a teacher (or a '*' default): ConfigError naming
    rl.teachers otherwise. ``platforms``: the labels the training records carry."""
    missing = sorted(set(platforms) - set(teachers)) if "*" not in teachers else []
    if missing:
        _fail("rl.teachers", dict(teachers), f"a teacher for every platform of the data: {missing} have none "
              f"(add them, or '*' for a default teacher)")


def _frozen_spec_ok(spec: str) -> bool:
    """An existing folder or random:<integer seed> (frozen models of stage 2)."""
    if spec.startswith("random:"):
        return spec[len("random:"):].lstrip("-").isdigit()
    return os.path.isdir(spec)


def _check_rl(c, known: Known) -> None:
    r = c.rl
    if r.old_logprobs == "sampler" and (r.top_p < 1.0 or r.top_k):
        _fail("rl.old_logprobs", r.old_logprobs, f"auto or recompute when sampling is truncated (rl.top_p = "
              f"{r.top_p}, rl.top_k = {r.top_k}): the sampler's log-probs are then not the policy's")
    if c.method == "grpo":
        if r.reference and not _frozen_spec_ok(r.reference) and not known.planning:
            _fail("rl.reference", r.reference, "an existing HF folder, training workdir or random:<seed> "
                  "('' = the starting policy)")
        if c.data.method != "guilibra":
            _fail("data.method", c.data.method, "guilibra for method=grpo (GUI-Libra rewards)")
    if c.method == "mopd":
        if not r.teachers:
            _fail("rl.teachers", dict(r.teachers), "a mapping platform label -> teacher folder")
        for label, path in r.teachers.items():
            if not _frozen_spec_ok(path) and not known.planning:
                _fail(f"rl.teachers.{label}", path, "an existing HF folder, training workdir or random:<seed>")
        if c.data.synthetic.enabled:
            check_teachers(r.teachers, c.data.synthetic.platforms)
        if c.data.method != "mopd":
            _fail("data.method", c.data.method, "mopd for method=mopd (tool-call rewards)")


def _check_world(c, known: Known) -> None:
    """rl.world = "miniwob": GRPO only, one prompt per browser slot, tasks with an expert,
    and the [miniwob] extra with Chromium present (the environment's own message)."""
    r = c.rl
    if not r.world:
        return
    if c.method != "grpo":
        _fail("rl.world", r.world, f"'' (the dataset) with method={c.method!r}: live browser states need "
              f"method=grpo (the experts label GUI-Libra actions)")
    procs = known.processes or max(c.distributed.num_processes, 1)
    if r.online.workers * procs != c.data.batch_size:
        _fail("rl.online.workers", r.online.workers, f"data.batch_size / processes = {c.data.batch_size} / {procs} "
              f"(one prompt per browser slot)")
    from guilibra_jax.envs.miniwob.experts import TASKS   # light: no browser, no selenium
    unknown = sorted(set(r.online.tasks) - set(TASKS))
    if unknown:
        _fail("rl.online.tasks", tuple(r.online.tasks), f"tasks with an expert ({unknown} have none): some of "
              f"{list(TASKS)}, or () for all")
    if not known.planning:
        from guilibra_jax.envs.miniwob.browser import available
        reason = available()
        if reason:
            _fail("rl.world", r.world, f"a machine that can run it: {reason}")


def _check_distributed(c, _known: Known) -> None:
    d = c.distributed
    if d.num_processes > 1 and d.coordinator_address and not 0 <= d.process_id < d.num_processes:
        _fail("distributed.process_id", d.process_id, f"in [0, {d.num_processes}) when distributed.num_processes "
              f"= {d.num_processes} (or JAX_PROCESS_ID in the environment, with -1 here)")


# (config, Known) -> None; raise through _fail naming the key.
CROSS_CHECKS = [_check_model, _check_data, _check_mesh_and_batch, _check_rl, _check_world, _check_distributed]


def _walk(tree, prefix: str = ""):
    """(full key, value) of every rule-checked entry: a key with a rule is not descended."""
    for k in tree.keys():
        key = f"{prefix}{k}"
        v = tree[k]
        if key not in RULES and isinstance(v, mlc.ConfigDict):
            yield from _walk(v, key + ".")
        else:
            yield key, v


def validate(c: mlc.ConfigDict, device_count: int | None = None, process_count: int | None = None, *,
             planning: bool = False) -> None:
    """Check every key's type and range (RULES), then the rules between keys
    (CROSS_CHECKS), before anything heavy starts; ``device_count`` (and
    ``process_count``), once known, also check the mesh and the batch against them;
    ``planning`` (launch.plan) lets data files and frozen-model folders be unset.
    Raises ConfigError naming the full key, the value and what is allowed. Regex
    options that must match parameters (optim.freeze, optim.lr_multipliers) are
    checked where the model is built (``loop.optimizer_from_config``)."""
    for key, value in _walk(c):
        rule = RULES.get(key)
        if planning and key in PLANNED_PATHS and isinstance(value, str):
            continue   # an earlier stage's output, planned before that stage has run
        if rule is not None:
            rule(key, value.to_dict() if isinstance(value, mlc.ConfigDict) else value)
    known = Known(device_count, process_count, planning)
    for check in CROSS_CHECKS:
        check(c, known)
