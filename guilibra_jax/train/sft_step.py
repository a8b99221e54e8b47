"""The ASFT train step: a pure function (state, batch) -> (state, metrics).

``state`` is a dict {step, params, opt_state, skipped} of arrays (params as the
model's pure dict). ``batch`` leaves carry a leading micro-batch axis [M, ...]:
gradients of the loss *numerator* are summed over micro-batches and divided by the
summed *denominator* once, so accumulation gives exactly the full-batch gradient for
both ASFT normalisations. A non-finite loss or gradient norm leaves params and
optimizer state untouched and increments ``skipped``.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from guilibra_jax import losses

PARTS = {"reasoning": 1, "action": 2, "grounding": 3}
MODEL_INPUTS = ("input_ids", "positions", "segment_ids", "pixel_values", "vision")


def model_logits(graphdef: nnx.GraphDef, params: Any, batch: dict) -> jax.Array:
    """Logits [B, T, V] of the model ``graphdef`` with ``params`` on one micro-batch."""
    model = nnx.merge(graphdef, params)
    return model(batch["input_ids"], batch["positions"], batch["segment_ids"],
                 batch.get("pixel_values"), batch.get("vision"))


def init_state(params: Any, tx: optax.GradientTransformation) -> dict:
    return {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params),
            "skipped": jnp.zeros((), jnp.int32)}


def make_sft_step(graphdef: nnx.GraphDef, tx: optax.GradientTransformation, *, alpha_action: float = 2.0,
                  alpha_grounding: float = 4.0, normalize: str = "sample",
                  schedule: Callable[[Any], Any] | None = None) -> Callable[[dict, dict], tuple[dict, dict]]:
    """Build the (unjitted) ASFT step for ``graphdef``; jit it with shardings."""

    def micro_terms(params, micro):
        logits = model_logits(graphdef, params, micro)
        num, den = losses.asft_loss_terms(logits, micro["targets"], micro["loss_segments"],
                                          alpha_action=alpha_action, alpha_grounding=alpha_grounding,
                                          normalize=normalize)
        nll = jax.lax.stop_gradient(losses.token_nll(logits, micro["targets"]))
        seg = micro["loss_segments"]
        parts = {}
        for name, sid in PARTS.items():
            on = seg == sid
            parts[f"nll_sum_{name}"] = jnp.sum(jnp.where(on, nll, 0.0))
            parts[f"tokens_{name}"] = jnp.sum(on.astype(jnp.float32))
        return num, (den, parts)

    grad_fn = jax.value_and_grad(micro_terms, has_aux=True)

    def step(state: dict, batch: dict) -> tuple[dict, dict]:
        params = state["params"]
        zeros = jax.tree.map(jnp.zeros_like, params)

        def body(carry, micro):
            g_acc, num_acc, den_acc, parts_acc = carry
            (num, (den, parts)), g = grad_fn(params, micro)
            g_acc = jax.tree.map(jnp.add, g_acc, g)
            parts_acc = jax.tree.map(jnp.add, parts_acc, parts)
            return (g_acc, num_acc + num, den_acc + den, parts_acc), None

        parts0 = {f"{k}_{n}": jnp.zeros((), jnp.float32) for n in PARTS for k in ("nll_sum", "tokens")}
        init = (zeros, jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32), parts0)
        (g_sum, num, den, parts), _ = jax.lax.scan(body, init, batch)
        safe_den = jnp.maximum(den, 1e-9)
        loss = num / safe_den
        grads = jax.tree.map(lambda g: g / safe_den, g_sum)
        grad_norm = optax.global_norm(grads)
        ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        updates, new_opt = tx.update(grads, state["opt_state"], params)
        new_params = optax.apply_updates(params, updates)
        keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, old)
        new_state = {
            "step": state["step"] + 1,
            "params": keep(new_params, params),
            "opt_state": keep(new_opt, state["opt_state"]),
            "skipped": state["skipped"] + (~ok).astype(jnp.int32),
        }
        metrics = {"loss": loss, "grad_norm": grad_norm, "skipped": new_state["skipped"],
                   "update_ok": ok.astype(jnp.float32), "loss_tokens": sum(parts[f"tokens_{n}"] for n in PARTS)}
        for n in PARTS:
            metrics[f"loss_{n}"] = parts[f"nll_sum_{n}"] / jnp.maximum(parts[f"tokens_{n}"], 1.0)
        if schedule is not None:
            metrics["lr"] = schedule(state["step"])
        return new_state, metrics

    return step
