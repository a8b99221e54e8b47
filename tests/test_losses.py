"""Specifications of guilibra_jax.losses, each checked against an independent reference
(numpy by hand, optax, or exact enumeration over a small vocabulary)."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from guilibra_jax import losses as L

B, T, V = 4, 7, 5


def _np_softmax(x):
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _asft_batch(seed=0):
    """Logits, targets and segment ids with all three kinds, a direct-action sample
    (no reasoning) and an all-masked sample."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(B, T, V)).astype(np.float32) * 2
    targets = rng.integers(0, V, size=(B, T))
    seg = np.array([
        [0, 0, 1, 1, 2, 3, 3],   # reasoning then action then grounding
        [0, 1, 2, 1, 3, 2, 0],   # mixed
        [0, 0, 0, 2, 2, 3, 3],   # direct action: |c| = 0
        [0, 0, 0, 0, 0, 0, 0],   # all masked
    ])
    return jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(seg)


def _np_weights(seg, aa=2.0, ag=4.0):
    return np.select([seg == 1, seg == 2, seg == 3], [1.0, aa, ag], 0.0)


def _np_asft(logits, targets, seg, normalize, aa=2.0, ag=4.0):
    """Loss and d loss / d logits by the analytic formula w (softmax - onehot) / normaliser."""
    p = _np_softmax(logits)
    onehot = np.eye(V)[np.asarray(targets)]
    nll = -np.log(np.take_along_axis(p, np.asarray(targets)[..., None], -1)[..., 0])
    w = _np_weights(np.asarray(seg), aa, ag)
    if normalize == "token":
        norm = np.full(w.shape, w.sum())
        loss = (w * nll).sum() / w.sum()
    else:
        wb = w.sum(-1)
        n_samples = (wb > 0).sum()
        norm = np.where(wb > 0, wb * n_samples, np.inf)[:, None] * np.ones_like(w)
        loss = sum((w[b] * nll[b]).sum() / wb[b] for b in range(len(wb)) if wb[b] > 0) / n_samples
    grad = (w / norm)[..., None] * (p - onehot)
    return loss, grad


# ----------------------------------------------------------------------------- ASFT


@pytest.mark.parametrize("normalize", ["sample", "token"])
def test_asft_loss_and_gradient_match_analytic_weighted_softmax_minus_onehot(normalize):
    logits, targets, seg = _asft_batch()
    loss_fn = lambda x: L.asft_loss(x, targets, seg, normalize=normalize)[0]
    loss, grad = jax.value_and_grad(loss_fn)(logits)
    ref_loss, ref_grad = _np_asft(logits, targets, seg, normalize)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    np.testing.assert_allclose(grad, ref_grad, atol=1e-6)


def test_asft_token_normalisation_with_unit_alphas_is_masked_cross_entropy():
    logits, targets, seg = _asft_batch(1)
    loss, _ = L.asft_loss(logits, targets, seg, alpha_action=1.0, alpha_grounding=1.0,
                          normalize="token")
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    mask = seg > 0
    np.testing.assert_allclose(loss, jnp.sum(ce * mask) / jnp.sum(mask), rtol=1e-6)


def test_asft_sample_normalisation_averages_only_samples_with_loss():
    logits, targets, seg = _asft_batch(2)
    loss, aux = L.asft_loss(logits, targets, seg, normalize="sample")
    per_sample = [L.asft_loss(logits[b:b + 1], targets[b:b + 1], seg[b:b + 1])[0] for b in range(3)]
    np.testing.assert_allclose(loss, np.mean(per_sample), rtol=1e-6)  # sample 3 is all masked
    assert float(aux["denominator"]) == 3.0
    # The direct-action sample alone: (2 Σ nll_action + 4 Σ nll_grounding) / (2·2 + 4·2).
    nll = optax.softmax_cross_entropy_with_integer_labels(logits[2], targets[2])
    np.testing.assert_allclose(per_sample[2], (2 * nll[3:5].sum() + 4 * nll[5:].sum()) / 12, rtol=1e-6)
    grad = jax.grad(lambda x: L.asft_loss(x, targets, seg)[0])(logits)
    assert np.all(np.isfinite(grad)) and np.all(grad[3] == 0)


def test_asft_aux_reports_per_part_mean_nll_and_counts():
    logits, targets, seg = _asft_batch(3)
    _, aux = L.asft_loss(logits, targets, seg)
    nll = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    for name, sid in (("reasoning", 1), ("action", 2), ("grounding", 3)):
        part = seg == sid
        assert float(aux[f"n_{name}"]) == float(part.sum())
        np.testing.assert_allclose(aux[f"nll_{name}"], nll[part].mean(), rtol=1e-6)


@pytest.mark.parametrize("normalize", ["sample", "token"])
def test_asft_all_masked_batch_gives_zero_loss_and_zero_gradient(normalize):
    logits, targets, _ = _asft_batch()
    seg = jnp.zeros((B, T), jnp.int32)
    targets = targets.at[0, 0].set(-100)  # HF-style ignore index under a masked position
    loss, grad = jax.value_and_grad(
        lambda x: L.asft_loss(x, targets, seg, normalize=normalize)[0])(logits)
    assert float(loss) == 0.0
    assert np.all(np.asarray(grad) == 0.0)


@pytest.mark.parametrize("normalize", ["sample", "token"])
def test_asft_terms_accumulated_over_micro_batches_equal_full_batch(normalize):
    logits, targets, seg = _asft_batch(4)
    terms = lambda x, t, s: L.asft_loss_terms(x, t, s, normalize=normalize)
    full_loss, full_grad = jax.value_and_grad(lambda x: L.asft_loss(x, targets, seg, normalize=normalize)[0])(logits)
    num, den, grads = 0.0, 0.0, []
    for sl in (slice(0, 1), slice(1, 4)):  # uneven split; the second holds the all-masked sample
        n, d = terms(logits[sl], targets[sl], seg[sl])
        grads.append(jax.grad(lambda x: terms(x, targets[sl], seg[sl])[0])(logits[sl]))
        num, den = num + n, den + d
    np.testing.assert_allclose(num / den, full_loss, rtol=1e-6)
    np.testing.assert_allclose(np.concatenate(grads) / den, full_grad, atol=1e-7)


def test_asft_bf16_logits_are_computed_in_float32():
    logits, targets, seg = _asft_batch(5)
    big = (logits * 300).astype(jnp.bfloat16)  # large magnitudes: naive bf16 softmax overflows
    loss, _ = L.asft_loss(big, targets, seg)
    assert loss.dtype == jnp.float32 and np.isfinite(loss)
    np.testing.assert_allclose(loss, L.asft_loss(big.astype(jnp.float32), targets, seg)[0], rtol=1e-6)


def test_segment_weights_and_token_nll_by_hand():
    seg = jnp.array([[0, 1, 2, 3, 7]])
    np.testing.assert_array_equal(L.segment_weights(seg, 2.0, 8.0), [[0, 1, 2, 8, 0]])
    logits = jnp.log(jnp.array([[[0.5, 0.25, 0.25]]]))
    np.testing.assert_allclose(L.token_nll(logits, jnp.array([[1]])), [[np.log(4)]], rtol=1e-6)


def test_invalid_options_raise_naming_the_value_and_the_choices():
    logits, targets, seg = _asft_batch()
    with pytest.raises(ValueError, match="'mean'.*sample"):
        L.asft_loss(logits, targets, seg, normalize="mean")
    with pytest.raises(ValueError, match="'k4'.*k1.*k2.*k3"):
        L.kl_penalty(jnp.zeros(3), jnp.zeros(3), "k4")
    with pytest.raises(ValueError, match="'seq_sum'"):
        L.aggregate(jnp.zeros((2, 3)), jnp.ones((2, 3)), "seq_sum")


# ----------------------------------------------------------------------------- GRPO


def _rl_batch(seed=0, b=3, t=6):
    rng = np.random.default_rng(seed)
    logp = jnp.asarray(-rng.uniform(0.1, 3.0, size=(b, t)), jnp.float32)
    mask = np.ones((b, t), np.float32)
    mask[0, 4:] = 0
    mask[1, 2:] = 0
    return logp, jnp.asarray(mask), rng


@pytest.mark.parametrize("aggregation", L.AGGREGATIONS)
def test_grpo_gradient_at_ratio_one_is_advantage_times_grad_logp(aggregation):
    logp, mask, _ = _rl_batch()
    adv = jnp.array([1.5, -0.7, 0.3])
    grad = jax.grad(lambda lp: L.grpo_loss(lp, logp, logp, adv, mask, kl_beta=0.0,
                                           aggregation=aggregation)[0])(logp)
    m = np.asarray(mask)
    n_b = m.sum(-1, keepdims=True)
    denom = {"token_mean": m.sum(), "seq_mean_token_mean": n_b * len(n_b),
             "seq_mean_token_sum": len(n_b)}[aggregation]
    np.testing.assert_allclose(grad, -np.asarray(adv)[:, None] * m / denom, rtol=1e-6)


def test_grpo_gradient_is_zero_exactly_on_the_clipped_side_only():
    # Per token: (ratio, advantage). eps = 0.2: clipped side is A>0, ρ>1.2 and A<0, ρ<0.8.
    ratio = jnp.array([[1.5, 0.5, 1.5, 0.5, 1.1, 0.9]])
    adv = jnp.array([[1.0, -1.0, -1.0, 1.0, 1.0, -1.0]])
    old = jnp.full(ratio.shape, -1.0)
    logp = old + jnp.log(ratio)
    mask = jnp.ones(ratio.shape)
    loss_fn = lambda lp: L.grpo_loss(lp, old, lp, adv, mask, kl_beta=0.0)
    grad = jax.grad(lambda lp: loss_fn(lp)[0])(logp)
    assert grad[0, 0] == 0.0 and grad[0, 1] == 0.0
    # Unclipped side and inside the range: d(-ρA)/d logp / n = -ρA / 6.
    np.testing.assert_allclose(grad[0, 2:], -(ratio * adv)[0, 2:] / 6, rtol=1e-6)
    aux = loss_fn(logp)[1]
    np.testing.assert_allclose(aux["clip_fraction"], 2 / 6, rtol=1e-6)
    np.testing.assert_allclose(aux["ratio_mean"], ratio.mean(), rtol=1e-6)


def test_grpo_asymmetric_clip_uses_clip_high_above_and_clip_low_below():
    old = jnp.zeros((1, 2))
    logp = jnp.log(jnp.array([[1.25, 0.75]]))  # inside [0.8, 1.28]? 1.25 yes, 0.75 no
    adv = jnp.array([[1.0, -1.0]])
    grad = jax.grad(lambda lp: L.grpo_loss(lp, old, lp, adv, jnp.ones((1, 2)), clip_low=0.2,
                                           clip_high=0.28, kl_beta=0.0)[0])(logp)
    np.testing.assert_allclose(grad, [[-1.25 / 2, 0.0]], rtol=1e-6)


@pytest.mark.parametrize("kind", L.KL_KINDS)
def test_kl_term_vanishes_when_policy_equals_reference(kind):
    logp, mask, _ = _rl_batch(1)
    kl_fn = lambda lp: jnp.sum(L.kl_penalty(lp, logp, kind))
    kl, grad = jax.value_and_grad(kl_fn)(logp)
    assert float(kl) == 0.0
    # k2 and k3 are stationary at lr = 0; k1's pointwise gradient is ∇log π_θ (constant 1
    # per token here), which is zero only in expectation (see the enumeration test).
    np.testing.assert_array_equal(grad, np.ones(logp.shape) if kind == "k1" else 0.0)
    adv = jnp.array([1.0, -1.0, 0.5])
    pg_only = jax.grad(lambda lp: L.grpo_loss(lp, logp, logp, adv, mask, kl_beta=0.0)[0])(logp)
    with_kl = jax.grad(lambda lp: L.grpo_loss(lp, logp, logp, adv, mask, kl_beta=0.1,
                                              kl_kind=kind)[0])(logp)
    if kind != "k1":
        np.testing.assert_allclose(with_kl, pg_only, atol=1e-7)


def test_k3_is_nonnegative_and_zero_exactly_when_equal():
    rng = np.random.default_rng(0)
    logp = jnp.asarray(-rng.exponential(3.0, size=(64, 32)), jnp.float32)
    ref = jnp.asarray(-rng.exponential(3.0, size=(64, 32)), jnp.float32)
    k3 = L.kl_penalty(logp, ref, "k3")
    assert np.all(np.asarray(k3) >= 0)
    assert np.all(np.asarray(k3)[np.asarray(logp != ref)] > 0)
    np.testing.assert_array_equal(L.kl_penalty(logp, logp, "k3"), 0.0)
    lr = np.asarray(logp, np.float64) - np.asarray(ref, np.float64)
    np.testing.assert_allclose(k3, np.exp(-lr) - 1 + lr, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(L.kl_penalty(logp, ref, "k2"), 0.5 * lr**2, rtol=1e-5)


def test_kl_clamp_bounds_value_and_keeps_gradient_finite_at_extremes():
    logp = jnp.array([-1000.0, -1.0, 0.0, -30.0])
    ref = jnp.array([0.0, -1.5, -30.0, 0.0])
    grad = jax.grad(lambda lp: jnp.sum(L.kl_penalty(lp, ref, "k3", clamp=10.0)))(logp)
    vals = L.kl_penalty(logp, ref, "k3", clamp=10.0)
    lr = 0.5
    np.testing.assert_allclose(vals, [10.0, np.expm1(-lr) + lr, 10.0, 10.0], rtol=1e-6)
    np.testing.assert_allclose(grad, [0.0, 1 - np.exp(-lr), 0.0, 0.0], rtol=1e-6)
    np.testing.assert_allclose(L.kl_penalty(jnp.array([-5.0, 5.0]), jnp.zeros(2), "k1", clamp=2.0), [-2.0, 2.0])


def test_sngs_scales_only_negative_advantages_by_min_lambda0_plus_kappa_p_and_one():
    adv = jnp.array([[1.0, -1.0, 0.0, -2.0],
                     [0.5, -0.5, 2.0, -4.0],
                     [-1.0, 1.0, -3.0, 3.0]])
    p = jnp.array([0.25, 0.5, 0.0])
    scaled, lam = L.sngs_scale(adv, p, lambda0=0.5, kappa=1.5)
    np.testing.assert_allclose(lam, [0.875, 1.0, 0.5])  # 0.5+0.375; min(1.25, 1); 0.5
    np.testing.assert_allclose(scaled, [[1.0, -0.875, 0.0, -1.75],
                                        [0.5, -0.5, 2.0, -4.0],
                                        [-0.5, 1.0, -1.5, 3.0]])


def test_group_advantages_are_zero_mean_unit_std_per_group():
    rng = np.random.default_rng(0)
    r = rng.uniform(size=(5, 8)).astype(np.float32)
    a = np.asarray(L.group_advantages(r))
    np.testing.assert_allclose(a.mean(-1), 0.0, atol=1e-6)
    np.testing.assert_allclose(a.std(-1), 1.0, rtol=1e-4)
    np.testing.assert_allclose(L.group_advantages(r, normalize_std=False), r - r.mean(-1, keepdims=True), atol=1e-7)
    const = L.group_advantages(jnp.ones((2, 8)))
    np.testing.assert_array_equal(const, 0.0)
    np.testing.assert_allclose(L.group_advantages(jnp.array([[1.0, 0.0]])), [[1.0, -1.0]], rtol=1e-5)


@pytest.mark.parametrize("aggregation", L.AGGREGATIONS)
def test_aggregations_against_numpy_and_exact_micro_batch_accumulation(aggregation):
    logp, mask, rng = _rl_batch(2, b=4)
    mask = mask.at[3].set(0.0)  # a sequence with no tokens
    old = logp + jnp.asarray(rng.normal(scale=0.3, size=logp.shape), jnp.float32)
    ref = logp + jnp.asarray(rng.normal(scale=0.3, size=logp.shape), jnp.float32)
    adv = jnp.asarray(rng.normal(size=4), jnp.float32)
    kw = dict(kl_beta=0.05, aggregation=aggregation)
    loss, aux = L.grpo_loss(logp, old, ref, adv, mask, **kw)
    # numpy reference of the aggregate of a per-token quantity x
    m = np.asarray(mask, bool)
    ratio = np.exp(np.asarray(logp - old, np.float64))
    a = np.asarray(adv)[:, None]
    x = -np.minimum(ratio * a, np.clip(ratio, 0.8, 1.2) * a)
    lr = np.asarray(logp - ref, np.float64)
    x = x + 0.05 * (np.exp(-lr) - 1 + lr)
    seqs = [x[b][m[b]] for b in range(4) if m[b].any()]
    ref_loss = {"token_mean": x[m].mean(), "seq_mean_token_mean": np.mean([s.mean() for s in seqs]),
                "seq_mean_token_sum": np.mean([s.sum() for s in seqs])}[aggregation]
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    np.testing.assert_allclose(loss, aux["pg_loss"] + 0.05 * aux["kl"], rtol=1e-6)
    num, den, sums = 0.0, 0.0, {}
    for sl in (slice(0, 1), slice(1, 4)):
        n, d, s = L.grpo_loss_terms(logp[sl], old[sl], ref[sl], adv[sl], mask[sl], **kw)
        num, den = num + n, den + d
        sums = {k: sums.get(k, 0.0) + v for k, v in s.items()}
    np.testing.assert_allclose(num / den, loss, rtol=1e-6)
    # the reporting sums, added over micro-batches, give the whole batch's metrics
    np.testing.assert_allclose(sums["tokens"], m.sum())
    np.testing.assert_allclose(sums["ratio"] / sums["tokens"], ratio[m].mean(), rtol=1e-5)
    np.testing.assert_allclose(sums["clipped"] / sums["tokens"], aux["clip_fraction"], rtol=1e-6)
    np.testing.assert_allclose(sums["kl"] / sums["kl_tokens"], (np.exp(-lr) - 1 + lr)[m].mean(), rtol=1e-5)
    assert sums["sequences"] == sums["kl_on"] == sum(m[b].any() for b in range(4))


def test_padding_garbage_never_reaches_loss_or_gradient():
    logp, mask, _ = _rl_batch(3)
    pad = lambda value: jnp.where(mask > 0, logp, value)
    adv = jnp.array([1.0, -1.0, 2.0])
    for fn in (lambda lp: L.grpo_loss(lp, pad(-jnp.inf), pad(jnp.inf), adv, mask)[0],
               lambda lp: L.mopd_loss(lp, pad(-jnp.inf), pad(jnp.inf), adv, mask, jnp.ones(3),
                                      kl_clamp=None)[0]):
        loss, grad = jax.value_and_grad(fn)(pad(jnp.nan))
        assert np.isfinite(loss) and np.all(np.isfinite(grad))
        assert np.all(np.asarray(grad)[np.asarray(mask) == 0] == 0)


# ------------------------------------------------------------------ K3 / UI-MOPD


def _categorical_pair(seed):
    rng = np.random.default_rng(seed)
    theta = jnp.asarray(rng.normal(size=5), jnp.float32)
    ref_logits = jnp.asarray(rng.normal(size=5), jnp.float32)
    return theta, jax.nn.log_softmax(ref_logits)


def _expected_estimator_grad(theta, log_ref, kind):
    """Σ_y sg(π_θ(y)) ∇θ k(y): the exact expectation, over y ~ π_θ, of the per-sample
    gradient of the estimator used as a loss."""
    def surrogate(th):
        logp = jax.nn.log_softmax(th)
        weight = jax.lax.stop_gradient(jnp.exp(logp))
        return jnp.sum(weight * L.kl_penalty(logp, log_ref, kind))
    return jax.grad(surrogate)(theta)


def _forward_kl(th, log_ref):   # KL(π_ref || π_θ)
    return jnp.sum(jnp.exp(log_ref) * (log_ref - jax.nn.log_softmax(th)))


def _reverse_kl(th, log_ref):   # KL(π_θ || π_ref)
    logp = jax.nn.log_softmax(th)
    return jnp.sum(jnp.exp(logp) * (logp - log_ref))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_k3_expected_gradient_is_forward_kl_gradient_not_reverse(seed):
    theta, log_ref = _categorical_pair(seed)
    k3_grad = _expected_estimator_grad(theta, log_ref, "k3")
    forward = jax.grad(_forward_kl)(theta, log_ref)
    reverse = jax.grad(_reverse_kl)(theta, log_ref)
    np.testing.assert_allclose(k3_grad, forward, atol=1e-6)
    # Closed form of the forward-KL gradient wrt logits: π_θ - π_ref.
    np.testing.assert_allclose(forward, jax.nn.softmax(theta) - jnp.exp(log_ref), atol=1e-6)
    assert np.max(np.abs(k3_grad - reverse)) > 1e-2
    # For contrast: k2's expected gradient is the reverse KL's, k1's is zero.
    np.testing.assert_allclose(_expected_estimator_grad(theta, log_ref, "k2"), reverse, atol=1e-6)
    np.testing.assert_allclose(_expected_estimator_grad(theta, log_ref, "k1"), 0.0, atol=1e-6)


def test_k3_expectation_is_reverse_kl_value():
    theta, log_ref = _categorical_pair(3)
    logp = jax.nn.log_softmax(theta)
    expected_k3 = jnp.sum(jnp.exp(logp) * L.kl_penalty(logp, log_ref, "k3"))
    np.testing.assert_allclose(expected_k3, _reverse_kl(theta, log_ref), rtol=1e-5)


def test_mopd_kl_is_clamped_masked_token_mean_of_k3_with_delta_teacher_minus_student():
    logp, mask, rng = _rl_batch(4)
    teacher = logp + jnp.asarray(rng.normal(scale=1.0, size=logp.shape), jnp.float32)
    teacher = teacher.at[2, 0].set(logp[2, 0] - 20.0)  # K3 = e^-20 + 19 > 10: clamped
    kl_mask = jnp.array([1.0, 0.0, 1.0])
    zeros = jnp.zeros(3)
    loss, aux = L.mopd_loss(logp, logp, teacher, zeros, mask, kl_mask, beta=1.0)
    d = np.asarray(teacher, np.float64) - np.asarray(logp, np.float64)
    k3 = np.minimum(np.exp(d) - d - 1, 10.0)
    m = np.asarray(mask, bool)
    per_token = k3 * np.asarray(kl_mask)[:, None]
    np.testing.assert_allclose(loss, per_token[m].sum() / m.sum(), rtol=1e-5)  # all response tokens
    np.testing.assert_allclose(aux["kl"], k3[m & (np.asarray(kl_mask)[:, None] > 0)].mean(), rtol=1e-5)
    np.testing.assert_allclose(aux["kl_loss"], loss, rtol=1e-6)
    np.testing.assert_allclose(L.kl_penalty(logp, teacher, "k3", 10.0)[m], k3[m], rtol=1e-5)


def test_mopd_kl_mask_zero_removes_that_sequences_kl_gradient_entirely():
    logp, mask, rng = _rl_batch(5)
    old = logp + jnp.asarray(rng.normal(scale=0.1, size=logp.shape), jnp.float32)
    teacher = logp + jnp.asarray(rng.normal(scale=1.0, size=logp.shape), jnp.float32)
    adv = jnp.array([0.8, -1.2, 0.4])
    kl_mask = jnp.array([0.0, 1.0, 0.0])
    grad = lambda beta: jax.grad(lambda lp: L.mopd_loss(lp, old, teacher, adv, mask, kl_mask,
                                                       beta=beta)[0])(logp)
    g_pg, g_full = np.asarray(grad(0.0)), np.asarray(grad(0.5))
    np.testing.assert_array_equal(g_full[[0, 2]], g_pg[[0, 2]])
    m1 = np.asarray(mask[1]) > 0
    assert np.max(np.abs(g_full[1, m1] - g_pg[1, m1])) > 1e-3
    # The added gradient is beta (1 - π_ref/π_θ) / n_tokens on kl_mask = 1 tokens.
    d = np.asarray(teacher - logp, np.float64)[1, m1]
    np.testing.assert_allclose(g_full[1, m1] - g_pg[1, m1], 0.5 * (1 - np.exp(d)) / float(mask.sum()),
                               rtol=1e-4, atol=1e-7)


def test_mopd_terms_accumulate_exactly():
    logp, mask, rng = _rl_batch(6, b=4)
    old = logp + jnp.asarray(rng.normal(scale=0.3, size=logp.shape), jnp.float32)
    teacher = logp + jnp.asarray(rng.normal(scale=1.0, size=logp.shape), jnp.float32)
    adv, kl_mask = jnp.array([1.0, -0.5, 0.0, 0.5]), jnp.array([1.0, 0.0, 1.0, 1.0])
    loss, aux = L.mopd_loss(logp, old, teacher, adv, mask, kl_mask)
    num, den, sums = 0.0, 0.0, {}
    for sl in (slice(0, 2), slice(2, 4)):
        n, d, s = L.mopd_loss_terms(logp[sl], old[sl], teacher[sl], adv[sl], mask[sl], kl_mask[sl])
        num, den = num + n, den + d
        sums = {k: sums.get(k, 0.0) + v for k, v in s.items()}
    np.testing.assert_allclose(num / den, loss, rtol=1e-6)
    # the reporting sums give mopd_loss's metrics (K3 over the tokens of kl_mask = 1 sequences)
    np.testing.assert_allclose(sums["kl"] / sums["kl_tokens"], aux["kl"], rtol=1e-5)
    np.testing.assert_allclose(sums["clipped"] / sums["tokens"], aux["clip_fraction"], rtol=1e-6)
    np.testing.assert_allclose(sums["ratio"] / sums["tokens"], aux["ratio_mean"], rtol=1e-6)
    has = np.asarray(mask).sum(1) > 0
    assert sums["sequences"] == has.sum() and sums["kl_on"] == (has & (np.asarray(kl_mask) > 0)).sum()


# ------------------------------------------------- MOPD estimators by exact enumeration


def _mopd_sample_grads(theta, log_teacher, estimator, *, beta=1.0, adv=0.0, weight=1.0, theta_old=None):
    """[V, V]: row y = ∇θ of `mopd_loss` on the one-token response y (old log-prob that of
    ``theta_old``, default θ itself: ρ = 1), clip wide enough never to bind."""
    old_logp = jax.nn.log_softmax(theta if theta_old is None else theta_old)

    def loss(th, y):
        lp = jax.nn.log_softmax(th)
        tok = L.reverse_kl_from_logits(th, log_teacher)[None, None] if estimator == "full_kl" else None
        out, _ = L.mopd_loss(lp[y][None, None], jax.lax.stop_gradient(old_logp[y])[None, None],
                             log_teacher[y][None, None], jnp.array([adv]), jnp.ones((1, 1)), jnp.array([weight]),
                             beta=beta, kl_clamp=None, clip_low=0.99, clip_high=1e3, estimator=estimator,
                             token_kl=tok)
        return out

    return jnp.stack([jax.grad(loss)(theta, y) for y in range(theta.shape[0])])


def _expected(grads, theta):
    """Σ_y π(y) grads[y]: the exact expectation over y ~ softmax(theta)."""
    return jnp.sum(jax.nn.softmax(theta)[:, None] * grads, axis=0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mopd_estimators_expected_gradients_by_exact_enumeration(seed):
    """k3: forward KL(π_t || π_θ); logratio_advantage and full_kl: reverse KL(π_θ || π_t),
    times beta. full_kl's gradient is the same whatever token is sampled (no variance at the
    position); logratio_advantage's varies with the token (a score-function estimate)."""
    theta, log_t = _categorical_pair(seed)
    forward, reverse = jax.grad(_forward_kl)(theta, log_t), jax.grad(_reverse_kl)(theta, log_t)
    beta = 0.7
    g = {e: _mopd_sample_grads(theta, log_t, e, beta=beta) for e in L.MOPD_ESTIMATORS}
    np.testing.assert_allclose(_expected(g["k3"], theta), beta * forward, atol=1e-6)
    np.testing.assert_allclose(_expected(g["logratio_advantage"], theta), beta * reverse, atol=1e-6)
    np.testing.assert_allclose(_expected(g["full_kl"], theta), beta * reverse, atol=1e-6)
    np.testing.assert_allclose(g["full_kl"], np.broadcast_to(beta * reverse, g["full_kl"].shape), atol=1e-6)
    assert np.max(np.abs(forward - reverse)) > 1e-2          # the two KLs' gradients differ here
    spread = lambda x: float(np.max(np.abs(np.asarray(x) - np.asarray(_expected(x, theta)))))
    assert spread(g["logratio_advantage"]) > 1e-2 and spread(g["full_kl"]) < 1e-6


def test_logratio_advantage_is_the_reverse_kl_gradient_off_policy_too():
    """Sampled from an older policy (a later PPO epoch): ρ · sg(log π_t - log π_θ) with the
    CURRENT student's log-prob keeps the expected gradient the reverse KL's at θ."""
    theta, log_t = _categorical_pair(4)
    theta_old = theta + jnp.asarray(np.random.default_rng(9).normal(scale=0.3, size=5), jnp.float32)
    g = _mopd_sample_grads(theta, log_t, "logratio_advantage", theta_old=theta_old)
    np.testing.assert_allclose(_expected(g, theta_old), jax.grad(_reverse_kl)(theta, log_t), atol=1e-6)


def test_logratio_advantage_adds_to_the_task_advantage_weighted_by_the_kl_mask():
    """Per sample: -(A + beta · w · (log π_t - log π_θ)(y)) ∇log π_θ(y) at ρ = 1; w = 0
    leaves the task policy gradient alone."""
    theta, log_t = _categorical_pair(5)
    lp = jax.nn.log_softmax(theta)
    jac = jax.jacobian(jax.nn.log_softmax)(theta)               # [V (y), V (θ)]
    for w in (1.0, 0.5, 0.0):
        g = _mopd_sample_grads(theta, log_t, "logratio_advantage", beta=0.3, adv=1.5, weight=w)
        want = -(1.5 + 0.3 * w * (log_t - lp))[:, None] * jac
        np.testing.assert_allclose(g, want, atol=1e-6)


def test_mopd_kl_weights_scale_the_kl_term_not_only_switch_it():
    """kl_mask carries rl.mopd.kl_mask="release"'s weights (advantages.kl_weights): the
    K3 (or exact KL) of each sequence is multiplied by its weight, not just masked."""
    logp, mask, rng = _rl_batch(7)
    teacher = logp + jnp.asarray(rng.normal(scale=1.0, size=logp.shape), jnp.float32)
    w = jnp.array([0.5, 0.0, 2.0])
    zeros = jnp.zeros(3)
    d = np.asarray(teacher, np.float64) - np.asarray(logp, np.float64)
    k3 = np.exp(d) - d - 1
    m = np.asarray(mask, bool)
    for est, tok in (("k3", None), ("full_kl", jnp.asarray(k3 + 0.25, jnp.float32))):
        per = k3 if tok is None else k3 + 0.25
        loss, _ = L.mopd_loss(logp, logp, teacher, zeros, mask, w, beta=1.0, kl_clamp=None, estimator=est,
                              token_kl=tok)
        np.testing.assert_allclose(loss, (per * np.asarray(w)[:, None])[m].sum() / m.sum(), rtol=1e-5)


def test_reverse_kl_from_logits_by_hand_and_with_banned_ids():
    rng = np.random.default_rng(3)
    s, t = rng.normal(size=(2, 6)), rng.normal(size=(2, 6))
    ls = s - np.log(np.exp(s).sum(-1, keepdims=True))
    lt = t - np.log(np.exp(t).sum(-1, keepdims=True))
    np.testing.assert_allclose(L.reverse_kl_from_logits(s, t), (np.exp(ls) * (ls - lt)).sum(-1), rtol=1e-5)
    # banned ids (-inf in both): the KL over the others, finite value and gradient
    sb, tb = jnp.asarray(s).at[:, :2].set(-jnp.inf), jnp.asarray(t).at[:, :2].set(-jnp.inf)
    kl, g = jax.value_and_grad(lambda x: L.reverse_kl_from_logits(x, tb).sum())(sb)
    np.testing.assert_allclose(kl, L.reverse_kl_from_logits(s[:, 2:], t[:, 2:]).sum(), rtol=1e-5)
    assert np.isfinite(np.asarray(g)).all() and np.all(np.asarray(g)[:, :2] == 0)


def test_full_kl_needs_token_kl_and_unknown_estimators_are_refused():
    logp, mask, _ = _rl_batch(8)
    with pytest.raises(ValueError, match="token_kl"):
        L.mopd_loss_terms(logp, logp, logp, jnp.zeros(3), mask, jnp.ones(3), estimator="full_kl")
    with pytest.raises(ValueError, match="estimator='k1'"):
        L.mopd_loss_terms(logp, logp, logp, jnp.zeros(3), mask, jnp.ones(3), estimator="k1")


# ------------------------------------------------------------------ properties

_SHAPE = (2, 4)
_logps = hnp.arrays(np.float32, _SHAPE, elements=st.floats(-60, 0, width=32))
_masks = hnp.arrays(np.float32, _SHAPE, elements=st.sampled_from([0.0, 1.0]))
_advs = hnp.arrays(np.float32, (2,), elements=st.floats(-10, 10, width=32))


@settings(max_examples=25, deadline=None)
@given(logits=hnp.arrays(np.float32, (2, 4, 6), elements=st.floats(-1e4, 1e4, width=32)),
       targets=hnp.arrays(np.int32, _SHAPE, elements=st.integers(0, 5)),
       seg=hnp.arrays(np.int32, _SHAPE, elements=st.integers(0, 3)),
       logp=_logps, old=_logps, ref=_logps, mask=_masks, adv=_advs,
       kl_mask=hnp.arrays(np.float32, (2,), elements=st.sampled_from([0.0, 1.0])),
       aggregation=st.sampled_from(L.AGGREGATIONS), kind=st.sampled_from(L.KL_KINDS))
def test_losses_and_gradients_are_finite_for_random_finite_inputs(
        logits, targets, seg, logp, old, ref, mask, adv, kl_mask, aggregation, kind):
    for normalize in L.NORMALIZATIONS:
        loss, g = jax.value_and_grad(lambda x: L.asft_loss(x, targets, seg, normalize=normalize)[0])(logits)
        assert np.isfinite(loss) and np.all(np.isfinite(g))
    grpo = lambda lp: L.grpo_loss(lp, old, ref, adv, mask, kl_kind=kind, aggregation=aggregation)
    mopd = lambda lp: L.mopd_loss(lp, old, ref, adv, mask, kl_mask, aggregation=aggregation)
    for fn in (grpo, mopd):
        (loss, aux), g = jax.value_and_grad(fn, has_aux=True)(logp)
        assert np.isfinite(loss) and np.all(np.isfinite(g))
        assert all(np.isfinite(v) for v in aux.values())


def test_losses_jit_with_static_options_and_match_eager():
    logits, targets, seg = _asft_batch(7)
    asft = jax.jit(L.asft_loss, static_argnames="normalize")
    np.testing.assert_allclose(asft(logits, targets, seg, normalize="token")[0],
                               L.asft_loss(logits, targets, seg, normalize="token")[0], rtol=1e-6)
    logp, mask, rng = _rl_batch(7)
    teacher = logp + jnp.asarray(rng.normal(size=logp.shape), jnp.float32)
    adv, kl_mask = jnp.array([1.0, -1.0, 0.5]), jnp.array([1.0, 0.0, 1.0])
    grpo = jax.jit(L.grpo_loss, static_argnames=("kl_kind", "aggregation"))
    mopd = jax.jit(L.mopd_loss, static_argnames="aggregation")
    np.testing.assert_allclose(grpo(logp, logp, teacher, adv, mask, kl_kind="k2")[0],
                               L.grpo_loss(logp, logp, teacher, adv, mask, kl_kind="k2")[0], rtol=1e-6)
    np.testing.assert_allclose(mopd(logp, logp, teacher, adv, mask, kl_mask)[0],
                               L.mopd_loss(logp, logp, teacher, adv, mask, kl_mask)[0], rtol=1e-6)


def test_mopd_kl_per_teacher_equals_each_teachers_rows_alone():
    """The per-teacher KL sums of mopd_loss_terms (groups = each row's teacher) equal the
    reported KL sums of that teacher's rows run alone, and add up to the whole batch's."""
    rng = np.random.default_rng(3)
    B, T = 6, 5
    logp = jnp.asarray(rng.normal(-1.5, 0.5, (B, T)), jnp.float32)
    old = logp + jnp.asarray(rng.normal(0, 0.05, (B, T)), jnp.float32)
    teacher = jnp.asarray(rng.normal(-1.5, 0.7, (B, T)), jnp.float32)
    adv = jnp.asarray(rng.normal(size=B), jnp.float32)
    mask = jnp.asarray(rng.random((B, T)) < 0.8, jnp.float32)
    kl_mask = jnp.asarray([1, 1, 0, 1, 1, 1], jnp.float32)
    group = jnp.asarray([0, 1, 1, 0, 2, 1], jnp.int32)
    _, _, sums = L.mopd_loss_terms(logp, old, teacher, adv, mask, kl_mask, groups=(group, 3))
    for g in range(3):
        rows = np.nonzero(np.asarray(group) == g)[0]
        _, _, alone = L.mopd_loss_terms(logp[rows], old[rows], teacher[rows], adv[rows], mask[rows], kl_mask[rows])
        np.testing.assert_allclose(sums["kl_by_group"][g], alone["kl"], rtol=1e-6)
        np.testing.assert_allclose(sums["kl_tokens_by_group"][g], alone["kl_tokens"])
    np.testing.assert_allclose(sums["kl_by_group"].sum(), sums["kl"], rtol=1e-6)
    np.testing.assert_allclose(sums["kl_tokens_by_group"].sum(), sums["kl_tokens"])
