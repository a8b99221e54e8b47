"""The update shared by every trainer: exact gradient accumulation over micro-batches,
a guarded optimizer update, and the train state.

A trainer supplies ``micro_terms(params, micro) -> (num, (den, sums))``: the loss
numerator of one micro-batch (differentiated), its denominator, and a dict of scalar
sums to report. Numerators, gradients, denominators and sums are added over the
micro-batches (the leading axis of every batch leaf) and divided once, so accumulation
gives exactly the full-batch gradient of ``Σ num / Σ den``. A non-finite loss or
gradient norm leaves params and optimizer state untouched and increments ``skipped``.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

MicroTerms = Callable[[Any, dict], tuple[jax.Array, tuple[jax.Array, dict]]]


def init_state(params: Any, tx: optax.GradientTransformation) -> dict:
    """{step, params, opt_state, skipped}: the train state every trainer checkpoints."""
    return {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params),
            "skipped": jnp.zeros((), jnp.int32)}


def make_step(micro_terms: MicroTerms, tx: optax.GradientTransformation, sums0: dict,
              schedule: Callable[[Any], Any] | None = None) -> Callable[[dict, dict], tuple[dict, dict, dict]]:
    """(state, batch, *frozen) -> (state, metrics, sums). ``sums0``: the zero of
    ``micro_terms``'s sums dict (its structure). metrics: loss, grad_norm, skipped,
    update_ok (and lr). ``frozen``: arrays passed on to ``micro_terms(params, micro,
    *frozen)`` and not differentiated (LoRA's base weights: a jit argument, not state)."""
    grad_fn = jax.value_and_grad(micro_terms, has_aux=True)
    tx = optax.with_extra_args_support(tx)

    def step(state: dict, batch: dict, *frozen):
        params = state["params"]

        def body(carry, micro):
            g_acc, num_acc, den_acc, sums_acc = carry
            (num, (den, sums)), g = grad_fn(params, micro, *frozen)
            return (jax.tree.map(jnp.add, g_acc, g), num_acc + num, den_acc + den,
                    jax.tree.map(jnp.add, sums_acc, sums)), None

        zero = jnp.zeros((), jnp.float32)
        init = (jax.tree.map(jnp.zeros_like, params), zero, zero, sums0)
        (g_sum, num, den, sums), _ = jax.lax.scan(body, init, batch)
        safe_den = jnp.maximum(den, 1e-9)
        loss = num / safe_den
        grads = lambda: jax.tree.map(lambda g: g / safe_den, g_sum)
        grad_norm = optax.tree.norm(grads())
        ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)

        # A guard by lax.cond, not by selecting between new and old values, with the gradients
        # divided inside it and the clip given the norm above (optimizer.clip_by_global_norm): XLA
        # then updates each parameter and its moments in place with no materialised gradient
        # copy and no copies of the old moments (benchmarks.optimizer_update: the update alone
        # against the select-guarded optax update, docs/benchmarks.md).
        def update(carry):
            params, opt_state = carry
            updates, new_opt = tx.update(grads(), opt_state, params, grad_norm=grad_norm)
            return optax.apply_updates(params, updates), new_opt

        new_params, new_opt = jax.lax.cond(ok, update, lambda carry: carry, (params, state["opt_state"]))
        new_state = {"step": state["step"] + 1, "params": new_params, "opt_state": new_opt,
                     "skipped": state["skipped"] + (~ok).astype(jnp.int32)}
        metrics = {"loss": loss, "grad_norm": grad_norm, "skipped": new_state["skipped"],
                   "update_ok": ok.astype(jnp.float32)}
        if schedule is not None:
            metrics["lr"] = schedule(state["step"])
        return new_state, metrics, sums

    return step
