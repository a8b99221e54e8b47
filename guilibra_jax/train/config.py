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
        max_length=4096,     # longer samples are filtered (counted, never silently)
        seq_buckets=(),      # padded lengths; () = one bucket of max_length (no recompiles)
        patch_bucket=2048,   # pixel rows per batch rounded up to a multiple of this
        min_pixels=0, max_pixels=0,  # image processor bounds; 0 = the family's default
        batch_size=8, seed=0, workers=0, pack=False,
        max_bad_fraction=0.05,
        synthetic=dict(enabled=False, platforms=("desktop", "mobile"), tasks=200, seed=0,
                       test_fraction=0.2, tokenizer_vocab=1024),
    ))
    c.loss = mlc.ConfigDict(dict(alpha_action=2.0, alpha_grounding=4.0, normalize="sample"))
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
        kl_beta=0.001, kl_kind="k3", kl_clamp=10.0,   # GRPO's trust region; beta > 0 by design
        reference="",        # GRPO: frozen reference (HF folder or training workdir); "" = start policy
        sngs=dict(enabled=True, lambda0=0.5, kappa=1.5, signal="mean_reward"),  # or success_rate
        reward=dict(w_fmt=0.1, value_rule="paper", point_tolerance=0.05),
        teachers={},         # MOPD: platform label -> HF folder or training workdir ("*": any other)
        mopd=dict(beta=0.01, kl_mask_tau=0.1, pass_floor=0.01),
        score_chunk=0,       # vocabulary projection over T-chunks of this size when scoring (0 = off)
    ))
    c.mesh = mlc.ConfigDict(dict(data=-1, fsdp=1, tensor=1))
    c.train = mlc.ConfigDict(dict(
        steps=100, grad_accum=1, log_every=10, checkpoint_every=100, keep_checkpoints=2,
        async_checkpoints=True, eval_every=0, eval_samples=64, eval_max_new_tokens=96,
        export=True, export_dir="",  # Hugging Face export at the end; "" = workdir/export
        tensorboard=True, progress=True,
    ))
    c.distributed = mlc.ConfigDict(dict(coordinator_address="", num_processes=0, process_id=-1,
                                        local_device_ids=""))
    return c


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


def validate(c: mlc.ConfigDict) -> None:
    """Check values before anything heavy starts; errors name the key."""
    if c.method not in METHODS:
        _fail("method", c.method, f"one of {METHODS}")
    if c.method != "sft":
        _validate_rl(c)
    m = c.model
    if m.hf_path and not os.path.isdir(m.hf_path):
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
    if not d.synthetic.enabled and not d.train_files:
        _fail("data.train_files", d.train_files, "at least one file (or data.synthetic.enabled=True)")
    for key in ("max_length", "batch_size"):
        if d[key] <= 0:
            _fail(f"data.{key}", d[key], "a positive integer")
    if not 0.0 <= d.max_bad_fraction <= 1.0:
        _fail("data.max_bad_fraction", d.max_bad_fraction, "a fraction in [0, 1]")
    if c.loss.normalize not in ("sample", "token"):
        _fail("loss.normalize", c.loss.normalize, "sample or token")
    if not isinstance(c.loss.logits_chunk, int) or c.loss.logits_chunk < 1:
        _fail("loss.logits_chunk", c.loss.logits_chunk, "a positive integer")
    if c.optim.schedule not in ("cosine", "linear", "constant"):
        _fail("optim.schedule", c.optim.schedule, "cosine, linear or constant")
    if c.optim.lr <= 0:
        _fail("optim.lr", c.optim.lr, "a positive learning rate")
    t = c.train
    for key in ("steps", "grad_accum", "log_every", "checkpoint_every", "keep_checkpoints"):
        if t[key] <= 0:
            _fail(f"train.{key}", t[key], "a positive integer")
    for axis in ("data", "fsdp", "tensor"):
        if c.mesh[axis] == 0 or c.mesh[axis] < -1:
            _fail(f"mesh.{axis}", c.mesh[axis], "a positive size or -1")


def _validate_rl(c: mlc.ConfigDict) -> None:
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
    rows = c.data.batch_size * r.group_size
    if rows % (r.minibatches * c.train.grad_accum):
        _fail("rl.minibatches", r.minibatches, f"a divisor of data.batch_size * rl.group_size = {rows} "
              f"together with train.grad_accum = {c.train.grad_accum}")
    if c.method == "grpo":
        if r.kl_kind not in KL_KINDS:
            _fail("rl.kl_kind", r.kl_kind, f"one of {KL_KINDS}")
        if r.kl_beta < 0:
            _fail("rl.kl_beta", r.kl_beta, ">= 0 (the conservative recipe uses > 0)")
        if r.sngs.signal not in ("mean_reward", "success_rate"):
            _fail("rl.sngs.signal", r.sngs.signal, "mean_reward or success_rate")
        if r.reference and not os.path.isdir(r.reference):
            _fail("rl.reference", r.reference, "an existing HF folder or training workdir")
        if c.data.method != "guilibra":
            _fail("data.method", c.data.method, "guilibra for method=grpo (GUI-Libra rewards)")
    if c.method == "mopd":
        if not r.teachers:
            _fail("rl.teachers", dict(r.teachers), "a mapping platform label -> teacher folder")
        for label, path in r.teachers.items():
            if not os.path.isdir(path):
                _fail(f"rl.teachers.{label}", path, "an existing HF folder or training workdir")
        if c.data.method != "mopd":
            _fail("data.method", c.data.method, "mopd for method=mopd (tool-call rewards)")
