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
        grads = jax.tree.map(lambda g: g / safe_den, g_sum)
        grad_norm = optax.global_norm(grads)
        ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        updates, new_opt = tx.update(grads, state["opt_state"], params)
        new_params = optax.apply_updates(params, updates)
        keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, old)
        new_state = {"step": state["step"] + 1, "params": keep(new_params, params),
                     "opt_state": keep(new_opt, state["opt_state"]),
                     "skipped": state["skipped"] + (~ok).astype(jnp.int32)}
        metrics = {"loss": loss, "grad_norm": grad_norm, "skipped": new_state["skipped"],
                   "update_ok": ok.astype(jnp.float32)}
        if schedule is not None:
            metrics["lr"] = schedule(state["step"])
        return new_state, metrics, sums

    return step
