"""The run config: every key declared once in :data:`KEYS` with its default, its rule
(type and range, checked before anything heavy starts) and one line of doc. Recipes in
``configs/`` call :func:`base_config` (built from the table) and override; ``launch.train
--help`` lists the keys and ``docs/config.md`` is generated from the table
(``python -m guilibra_jax.train.config`` rewrites it)."""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import math
import os
import sys
from typing import Any

import ml_collections as mlc

from guilibra_jax import choices as CH
from guilibra_jax.errors import ConfigError
from guilibra_jax.served_scorer import check_url, is_url
from guilibra_jax.train import config_checks as K

DEMO_MIN_VOCAB = 276                         # = len(demo_tokenizer.QWEN_SPECIAL_TOKENS) + 256 bytes


@dataclasses.dataclass(frozen=True)
class Key:
    """One config key: ``default`` (copied afresh into every :func:`base_config`),
    ``rule`` (its type and range: :mod:`guilibra_jax.train.config_checks`) and ``doc``
    (one line: what it does, its units, what 0 or '' means, which paper or release uses
    what). ``any_type``: the value may change type (train.tensorboard: 'auto' or a bool),
    so it is held in a fresh ``FieldReference`` of field type ``object``."""

    default: Any
    rule: K.Check
    doc: str
    any_type: bool = False

    def fresh(self) -> Any:
        if self.any_type:
            return mlc.FieldReference(self.default, field_type=object)
        return copy.deepcopy(self.default)


_MESH_AXIS = K.Check(lambda v: isinstance(v, int) and (v >= 1 or v == -1), "a positive size or -1")


def _pixel_bounds_ok(v) -> bool:
    """data.pixels: platform -> (min, max) pixel counts, 0 <= min <= max (0: unset)."""
    return hasattr(v, "items") and all(
        isinstance(k, str) and isinstance(p, (tuple, list)) and len(p) == 2
        and all(K._is_int(x) and x >= 0 for x in p) and not (p[0] and p[1] and p[0] > p[1])
        for k, p in v.items())


def _profile_steps_ok(v) -> bool:
    """train.profile_steps: () or (start, stop) with 1 <= start < stop."""
    return isinstance(v, (tuple, list)) and (len(v) == 0 or (
        len(v) == 2 and all(K._is_int(x) for x in v) and 1 <= v[0] < v[1]))


# Full key -> Key, in declaration order (docs/config.md and --help list them in this order).
# Adding a key? One line here: default, rule, doc. Rules that involve several keys are
# CROSS_CHECKS below; a section's longer explanation is its SECTIONS entry.
KEYS: dict[str, Key] = {
    "method": Key("sft", K.one_of(*CH.METHODS),
                  "the trainer: sft (ASFT, GUI-Libra stage 1) | grpo (GUI-Libra stage 2) | mopd (UI-MOPD stage 2)"),
    # ------------------------------------------------------------------ model
    "model.hf_path": Key("", K.folder_or_empty("a Hugging Face checkpoint: config.json + *.safetensors"),
                         "local Hugging Face folder to start from; '' = random init of model.name"),
    "model.name": Key("tiny", K.Check(lambda v: isinstance(v, str) and v != "",
                                      "'tiny' or a named size such as qwen2_5_vl_3b"),
                      "'tiny' (model.tiny) or a named real size (qwen2_5_vl_3b, qwen3_vl_8b, ...) for a random init"),
    "model.dtype": Key("bfloat16", K.one_of(*CH.DTYPE_NAMES), "compute dtype"),
    "model.param_dtype": Key("float32", K.one_of(*CH.DTYPE_NAMES), "dtype of the master weights (and optimizer state)"),
    "model.remat": Key("none", K.one_of(*CH.REMATS),
                       "rematerialisation (activation checkpointing) policy of the layers: none, full or a "
                       "jax.checkpoint_policies name"),
    "model.scan_layers": Key(False, K.boolean(), "run the decoder layers and vision blocks as one scanned layer"),
    "model.attention_block": Key(1024, K.integer(1),
                                 "flash-attention tile; sequences longer than it attend blockwise"),
    "model.mlp_chunk": Key(0, K.integer(0, note="(0 = whole rows)"),
                           "MLPs of rows longer than this run in chunks of it (0 = whole rows)"),
    "model.seed": Key(0, K.integer(0), "seed of the random init"),
    "model.tiny.family": Key("qwen2_5_vl", K.one_of(*CH.FAMILIES), "architecture family of the tiny model"),
    "model.tiny.hidden": Key(128, K.integer(1), "text hidden size"),
    "model.tiny.intermediate": Key(256, K.integer(1), "text MLP size"),
    "model.tiny.layers": Key(2, K.integer(1), "text decoder layers"),
    "model.tiny.heads": Key(4, K.integer(1), "attention heads (head size hidden / heads, even)"),
    "model.tiny.kv_heads": Key(2, K.integer(1), "key / value heads (grouped-query attention; divides heads)"),
    "model.tiny.vision_depth": Key(2, K.integer(1), "vision tower blocks"),
    "model.tiny.vision_hidden": Key(64, K.integer(1), "vision hidden size"),
    "model.tiny.vision_intermediate": Key(128, K.integer(1), "vision MLP size"),
    "model.tiny.vision_heads": Key(4, K.integer(1), "vision attention heads"),
    "model.tiny.tie": Key(True, K.boolean(), "tie the LM head to the token embedding"),
    "model.tiny.mrope_section": Key((), K.integers(1, lengths=(0, 3), note="(t, h, w) sizes summing to head_dim / 2"),
                                    "M-RoPE (t, h, w) sections of head_dim / 2; () = the default split"),
    "model.lora.rank": Key(0, K.integer(0, note="(0 = off: full fine-tuning)"),
                           "LoRA rank r: train adapters A [in, r], B [r, out] on model.lora.targets, the base frozen; "
                           "0 = full fine-tuning"),
    "model.lora.alpha": Key(16.0, K.number(0, lo_open=True), "LoRA alpha: the adapters' scale is alpha / rank"),
    "model.lora.dropout": Key(0.0, K.number(0, 1, hi_open=True),
                              "LoRA dropout; only 0 (adapters are merged into the weights at the forward)"),
    "model.lora.targets": Key(CH.LORA_TEXT_TARGETS, K.strings("regexes, re.search-ed over '/'-joined parameter paths"),
                              "the Linear kernels LoRA adapts; a pattern that matches nothing is an error; default: "
                              "the decoder's q/k/v/o and gate/up/down projections"),
    "model.quantize": Key("", K.one_of("", *CH.QUANTIZE),
                          "QLoRA: the frozen base's adapted kernels stored blockwise quantized (int8 or nf4), "
                          "dequantized at each merge; '' = off. Needs model.lora.rank > 0"),
    # ------------------------------------------------------------------ tokenizer
    "tokenizer.path": Key("", K.folder_or_empty("a tokenizer folder; '' = the model folder's"),
                          "tokenizer folder; '' = the model folder's tokenizer"),
    # ------------------------------------------------------------------ data
    "data.format": Key("native", K.one_of(*CH.DATA_FORMATS),
                       "format of the record files (launch.convert_data converts between them)"),
    "data.train_files": Key((), K.strings("files, folders or globs"), "training records: files, folders or globs"),
    "data.eval_files": Key((), K.strings("files, folders or globs"),
                           "held-out records for the periodic offline eval (native): files, folders or globs"),
    "data.image_root": Key("", K.folder_or_empty("the folder relative image paths start from"),
                           "guilibra_sft: the folder relative image paths start from"),
    "data.method": Key("guilibra", K.one_of(*CH.TARGET_FORMATS),
                       "the target format: guilibra (<think> + <answer> JSON) | mopd (Qwen3-VL tool calls)"),
    "data.system_prompt": Key("", K.template(("platform", "actions")),
                              "'' = the method's own system turn; else a template that may use {platform} and "
                              "{actions} (a short one keeps CPU demos fast)"),
    "data.mix": Key("both", K.probability_or("both", "reasoning", "direct"),
                    "both (each step as a reasoning and a direct-action sample: 1:1) | reasoning | direct | a "
                    "probability of keeping the reasoning, e.g. '0.5'"),
    "data.max_length": Key(4096, K.integer(1),
                           "tokens; longer samples are filtered (counted, never silently); RL: the prompt's length "
                           "(the releases' max_prompt_length)"),
    "data.seq_buckets": Key((), K.integers(1, note="padded lengths; () = one bucket of data.max_length"),
                            "padded lengths; () = one bucket of data.max_length (no recompiles)"),
    "data.patch_bucket": Key(2048, K.Check(lambda v: isinstance(v, int) and v >= 4 and v % 4 == 0,
                                           "a positive multiple of 4 (2 x 2 patches merge into one token)"),
                             "pixel (patch) rows per batch are rounded up to a multiple of this"),
    "data.min_pixels": Key(0, K.integer(0, note="(0 = the family's default)"),
                           "image processor's lower bound in pixels; 0 = the family's default"),
    "data.max_pixels": Key(0, K.integer(0, note="(0 = the family's default)"),
                           "image processor's upper bound in pixels; 0 = the family's default"),
    "data.pixels": Key({}, K.Check(_pixel_bounds_ok, "platform -> (min, max) pixel counts with 0 <= min <= max "
                                                     "(0: data.min_pixels / data.max_pixels)"),
        "per-platform (min, max) pixel bounds, e.g. {'mobile': (40768, 548800)}; 0 or an unlisted platform: "
        "data.min_pixels / data.max_pixels (data.images.PixelBudgets)"),
    "data.open_think": Key("auto", K.one_of(*CH.OPEN_THINK),
                           "prompts end with '<think>\\n' as Qwen3-VL-*-Thinking templates do: auto (the tokenizer's "
                           "chat template decides) | on | off"),
    "data.rebalance.step_keep": Key((), K.Check(lambda v: isinstance(v, (tuple, list)) and all(
        K._is_number(p) and 0.0 <= p <= 1.0 for p in v), "keep probabilities in [0, 1], one per step index"),
        "keep probability per step index, e.g. (0.3, 0.6): step 0 kept with 0.3, step 1 with 0.6, later steps "
        "always; () = off"),
    "data.rebalance.max_share": Key({}, K.Check(lambda v: hasattr(v, "items") and all(
        K._is_number(x) and 0.0 < x < 1.0 for x in v.values()), "domain -> a share in (0, 1)"),
        "largest share a domain may hold, e.g. {'mobile': 0.5}; {} = off"),
    "data.rebalance.key": Key("platform", K.one_of(*CH.REBALANCE_KEYS),
                              "the record field naming the domain: platform | source"),
    "data.batch_size": Key(8, K.integer(1), "samples (RL: prompts) per step over all processes"),
    "data.seed": Key(0, K.integer(0), "seed of the data pipeline (shuffle, sampling)"),
    "data.workers": Key(0, K.integer(0), "data-loading worker processes (0 = in the training process)"),
    "data.pack": Key(False, K.boolean(), "pack several samples into one row (SFT)"),
    "data.max_bad_fraction": Key(0.05, K.number(0, 1),
                                 "the run stops when more than this fraction of the records read are bad (skipped "
                                 "and counted by reason)"),
    "data.synthetic.enabled": Key(False, K.boolean(),
                                  "the bundled synthetic world instead of data.train_files / data.eval_files"),
    "data.synthetic.mix_with_files": Key(False, K.boolean(),
                                         "train on the world and data.train_files both (native files only); files "
                                         "given with the world without it are an error"),
    "data.synthetic.platforms": Key(CH.PLATFORMS, K.Check(lambda v: isinstance(v, (tuple, list)) and len(v) > 0 and all(
        p in CH.PLATFORMS for p in v), f"a non-empty tuple from {CH.PLATFORMS}"), "platforms of the world"),
    "data.synthetic.tasks": Key(200, K.integer(1), "tasks generated per platform"),
    "data.synthetic.platform_tasks": Key({}, K.Check(lambda v: hasattr(v, "items") and all(
        p in CH.PLATFORMS and isinstance(n, int) and not isinstance(n, bool) and n >= 1 for p, n in v.items()),
        f"a mapping platform -> tasks (an integer >= 1), platforms from {CH.PLATFORMS}"),
        "tasks of the platforms it names, instead of data.synthetic.tasks (e.g. {'desktop': 480, 'mobile': 96}: "
        "a 5:1 mix)"),
    "data.synthetic.seed": Key(0, K.integer(0), "seed of the world"),
    "data.synthetic.test_fraction": Key(0.2, K.number(0, 1, hi_open=True), "fraction of the tasks held out"),
    "data.synthetic.tokenizer_vocab": Key(1024, K.integer(DEMO_MIN_VOCAB, note="(Qwen's special tokens + 256 bytes)"),
                                          "vocabulary size of the demo tokenizer built for the world"),
    "data.synthetic.tokenizer_spell_quoted": Key(False, K.boolean(),
                                                 "the demo tokenizer learns no merges from the strings quoted in "
                                                 "instructions (names, passwords to type): they are spelled from "
                                                 "frequent pieces, not rare whole-word tokens"),
    # ------------------------------------------------------------------ loss (ASFT)
    "loss.alpha_action": Key(2.0, K.number(0), "ASFT weight of action tokens"),
    "loss.alpha_grounding": Key(4.0, K.number(0), "ASFT weight of grounding (coordinate) tokens"),
    "loss.normalize": Key("sample", K.one_of(*CH.NORMALIZATIONS),
                          "sample (the paper: per-sample weighted mean) | token (Σ w·nll / Σ w, the release's)"),
    "loss.weighting": Key("paper", K.one_of(*CH.WEIGHTINGS),
                          "paper: reasoning 1 / action alpha_action / coordinate digits alpha_grounding | release: "
                          "x alpha_action inside <answer>, x alpha_grounding from \"point_2d\": on"),
    "loss.logits_chunk": Key(128, K.integer(1, note="(loss positions per row per LM-head chunk)"),
                             "loss positions per row per LM-head chunk (guilibra_jax/head_loss.py)"),
    # ------------------------------------------------------------------ optim
    "optim.lr": Key(1e-5, K.number(0, lo_open=True), "peak learning rate"),
    "optim.warmup_steps": Key(0, K.integer(0), "steps of linear warmup from 0 to optim.lr"),
    "optim.schedule": Key("cosine", K.one_of(*CH.SCHEDULES), "learning-rate schedule after the warmup"),
    "optim.end_lr_fraction": Key(0.0, K.number(0, 1), "the schedule's final learning rate as a fraction of optim.lr"),
    "optim.weight_decay": Key(0.0, K.number(0), "AdamW weight decay"),
    "optim.b1": Key(0.9, K.number(0, 1, hi_open=True), "Adam beta1"),
    "optim.b2": Key(0.999, K.number(0, 1, hi_open=True), "Adam beta2"),
    "optim.eps": Key(1e-8, K.number(0, lo_open=True), "Adam epsilon"),
    "optim.clip_norm": Key(1.0, K.number(0, note="(0 = no clipping)"), "global gradient-norm clip (0 = no clipping)"),
    "optim.lr_multipliers": Key({}, K.regex_to_number(0.0), "parameter-path regex -> learning-rate factor"),
    "optim.freeze": Key((), K.regexes("parameter paths not trained"), "parameter-path regexes not trained"),
    "optim.ema_decay": Key(0.0, K.number(0, 1, hi_open=True, note="(0 = off)"),
                           "moving average of the trained parameters (float32, in the optimizer state, from the "
                           "initial ones); the export and launch.convert write it, not the last ones (0 = off)"),
    # ------------------------------------------------------------------ rl (stage 2: grpo, mopd)
    "rl.group_size": Key(8, K.integer(2, note="(group-relative advantages)"),
                         "G responses per prompt (data.batch_size prompts per round)"),
    "rl.temperature": Key(1.0, K.number(0, lo_open=True, note="(on-policy sampling)"), "sampling temperature"),
    "rl.top_p": Key(0.98, K.number(0, 1, lo_open=True), "nucleus sampling (1.0 = off)"),
    "rl.top_k": Key(0, K.integer(0, note="(0 = off)"), "top-k sampling (0 = off)"),
    "rl.max_new_tokens": Key(256, K.integer(1), "response length limit in tokens"),
    "rl.ppo_epochs": Key(1, K.integer(1), "passes over each round; optimizer updates per round = ppo_epochs x "
                                          "minibatches"),
    "rl.minibatches": Key(1, K.integer(1), "optimizer updates per pass over a round"),
    "rl.clip_low": Key(0.2, K.number(0, 1, hi_open=True), "PPO ratio clip below: 1 - clip_low"),
    "rl.clip_high": Key(0.2, K.number(0), "PPO ratio clip above: 1 + clip_high"),
    "rl.aggregation": Key("token_mean", K.one_of(*CH.AGGREGATIONS),
                          "how per-token terms become the loss (losses.aggregate_terms)"),
    "rl.normalize_std": Key(True, K.boolean(), "group advantages (r - mean) / std; False: r - mean (UI-MOPD)"),
    "rl.std_unbiased": Key(False, K.boolean(),
                           "that std divides by G - 1 (torch.std; GUI-Libra's EasyR1) instead of G"),
    "rl.dual_clip": Key(0.0, K.Check(lambda v: K._is_number(v) and (v == 0 or v > 1.0),
                                     "0 (off) or a constant > 1 (the releases use 3.0 and 10.0)"),
                        "dual-clip PPO constant c > 1 capping -A*ratio for A < 0 (EasyR1 3.0, UI-MOPD's veRL run "
                        "10.0); 0 = off"),
    "rl.kl_beta": Key(0.001, K.number(0, note="(the conservative recipe uses > 0)"),
                      "GRPO: weight of the KL to the reference, its trust region (> 0 by design)"),
    "rl.kl_kind": Key("k3", K.one_of(*CH.KL_KINDS), "GRPO: the KL estimator"),
    "rl.kl_clamp": Key(10.0, K.number(0, note="(0 = no clamp)"), "clamp of the per-token KL (0 = no clamp)"),
    "rl.reference": Key("", K.text("an HF folder, training workdir, random:<seed> or http(s) URL of a served "
                                   "scorer; '' = the starting policy"),
                        "GRPO: the frozen reference (HF folder, training workdir, random:<seed>, or the URL of a "
                        "served scorer: rl.served); '' = the starting policy"),
    "rl.sngs.enabled": Key(True, K.boolean(), "GRPO: success-adaptive negative gradient scaling"),
    "rl.sngs.lambda0": Key(0.5, K.number(0, 1), "lambda = min(lambda0 + kappa * signal, 1)"),
    "rl.sngs.kappa": Key(1.5, K.number(0), "lambda's slope in the group's signal"),
    "rl.sngs.signal": Key("mean_reward", K.one_of(*CH.SNGS_SIGNALS),
                          "the group's signal: mean_reward (the release) | success_rate (the paper's p^)"),
    "rl.reward.w_fmt": Key(0.1, K.number(0, 1), "GRPO: total = w_fmt * format + (1 - w_fmt) * accuracy"),
    "rl.reward.value_rule": Key("paper", K.one_of(*CH.REWARD_RULES),
                                "GRPO typed values: paper (word F1 > 0.5) | release (token-set F1 >= 0.5 or one word "
                                "inside the other; points strictly inside the box)"),
    "rl.reward.point_tolerance": Key(0.05, K.number(0),
                                     "GRPO: a point this close to the demo point counts when the demo has no box "
                                     "(unit space: [0, 1] of the image side)"),
    "rl.reward.grounding_sigma": Key(0.0, K.number(0),
                                     "GRPO: 0 = the paper's binary grounding; > 0 = a missed point earns "
                                     "0.5 * exp(-d^2 / (2 sigma^2)), d its distance to the demo box (unit space)"),
    "rl.reward.format_rule": Key("paper", K.one_of(*CH.REWARD_RULES),
                                 "GRPO format reward: paper (parses) | release (r1gui.py)"),
    "rl.reward.mopd_rule": Key("strict", K.one_of(*CH.MOPD_REWARD_RULES),
                               "MOPD reward: strict (ours) | release (gui_agent.py)"),
    "rl.reward.check_tool_name": Key(True, K.boolean(), "MOPD: the type point needs the label's tool name too"),
    "rl.teachers": Key({}, K.mapping_of_text("platform label -> teacher folder, random:<seed> or http(s) URL; "
                                             "'*' = any other"),
                       "MOPD: platform label -> HF folder, training workdir, random:<seed> or URL of a served scorer "
                       "(rl.served) ('*': any other)"),
    "rl.teacher_model_name": Key("", K.text("a named size for launch.plan; '' = the policy's"),
                                 "architecture of unset teachers for launch.plan (a named size); '' = the policy's"),
    "rl.mopd.beta": Key(0.01, K.number(0), "weight of the teachers' distillation term"),
    "rl.mopd.kl_mask_tau": Key(0.1, K.number(0, 1),
                               "KL mask: groups whose pass rate exceeds it get no teachers' term"),
    "rl.mopd.pass_floor": Key(0.01, K.number(0, 1),
                              "advantages of groups whose pass rate is below it are zeroed (KL mask not off)"),
    "rl.mopd.kl_mask": Key("paper", K.one_of(*CH.KL_MASKS),
                           "adaptive KL mask and pass-rate floor: off (the UI-MOPD release script) | paper (the "
                           "paper's method) | release (the release's off-by-default use_kl_loss_mask path)"),
    "rl.mopd.estimator": Key("k3", K.one_of(*CH.MOPD_ESTIMATORS),
                             "the distillation term (losses.mopd_loss): k3 (the paper, the release) | "
                             "logratio_advantage (on-policy distillation) | full_kl (exact reverse KL)"),
    "rl.mopd.task_reward": Key(True, K.boolean(),
                               "False: every advantage 0, the teachers' term alone (distillation)"),
    "rl.update_groups": Key(0, K.integer(0, note="(0 = every prompt of a round)"),
                            "groups (prompts) per update over all processes; 0 = every prompt of the round"),
    "rl.group_filter.enabled": Key(False, K.boolean(),
                                   "DAPO-style dynamic sampling (UI-MOPD release: on): drop groups whose pass rate "
                                   "is 0 or 1, sample more rounds"),
    "rl.group_filter.max_rounds": Key(10, K.integer(0, note="(0 = no limit)"),
                                      "rounds per update at most (0 = no limit, the release)"),
    "rl.group_filter.greedy_wrong": Key(False, K.boolean(),
                                        "also drop groups whose prompt's greedy response passes (keep states where the "
                                        "policy's mode is wrong and a sample is right)"),
    "rl.demo_in_failed_groups": Key(False, K.boolean(),
                                    "GRPO: in a group where no sample passes, the last response becomes the record's "
                                    "demonstrated action (off-policy guidance; old log-probs recomputed; demo/* metrics)"),
    "rl.sft_replay.every": Key(0, K.integer(0, note="(0 = off)"),
                               "one ASFT step (loss.*) on data.train_files after every this many RL rounds, same "
                               "optimizer: replay against forgetting (0 = off)"),
    "rl.sft_replay.batch_size": Key(0, K.integer(0, note="(0 = data.batch_size)"),
                                    "packed rows per replay micro-batch over all processes (0 = data.batch_size)"),
    "rl.served.timeout": Key(120.0, K.number(0, lo_open=True), "seconds per request to a served scorer"),
    "rl.served.retries": Key(3, K.integer(0), "more attempts per failed request (backoff 1 s x 2^k, jittered, <= 30 s)"),
    "rl.served.concurrency": Key(8, K.integer(1), "requests in flight per served scorer and process"),
    "rl.served.rows_per_request": Key(8, K.integer(1), "rows (prompt + response) per request to a served scorer"),
    "rl.served.max_failed_steps": Key(3, K.integer(0, note="(0 = never stop)"),
                                      "stop the run after this many consecutive steps in which a served scorer "
                                      "scored none of its rows (0 = never)"),
    "rl.score_chunk": Key(0, K.integer(0, note="(0 = off)"),
                          "vocabulary projection over T-chunks of this size when scoring (0 = off)"),
    "rl.old_logprobs": Key("auto", K.one_of(*CH.OLD_LOGPROBS),
                           "old-policy log-probs of the PPO ratio: auto (the sampler's own unless sampling is top-p "
                           "/ top-k truncated) | sampler | recompute (a scoring pass)"),
    "rl.generation_rows": Key(0, K.integer(0, note="(0 = a whole round per call)"),
                              "rows (responses) per sampler call over all processes, bounding the KV cache (0 = a "
                              "whole round in one call)"),
    "rl.score_rows": Key(0, K.integer(0, note="(0 = a whole round per call)"),
                         "rows per scoring call over all processes, bounding the scoring activations (0 = a whole "
                         "round in one call)"),
    "rl.share_prefill": Key(True, K.boolean(),
                            "sample a prompt's G rows from one prefill (KV cache shared by the group); False: one "
                            "prefill per row (G x the work)"),
    "rl.world": Key("", K.one_of(*CH.RL_WORLDS),
                    "where prompts come from: '' = the dataset (data.train_files / data.synthetic) | miniwob (live "
                    "MiniWoB++ pages, GRPO) | synthetic (live synthetic-world episodes on train task seeds, GRPO)"),
    "rl.online.workers": Key(2, K.integer(1, note="(browser processes per process)"),
                             "browser processes per process (one live episode, one prompt each)"),
    "rl.online.tasks": Key((), K.strings("MiniWoB++ task names with an expert; () = all of envs.miniwob.TASKS"),
                           "task names; () = every task with an expert (envs.miniwob.TASKS)"),
    "rl.online.scale": Key(1.0, K.number(0, lo_open=True, note="(device pixels per CSS pixel)"),
                           "device pixels per CSS pixel (1: 160 x 210 screenshots)"),
    "rl.online.max_steps": Key(0, K.integer(0, note="(0 = the task's own limit)"),
                               "an episode ends (failed) after this many actions; 0 = the task's own limit "
                               "(envs.miniwob.env: 10, click-checkboxes-large 16)"),
    "rl.online.play": Key("first", K.one_of(*CH.ONLINE_PLAYS),
                          "what each live episode executes: first (its group's first sample, the release's) | "
                          "greedy (a greedy answer, one more row per prompt: the states launch.eval's agent reaches)"),
    "rl.online.stop_at_mistake": Key(False, K.boolean(),
                                     "end an episode (failed) at its first wrong executed action: training states "
                                     "are the policy's own, but never those after its mistakes (no recovery labels)"),
    # ------------------------------------------------------------------ mesh
    "mesh.data": Key(-1, _MESH_AXIS, "data-parallel axis size (-1 = the rest of the devices)"),
    "mesh.fsdp": Key(1, _MESH_AXIS, "parameter-sharding (FSDP) axis size (-1 = the rest of the devices)"),
    "mesh.tensor": Key(1, _MESH_AXIS, "tensor-parallel axis size (-1 = the rest of the devices)"),
    # ------------------------------------------------------------------ train
    "train.steps": Key(100, K.integer(1), "training steps (RL: rounds, each with its updates)"),
    "train.grad_accum": Key(1, K.integer(1), "micro-batches per optimizer update (exact gradient accumulation)"),
    "train.log_every": Key(10, K.integer(1), "steps between metrics rows"),
    "train.checkpoint_every": Key(100, K.integer(1), "steps between checkpoints"),
    "train.keep_checkpoints": Key(2, K.integer(1), "checkpoints kept (the newest)"),
    "train.async_checkpoints": Key(True, K.boolean(), "write checkpoints in the background"),
    "train.eval_every": Key(0, K.integer(0, note="(0 = no periodic eval)"),
                            "steps between offline evals on held-out records (0 = no periodic eval)"),
    "train.eval_samples": Key(64, K.integer(1), "held-out samples per eval"),
    "train.eval_max_new_tokens": Key(96, K.integer(1), "response length limit of the eval, in tokens"),
    "train.export": Key(True, K.boolean(), "Hugging Face export at the end"),
    "train.export_dir": Key("", K.text("'' = workdir/export"), "folder of the export; '' = workdir/export"),
    "train.tensorboard": Key("auto", K.Check(lambda v: v == "auto" or isinstance(v, bool),
                                             "'auto' (when tensorboardX is installed), True or False"),
                             "TensorBoard event files: 'auto' (if tensorboardX is installed) | True | False",
                             any_type=True),
    "train.progress": Key(True, K.boolean(), "a progress bar (steps, ETA, loss, tokens/s)"),
    "train.max_skipped_updates": Key(10, K.integer(0, note="(0 = never stop)"),
                                     "stop after this many consecutive non-finite updates (0 = never)"),
    "train.memory_plan": Key(True, K.boolean(),
                             "compile the run's programs ahead of time and write memory_plan.json"),
    "train.allow_config_change": Key(False, K.boolean(),
                                     "a rerun may change the run's config (recorded in config_history.jsonl)"),
    "train.wandb.project": Key("", K.text("'' = off"), "Weights & Biases project; '' = off"),
    "train.wandb.entity": Key("", K.text(), "W&B entity; '' = the default"),
    "train.wandb.name": Key("", K.text(), "W&B run name; '' = the workdir's name"),
    "train.wandb.mode": Key("online", K.one_of(*CH.WANDB_MODES), "W&B mode (offline: no network)"),
    "train.wandb.tags": Key((), K.strings(), "W&B tags"),
    "train.profile_steps": Key((), K.Check(_profile_steps_ok, "() or (start, stop) with 1 <= start < stop"),
        "(start, stop): jax.profiler trace of steps start..stop-1 into workdir/profile; () = off"),
    "train.compilation_cache_dir": Key("auto", K.text("'auto', '' (off) or a folder"),
                                       "persistent XLA cache: 'auto' = workdir/compilation_cache, '' = off, or a path"),
    "train.curves": Key(True, K.boolean(),
                        "training curves (loss, held-out accuracy) as workdir/curves.png at the end"),
    "print_only": Key(False, K.boolean(),
                      "launch.train: print the resolved, validated config (and memory plan) and exit"),
    # ------------------------------------------------------------------ hardware (what the recipe is sized for)
    "hardware.name": Key("1 x CPU", K.text(), "the hardware in words, e.g. '1 x 8 H100 80GB'"),
    "hardware.hosts": Key(1, K.integer(1), "hosts (processes)"),
    "hardware.devices_per_host": Key(1, K.integer(1), "accelerators per host"),
    "hardware.device_memory_gib": Key(0.0, K.number(0, note="(0 = unknown)"),
                                      "memory per device in GiB (0 = unknown, e.g. a CPU)"),
    "hardware.topology": Key("", K.text("a TPU slice such as 'v5p:2x2x2', or '' for none"),
                             "a TPU slice ('v5p:2x2x2'): launch.plan compiles for it with the TPU compiler; '' = none"),
    # ------------------------------------------------------------------ distributed
    "distributed.coordinator_address": Key("", K.host_port(),
                                           "host:port of process 0; '' = from the environment (JAX_COORDINATOR_"
                                           "ADDRESS, SLURM, a TPU VM) or one process"),
    "distributed.num_processes": Key(0, K.integer(0), "processes; 0 = from the environment (JAX_NUM_PROCESSES)"),
    "distributed.process_id": Key(-1, K.integer(-1), "this process's id; -1 = from the environment (JAX_PROCESS_ID)"),
    "distributed.local_device_ids": Key("", K.device_ids(),
                                        "this process's devices, e.g. '0,1,2,3'; '' = all it sees"),
}

# One rule per key (the table's): full key -> check of its type and range.
RULES: dict[str, K.Check] = {key: k.rule for key, k in KEYS.items()}

# A section's longer explanation: the paragraph above its table in docs/config.md.
SECTIONS: dict[str, str] = {
    "": "Top-level keys. `method` picks the trainer; `print_only` (or `--dry_run`) stops after validation.",
    "model": "The policy: a Hugging Face folder (`model.hf_path`, also a Hub id: `launch.train` resolves it) or a "
             "random init of `model.name`.",
    "model.tiny": "The random-init model of `model.name = 'tiny'` (no `model.hf_path`): CPU demos and tests.",
    "model.lora": "LoRA (`model.lora.rank > 0`; sft, grpo and mopd): the optimizer and the checkpoints hold only "
                  "the adapters; the base (`model.hf_path`, or the random init) stays frozen and is read again on "
                  "resume. GRPO's reference is then the base itself (no second copy) unless `rl.reference` names "
                  "another model. "
                  "The run exports the merged model (`export/`) and the adapter alone in PEFT's format (`adapter/`, "
                  "for `peft.PeftModel.from_pretrained` and vLLM's LoRA serving). QLoRA (`model.quantize`): the "
                  "kernels LoRA adapts are kept quantized, 64 entries per float32 scale (guilibra_jax/quantize.py); "
                  "a resumed run checks its base against `lora_base.json` in the workdir.",
    "data": "Records, prompts and batches. `data.batch_size` is the batch over all processes (SFT: samples; RL: "
            "prompts per round) and must divide by the process count.",
    "data.rebalance": "GUI-Libra's RL subset (`data.mixing.rebalance`), applied before `data.mix`.",
    "data.synthetic": "The bundled synthetic world instead of `data.train_files` / `data.eval_files`; files given "
                      "with it are an error unless `mix_with_files=True` (train on both: native files only).",
    "loss": "ASFT (`method = sft`): GUI-Libra's action-aware token weights.",
    "optim": "AdamW after a linear warmup, then `optim.schedule`. Regexes of `optim.lr_multipliers` and "
             "`optim.freeze` must match parameter paths (checked where the model is built).",
    "rl": "Stage 2 (`method = grpo` or `mopd`): each round samples `rl.group_size` responses to each of "
          "`data.batch_size` prompts, then updates `rl.ppo_epochs x rl.minibatches` times. A round's rows "
          "(`data.batch_size x rl.group_size`) go through the sampler and the scorer in calls of "
          "`rl.generation_rows` / `rl.score_rows` rows, so the KV cache and the scoring activations are bounded by "
          "them. `rl.old_logprobs = auto` takes the sampler's own log-probs when sampling is not truncated: one "
          "scoring pass less per step. `rl.share_prefill`: the vision tower and the prompt run once per group, "
          "their KV cache shared by its G rows. `rl.world = 'miniwob'`: prompts from live MiniWoB++ pages in "
          "headless Chromium (GRPO on on-policy states, labelled by the DOM experts; `train/rl/online.py`; the "
          "optional `[miniwob]` extra), with `data.batch_size = rl.online.workers x processes`. `rl.world = "
          "'synthetic'`: the same on live episodes of the synthetic world (train task seeds of "
          "`data.synthetic.seed`, each state labelled by the world's expert; `envs/synthetic_pool.py`), in process.",
    "rl.sngs": "GUI-Libra's success-adaptive negative gradient scaling (GRPO): a group's negative advantages are "
               "multiplied by lambda = min(lambda0 + kappa * signal, 1).",
    "rl.reward": "The verifier rewards (`guilibra_jax/rewards.py`). GRPO: total = w_fmt * format + (1 - w_fmt) * "
                 "accuracy. MOPD: 1 for a full match, -0.5 for a partial one, -1 when unparsable.",
    "rl.mopd": "UI-MOPD: the teachers' term and the adaptive KL mask (`train/rl/advantages.py`). "
               "`rl.mopd.estimator` (`losses.mopd_loss`): k3 (the paper, the release); logratio_advantage "
               "(beta * (log pi_teacher - log pi_student) as a per-token advantage: on-policy distillation); full_kl "
               "(exact reverse KL over the vocabulary: the teachers run inside the update, with the policy's "
               "vocabulary and inputs). The pass-rate floor is on exactly when `rl.mopd.kl_mask` is not off.",
    "rl.served": "Served scorers (`guilibra_jax/served_scorer.py`): an `http(s)://` URL in `rl.teachers.<label>` or "
                 "`rl.reference` names an OpenAI-compatible server (vLLM `serve`, the same tokenizer) that returns the "
                 "log-probs of our prompt + response tokens (`prompt_logprobs`: text-only prompts as token ids to "
                 "`/v1/completions`, prompts with a screenshot as chat messages to `/v1/chat/completions`); nothing "
                 "of it sits on the mesh. Each process sends its own rows. A row whose request fails every attempt is "
                 "dropped from the KL term (weight 0) and counted (`served/<label>/dropped_rows`), as is a response "
                 "the server retokenizes (`served/<label>/retokenized`); a prompt the server tokenizes differently "
                 "is a one-line error. rl.temperature 1, not with full_kl.",
    "rl.group_filter": "DAPO-style dynamic sampling (the UI-MOPD release: on): groups whose pass rate is 0 or 1 are "
                       "dropped and more rounds of `data.batch_size` prompts are sampled until `rl.update_groups` "
                       "groups are kept; after `max_rounds` rounds (0 = no limit, the release) the update is "
                       "completed with dropped groups that carry no loss (logged as `group_filter/short_groups`). "
                       "`greedy_wrong`: one greedy decode per prompt (shared with greedy play); a group is kept only "
                       "if that response fails, so updates act where greedy play and evaluation would change "
                       "(`group_filter/greedy_right` counts the groups it drops).",
    "rl.online": "`rl.world = 'miniwob'` / `'synthetic'`: the live episodes' slots (`data.batch_size = "
                 "rl.online.workers x processes`).",
    "mesh": "The device mesh: at most one axis is -1 (the rest of the devices); rows are split over data x fsdp.",
    "train": "The run harness: steps, checkpoints, evals, export and logging.",
    "train.wandb": "Weights & Biases (`pip install 'guilibra_jax[wandb]'`); `project = ''` leaves it off.",
    "hardware": "What the recipe is sized for: `launch.plan`'s defaults (devices = hosts x devices_per_host, "
                "device_memory_gib). The mesh must divide hosts x devices_per_host. Recipes set it with "
                "`hardware(...)` and the presets of `train/config.py` (`H100_1x8`, `V5P_2x2x2`, ...).",
    "distributed": "Multi-process JAX (`train/distributed.py`): values given win; else SLURM, the "
                   "JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID variables, or a Cloud TPU VM's "
                   "metadata.",
}


def base_config() -> mlc.ConfigDict:
    """The defaults of every key (:data:`KEYS`) as a nested ConfigDict, built afresh."""
    tree: dict[str, Any] = {}
    for key, k in KEYS.items():
        *sections, name = key.split(".")
        node = tree
        for s in sections:
            node = node.setdefault(s, {})
        node[name] = k.fresh()
    return mlc.ConfigDict(tree)


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


# ----------------------------------------------------------------------------- docs from the table
DOCS_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                         "docs", "config.md")


def _sections() -> dict[str, list[str]]:
    """Section ("" for top-level keys, else the key up to its last dot) -> its keys, in
    the order of first appearance in KEYS."""
    out: dict[str, list[str]] = {}
    for key in KEYS:
        out.setdefault(key.rpartition(".")[0], []).append(key)
    return out


def _md(text: str) -> str:
    """Text for a markdown table cell: what markdown would read as syntax, escaped."""
    for ch in "\\|*<":
        text = text.replace(ch, "\\" + ch)
    return text


def key_table_markdown() -> str:
    """docs/config.md: a table per section (key, default, allowed values, doc) from KEYS,
    with the section's SECTIONS paragraph above it."""
    lines = ["# Config keys", "",
             "<!-- Generated from KEYS in guilibra_jax/train/config.py by `python -m guilibra_jax.train.config`; "
             "do not edit (tests/train/test_config_docs.py checks it is current). -->", "",
             "Every key of the training config, declared once in `guilibra_jax/train/config.py` (`KEYS`: default, "
             "rule, doc). Recipes (`configs/*.py`) start from `base_config()` and override; any key can be set on "
             "the command line with `--config.KEY=value`. `launch.train` checks each value against its rule (the "
             "allowed values below) and the rules between keys before anything heavy starts, and stops with one "
             "line naming the key. The enumerations are defined once in `guilibra_jax/choices.py`.", ""]
    for section, keys in _sections().items():
        lines += [f"## {'`' + section + '`' if section else 'Top level'}", ""]
        if SECTIONS.get(section):
            lines += [SECTIONS[section], ""]
        lines += ["| key | default | allowed values | doc |", "| --- | --- | --- | --- |"]
        for key in keys:
            k = KEYS[key]
            lines.append(f"| `{key}` | `{k.default!r}` | {_md(k.rule.expected)} | {_md(k.doc)} |")
        lines.append("")
    return "\n".join(lines)


def key_list_text() -> str:
    """The key list ``launch.train --help`` ends with: each key, its default and its doc."""
    lines = ["", "Config keys (--config.KEY=value; default, then what it does; allowed values: docs/config.md):"]
    for key, k in KEYS.items():
        lines.append(f"  {key} = {k.default!r}: {k.doc}")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    """``python -m guilibra_jax.train.config``: rewrite docs/config.md from KEYS
    (``--check``: exit 1 when it is not current, writing nothing)."""
    text = key_table_markdown()
    current = open(DOCS_PATH).read() if os.path.exists(DOCS_PATH) else None
    if "--check" in argv[1:]:
        print(f"{DOCS_PATH}: {'current' if current == text else 'stale: run python -m guilibra_jax.train.config'}")
        return 0 if current == text else 1
    if current != text:
        with open(DOCS_PATH, "w") as f:
            f.write(text)
    print(f"wrote {DOCS_PATH} ({len(KEYS)} keys)")
    return 0


# ----------------------------------------------------------------------------- validation
# Each key's own rule is its KEYS entry (RULES); rules that involve several keys are
# CROSS_CHECKS below.
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


def _check_lora(c, _known: Known) -> None:
    lo = c.model.lora
    if c.model.quantize and not lo.rank:
        _fail("model.quantize", c.model.quantize, "'' without LoRA: a quantized base is frozen, so only adapters "
              "can train on it (set model.lora.rank > 0)")
    if not lo.rank:
        return
    if lo.dropout:
        _fail("model.lora.dropout", lo.dropout, "0.0: the adapters are merged into the weights at the forward "
              "(W + alpha/r * A @ B), which cannot drop the LoRA input per token as PEFT's lora_dropout does")
    for key in ("optim.freeze", "optim.lr_multipliers"):
        if len(c.optim[key.split(".")[1]]):
            _fail(key, c.optim[key.split(".")[1]], "empty with model.lora.rank > 0 (only the adapters train; choose "
                  "the adapted kernels with model.lora.targets)")


def _check_model(c, known: Known) -> None:
    _check_lora(c, known)
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


def _check_synthetic_and_files(d) -> None:
    """Files given with the synthetic world are never silently left out: an error unless
    data.synthetic.mix_with_files asks for both."""
    s = d.synthetic
    if s.mix_with_files and not s.enabled:
        _fail("data.synthetic.mix_with_files", True, "False when data.synthetic.enabled=False (it adds the "
              "synthetic world to data.train_files)")
    if not s.enabled:
        return
    for key, use in (("train_files", "trains on"), ("eval_files", "evaluates on")):
        files = tuple(d[key])
        if files and not s.mix_with_files:
            raise ConfigError(
                f"config key data.{key} = {files!r} is set while data.synthetic.enabled=True: the run "
                f"{use} the synthetic world and would ignore these files. Set data.synthetic.enabled=False to use "
                f"only the files, or data.synthetic.mix_with_files=True to use both")
    if s.mix_with_files and d.format != "native":
        _fail("data.format", d.format, "'native' with data.synthetic.mix_with_files=True (the synthetic world is "
              "native JSONL; convert the files with launch.convert_data --to=native)")


def _check_data(c, known: Known) -> None:
    d = c.data
    _check_synthetic_and_files(d)
    other = sorted(set(d.synthetic.platform_tasks) - set(d.synthetic.platforms))
    if other:
        _fail("data.synthetic.platform_tasks", dict(d.synthetic.platform_tasks),
              f"platforms of data.synthetic.platforms = {tuple(d.synthetic.platforms)} ({other} are not)")
    online_tokenizer = c.rl.world and (c.model.hf_path or c.tokenizer.path)   # no records needed
    if not known.planning and (d.synthetic.enabled or not online_tokenizer):
        if not d.synthetic.enabled and not d.train_files:
            _fail("data.train_files", d.train_files, "at least one file (or data.synthetic.enabled=True)")
        for key in ("train_files", "eval_files"):
            missing = K.missing_inputs(d[key])
            if missing:
                _fail(f"data.{key}", missing[0], "existing files, folders or globs that match something")
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
    if rl.group_filter.greedy_wrong and not rl.group_filter.enabled:
        _fail("rl.group_filter.greedy_wrong", True, "only with rl.group_filter.enabled (it narrows the groups the "
              "filter keeps)")
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


def _frozen_specs(c) -> list[tuple[str, str]]:
    """(config key, spec) of the run's frozen models: rl.reference (GRPO) or rl.teachers.* (MOPD)."""
    if c.method == "grpo":
        return [("rl.reference", c.rl.reference)] if c.rl.reference else []
    if c.method == "mopd":
        return [(f"rl.teachers.{label}", spec) for label, spec in c.rl.teachers.items()]
    return []


def _frozen_spec_ok(spec: str) -> bool:
    """An existing folder, random:<integer seed> or a served scorer's URL (checked by
    served_scorer.check_url) (frozen models of stage 2)."""
    if is_url(spec):
        return True
    if spec.startswith("random:"):
        return spec[len("random:"):].lstrip("-").isdigit()
    return os.path.isdir(spec)


# rl.reward keys each trainer ignores: GRPO scores GUI-Libra answers, MOPD tool calls.
INERT_REWARD_KEYS = {"mopd": ("w_fmt", "value_rule", "point_tolerance", "grounding_sigma", "format_rule"),
                     "grpo": ("mopd_rule", "check_tool_name")}


def inert_reward_keys(c) -> list[str]:
    """The rl.reward keys set away from their default that c.method's reward does not read
    (a GRPO recipe switched to method=mopd keeps its GUI-Libra reward settings, unused)."""
    return [f"rl.reward.{name}" for name in INERT_REWARD_KEYS.get(c.method, ())
            if c.rl.reward[name] != KEYS[f"rl.reward.{name}"].default]


def _check_rl(c, known: Known) -> None:
    r = c.rl
    for key in inert_reward_keys(c):
        logging.warning("config: %s = %r has no effect with method=%r (its reward is %s)", key,
                        r.reward[key.rsplit(".", 1)[1]], c.method,
                        "the tool-call reward, rl.reward.mopd_rule" if c.method == "mopd" else
                        "GUI-Libra's, rl.reward.w_fmt / value_rule / format_rule / grounding_sigma")
    if r.demo_in_failed_groups and c.method != "grpo":
        _fail("rl.demo_in_failed_groups", True, f"only with method=grpo (the demonstrated action is GUI-Libra's "
              f"label; method is {c.method!r})")
    if r.demo_in_failed_groups and r.old_logprobs == "sampler":
        _fail("rl.old_logprobs", r.old_logprobs, "auto or recompute with rl.demo_in_failed_groups: the sampler "
              "did not draw the demonstrated responses, so it has no log-probs of them")
    if r.old_logprobs == "sampler" and (r.top_p < 1.0 or r.top_k):
        _fail("rl.old_logprobs", r.old_logprobs, f"auto or recompute when sampling is truncated (rl.top_p = "
              f"{r.top_p}, rl.top_k = {r.top_k}): the sampler's log-probs are then not the policy's")
    served = [(key, spec) for key, spec in _frozen_specs(c) if is_url(spec)]
    for key, spec in served:
        check_url(key, spec)
    if served and r.temperature != 1.0:
        _fail("rl.temperature", r.temperature, f"1.0 with a served scorer ({served[0][0]}): the server's "
              f"prompt log-probs are of the raw logits (temperature 1)")
    if served and c.method == "mopd" and r.mopd.estimator == "full_kl":
        _fail("rl.mopd.estimator", r.mopd.estimator, f"k3 or logratio_advantage with a served teacher "
              f"({served[0][0]}): full_kl needs the teacher's logits on the mesh")
    if c.method == "grpo":
        if r.reference and not _frozen_spec_ok(r.reference) and not known.planning:
            _fail("rl.reference", r.reference, "an existing HF folder, training workdir, random:<seed> or "
                  "http(s):// URL of a served scorer ('' = the starting policy)")
        if c.data.method != "guilibra":
            _fail("data.method", c.data.method, "guilibra for method=grpo (GUI-Libra rewards)")
    if c.method == "mopd":
        if not r.teachers:
            _fail("rl.teachers", dict(r.teachers), "a mapping platform label -> teacher folder")
        for label, path in r.teachers.items():
            if not _frozen_spec_ok(path) and not known.planning:
                _fail(f"rl.teachers.{label}", path, "an existing HF folder, training workdir, random:<seed> or "
                      "http(s):// URL of a served scorer")
        if c.data.synthetic.enabled:
            check_teachers(r.teachers, c.data.synthetic.platforms)
        if c.data.method != "mopd":
            _fail("data.method", c.data.method, "mopd for method=mopd (tool-call rewards)")


def _check_world(c, known: Known) -> None:
    """rl.world: GRPO only, one prompt per live slot; "miniwob": tasks with an expert, and
    the [miniwob] extra with Chromium present (the environment's own message)."""
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
    if r.world == "synthetic":
        if tuple(r.online.tasks):
            _fail("rl.online.tasks", tuple(r.online.tasks), "() with rl.world='synthetic' (its tasks are the "
                  "platforms of data.synthetic.platforms)")
        return
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


if __name__ == "__main__":
    sys.exit(main(sys.argv))
