"""Losses of GUI-Libra (ASFT, conservative GRPO) and UI-MOPD as pure jnp functions.

Shapes: B sequences, T tokens, V vocabulary; N groups (prompts) of G responses each.
Everything is jit-able (string options are static Python values) and computes in
float32 or wider whatever the input dtype. Each loss has a `*_terms` twin returning
(numerator, denominator): sum both over micro-batches, divide once, and the result is
exactly the full-batch loss, so gradient accumulation stays exact.

Masks are 0/1 of any dtype (nonzero counts as 1). Masked-out positions are replaced by
zeros before any arithmetic, so garbage there (padding logps, -inf) never reaches the
loss or its gradient.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array

# Segment ids of ASFT targets; 0 = no loss (prompt, padding). Under weighting "release" they
# also carry flags (data.tokenize): IN_ANSWER (inside <answer>) and AFTER_POINT (after
# "point_2d":); the part is segment & PART_MASK either way.
REASONING, ACTION, GROUNDING = 1, 2, 3
IN_ANSWER, AFTER_POINT, PART_MASK = 4, 8, 3
NORMALIZATIONS = ("sample", "token")
WEIGHTINGS = ("paper", "release")
KL_KINDS = ("k1", "k2", "k3")
AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum")
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


def _grpo_parts(logp, old_logp, ref_logp, advantages, mask, clip_low, clip_high, kl_kind,
                kl_clamp, dual_clip=None):
    pg, ratio, clipped, on = _clipped_pg(logp, old_logp, advantages, mask, clip_low, clip_high, dual_clip)
    kl = kl_penalty(jnp.where(on, logp, 0.0), jnp.where(on, ref_logp, 0.0), kl_kind, kl_clamp)
    return pg, kl, ratio, clipped, on


def grpo_loss_terms(logp, old_logp, ref_logp, advantages, mask, *, clip_low=0.2,
                    clip_high=0.2, kl_beta=0.001, kl_kind="k3", kl_clamp=None,
                    aggregation="token_mean", dual_clip=None) -> tuple[Array, Array]:
    """(numerator, denominator) of `grpo_loss`; sum both over micro-batches, then divide."""
    pg, kl, *_ = _grpo_parts(logp, old_logp, ref_logp, advantages, mask, clip_low, clip_high,
                             kl_kind, kl_clamp, dual_clip)
    return aggregate_terms(pg + kl_beta * kl, mask, aggregation)


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


def _mopd_parts(logp, old_logp, teacher_logp, advantages, mask, kl_mask, clip_low, clip_high,
                kl_clamp, dual_clip=None):
    pg, ratio, clipped, on = _clipped_pg(logp, old_logp, advantages, mask, clip_low, clip_high, dual_clip)
    # K3 with δ = teacher - student is kl_penalty(student, teacher, "k3").
    k3 = kl_penalty(jnp.where(on, logp, 0.0), jnp.where(on, teacher_logp, 0.0), "k3", kl_clamp)
    kl_on = _float(kl_mask)[:, None] > 0  # [B, 1]
    return pg, jnp.where(kl_on, k3, 0.0), k3, ratio, clipped, on, on & kl_on


def mopd_loss_terms(logp, old_logp, teacher_logp, advantages, mask, kl_mask, *, beta=0.01,
                    clip_low=0.2, clip_high=0.28, kl_clamp=10.0,
                    aggregation="token_mean", dual_clip=None) -> tuple[Array, Array]:
    """(numerator, denominator) of `mopd_loss`; sum both over micro-batches, then divide."""
    pg, kl, *_ = _mopd_parts(logp, old_logp, teacher_logp, advantages, mask, kl_mask, clip_low,
                             clip_high, kl_clamp, dual_clip)
    return aggregate_terms(pg + beta * kl, mask, aggregation)


def mopd_loss(logp, old_logp, teacher_logp, advantages, mask, kl_mask, *, beta=0.01,
              clip_low=0.2, clip_high=0.28, kl_clamp=10.0,
              aggregation="token_mean", dual_clip=None) -> tuple[Array, dict]:
    """UI-MOPD's loss L = L_PG + beta * L_MOPD. Returns (loss, aux).

    logp, old_logp [B, T]: the student's (current, sampling) log-probs of its sampled
    tokens; teacher_logp [B, T]: the platform teacher's log-probs of the same tokens;
    advantages [B] (or [B, T]); mask [B, T] 0/1 response tokens; kl_mask [B] 0/1 (μ_g,
    0 for sequences of groups the student already solves).
    L_PG: the PPO clipped surrogate of `grpo_loss` (asymmetric clip; dual_clip as there,
    the release's veRL run sets clip_ratio_c = 10).
    L_MOPD: per token K3 = exp(δ) - δ - 1, δ = teacher_logp - logp, clamped to
    [-kl_clamp, kl_clamp] and multiplied by its sequence's kl_mask, then aggregated like
    L_PG. With "token_mean" the denominator is all response tokens of the batch,
    including those of kl_mask = 0 sequences (veRL's token mean over response_mask).
    K3 here equals kl_penalty(logp, teacher_logp, "k3"). Its gradient, with y_t sampled
    from π_θ, is (1 - π_ref/π_θ) ∇log π_θ(y_t), whose expectation is the gradient of the
    FORWARD KL(π_ref || π_θ), not of the reverse KL.
    aux: loss, pg_loss, kl_loss (L_MOPD), kl (mean K3 over tokens with mask and kl_mask),
    clip_fraction, ratio_mean, kl_mask_fraction (of sequences), n_tokens.
    """
    pg, kl, k3, ratio, clipped, on, kl_on = _mopd_parts(
        logp, old_logp, teacher_logp, advantages, mask, kl_mask, clip_low, clip_high, kl_clamp, dual_clip)
    pg_loss, kl_loss = aggregate(pg, on, aggregation), aggregate(kl, on, aggregation)
    loss = pg_loss + beta * kl_loss
    aux = {"loss": loss, "pg_loss": pg_loss, "kl_loss": kl_loss, "kl": _token_mean(k3, kl_on),
           "clip_fraction": _token_mean(clipped.astype(jnp.float32), on),
           "ratio_mean": _token_mean(ratio, on),
           "kl_mask_fraction": jnp.mean((_float(kl_mask) > 0).astype(jnp.float32)),
           "n_tokens": jnp.sum(on.astype(jnp.float32))}
    return loss, aux
