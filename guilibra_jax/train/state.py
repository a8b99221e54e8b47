"""The train state of a run: the optimizer from ``config.optim`` and the sharded
``{step, params, opt_state, skipped}`` every trainer checkpoints."""

from __future__ import annotations

import jax

from guilibra_jax import sharding as S
from guilibra_jax.errors import ConfigError
from guilibra_jax.train.optimizer import make_optimizer, param_paths, unmatched_patterns
from guilibra_jax.train.step_core import init_state


def optimizer_from_config(config, params, total_steps: int):
    """(tx, schedule) of ``config.optim`` over ``total_steps`` optimizer updates. A
    freeze / lr-multiplier regex that matches no parameter path is a ConfigError."""
    o = config.optim
    for key, patterns in (("optim.freeze", tuple(o.freeze)), ("optim.lr_multipliers", tuple(o.lr_multipliers))):
        unmatched = unmatched_patterns(params, patterns)
        if unmatched:
            example = jax.tree.leaves(param_paths(params))[:3]
            raise ConfigError(f"config key {key} pattern {unmatched[0]!r} matches no parameter path (paths look "
                              f"like {', '.join(example)}; re.search over '/'-joined paths)")
    return make_optimizer(params, lr=o.lr, total_steps=total_steps, warmup_steps=o.warmup_steps,
                          schedule=o.schedule, weight_decay=o.weight_decay, b1=o.b1, b2=o.b2, eps=o.eps,
                          clip_norm=o.clip_norm, lr_multipliers=dict(o.lr_multipliers), freeze=tuple(o.freeze),
                          end_lr_fraction=o.end_lr_fraction, ema_decay=o.ema_decay)


def sharded_state(params, tx, param_sh, mesh, *, materialize: bool = True) -> tuple[dict, dict]:
    """(train state, its shardings): params from their logical names, optimizer state
    following params, scalars replicated. ``materialize=False``: an abstract state
    (ShapeDtypeStructs with shardings, nothing allocated) for ahead-of-time plans."""
    opt_sh = S.opt_state_shardings(tx, params, param_sh, mesh)
    rep = S.replicated(mesh)
    state_sh = {"step": rep, "params": param_sh, "opt_state": opt_sh, "skipped": rep}
    if not materialize:
        shapes = jax.eval_shape(lambda p: init_state(p, tx), params)
        return jax.tree.map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh), shapes,
                            state_sh), state_sh
    params = jax.device_put(params, param_sh)
    return jax.jit(lambda p: init_state(p, tx), out_shardings=state_sh)(params), state_sh


def jit_update(step_fn, mesh, state_sh, frozen_sh=None):
    """``step_fn(state, batch) -> (state, metrics)`` jitted on ``mesh``: the state keeps its
    shardings and is donated. ``frozen_sh``: the step is ``(state, batch, frozen)`` with a
    frozen tree (LoRA's base weights) in these shardings, read and never donated."""
    extra = () if frozen_sh is None else (frozen_sh,)
    return jax.jit(S.traced_on(mesh, step_fn), in_shardings=(state_sh, None, *extra),
                   out_shardings=(state_sh, None), donate_argnums=0)
