"""AdamW with warmup + cosine decay, global-norm clipping, per-module learning-rate
multipliers and freezing, chosen by regular expressions over parameter paths
("text/layers/0/mlp/gate/kernel"); optionally an exponential moving average of the
trained parameters kept in the optimizer state (``optim.ema_decay``)."""

from __future__ import annotations

import re
from typing import Any, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import optax

from guilibra_jax.choices import SCHEDULES
from guilibra_jax.param_paths import param_paths, unmatched_patterns  # noqa: F401  (train.state uses both)


def learning_rate_schedule(lr: float, total_steps: int, warmup_steps: int = 0, schedule: str = "cosine",
                           end_lr_fraction: float = 0.0) -> optax.Schedule:
    """Linear warmup from 0 to ``lr`` then ``schedule`` ("cosine", "linear", "constant")."""
    if schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(0.0, lr, max(warmup_steps, 0), max(total_steps, warmup_steps + 1),
                                                  end_value=lr * end_lr_fraction)
    decay_steps = max(total_steps - warmup_steps, 1)
    if schedule == "linear":
        tail = optax.linear_schedule(lr, lr * end_lr_fraction, decay_steps)
    elif schedule == "constant":
        tail = optax.constant_schedule(lr)
    else:
        raise ValueError(f"optim.schedule: unknown schedule {schedule!r}; expected one of {SCHEDULES}")
    if warmup_steps <= 0:
        return tail
    return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup_steps), tail], [warmup_steps])


def _group_of(path: str, multipliers: Mapping[str, float], freeze: Sequence[str]) -> str:
    if any(re.search(p, path) for p in freeze):
        return "frozen"
    for i, pattern in enumerate(multipliers):
        if re.search(pattern, path):
            return f"group{i}"
    return "default"


def decays(path: str) -> bool:
    """Whether weight decay applies to the parameter at ``path`` (kernels, embeddings)."""
    return path.rsplit("/", 1)[-1] in ("kernel", "embedding")


def make_optimizer(params: Any, *, lr: float, total_steps: int, warmup_steps: int = 0, schedule: str = "cosine",
                   weight_decay: float = 0.0, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
                   clip_norm: float | None = 1.0, lr_multipliers: Mapping[str, float] | None = None,
                   freeze: Sequence[str] = (), end_lr_fraction: float = 0.0, ema_decay: float = 0.0
                   ) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """The optimizer and its base schedule. ``lr_multipliers`` maps a path regex to a
    factor on the learning rate (first match wins); ``freeze`` regexes get no update
    and no optimizer state. Weight decay applies to kernels and embeddings only (never to
    biases or norm scales, whatever their rank: q/k/v biases are [heads, head_dim]).
    ``ema_decay`` > 0: the optimizer also keeps :func:`param_ema` of the parameters."""
    lr_multipliers = dict(lr_multipliers or {})
    base = learning_rate_schedule(lr, total_steps, warmup_steps, schedule, end_lr_fraction)
    paths = param_paths(params)
    labels = jax.tree.map(lambda p: _group_of(p, lr_multipliers, freeze), paths)

    def decay_mask(tree):
        return jax.tree.map(decays, param_paths(tree))

    def adamw(scale: float) -> optax.GradientTransformation:
        return optax.adamw(lambda step: base(step) * scale, b1=b1, b2=b2, eps=eps,
                           weight_decay=weight_decay, mask=decay_mask)

    transforms = {"default": adamw(1.0), "frozen": optax.set_to_zero()}
    for i, scale in enumerate(lr_multipliers.values()):
        transforms[f"group{i}"] = adamw(float(scale))
    used = set(jax.tree.leaves(labels))
    transforms = {k: v for k, v in transforms.items() if k in used}
    tx = optax.multi_transform(transforms, labels)
    if clip_norm:
        tx = optax.chain(clip_by_global_norm(clip_norm), tx)
    if ema_decay:
        tx = param_ema(tx, ema_decay)
    return tx, base


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformationExtraArgs:
    """``optax.clip_by_global_norm`` (same state, same values) that takes the updates' global
    norm as ``grad_norm=`` when the caller has it (``step_core.make_step`` does), so the update
    holds no second reduction over every gradient: with one, XLA's CPU backend materialised the
    divided gradients before the AdamW update (benchmarks.optimizer_update)."""
    def update(updates, state, params=None, *, grad_norm=None, **extra_args):
        del params, extra_args
        g_norm = optax.tree.norm(updates) if grad_norm is None else grad_norm
        trigger = jnp.squeeze(g_norm < max_norm)
        clip = lambda t: jax.lax.select(trigger, t, (t / g_norm.astype(t.dtype)) * max_norm)
        return jax.tree.map(clip, updates), state

    return optax.GradientTransformationExtraArgs(optax.init_empty_state, update)


class EmaState(NamedTuple):
    """The state of :func:`param_ema`: the average (float32, like the parameters) and the
    wrapped optimizer's state. Checkpoints store it as ``opt_state/ema/<param path>``."""
    ema: Any
    inner: Any


def param_ema(inner: optax.GradientTransformation, decay: float) -> optax.GradientTransformation:
    """``inner`` that also keeps an exponential moving average of the parameters it
    updates: after every update ``ema <- decay * ema + (1 - decay) * new_params``,
    starting at the initial parameters (Polyak averaging; no bias correction, so a
    fine-tune's average stays anchored to its start at weight ``decay ** steps``). The
    updates are ``inner``'s, unchanged. The average is float32 whatever the parameters'
    dtype (a bf16 average could not move by ``(1 - decay)`` of a small change); it lives
    in the optimizer state so it is sharded like the parameters, checkpointed, and left
    untouched by an update the step's guard skips."""
    if not 0.0 < decay < 1.0:
        raise ValueError(f"param_ema: decay must be in (0, 1); got {decay}")

    def init(params):
        return EmaState(ema=jax.tree.map(lambda p: jnp.array(p, jnp.float32, copy=True), params),
                        inner=inner.init(params))

    inner = optax.with_extra_args_support(inner)

    def update(updates, state, params=None, **extra_args):
        if params is None:
            raise ValueError("param_ema: update needs the parameters")
        updates, inner_state = inner.update(updates, state.inner, params, **extra_args)
        new_params = optax.apply_updates(params, updates)
        ema = jax.tree.map(lambda e, p: decay * e + (1.0 - decay) * p.astype(jnp.float32), state.ema, new_params)
        return updates, EmaState(ema=ema, inner=inner_state)

    return optax.GradientTransformationExtraArgs(init, update)


def ema_of(opt_state: Any, params: Any) -> Any | None:
    """The parameter average in ``opt_state`` (:func:`param_ema`) cast to ``params``'
    dtypes, or None when the optimizer keeps none."""
    if not isinstance(opt_state, EmaState):
        return None
    return jax.tree.map(lambda e, p: e.astype(p.dtype), opt_state.ema, params)


def averaged(state: dict) -> dict:
    """The train ``state`` with its params replaced by the optimizer's parameter average
    (:func:`param_ema`; what a run with ``optim.ema_decay`` exports), or ``state`` itself."""
    ema = ema_of(state["opt_state"], state["params"])
    return state if ema is None else {**state, "params": ema}
