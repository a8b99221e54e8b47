"""The ASFT train step: a pure function (state, batch) -> (state, metrics).

``state`` is a dict {step, params, opt_state, skipped} of arrays (params as the
model's pure dict). ``batch`` leaves carry a leading micro-batch axis [M, ...]; the
accumulation and the guarded update are :mod:`step_core`'s, so accumulation gives
exactly the full-batch gradient for both ASFT normalisations.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from guilibra_jax import losses
from guilibra_jax.train.step_core import make_step

PARTS = {"reasoning": 1, "action": 2, "grounding": 3}
MODEL_INPUTS = ("input_ids", "positions", "segment_ids", "pixel_values", "vision")


def model_logits(graphdef: nnx.GraphDef, params: Any, batch: dict) -> jax.Array:
    """Logits [B, T, V] of the model ``graphdef`` with ``params`` on one micro-batch."""
    model = nnx.merge(graphdef, params)
    return model(batch["input_ids"], batch["positions"], batch["segment_ids"],
                 batch.get("pixel_values"), batch.get("vision"))


def make_sft_step(graphdef: nnx.GraphDef, tx: optax.GradientTransformation, *, alpha_action: float = 2.0,
                  alpha_grounding: float = 4.0, normalize: str = "sample",
                  schedule: Callable[[Any], Any] | None = None,
                  weighting: str = "paper") -> Callable[[dict, dict], tuple[dict, dict]]:
    """Build the (unjitted) ASFT step for ``graphdef``; jit it with shardings.
    ``weighting``: "paper" or "release" (``losses.segment_weights``)."""

    def micro_terms(params, micro):
        logits = model_logits(graphdef, params, micro)
        num, den = losses.asft_loss_terms(logits, micro["targets"], micro["loss_segments"],
                                          alpha_action=alpha_action, alpha_grounding=alpha_grounding,
                                          normalize=normalize, weighting=weighting)
        nll = jax.lax.stop_gradient(losses.token_nll(logits, micro["targets"]))
        seg = losses.segment_part(micro["loss_segments"])
        parts = {}
        for name, sid in PARTS.items():
            on = seg == sid
            parts[f"nll_sum_{name}"] = jnp.sum(jnp.where(on, nll, 0.0))
            parts[f"tokens_{name}"] = jnp.sum(on.astype(jnp.float32))
        return num, (den, parts)

    parts0 = {f"{k}_{n}": jnp.zeros((), jnp.float32) for n in PARTS for k in ("nll_sum", "tokens")}
    core = make_step(micro_terms, tx, parts0, schedule)

    def step(state: dict, batch: dict) -> tuple[dict, dict]:
        new_state, metrics, parts = core(state, batch)
        metrics["loss_tokens"] = sum(parts[f"tokens_{n}"] for n in PARTS)
        for n in PARTS:
            metrics[f"loss_{n}"] = parts[f"nll_sum_{n}"] / jnp.maximum(parts[f"tokens_{n}"], 1.0)
        return new_state, metrics

    return step
