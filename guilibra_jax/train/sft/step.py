"""The ASFT train step: a pure function (state, batch) -> (state, metrics).

``state`` is a dict {step, params, opt_state, skipped} of arrays (params as the
model's pure dict). ``batch`` leaves carry a leading micro-batch axis [M, ...]; the
accumulation and the guarded update are :mod:`step_core`'s, so accumulation gives
exactly the full-batch gradient for both ASFT normalisations.
"""

from __future__ import annotations

from typing import Any, Callable

import jax.numpy as jnp
import optax
from flax import nnx

from guilibra_jax import head_loss, losses
from guilibra_jax import lora as L
from guilibra_jax.train.lora_state import lora_spec
from guilibra_jax.train.step_core import make_step

PARTS = {"reasoning": 1, "action": 2, "grounding": 3}
MODEL_INPUTS = ("input_ids", "positions", "segment_ids", "pixel_values", "vision")


def make_sft_step(graphdef: nnx.GraphDef, tx: optax.GradientTransformation, *, alpha_action: float = 2.0,
                  alpha_grounding: float = 4.0, normalize: str = "sample",
                  schedule: Callable[[Any], Any] | None = None,
                  logits_chunk: int = 128,
                  weighting: str = "paper", lora: L.LoraSpec | None = None) -> Callable[..., tuple[dict, dict]]:
    """Build the (unjitted) ASFT step for ``graphdef``; jit it with shardings.
    ``weighting``: "paper" or "release" (``losses.segment_weights``). ``lora``: the
    state's params are LoRA adapters, and the step is ``(state, batch, base)`` with the
    frozen base weights; the model runs on ``lora.merge(base, adapters)``.

    The LM head and the cross-entropy run only at the loss positions (loss_segments > 0),
    ``logits_chunk`` positions per row at a time (guilibra_jax.head_loss): no [B, T, V]
    logits, and head FLOPs in proportion to the loss positions rather than to T."""

    def micro_terms(params, micro):
        model = nnx.merge(graphdef, params)
        h = model.hidden_states(micro["input_ids"], micro["positions"], micro["segment_ids"],
                                micro.get("pixel_values"), micro.get("vision"))
        loss_segments = micro["loss_segments"]
        coef, den = losses.asft_token_coefficients(loss_segments, alpha_action=alpha_action,
                                                   alpha_grounding=alpha_grounding, normalize=normalize,
                                                   weighting=weighting)
        num, nll = head_loss.head_nll(h, model.lm_head_weight(), micro["targets"], coef, loss_segments > 0,
                                      chunk=logits_chunk)
        seg = losses.segment_part(loss_segments)
        parts = {}
        for name, sid in PARTS.items():
            on = seg == sid
            parts[f"nll_sum_{name}"] = jnp.sum(jnp.where(on, nll, 0.0))
            parts[f"tokens_{name}"] = jnp.sum(on.astype(jnp.float32))
        return num, (den, parts)

    parts0 = {f"{k}_{n}": jnp.zeros((), jnp.float32) for n in PARTS for k in ("nll_sum", "tokens")}
    if lora is not None:
        full_terms = micro_terms
        micro_terms = lambda adapters, micro, base: full_terms(L.merge(base, adapters, lora), micro)
    core = make_step(micro_terms, tx, parts0, schedule)

    def step(state: dict, batch: dict, *frozen) -> tuple[dict, dict]:
        new_state, metrics, parts = core(state, batch, *frozen)
        metrics["loss_tokens"] = sum(parts[f"tokens_{n}"] for n in PARTS)
        for n in PARTS:
            metrics[f"loss_{n}"] = parts[f"nll_sum_{n}"] / jnp.maximum(parts[f"tokens_{n}"], 1.0)
        return new_state, metrics

    return step


def sft_step_from_config(config, graphdef: nnx.GraphDef, tx: optax.GradientTransformation,
                         schedule: Callable[[Any], Any] | None = None) -> Callable[..., tuple[dict, dict]]:
    """`make_sft_step` with the run config's loss keys (loss.*) and LoRA (model.lora.*):
    the one builder of the trainer (train.sft.trainer) and the memory planner
    (train.sft.plan), so a plan compiles the step the trainer runs."""
    lc = config.loss
    return make_sft_step(graphdef, tx, alpha_action=lc.alpha_action, alpha_grounding=lc.alpha_grounding,
                         normalize=lc.normalize, schedule=schedule, logits_chunk=lc.logits_chunk,
                         weighting=lc.weighting, lora=lora_spec(config))
