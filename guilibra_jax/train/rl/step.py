"""The stage-2 policy update (GRPO and MOPD): a pure function (state, batch) -> (state, metrics).

``batch`` is a rollout minibatch (``rl_loop.update``) whose leaves carry a leading
micro-batch axis [M, ...], in one of two layouts: whole sequences

    input_ids, segment_ids [B, T], positions [3, B, T], pixel_values, vision
    response_mask [B, T]   1 where the *next* token is a sampled response token
    old_logp [B, T]        log-probs of those tokens under the sampling policy
    ref_logp [B, T]        GRPO: under the frozen reference; MOPD: under the rollout's
                           platform teacher (routed per sequence before the batch is built)
    advantages [B]         per sequence (after SNGS / the pass-rate floor)
    kl_mask [B]            MOPD's μ_g per sequence (1 for GRPO)

or the shared-prompt layout (``rollout.shared_batch``: each prompt once for its rows, the
model inputs and the [B, T] arrays above as response columns [B, N'], scored by
:func:`generate.shared_token_logprobs`).

The current policy's log-probs are recomputed under the sampling temperature with
:func:`generate.token_logprobs`, so on the first PPO epoch ρ = 1 exactly. Losses are
:func:`losses.grpo_loss_terms` / :func:`losses.mopd_loss_terms` accumulated exactly over
micro-batches by :mod:`step_core`.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from guilibra_jax import generate as G
from guilibra_jax import losses
from guilibra_jax.train.step_core import make_step

LOSSES = ("grpo", "mopd")
SUMS = ("tokens", "clipped", "kl", "kl_tokens", "entropy", "ratio", "sequences", "kl_on")


def make_rl_step(graphdef: nnx.GraphDef, tx: optax.GradientTransformation, *, loss: str = "grpo",
                 loss_kwargs: dict | None = None, temperature: float = 1.0, chunk_size: int | None = None,
                 banned_token_ids: tuple[int, ...] = (), schedule: Callable[[Any], Any] | None = None) -> Callable[[dict, dict], tuple[dict, dict]]:
    """Build the (unjitted) policy-update step. ``loss``: "grpo" (kwargs of
    :func:`losses.grpo_loss_terms`: clip_low, clip_high, kl_beta, kl_kind, kl_clamp,
    aggregation, dual_clip) or "mopd" (of :func:`losses.mopd_loss_terms`: beta, clip_low,
    clip_high, kl_clamp, aggregation, dual_clip). ``banned_token_ids``: the sampler's (excluded from the
    distribution, so that ρ = 1 on the first epoch)."""
    if loss not in LOSSES:
        raise ValueError(f"unknown RL loss {loss!r}; expected one of {LOSSES}")
    kw = dict(loss_kwargs or {})
    clip_low, clip_high = kw.get("clip_low", 0.2), kw.get("clip_high", 0.2 if loss == "grpo" else 0.28)
    kl_kind = kw.get("kl_kind", "k3") if loss == "grpo" else "k3"
    kl_clamp = kw.get("kl_clamp", None if loss == "grpo" else 10.0)

    def micro_terms(params, micro):
        model = nnx.merge(graphdef, params)
        if "prompt_ids" in micro:   # the shared-prompt layout: [B, N'] response columns
            logp, valid, entropy = G.shared_token_logprobs(
                model, micro, temperature=temperature, chunk_size=chunk_size, with_entropy=True,
                banned_token_ids=banned_token_ids)
        else:
            logp, valid, entropy = G.token_logprobs(
                model, micro["input_ids"], micro["positions"], micro["segment_ids"], micro.get("pixel_values"),
                micro.get("vision"), micro["response_mask"], temperature=temperature, chunk_size=chunk_size,
                with_entropy=True, banned_token_ids=banned_token_ids)
        mask = valid.astype(jnp.float32)
        if loss == "grpo":
            num, den = losses.grpo_loss_terms(logp, micro["old_logp"], micro["ref_logp"], micro["advantages"],
                                              mask, **kw)
        else:
            num, den = losses.mopd_loss_terms(logp, micro["old_logp"], micro["ref_logp"], micro["advantages"],
                                              mask, micro["kl_mask"], **kw)
        # Reporting sums (no gradient): clipped tokens, KL, entropy, ratio.
        lp = jax.lax.stop_gradient(logp)
        adv = micro["advantages"][:, None]
        ratio = jnp.exp(jnp.clip(lp - micro["old_logp"], -20.0, 20.0))
        clipped = ((adv > 0) & (ratio > 1 + clip_high)) | ((adv < 0) & (ratio < 1 - clip_low))
        if kw.get("dual_clip"):
            clipped = clipped | ((adv < 0) & (ratio > kw["dual_clip"]))
        kl = losses.kl_penalty(lp, micro["ref_logp"], kl_kind, kl_clamp)
        kl_on = mask * (micro["kl_mask"][:, None] > 0)
        sums = {"tokens": jnp.sum(mask), "clipped": jnp.sum(mask * clipped), "kl": jnp.sum(kl * kl_on),
                "kl_tokens": jnp.sum(kl_on), "entropy": jnp.sum(jax.lax.stop_gradient(entropy) * mask),
                "ratio": jnp.sum(ratio * mask), "sequences": jnp.sum((jnp.sum(mask, -1) > 0).astype(jnp.float32)),
                "kl_on": jnp.sum(((micro["kl_mask"] > 0) & (jnp.sum(mask, -1) > 0)).astype(jnp.float32))}
        return num, (den, sums)

    sums0 = {k: jnp.zeros((), jnp.float32) for k in SUMS}
    core = make_step(micro_terms, tx, sums0, schedule)

    def step(state: dict, batch: dict) -> tuple[dict, dict]:
        new_state, metrics, s = core(state, batch)
        n = jnp.maximum(s["tokens"], 1.0)
        metrics.update({"clip_fraction": s["clipped"] / n, "kl": s["kl"] / jnp.maximum(s["kl_tokens"], 1.0),
                        "entropy": s["entropy"] / n, "ratio_mean": s["ratio"] / n, "update_tokens": s["tokens"],
                        "kl_mask_fraction": s["kl_on"] / jnp.maximum(s["sequences"], 1.0)})
        return new_state, metrics

    return step
