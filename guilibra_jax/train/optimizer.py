"""AdamW with warmup + cosine decay, global-norm clipping, per-module learning-rate
multipliers and freezing, chosen by regular expressions over parameter paths
("text/layers/0/mlp/gate/kernel")."""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

import jax
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
                   freeze: Sequence[str] = (), end_lr_fraction: float = 0.0
                   ) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """The optimizer and its base schedule. ``lr_multipliers`` maps a path regex to a
    factor on the learning rate (first match wins); ``freeze`` regexes get no update
    and no optimizer state. Weight decay applies to kernels and embeddings only (never to
    biases or norm scales, whatever their rank: q/k/v biases are [heads, head_dim])."""
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
        tx = optax.chain(optax.clip_by_global_norm(clip_norm), tx)
    return tx, base
