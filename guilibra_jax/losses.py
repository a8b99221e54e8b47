"""Losses of GUI-Libra (ASFT, conservative GRPO) and UI-MOPD as pure jnp functions.

Shapes: B sequences, T tokens, V vocabulary; N groups (prompts) of G responses each.
Everything is jit-able (string options are static Python values) and computes in
float32 or wider whatever the input dtype. Each loss has a `*_terms` twin returning
(numerator, denominator): sum both over micro-batches, divide once, and the result is
exactly the full-batch loss, so gradient accumulation stays exact. The RL twins also return
the sums their metrics are made of (`report_sums`: clipped tokens, ratio, KL), so that a
trainer or a benchmark never recomputes them.

Masks are 0/1 of any dtype (nonzero counts as 1). Masked-out positions are replaced by
zeros before any arithmetic, so garbage there (padding logps, -inf) never reaches the
loss or its gradient.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from guilibra_jax import choices as CH

Array = jax.Array

# Segment ids of ASFT targets; 0 = no loss (prompt, padding). Under weighting "release" they
# also carry flags (data.tokenize): IN_ANSWER (inside <answer>) and AFTER_POINT (after
# "point_2d":); the part is segment & PART_MASK either way.
REASONING, ACTION, GROUNDING = 1, 2, 3
IN_ANSWER, AFTER_POINT, PART_MASK = 4, 8, 3
# The options' names (ASFT normalisations and weightings, KL estimators, aggregations, MOPD's
# distillation estimators) are defined once, in guilibra_jax/choices.py.
NORMALIZATIONS, WEIGHTINGS, KL_KINDS = CH.NORMALIZATIONS, CH.WEIGHTINGS, CH.KL_KINDS
AGGREGATIONS, MOPD_ESTIMATORS = CH.AGGREGATIONS, CH.MOPD_ESTIMATORS
# |log ρ| is clamped to this before exp, as veRL does: ρ stays finite, and only ratios
# beyond e^±20 (far outside any clip range) see their gradient cut.
LOG_RATIO_BOUND = 20.0


def _check(name: str, value: str, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise ValueError(f"losses: {name}={value!r} is not one of {valid}")


def _float(x) -> Array:
    """x as float32, or wider if it already is."""
    x = jnp.asarray(x)
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def _safe_div(num: Array, den: Array) -> Array:
    """num / den, and 0 (with a zero, finite gradient) where den == 0."""
    ok = den > 0
    return jnp.where(ok, num / jnp.where(ok, den, 1.0), 0.0)


# ----------------------------------------------------------------------------- ASFT


def token_nll(logits: Array, targets: Array) -> Array:
    """-log softmax(logits)[target], computed in float32 even for bf16 logits.

    logits [B, T, V] aligned with targets [B, T] (logits[:, t] predicts targets[:, t]).
    Returns [B, T] float32. Targets must lie in [0, V) (out of range gives NaN).
    """
    x = _float(logits)
    picked = jnp.take_along_axis(x, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return jax.nn.logsumexp(x, axis=-1) - picked


def segment_part(segment_ids: Array) -> Array:
    """The part (0 none, 1 reasoning, 2 action, 3 grounding) of each segment id."""
    return jnp.where(segment_ids > 0, segment_ids & PART_MASK, 0)


def segment_weights(segment_ids: Array, alpha_action=2.0, alpha_grounding=4.0, weighting="paper") -> Array:
    """Per-token ASFT weight [B, T] float32; 0 where segment_ids is 0.

    "paper": 1 (reasoning) -> 1, 2 (action) -> alpha_action, 3 (grounding) ->
    alpha_grounding (the paper's three token sets); any other id -> 0.
    "release" (GUI-Libra's SFT code): 1, times alpha_action inside ``<answer>`` (flag
    IN_ANSWER), times alpha_grounding from ``"point_2d":`` to the end (flag AFTER_POINT);
    with 2 and 4 that is x2 on the answer JSON, x8 on the coordinates, the [-100, -100]
    placeholder and the closing brackets, x4 on ``</answer>`` and ``<|im_end|>``, x1 on the
    reasoning (the release's ``action_weight`` 2 and its ``action_weight * 2``).
    """
    _check("weighting", weighting, WEIGHTINGS)
    s = segment_ids
    if weighting == "release":
        w = jnp.where((s & IN_ANSWER) > 0, alpha_action, 1.0) * jnp.where((s & AFTER_POINT) > 0, alpha_grounding, 1.0)
        return jnp.where(s > 0, w, 0.0).astype(jnp.float32)
    p = s
    w = jnp.where(p == GROUNDING, alpha_grounding, 0.0)
    w = jnp.where(p == ACTION, alpha_action, w)
    return jnp.where(p == REASONING, 1.0, w).astype(jnp.float32)


def _asft_parts(logits, targets, segment_ids, alpha_action, alpha_grounding, normalize, weighting="paper"):
    _check("normalize", normalize, NORMALIZATIONS)
    if logits.ndim != 3 or logits.shape[:2] != targets.shape or targets.shape != segment_ids.shape:
        raise ValueError(
            f"asft_loss: expected logits [B, T, V] and targets, segment_ids [B, T]; got "
            f"{logits.shape}, {targets.shape}, {segment_ids.shape}")
    nll = token_nll(logits, jnp.where(segment_ids > 0, targets, 0))  # [B, T]
    w = segment_weights(segment_ids, alpha_action, alpha_grounding, weighting)  # [B, T]
    if normalize == "token":
        return nll, jnp.sum(w * nll), jnp.sum(w)
    num_b, den_b = jnp.sum(w * nll, axis=-1), jnp.sum(w, axis=-1)  # [B]
    return nll, jnp.sum(_safe_div(num_b, den_b)), jnp.sum((den_b > 0).astype(jnp.float32))


def asft_loss_terms(logits, targets, segment_ids, *, alpha_action=2.0, alpha_grounding=4.0,
                    normalize="sample", weighting="paper") -> tuple[Array, Array]:
    """(numerator, denominator) of `asft_loss`; their ratio is the loss. ``weighting``:
    see `segment_weights`.

    "token":  numerator = Σ w·nll, denominator = Σ w over the batch.
    "sample": numerator = Σ_b Σ_t w·nll / Σ_t w over samples with Σ_t w > 0,
              denominator = the number of such samples.
    Summing both over micro-batches and dividing gives the full-batch loss exactly.
    """
    _, num, den = _asft_parts(logits, targets, segment_ids, alpha_action, alpha_grounding,
                              normalize, weighting)
    return num, den


def asft_token_coefficients(segment_ids, *, alpha_action=2.0, alpha_grounding=4.0,
                            normalize="sample", weighting="paper") -> tuple[Array, Array]:
    """(coef [B, T] float32, denominator []): `asft_loss_terms`' numerator is
    Σ coef · nll, for a step that forms the NLL itself (only at the loss positions:
    guilibra_jax.head_loss). "token": coef = w; "sample": coef = w / Σ_t w of its sample
    (0 for samples without weight). The denominator is `asft_loss_terms`'. ``weighting``:
    see `segment_weights`."""
    _check("normalize", normalize, NORMALIZATIONS)
    w = segment_weights(segment_ids, alpha_action, alpha_grounding, weighting)  # [B, T]
    if normalize == "token":
        return w, jnp.sum(w)
    den_b = jnp.sum(w, axis=-1, keepdims=True)  # [B, 1]
    return _safe_div(w, den_b), jnp.sum((den_b > 0).astype(jnp.float32))


def asft_loss(logits, targets, segment_ids, *, alpha_action=2.0, alpha_grounding=4.0,
              normalize="sample", weighting="paper") -> tuple[Array, dict]:
    """GUI-Libra's action-aware SFT loss. Returns (loss, aux).

    logits [B, T, V] aligned with targets [B, T]; segment_ids [B, T]: 0 no loss,
    1 reasoning (weight 1), 2 action (alpha_action), 3 grounding (alpha_grounding).
    normalize="sample" (the paper): per sample Σ w·nll / Σ w, averaged over the samples
    that carry any weight; all-masked samples are left out, and a batch with none gives
    loss 0 with a zero gradient. normalize="token" (the release): Σ w·nll / Σ w over the
    whole batch (GUI-Libra's release normalises so, per device micro-batch).
    weighting="paper" weighs by part as above; "release" weighs as GUI-Libra's SFT code
    (`segment_weights`; segment ids then carry its flags). Log-softmax runs in float32
    even for bf16 logits.
    aux: nll_{reasoning,action,grounding} (unweighted mean NLL of that part, 0 if
    absent), n_{reasoning,action,grounding} (token counts), numerator, denominator.
    """
    nll, num, den = _asft_parts(logits, targets, segment_ids, alpha_action, alpha_grounding,
                                normalize, weighting)
    aux = {"numerator": num, "denominator": den}
    parts = segment_part(segment_ids)
    for name, sid in (("reasoning", REASONING), ("action", ACTION), ("grounding", GROUNDING)):
        part = parts == sid
        n = jnp.sum(part.astype(jnp.float32))
        aux[f"nll_{name}"] = _safe_div(jnp.sum(jnp.where(part, nll, 0.0)), n)
        aux[f"n_{name}"] = n
    return _safe_div(num, den), aux


# ------------------------------------------------------------------ KL and advantages


def kl_penalty(logp: Array, ref_logp: Array, kind: str, clamp: float | None = None) -> Array:
    """Per-token KL estimator [B, T] from sampled-token log-probs, lr = logp - ref_logp.

    k1 = lr;  k2 = lr² / 2;  k3 = π_ref/π_θ - 1 - log(π_ref/π_θ) = expm1(-lr) + lr (>= 0).
    clamp: clip the result to [-clamp, clamp] (UI-MOPD clamps k3 to [-10, 10]). For k3
    lr is first clipped to ±min(clamp + 1, 80), which changes neither value nor gradient
    (k3 is past the clamp there) but keeps exp from overflowing into a NaN gradient.
    Without clamp, k3 overflows float32 once ref_logp - logp exceeds ~88.

    Gradients as losses, with y_t sampled from π_θ (the estimators' values all estimate
    the reverse KL(π_θ || π_ref), their gradients do not):
      ∇k1 = ∇log π_θ(y_t): expectation 0;
      ∇k2 = lr ∇log π_θ(y_t): expectation ∇KL(π_θ || π_ref), the reverse KL;
      ∇k3 = (1 - π_ref/π_θ) ∇log π_θ(y_t): expectation is the gradient of the FORWARD
            KL(π_ref || π_θ), not of the reverse KL.
    """
    _check("kind", kind, KL_KINDS)
    lr = _float(logp) - _float(ref_logp)
    if kind == "k1":
        kl = lr
    elif kind == "k2":
        kl = 0.5 * jnp.square(lr)
    else:
        if clamp is not None:
            bound = jnp.minimum(clamp + 1.0, 80.0)
            lr = jnp.clip(lr, -bound, bound)
        kl = jnp.expm1(-lr) + lr
    if clamp is not None:
        kl = jnp.clip(kl, -clamp, clamp)
    return kl


def group_advantages(rewards: Array, *, normalize_std: bool = True, std_unbiased: bool = False,
                     eps: float = 1e-6) -> Array:
    """Group-relative advantages [N, G] from rewards [N, G] (G responses per prompt):
    (r - mean_g r) / (std_g r + eps), or r - mean_g r (UI-MOPD's release). The std is the
    population std (divides by G; the paper's formula) or, with ``std_unbiased``, the
    sample std (divides by G - 1; ``torch.std``'s default, which GUI-Libra's EasyR1 run
    uses). A constant group gives zeros."""
    r = _float(rewards)
    centred = r - jnp.mean(r, axis=-1, keepdims=True)
    if not normalize_std:
        return centred
    std = jnp.std(r, axis=-1, keepdims=True, ddof=1 if std_unbiased else 0)
    return centred / (std + eps)


def sngs_scale(advantages: Array, group_signal: Array, *, lambda0: float = 0.5,
               kappa: float = 1.5) -> tuple[Array, Array]:
    """Success-adaptive negative gradient scaling (GUI-Libra).

    advantages [N, G], group_signal [N] (the group's success rate p^; the release uses
    its mean reward). λ = min(lambda0 + kappa * p^, 1) [N], floored at 0 so that a
    negative signal (a reward scale below 0) never flips a negative advantage's sign;
    negative advantages are multiplied by λ, the others are unchanged. Returns
    (scaled [N, G], λ [N]).
    """
    a = _float(advantages)
    lam = jnp.clip(lambda0 + kappa * _float(group_signal), 0.0, 1.0)
    return jnp.where(a < 0, lam[..., None] * a, a), lam


# ------------------------------------------------------------- policy-gradient losses


def aggregate_terms(x: Array, mask: Array, aggregation: str = "token_mean") -> tuple[Array, Array]:
    """(numerator, denominator) of a masked aggregate of per-token x [B, T].

    "token_mean": Σ x / number of masked tokens.
    "seq_mean_token_mean": each sequence's mean over its tokens, averaged over sequences.
    "seq_mean_token_sum": each sequence's sum over its tokens, averaged over sequences.
    Sequences without masked tokens are left out of the sequence means.
    """
    _check("aggregation", aggregation, AGGREGATIONS)
    on = mask > 0
    x = jnp.where(on, _float(x), 0.0)
    if aggregation == "token_mean":
        return jnp.sum(x), jnp.sum(on.astype(jnp.float32))
    per_seq, n = jnp.sum(x, axis=-1), jnp.sum(on.astype(jnp.float32), axis=-1)  # [B]
    if aggregation == "seq_mean_token_mean":
        per_seq = _safe_div(per_seq, n)
    return jnp.sum(per_seq), jnp.sum((n > 0).astype(jnp.float32))


def aggregate(x: Array, mask: Array, aggregation: str = "token_mean") -> Array:
    """The masked aggregate of `aggregate_terms` (0 when nothing is masked in)."""
    return _safe_div(*aggregate_terms(x, mask, aggregation))


def _token_mean(x, on):
    return _safe_div(jnp.sum(jnp.where(on, x, 0.0)), jnp.sum(on.astype(jnp.float32)))


def _clipped_pg(logp, old_logp, advantages, mask, clip_low, clip_high, dual_clip=None):
    """Per-token PPO clipped surrogate -min(ρA, clip(ρ, 1-clip_low, 1+clip_high) A) [B, T],
    with ρ [B, T], the clipped-branch indicator [B, T] and the mask as bool [B, T].
    dual_clip c (> 1, or None): where A < 0 the loss is further capped at -c·A (dual-clip
    PPO, Ye et al. 2020; EasyR1's clip_ratio_dual, veRL's clip_ratio_c), so a token whose
    ratio exceeds c has zero gradient."""
    if logp.ndim != 2 or logp.shape != old_logp.shape or logp.shape != mask.shape:
        raise ValueError(f"expected logp, old_logp, mask of one shape [B, T]; got "
                         f"{logp.shape}, {old_logp.shape}, {mask.shape}")
    on = mask > 0
    logp = jnp.where(on, _float(logp), 0.0)
    old_logp = jnp.where(on, _float(old_logp), 0.0)
    adv = _float(advantages)
    adv = jnp.broadcast_to(adv[:, None] if adv.ndim == 1 else adv, logp.shape)  # [B, T]
    ratio = jnp.exp(jnp.clip(logp - old_logp, -LOG_RATIO_BOUND, LOG_RATIO_BOUND))
    pg = -jnp.minimum(ratio * adv, jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv)
    # Where the clipped branch is the minimum, the token's gradient is zero.
    clipped = ((adv > 0) & (ratio > 1.0 + clip_high)) | ((adv < 0) & (ratio < 1.0 - clip_low))
    if dual_clip is not None:
        pg = jnp.where(adv < 0, jnp.minimum(pg, -dual_clip * adv), pg)
        clipped = clipped | ((adv < 0) & (ratio > dual_clip))
    return pg, ratio, clipped & on, on


REPORT_SUMS = ("tokens", "clipped", "ratio", "kl", "kl_tokens", "sequences", "kl_on")


def report_sums(ratio, clipped, on, kl, kl_rows) -> dict[str, Array]:
    """Scalar sums over a micro-batch that RL metrics divide (no gradient): masked
    ``tokens``, ``clipped`` tokens (on the clipped branch), ``ratio`` ρ, ``kl`` over the
    ``kl_tokens`` whose sequence has the KL term on (``kl_rows`` [B] > 0), ``sequences``
    with a token, and those of them with the KL on (``kl_on``). Summed over micro-batches:
    clip_fraction = clipped / tokens, ratio_mean = ratio / tokens, kl = kl / kl_tokens,
    kl_mask_fraction = kl_on / sequences."""
    sg = jax.lax.stop_gradient
    m = on.astype(jnp.float32)
    rows_on = (_float(kl_rows) > 0)
    kl_m = m * rows_on[:, None]
    has = jnp.sum(m, -1) > 0
    return {"tokens": jnp.sum(m), "clipped": jnp.sum(m * clipped), "ratio": jnp.sum(sg(ratio) * m),
            "kl": jnp.sum(sg(kl) * kl_m), "kl_tokens": jnp.sum(kl_m),
            "sequences": jnp.sum(has.astype(jnp.float32)), "kl_on": jnp.sum((has & rows_on).astype(jnp.float32))}


def kl_by_group(kl, on, kl_rows, group, n: int) -> dict[str, Array]:
    """:func:`report_sums`' ``kl`` / ``kl_tokens`` split by row group: ``group`` [B] ints in
    [0, n) (MOPD: each row's teacher), as [n] sums ``kl_by_group`` / ``kl_tokens_by_group``
    (summed over micro-batches, their ratio is each group's mean per-token KL)."""
    m = on.astype(jnp.float32) * (_float(kl_rows) > 0)[:, None]
    rows = jax.nn.one_hot(group, n, dtype=jnp.float32)          # [B, n]
    return {"kl_by_group": jnp.sum(jax.lax.stop_gradient(kl) * m, -1) @ rows, "kl_tokens_by_group": jnp.sum(m, -1) @ rows}


def _grpo_parts(logp, old_logp, ref_logp, advantages, mask, clip_low, clip_high, kl_kind,
                kl_clamp, dual_clip=None):
    pg, ratio, clipped, on = _clipped_pg(logp, old_logp, advantages, mask, clip_low, clip_high, dual_clip)
    kl = kl_penalty(jnp.where(on, logp, 0.0), jnp.where(on, ref_logp, 0.0), kl_kind, kl_clamp)
    return pg, kl, ratio, clipped, on


def grpo_loss_terms(logp, old_logp, ref_logp, advantages, mask, *, clip_low=0.2,
                    clip_high=0.2, kl_beta=0.001, kl_kind="k3", kl_clamp=None,
                    aggregation="token_mean", dual_clip=None, kl_rows=None) -> tuple[Array, Array, dict]:
    """(numerator, denominator, `report_sums`) of `grpo_loss`; sum each over micro-batches,
    then divide. ``kl_rows`` [B] (default 1): each sequence's KL weight (0: a row whose
    reference could not be scored, a served reference's failure)."""
    pg, kl, ratio, clipped, on = _grpo_parts(logp, old_logp, ref_logp, advantages, mask, clip_low, clip_high,
                                             kl_kind, kl_clamp, dual_clip)
    rows = jnp.ones(on.shape[:1]) if kl_rows is None else _float(kl_rows)
    num, den = aggregate_terms(pg + kl_beta * kl * rows[:, None], mask, aggregation)
    return num, den, report_sums(ratio, clipped, on, kl, rows)


def grpo_loss(logp, old_logp, ref_logp, advantages, mask, *, clip_low=0.2, clip_high=0.2,
              kl_beta=0.001, kl_kind="k3", kl_clamp=None,
              aggregation="token_mean", dual_clip=None) -> tuple[Array, dict]:
    """GUI-Libra's conservative GRPO loss. Returns (loss, aux).

    logp, old_logp, ref_logp [B, T]: log-probs of the sampled tokens under the current,
    sampling and reference (SFT) policies; advantages [B] (or [B, T]); mask [B, T] 0/1.
    Per token pg = -min(ρA, clip(ρ, 1 - clip_low, 1 + clip_high) A), ρ = exp(logp - old_logp);
    loss = agg(pg) + kl_beta * agg(kl_penalty(logp, ref_logp, kl_kind, kl_clamp)), agg one
    of AGGREGATIONS (see `aggregate_terms`). The release (EasyR1 "low_var_kl") is k3 with
    kl_clamp=10; see `kl_penalty` for what the k3 gradient estimates. dual_clip c caps the
    loss of a negative-advantage token at -c·A (EasyR1 runs with c = 3; None: off).
    aux: loss, pg_loss, kl (aggregated, before kl_beta), clip_fraction (fraction of
    masked tokens on the clipped branch, whose gradient is zero), ratio_mean, n_tokens.
    """
    pg, kl, ratio, clipped, on = _grpo_parts(logp, old_logp, ref_logp, advantages, mask,
                                             clip_low, clip_high, kl_kind, kl_clamp, dual_clip)
    pg_loss, kl_term = aggregate(pg, on, aggregation), aggregate(kl, on, aggregation)
    loss = pg_loss + kl_beta * kl_term
    aux = {"loss": loss, "pg_loss": pg_loss, "kl": kl_term,
           "clip_fraction": _token_mean(clipped.astype(jnp.float32), on),
           "ratio_mean": _token_mean(ratio, on), "n_tokens": jnp.sum(on.astype(jnp.float32))}
    return loss, aux


# --------------------------------------------------------------------------- MOPD

# How the distillation term of `mopd_loss` is estimated (config key rl.mopd.estimator):
# MOPD_ESTIMATORS, from guilibra_jax/choices.py (top of this file).


def reverse_kl_from_logits(logits: Array, teacher_logits: Array) -> Array:
    """Exact KL(π_s || π_t) over the last (vocabulary) axis: Σ_v π_s(v) (log π_s(v) - log π_t(v)),
    π = softmax(logits), in float32 or wider. Entries where the student's log-prob is -inf
    (banned ids, -inf in both) are left out with a zero gradient; a teacher -inf where the
    student has mass gives +inf, as the KL is. Its gradient wrt the student's logits is the
    exact ∇KL(π_s || π_t) = π_s ⊙ (d - Σ π_s d), d = log π_s - log π_t."""
    ls = jax.nn.log_softmax(_float(logits), axis=-1)
    lt = jax.nn.log_softmax(_float(teacher_logits), axis=-1)
    on = jnp.isfinite(ls)
    ls, lt = jnp.where(on, ls, 0.0), jnp.where(on, lt, 0.0)
    return jnp.sum(jnp.where(on, jnp.exp(ls) * (ls - lt), 0.0), axis=-1)


def _mopd_parts(logp, old_logp, teacher_logp, advantages, mask, kl_mask, clip_low, clip_high,
                kl_clamp, dual_clip=None, estimator="k3", beta=0.0, token_kl=None):
    """(pg, the distillation term per token before beta (0 for logratio_advantage: it is
    inside pg), the reported per-token KL, ρ, clipped, on, on & kl_on)."""
    _check("estimator", estimator, MOPD_ESTIMATORS)
    if estimator == "full_kl" and token_kl is None:
        raise ValueError("losses: estimator='full_kl' needs token_kl (the exact per-position KL [B, T])")
    on = mask > 0
    # K3 with δ = teacher - student is kl_penalty(student, teacher, "k3").
    k3 = kl_penalty(jnp.where(on, logp, 0.0), jnp.where(on, teacher_logp, 0.0), "k3", kl_clamp)
    weight = _float(kl_mask)[:, None]      # [B, 1]: μ_g (0/1) or rl.mopd.kl_mask="release"'s weights
    kl_on = weight > 0
    weight = jnp.where(kl_on, weight, 0.0)
    if estimator == "logratio_advantage":
        # per-token advantage β w (log π_t - log π_θ)(y_t), the student's log-prob current and
        # stop-gradient, added to the task advantage inside the clipped surrogate
        adv = _float(advantages)
        adv = jnp.broadcast_to(adv[:, None] if adv.ndim == 1 else adv, logp.shape)
        distill = jax.lax.stop_gradient(jnp.where(on, _float(teacher_logp) - _float(logp), 0.0))
        pg, ratio, clipped, on = _clipped_pg(logp, old_logp, adv + beta * weight * distill, mask, clip_low,
                                             clip_high, dual_clip)
        return pg, jnp.zeros_like(pg), k3, ratio, clipped, on, on & kl_on
    pg, ratio, clipped, on = _clipped_pg(logp, old_logp, advantages, mask, clip_low, clip_high, dual_clip)
    per_token = k3 if estimator == "k3" else jnp.where(on, _float(token_kl), 0.0)
    return pg, weight * per_token, per_token, ratio, clipped, on, on & kl_on


def mopd_loss_terms(logp, old_logp, teacher_logp, advantages, mask, kl_mask, *, beta=0.01,
                    clip_low=0.2, clip_high=0.28, kl_clamp=10.0, aggregation="token_mean",
                    dual_clip=None, estimator="k3", token_kl=None, groups=None) -> tuple[Array, Array, dict]:
    """(numerator, denominator, `report_sums`) of `mopd_loss`; sum each over micro-batches,
    then divide. The reported KL is the per-token K3 (k3, logratio_advantage: an unbiased
    estimate of the reverse KL's value) or the exact KL (full_kl) over the tokens of
    sequences whose kl_mask > 0; ``groups`` = (teacher index [B], number of teachers) adds
    it per teacher (:func:`kl_by_group`)."""
    pg, kl, report_kl, ratio, clipped, on, _ = _mopd_parts(
        logp, old_logp, teacher_logp, advantages, mask, kl_mask, clip_low, clip_high, kl_clamp, dual_clip,
        estimator, beta, token_kl)
    num, den = aggregate_terms(pg + beta * kl, mask, aggregation)
    sums = report_sums(ratio, clipped, on, report_kl, kl_mask)
    if groups is not None:
        sums.update(kl_by_group(report_kl, on, kl_mask, *groups))
    return num, den, sums


def mopd_loss(logp, old_logp, teacher_logp, advantages, mask, kl_mask, *, beta=0.01,
              clip_low=0.2, clip_high=0.28, kl_clamp=10.0, aggregation="token_mean",
              dual_clip=None, estimator="k3", token_kl=None) -> tuple[Array, dict]:
    """UI-MOPD's loss L = L_PG + beta * L_MOPD. Returns (loss, aux).

    logp, old_logp [B, T]: the student's (current, sampling) log-probs of its sampled
    tokens; teacher_logp [B, T]: the platform teacher's log-probs of the same tokens;
    advantages [B] (or [B, T]); mask [B, T] 0/1 response tokens; kl_mask [B] >= 0: each
    sequence's KL weight w (μ_g: 0 for sequences of groups the student already solves, else
    1; rl.mopd.kl_mask="release" passes other weights, `advantages.kl_weights`).
    L_PG: the PPO clipped surrogate of `grpo_loss` (asymmetric clip; dual_clip as there,
    the release's veRL run sets clip_ratio_c = 10).

    ``estimator`` (rl.mopd.estimator), the distillation term; y_t ~ π_θ below, and each
    expected gradient is the expectation over y_t of the per-sample gradient (exact
    enumeration: tests/test_losses.py):

    * "k3" (the paper and its release; default): L_MOPD = agg(w · K3_t), K3 = exp(δ) - δ - 1,
      δ = teacher_logp - logp, clamped to [-kl_clamp, kl_clamp]; equals kl_penalty(logp,
      teacher_logp, "k3"). Per-sample gradient (1 - π_t/π_θ) ∇log π_θ(y_t); its expectation
      is ∇ of the FORWARD KL(π_t || π_θ) (mass-covering), not of the reverse KL. Variance:
      the weight 1 - π_t/π_θ is unbounded where the teacher likes a token the student rarely
      samples (the clamp bounds it).
    * "logratio_advantage" (on-policy distillation as commonly run: Thinking Machines,
      Qwen3): no separate loss; the per-token advantage of the clipped surrogate becomes
      A + beta · w · sg(log π_t(y_t) - log π_θ(y_t)) (the current student's log-prob,
      stop-gradient: -log ratio student/teacher). With A = 0 and ρ = 1 the per-sample
      gradient of the loss is beta · w · (log π_θ - log π_t)(y_t) ∇log π_θ(y_t), whose
      expectation is beta · w · ∇ of the REVERSE KL(π_θ || π_t) (mode-seeking), also on
      later PPO epochs (the ratio corrects the sampling; clipping aside). Variance: one
      sampled token's log ratio per position (a score-function estimate; the task advantage
      adds in; nothing bounds it but the clip). The loss value carries no KL.
    * "full_kl": L_MOPD = agg(w · KL_t) with ``token_kl`` [B, T] the exact reverse
      KL(π_θ || π_t) over the vocabulary at each response position
      (`reverse_kl_from_logits`; the update step forms it from both models' logits, chunked
      over positions). Gradient: exactly beta · w · ∇KL(π_θ || π_t) at every position,
      whatever token was sampled: no sampling variance at the position (the prefix is
      still sampled). Needs the teacher's logits over the student's vocabulary.

    With "token_mean" the denominator is all response tokens of the batch, including those
    of kl_mask = 0 sequences (veRL's token mean over response_mask).
    aux: loss, pg_loss, kl_loss (beta-free L_MOPD; 0 for logratio_advantage), kl (mean
    reported per-token KL over tokens with mask and kl_mask: K3, or the exact KL for
    full_kl), clip_fraction, ratio_mean, kl_mask_fraction (of sequences), n_tokens.
    """
    pg, kl, report_kl, ratio, clipped, on, kl_on = _mopd_parts(
        logp, old_logp, teacher_logp, advantages, mask, kl_mask, clip_low, clip_high, kl_clamp, dual_clip,
        estimator, beta, token_kl)
    pg_loss, kl_loss = aggregate(pg, on, aggregation), aggregate(kl, on, aggregation)
    loss = pg_loss + beta * kl_loss
    aux = {"loss": loss, "pg_loss": pg_loss, "kl_loss": kl_loss, "kl": _token_mean(report_kl, kl_on),
           "clip_fraction": _token_mean(clipped.astype(jnp.float32), on),
           "ratio_mean": _token_mean(ratio, on),
           "kl_mask_fraction": jnp.mean((_float(kl_mask) > 0).astype(jnp.float32)),
           "n_tokens": jnp.sum(on.astype(jnp.float32))}
    return loss, aux
