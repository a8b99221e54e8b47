"""The stage-2 policy update (GRPO and MOPD): a pure function (state, batch) -> (state, metrics).

``batch`` is a rollout minibatch (``rl.phases.update``) whose leaves carry a leading
micro-batch axis [M, ...], in one of two layouts: whole sequences

    input_ids, segment_ids [B, T], positions [3, B, T], pixel_values, vision
    response_mask [B, T]   1 where the *next* token is a sampled response token
    old_logp [B, T]        log-probs of those tokens under the sampling policy
    ref_logp [B, T]        GRPO: under the frozen reference; MOPD: under the rollout's
                           platform teacher (routed per sequence before the batch is built)
    advantages [B]         per sequence (after SNGS / the pass-rate floor)
    kl_mask [B]            KL weight per sequence (MOPD: μ_g, or advantages.kl_weights'; GRPO: 1;
                           both: 0 where a served scorer failed)
    teacher_index [B]      MOPD: the row's teacher (frozen.teacher_index); full_kl also
                           carries the teachers' parameters as ``teacher_params`` (no micro axis)

or the shared-prompt layout (``rollout.shared_batch``: each prompt once for its rows, the
model inputs and the [B, T] arrays above as response columns [B, N'], scored by
:func:`generate.shared_token_logprobs`).

The current policy's log-probs are recomputed under the sampling temperature with
:func:`generate.token_logprobs` (full_kl: :func:`full_kl_terms`, from the same hidden
states), so on the first PPO epoch ρ = 1 exactly. Losses are
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
from guilibra_jax import lora as L
from guilibra_jax import losses
from guilibra_jax.train.step_core import make_step

LOSSES = ("grpo", "mopd")
SUMS = losses.REPORT_SUMS + ("entropy",)
FULL_KL_CHUNK = 128   # positions per chunk of full_kl's two-model head when rl.score_chunk is 0


def _tempered_logits(model, h, temperature: float, banned: tuple[int, ...]):
    """The sampler's distribution's logits (float32, banned ids -inf, / temperature) of hidden states h."""
    logits = G.ban_tokens(model.logits_from_hidden(h).astype(jnp.float32), banned)
    return logits / jnp.float32(temperature) if temperature != 1.0 else logits


def full_kl_terms(student, h, teachers, teacher_h, teacher_index, targets, valid, *, temperature: float,
                  chunk_size: int, banned: tuple[int, ...]):
    """(logp, entropy, kl), each [B, T] float32, 0 where not ``valid``: the student's log-prob
    of ``targets`` and its entropy, and the exact KL(π_student || π_teacher) over the
    vocabulary, π_teacher that of row b's teacher ``teachers[teacher_index[b]]`` (hidden
    states ``teacher_h[k]`` [B, T, D_k]); both distributions as the sampler's (temperature,
    banned ids). Positions go through the heads ``chunk_size`` at a time under
    ``jax.checkpoint``: at most [B, chunk, V] logits per model live at once, in the forward
    and in the backward pass (which recomputes a chunk's logits, the teachers' included,
    instead of storing them), so no [B, T, V] array exists."""
    b, t = targets.shape
    idx = teacher_index.astype(jnp.int32)

    def one(hc, thc, tc):
        ls = _tempered_logits(student, hc, temperature, banned)
        lts = [_tempered_logits(m, x, temperature, banned) for m, x in zip(teachers, thc)]
        lt = lts[0]
        for k in range(1, len(lts)):
            lt = jnp.where((idx == k)[:, None, None], lts[k], lt)
        logz = jax.nn.logsumexp(ls, axis=-1)
        picked = jnp.take_along_axis(ls, tc[..., None], axis=-1)[..., 0] - logz
        p = jnp.exp(ls - logz[..., None])
        ent = logz - jnp.sum(jnp.where(p > 0, p * ls, 0.0), axis=-1)
        return picked, jax.lax.stop_gradient(ent), losses.reverse_kl_from_logits(ls, lt)

    one = jax.checkpoint(one)
    c = min(chunk_size, t)
    n = -(-t // c)
    pad = lambda x: jnp.pad(x, ((0, 0), (0, n * c - t)) + ((0, 0),) * (x.ndim - 2))
    split = lambda x: pad(x).reshape((b, n, c) + x.shape[2:]).swapaxes(0, 1)
    tc = jnp.where(valid, targets, 0)
    outs = jax.lax.map(lambda xs: one(*xs), (split(h), [split(x) for x in teacher_h], split(tc)))
    return tuple(jnp.where(valid, x.swapaxes(0, 1).reshape(b, n * c)[:, :t], 0.0) for x in outs)


def make_rl_step(graphdef: nnx.GraphDef, tx: optax.GradientTransformation, *, loss: str = "grpo",
                 loss_kwargs: dict | None = None, temperature: float = 1.0, chunk_size: int | None = None,
                 banned_token_ids: tuple[int, ...] = (), schedule: Callable[[Any], Any] | None = None,
                 teacher_graphdefs: tuple = (), lora: L.LoraSpec | None = None, n_teachers: int = 0
                 ) -> Callable[[dict, dict], tuple[dict, dict]]:
    """Build the (unjitted) policy-update step. ``loss``: "grpo" (kwargs of
    :func:`losses.grpo_loss_terms`: clip_low, clip_high, kl_beta, kl_kind, kl_clamp,
    aggregation, dual_clip) or "mopd" (of :func:`losses.mopd_loss_terms`: beta, clip_low,
    clip_high, kl_clamp, aggregation, dual_clip, estimator). ``banned_token_ids``: the
    sampler's (excluded from the distribution, so that ρ = 1 on the first epoch).

    MOPD with estimator "full_kl": ``teacher_graphdefs`` (the teachers in
    ``frozen.teacher_order``), and every batch carries ``teacher_params`` (a tuple of their
    parameters, no micro-batch axis; ``setup.with_teachers`` adds it) and per row
    ``teacher_index`` [M, B] (``frozen.teacher_index``). Each micro-batch then runs every
    teacher's forward pass (no gradient) on all its rows, and :func:`full_kl_terms` forms
    the exact per-position KL to each row's teacher. Cost per micro-batch, K teachers of N_k
    parameters, n tokens: K teacher forwards (≈ 2 N_k n FLOPs each, all rows: routing rows
    to teachers inside one program would need dynamic shapes) plus the teachers' heads over
    the response positions twice (forward, and recomputed in the backward pass), against
    the policy's ≈ 6 N n of forward + backward; with one 32B teacher for an 8B student about
    2.3x the update's FLOPs (1 + 2·32/(6·8)), each further teacher +1.3x. Memory: the
    teachers' activations of one micro-batch's forward (no gradient, so transient) and
    [B, chunk, V] logits per model. The scoring phase then scores no teacher.

    ``lora``: the state's params are LoRA adapters and every batch carries ``lora_base``
    (the frozen base weights, no micro-batch axis); the policy is ``lora.merge(base, adapters)``.

    MOPD with ``n_teachers`` > 1 (every estimator; batches carry ``teacher_index``): the
    reported KL also per teacher, as metrics ``kl_teacher_<i>`` / ``kl_tokens_teacher_<i>``
    (sums; :func:`phases.teacher_kl_metrics` turns them into ``<platform>/kl``)."""
    if loss not in LOSSES:
        raise ValueError(f"unknown RL loss {loss!r}; expected one of {LOSSES}")
    kw = dict(loss_kwargs or {})
    full_kl = loss == "mopd" and kw.get("estimator") == "full_kl"
    if full_kl and not teacher_graphdefs:
        raise ValueError("make_rl_step: estimator='full_kl' needs teacher_graphdefs (the teachers run in the update)")
    banned = tuple(banned_token_ids)

    def micro_terms(params, micro, teacher_params=()):
        model = nnx.merge(graphdef, params)
        token_kl = None
        if full_kl:
            shared = "prompt_ids" in micro
            hidden = ((lambda m: G.shared_hidden(m, micro)) if shared else
                      (lambda m: G.sequence_hidden(m, micro["input_ids"], micro["positions"], micro["segment_ids"],
                                                   micro.get("pixel_values"), micro.get("vision"),
                                                   micro["response_mask"])))
            h, targets, valid = hidden(model)
            teachers = [nnx.merge(gd, jax.lax.stop_gradient(p)) for gd, p in zip(teacher_graphdefs, teacher_params)]
            teacher_h = [jax.lax.stop_gradient(hidden(t)[0]) for t in teachers]
            index = micro["teacher_index"] if len(teachers) > 1 else jnp.zeros(targets.shape[:1], jnp.int32)
            logp, entropy, token_kl = full_kl_terms(model, h, teachers, teacher_h, index, targets, valid,
                                                    temperature=float(temperature),
                                                    chunk_size=chunk_size or FULL_KL_CHUNK, banned=banned)
        elif "prompt_ids" in micro:   # the shared-prompt layout: [B, N'] response columns
            logp, valid, entropy = G.shared_token_logprobs(
                model, micro, temperature=temperature, chunk_size=chunk_size, with_entropy=True,
                banned_token_ids=banned)
        else:
            logp, valid, entropy = G.token_logprobs(
                model, micro["input_ids"], micro["positions"], micro["segment_ids"], micro.get("pixel_values"),
                micro.get("vision"), micro["response_mask"], temperature=temperature, chunk_size=chunk_size,
                with_entropy=True, banned_token_ids=banned)
        mask = valid.astype(jnp.float32)
        if loss == "grpo":
            num, den, sums = losses.grpo_loss_terms(logp, micro["old_logp"], micro["ref_logp"], micro["advantages"],
                                                    mask, kl_rows=micro.get("kl_mask"), **kw)
        else:
            groups = (micro["teacher_index"], n_teachers) if n_teachers > 1 else None
            num, den, sums = losses.mopd_loss_terms(logp, micro["old_logp"], micro["ref_logp"], micro["advantages"],
                                                    mask, micro["kl_mask"], token_kl=token_kl, groups=groups, **kw)
        sums["entropy"] = jnp.sum(jax.lax.stop_gradient(entropy) * mask)
        return num, (den, sums)

    sums0 = {k: jnp.zeros((), jnp.float32) for k in SUMS}
    if loss == "mopd" and n_teachers > 1:
        sums0.update({k: jnp.zeros((n_teachers,), jnp.float32) for k in ("kl_by_group", "kl_tokens_by_group")})

    def step(state: dict, batch: dict) -> tuple[dict, dict]:
        batch = dict(batch)
        teacher_params = batch.pop("teacher_params", ())
        base = batch.pop("lora_base", None)
        if full_kl and len(teacher_params) != len(teacher_graphdefs):
            raise ValueError(f"make_rl_step: estimator='full_kl' with {len(teacher_graphdefs)} teachers needs the "
                             f"batch's teacher_params (setup.with_teachers); got {len(teacher_params)}")
        if (lora is None) != (base is None):
            raise ValueError("make_rl_step: LoRA needs the batch's lora_base (setup.with_teachers), and only LoRA")
        if lora is None:
            terms = lambda p, m: micro_terms(p, m, teacher_params)
        else:    # the state's params are the adapters; the model runs on base + alpha/r A @ B
            terms = lambda a, m: micro_terms(L.merge(base, a, lora), m, teacher_params)
        core = make_step(terms, tx, sums0, schedule)
        new_state, metrics, s = core(state, batch)
        n = jnp.maximum(s["tokens"], 1.0)
        metrics.update({"clip_fraction": s["clipped"] / n, "kl": s["kl"] / jnp.maximum(s["kl_tokens"], 1.0),
                        "entropy": s["entropy"] / n, "ratio_mean": s["ratio"] / n, "update_tokens": s["tokens"],
                        "kl_mask_fraction": s["kl_on"] / jnp.maximum(s["sequences"], 1.0)})
        for i in range(n_teachers if "kl_by_group" in s else 0):   # (phases.teacher_kl_metrics names them)
            metrics[f"kl_teacher_{i}"] = s["kl_by_group"][i]
            metrics[f"kl_tokens_teacher_{i}"] = s["kl_tokens_by_group"][i]
        return new_state, metrics

    return step
