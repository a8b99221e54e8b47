"""The fixed parts of a stage-2 run, built once by :func:`setup`: the policy and its
optimizer state, the frozen models (GRPO's reference, MOPD's teachers), the jitted
update, the sampler's settings; and the facts of the config every phase reads."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
from flax import nnx

from guilibra_jax import generate as G
from guilibra_jax import sharding as S
from guilibra_jax.errors import ConfigError
from guilibra_jax.train import data_source, model_factory
from guilibra_jax.train.lora_state import FrozenBase
from guilibra_jax.train.rl import frozen as FZ
from guilibra_jax.train.rl import replay as RP
from guilibra_jax.train.rl import rollout as RO
from guilibra_jax.train.rl.step import make_rl_step
from guilibra_jax.train.state import jit_update, optimizer_from_config, sharded_state


@dataclasses.dataclass
class Stage2:
    """What every phase needs, built once per run by :func:`setup`."""

    config: Any
    mesh: Any
    graphdef: Any
    model_config: Any
    tokenizer: Any
    sampling: G.SamplingConfig
    frozen: dict
    update_fn: Any          # jitted (state, batch) -> (state, metrics)
    pad_id: int
    stop: tuple
    banned: tuple
    row_multiple: int       # rows per process of any global batch: a multiple of this
    think_opened: bool = False   # prompts open <think> (data.open_think): responses may lack it
    lora: Any = None        # LoRA (model.lora.rank > 0): lora_state.FrozenBase; the state's params are adapters
    replay_fn: Any = None   # rl.sft_replay: the jitted ASFT step on the same state (replay.make_replay_fn)

    def policy(self, params):
        """The policy's model parameters from the state's ``params``: themselves, or with
        LoRA the frozen base + alpha/r A @ B (what sampling and scoring run on)."""
        return params if self.lora is None else self.lora.merged(params)

    @property
    def rl(self):
        return self.config.rl

    @property
    def method(self) -> str:
        return self.config.method

    @property
    def patch_bucket(self) -> int:
        return self.config.data.patch_bucket

    @property
    def chunk(self) -> int | None:
        return self.config.rl.score_chunk or None


def loss_kwargs(config) -> dict:
    rl = config.rl
    if config.method == "grpo":
        return dict(clip_low=rl.clip_low, clip_high=rl.clip_high, kl_beta=rl.kl_beta, kl_kind=rl.kl_kind,
                    kl_clamp=rl.kl_clamp or None, aggregation=rl.aggregation, dual_clip=rl.dual_clip or None)
    return dict(beta=rl.mopd.beta, clip_low=rl.clip_low, clip_high=rl.clip_high, kl_clamp=rl.kl_clamp or None,
                aggregation=rl.aggregation, dual_clip=rl.dual_clip or None, estimator=rl.mopd.estimator)


def uses_full_kl(config) -> bool:
    """MOPD with rl.mopd.estimator = "full_kl": the teachers run inside the update."""
    return config.method == "mopd" and config.rl.mopd.estimator == "full_kl"


# what the update's inputs are built from: a full_kl teacher must read the policy's own batch
_INPUT_FIELDS = ("family", "image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
_VISION_INPUT_FIELDS = ("patch_size", "temporal_patch_size", "spatial_merge_size", "in_channels")


def check_full_kl_teachers(model_config, frozen: dict) -> None:
    """full_kl needs every teacher's distribution over the policy's vocabulary, on the
    policy's update batch: a teacher of another vocabulary or input layout is a ConfigError
    naming rl.mopd.estimator (k3 / logratio_advantage need only sampled-token log-probs)."""
    for label, f in frozen.items():
        if FZ.is_served(f):
            raise ConfigError(f"config key rl.mopd.estimator = 'full_kl' is invalid with a served teacher "
                              f"({f.key} = {f.url!r}): it needs the teacher's logits on the mesh; use 'k3' or "
                              f"'logratio_advantage'")
        mc = f.model_config
        diff = [f"vocab_size {mc.text.vocab_size} != {model_config.text.vocab_size}"] * (
            mc.text.vocab_size != model_config.text.vocab_size)
        diff += [f"{k} {getattr(mc, k)!r} != {getattr(model_config, k)!r}" for k in _INPUT_FIELDS
                 if getattr(mc, k) != getattr(model_config, k)]
        diff += [f"vision.{k} {getattr(mc.vision, k)} != {getattr(model_config.vision, k)}"
                 for k in _VISION_INPUT_FIELDS if getattr(mc.vision, k) != getattr(model_config.vision, k)]
        if diff:
            raise ConfigError(f"config key rl.mopd.estimator = 'full_kl' is invalid for teacher {label!r} "
                              f"({'; '.join(diff)} vs the policy): it needs teacher logits over the policy's "
                              f"vocabulary and inputs; use 'k3' or 'logratio_advantage'")


def rl_step(config, graphdef, model_config, tx, banned: tuple, frozen: dict, schedule=None, lora=None):
    """(the unjitted update of ``config``, the teachers' parameters its batches must carry:
    () unless full_kl, see :func:`with_teachers`)."""
    teachers = []
    if uses_full_kl(config):
        check_full_kl_teachers(model_config, frozen)
        teachers = [frozen[k] for k in FZ.teacher_order(frozen)]
    rl = config.rl
    step_fn = make_rl_step(graphdef, tx, loss=config.method, loss_kwargs=loss_kwargs(config),
                           temperature=rl.temperature, chunk_size=rl.score_chunk or None, banned_token_ids=banned,
                           schedule=schedule, teacher_graphdefs=tuple(f.graphdef for f in teachers), lora=lora,
                           n_teachers=len(FZ.teacher_order(frozen)) if config.method == "mopd" else 0)
    return step_fn, tuple(f.params for f in teachers)


class WithTeachers:
    """A jitted update whose every batch gets the frozen teachers' parameters (full_kl)
    and / or LoRA's frozen base weights: called and lowered (``launch.plan``) like the
    jitted function itself."""

    def __init__(self, fn, teacher_params: tuple, lora_base=None):
        self.fn, self.extra = fn, {}
        if teacher_params:
            self.extra["teacher_params"] = teacher_params
        if lora_base is not None:
            self.extra["lora_base"] = lora_base

    def __call__(self, state, batch):
        return self.fn(state, dict(batch, **self.extra))

    def lower(self, state, batch):
        return self.fn.lower(state, dict(batch, **self.extra))


def with_teachers(update_fn, teacher_params: tuple, lora_base=None):
    """``update_fn`` itself, or wrapped in :class:`WithTeachers` when it needs teachers or
    LoRA's base."""
    return WithTeachers(update_fn, teacher_params, lora_base) if teacher_params or lora_base is not None else update_fn


def setup(config, mesh, tokenizer, *, materialize: bool = True) -> tuple[Stage2, dict, dict]:
    """(Stage2, train state, its shardings): the policy, its optimizer state and the frozen
    models, sharded over ``mesh``, and the jitted update. ``materialize=False`` allocates
    nothing: parameters and state are abstract (what ``launch.plan`` compiles against)."""
    rl, tc = config.rl, config.train
    if materialize:
        model, model_config = model_factory.build_model(config, tokenizer, mesh=mesh)
        graphdef, pstate, _ = nnx.split(model, nnx.Param, ...)
        param_sh = S.param_shardings(pstate, mesh)
        params = nnx.to_pure_dict(pstate)
        del model, pstate
    else:
        model_config = model_factory.model_config_of(config, tokenizer)
        graphdef, params, param_sh = model_factory.abstract_model(model_config, mesh,
                                                                  **model_factory.model_kwargs(config))
    lora = FrozenBase.build(config, params, param_sh, mesh, materialize=materialize)
    base = params
    if lora is not None:     # LoRA: the adapters train; the base is frozen (and GRPO's default reference)
        base, params, param_sh = lora.base, lora.adapters, lora.adapter_sh
    tx, schedule = optimizer_from_config(config, params, tc.steps * rl.ppo_epochs * rl.minibatches
                                         + RP.optimizer_steps(config))
    frozen: dict[str, FZ.Frozen] = {}
    if config.method == "grpo":
        if rl.reference or (not materialize and lora is None):
            frozen["reference"] = FZ.load("reference", rl.reference, config, mesh, tokenizer, materialize=materialize,
                                          key="rl.reference")
        elif lora is not None:   # the base without the adapter: no second copy of the weights
            frozen["reference"] = FZ.Frozen("reference", graphdef, base, model_config,
                                            unpack=lora.plain if lora.quantize else None)
        else:  # the starting policy
            frozen["reference"] = FZ.from_params("reference", graphdef, params, model_config,
                                                 model_factory.dtype_of(config.model.dtype, "model.dtype"), param_sh)
    else:
        for label, spec in rl.teachers.items():
            frozen[label] = FZ.load(f"teacher_{label}", spec, config, mesh, tokenizer, materialize=materialize,
                                    key=f"rl.teachers.{label}")
    state, state_sh = sharded_state(params, tx, param_sh, mesh, materialize=materialize)
    del params
    banned = RO.vision_token_ids(model_config)
    step_fn, teacher_params = rl_step(config, graphdef, model_config, tx, banned, frozen, schedule,
                                      None if lora is None else lora.spec)
    update_fn = with_teachers(jit_update(step_fn, mesh, state_sh), teacher_params,
                              None if lora is None else lora.base)
    replay_fn = RP.make_replay_fn(config, graphdef, tx, schedule, mesh, state_sh, lora)
    pad_id, stop = special_ids(tokenizer, model_config)
    sampling = G.SamplingConfig(temperature=rl.temperature, top_p=rl.top_p, top_k=rl.top_k,
                                max_new_tokens=rl.max_new_tokens, stop_token_ids=stop, pad_token_id=pad_id,
                                banned_token_ids=banned)
    dp = int(np.prod([mesh.shape[a] for a in S.BATCH_AXES]))
    s2 = Stage2(config, mesh, graphdef, model_config, tokenizer, sampling, frozen, update_fn, pad_id, stop, banned,
                row_multiple=max(1, dp // jax.process_count()),
                think_opened=_think_opened(config, tokenizer), lora=lora, replay_fn=replay_fn)
    return s2, state, state_sh


def _think_opened(config, tokenizer) -> bool:
    """data_source.think_opened, False when planning without a tokenizer."""
    return tokenizer is not None and data_source.think_opened(config, tokenizer)


def special_ids(tokenizer, model_config) -> tuple[int, tuple[int, ...]]:
    """(pad id, stop ids): the tokenizer's, or the model config's when planning without one."""
    if tokenizer is None:
        t = model_config.text
        eos = t.eos_token_id if isinstance(t.eos_token_id, (list, tuple)) else (t.eos_token_id,)
        return int(t.pad_token_id or 0), tuple(int(i) for i in eos if i is not None)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    stop = tuple(i for i in (tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.eos_token_id) if i is not None)
    return pad_id, stop


def reuse_sampler_log_probs(rl) -> bool:
    """``rl.old_logprobs``: the old-policy log-probs are the sampler's ("sampler"; "auto"
    when sampling is neither top-p nor top-k truncated, so the sampler drew from the
    policy's own tempered distribution, and no demonstrated response replaces a sampled one:
    ``rl.demo_in_failed_groups``) or a rescoring pass ("recompute")."""
    mode = rl.old_logprobs
    return mode == "sampler" or (mode == "auto" and rl.top_p >= 1.0 and rl.top_k == 0
                                 and not rl.get("demo_in_failed_groups", False))


def shares_prompts(s: Stage2) -> bool:
    """``rl.share_prefill``: each prompt computed once for the rows of its group that a call
    holds, in sampling, scoring and updates (the shared-prompt layout, ``rollout.shared_batch``)."""
    return bool(s.rl.share_prefill)


def update_groups(config) -> int:
    """Groups (prompts) per update over all processes: rl.update_groups, or every prompt of a round."""
    return config.rl.update_groups or config.data.batch_size
