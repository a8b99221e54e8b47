"""The run config: defaults every recipe starts from, and validation that runs before
anything heavy. Recipes in ``configs/`` call :func:`base_config` and override."""

from __future__ import annotations

import json
import os
from typing import Any

import ml_collections as mlc

from guilibra_jax.errors import ConfigError

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
    ))
    c.mesh = mlc.ConfigDict(dict(data=-1, fsdp=1, tensor=1))
    # What the recipe is sized for: launch.plan's defaults (devices = hosts * devices_per_host,
    # device_memory_gib; 0 = unknown, e.g. a CPU). The mesh must divide hosts * devices_per_host.
    c.hardware = mlc.ConfigDict(dict(name="1 x CPU", hosts=1, devices_per_host=1, device_memory_gib=0.0))
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
    ))
    c.print_only = False     # launch.train: print the resolved, validated config (and memory plan) and exit
    c.distributed = mlc.ConfigDict(dict(coordinator_address="", num_processes=0, process_id=-1,
                                        local_device_ids=""))
    return c


def hardware(name: str, hosts: int, devices_per_host: int, device_memory_gib: float) -> mlc.ConfigDict:
    """A recipe's ``hardware`` entry, e.g. ``hardware("1 x 8 H100 80GB", 1, 8, 80)``."""
    return mlc.ConfigDict(dict(name=name, hosts=hosts, devices_per_host=devices_per_host,
                               device_memory_gib=float(device_memory_gib)))


H100_1x8 = ("1 x 8 H100 80GB", 1, 8, 80)
H100_8x8 = ("8 x 8 H100 80GB", 8, 8, 80)


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


def _fail(key: str, value: Any, expected: str) -> None:
    raise ConfigError(f"config key {key} = {value!r} is invalid: expected {expected}")


def validate(c: mlc.ConfigDict, *, planning: bool = False) -> None:
    """Check values before anything heavy starts; errors name the key. ``planning``
    (launch.plan): data files and model folders may not exist yet (a recipe that starts from
    an earlier run's output is planned before that run)."""
    if c.method not in METHODS:
        _fail("method", c.method, f"one of {METHODS}")
    if c.method != "sft":
        _validate_rl(c, planning)
    m = c.model
    if m.hf_path and not os.path.isdir(m.hf_path) and not planning:
        _fail("model.hf_path", m.hf_path, "an existing local Hugging Face folder")
    for key in ("dtype", "param_dtype"):
        if m[key] not in ("float32", "bfloat16", "float16"):
            _fail(f"model.{key}", m[key], "float32, bfloat16 or float16")
    if m.remat not in REMATS:
        _fail("model.remat", m.remat, f"one of {REMATS}")
    if not m.hf_path and m.name == "tiny" and m.tiny.family not in FAMILIES:
        _fail("model.tiny.family", m.tiny.family, f"one of {FAMILIES}")
    d = c.data
    if d.format not in ("native", "guilibra_sft", "guilibra_rl", "uni_gui"):
        _fail("data.format", d.format, "native, guilibra_sft, guilibra_rl or uni_gui")
    if d.method not in ("guilibra", "mopd"):
        _fail("data.method", d.method, "guilibra or mopd")
    if d.mix not in ("both", "reasoning", "direct"):
        try:
            p = float(d.mix)
        except ValueError:
            p = -1.0
        if not 0.0 <= p <= 1.0:
            _fail("data.mix", d.mix, "both, reasoning, direct or a probability such as '0.5'")
    if not d.synthetic.enabled and not d.train_files and not planning:
        _fail("data.train_files", d.train_files, "at least one file (or data.synthetic.enabled=True)")
    for key in ("max_length", "batch_size"):
        if d[key] <= 0:
            _fail(f"data.{key}", d[key], "a positive integer")
    if not 0.0 <= d.max_bad_fraction <= 1.0:
        _fail("data.max_bad_fraction", d.max_bad_fraction, "a fraction in [0, 1]")
    rb = d.rebalance
    if not all(isinstance(p, (int, float)) and 0.0 <= p <= 1.0 for p in rb.step_keep):
        _fail("data.rebalance.step_keep", rb.step_keep, "keep probabilities in [0, 1], one per step index")
    for dom, share in dict(rb.max_share).items():
        if not isinstance(share, (int, float)) or not 0.0 < share < 1.0:
            _fail(f"data.rebalance.max_share.{dom}", share, "a share in (0, 1)")
    if rb.key not in ("platform", "source"):
        _fail("data.rebalance.key", rb.key, "platform or source")
    if d.open_think not in ("auto", "on", "off"):
        _fail("data.open_think", d.open_think, "auto, on or off")
    for platform, pair in dict(d.pixels).items():
        ok = isinstance(pair, (tuple, list)) and len(pair) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in pair)
        if not ok or (pair[0] and pair[1] and pair[0] > pair[1]):
            _fail(f"data.pixels.{platform}", pair, "(min, max) pixel counts with 0 <= min <= max (0: "
                  "data.min_pixels / data.max_pixels)")
    if c.loss.normalize not in ("sample", "token"):
        _fail("loss.normalize", c.loss.normalize, "sample or token")
    if c.loss.weighting not in ("paper", "release"):
        _fail("loss.weighting", c.loss.weighting, "paper or release")
    if c.optim.schedule not in ("cosine", "linear", "constant"):
        _fail("optim.schedule", c.optim.schedule, "cosine, linear or constant")
    if c.optim.lr <= 0:
        _fail("optim.lr", c.optim.lr, "a positive learning rate")
    t = c.train
    for key in ("steps", "grad_accum", "log_every", "checkpoint_every", "keep_checkpoints"):
        if t[key] <= 0:
            _fail(f"train.{key}", t[key], "a positive integer")
    if t.max_skipped_updates < 0:
        _fail("train.max_skipped_updates", t.max_skipped_updates, ">= 0 (0 = never stop)")
    for axis in ("data", "fsdp", "tensor"):
        if c.mesh[axis] == 0 or c.mesh[axis] < -1:
            _fail(f"mesh.{axis}", c.mesh[axis], "a positive size or -1")
    hw = c.hardware
    if hw.hosts < 1 or hw.devices_per_host < 1 or hw.device_memory_gib < 0:
        _fail("hardware", hw.to_dict(), "hosts >= 1, devices_per_host >= 1, device_memory_gib >= 0")

    if t.tensorboard not in ("auto", True, False) or isinstance(t.tensorboard, int) and not isinstance(
            t.tensorboard, bool):
        _fail("train.tensorboard", t.tensorboard, "'auto' (when tensorboardX is installed), True or False")
    if t.wandb.mode not in ("online", "offline", "disabled"):
        _fail("train.wandb.mode", t.wandb.mode, "online, offline or disabled")
    if len(t.profile_steps) not in (0, 2) or len(t.profile_steps) == 2 and not 1 <= t.profile_steps[0] < \
            t.profile_steps[1]:
        _fail("train.profile_steps", t.profile_steps, "() or (start, stop) with 1 <= start < stop")
    if not isinstance(t.compilation_cache_dir, str):
        _fail("train.compilation_cache_dir", t.compilation_cache_dir, "'auto', '' (off) or a folder")


def _frozen_spec_ok(spec: str) -> bool:
    """An existing folder or random:<integer seed> (frozen models of stage 2)."""
    if spec.startswith("random:"):
        return spec[len("random:"):].lstrip("-").isdigit()
    return os.path.isdir(spec)


def _validate_rl(c: mlc.ConfigDict, planning: bool = False) -> None:
    r = c.rl
    for key in ("group_size", "max_new_tokens", "ppo_epochs", "minibatches"):
        if r[key] <= 0:
            _fail(f"rl.{key}", r[key], "a positive integer")
    if r.group_size < 2:
        _fail("rl.group_size", r.group_size, "at least 2 (group-relative advantages)")
    if r.temperature <= 0:
        _fail("rl.temperature", r.temperature, "> 0 (on-policy sampling)")
    if not 0.0 < r.top_p <= 1.0:
        _fail("rl.top_p", r.top_p, "in (0, 1]")
    if r.aggregation not in AGGREGATIONS:
        _fail("rl.aggregation", r.aggregation, f"one of {AGGREGATIONS}")
    if r.update_groups < 0:
        _fail("rl.update_groups", r.update_groups, ">= 0 (0 = every prompt of a round)")
    if r.update_groups and not r.group_filter.enabled and r.update_groups != c.data.batch_size:
        _fail("rl.update_groups", r.update_groups, f"0 or data.batch_size = {c.data.batch_size} without "
              f"rl.group_filter (each step updates on the groups of one round)")
    if r.group_filter.max_rounds < 0:
        _fail("rl.group_filter.max_rounds", r.group_filter.max_rounds, ">= 0 (0 = no limit)")
    rows = (r.update_groups or c.data.batch_size) * r.group_size
    if rows % (r.minibatches * c.train.grad_accum):
        _fail("rl.minibatches", r.minibatches, f"a divisor of (rl.update_groups or data.batch_size) * "
              f"rl.group_size = {rows} together with train.grad_accum = {c.train.grad_accum}")
    if r.dual_clip != 0 and not r.dual_clip > 1.0:
        _fail("rl.dual_clip", r.dual_clip, "0 (off) or a constant > 1 (the release uses 3.0)")
    if not isinstance(r.std_unbiased, bool):
        _fail("rl.std_unbiased", r.std_unbiased, "True or False")
    if r.reward.format_rule not in ("paper", "release"):
        _fail("rl.reward.format_rule", r.reward.format_rule, "paper or release")
    if r.reward.mopd_rule not in ("strict", "release"):
        _fail("rl.reward.mopd_rule", r.reward.mopd_rule, "strict or release")
    if not isinstance(r.reward.check_tool_name, bool):
        _fail("rl.reward.check_tool_name", r.reward.check_tool_name, "True or False")
    if c.method == "grpo":
        if r.kl_kind not in KL_KINDS:
            _fail("rl.kl_kind", r.kl_kind, f"one of {KL_KINDS}")
        if r.kl_beta < 0:
            _fail("rl.kl_beta", r.kl_beta, ">= 0 (the conservative recipe uses > 0)")
        if r.sngs.signal not in ("mean_reward", "success_rate"):
            _fail("rl.sngs.signal", r.sngs.signal, "mean_reward or success_rate")
        if r.reference and not _frozen_spec_ok(r.reference) and not planning:
            _fail("rl.reference", r.reference, "an existing HF folder, training workdir or random:<seed>")
        if c.data.method != "guilibra":
            _fail("data.method", c.data.method, "guilibra for method=grpo (GUI-Libra rewards)")
    if c.method == "mopd":
        if not r.teachers:
            _fail("rl.teachers", dict(r.teachers), "a mapping platform label -> teacher folder")
        for label, path in r.teachers.items():
            if not _frozen_spec_ok(path) and not planning:
                _fail(f"rl.teachers.{label}", path, "an existing HF folder, training workdir or random:<seed>")
        if r.mopd.kl_mask not in ("off", "paper", "release"):
            _fail("rl.mopd.kl_mask", r.mopd.kl_mask, "off (release script), paper or release")
        platforms = tuple(c.data.synthetic.platforms) if c.data.synthetic.enabled else ()
        missing = [p for p in platforms if p not in r.teachers and "*" not in r.teachers]
        if missing:
            _fail("rl.teachers", dict(r.teachers), f"a teacher for every platform of the data (missing {missing}; "
                  f"'*' is a default teacher)")
        if c.data.method != "mopd":
            _fail("data.method", c.data.method, "mopd for method=mopd (tool-call rewards)")
