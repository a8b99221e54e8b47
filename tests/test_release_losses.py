"""Release-exact loss options, checked against hand-computed rows of the releases' code.

Dual clip: EasyR1 ``verl/trainer/core_algos.py::compute_policy_loss`` (GUI-Libra's fork,
``clip_ratio_dual`` = 3.0 by default in ``workers/actor/config.py``) and veRL's vanilla policy
loss (UI-MOPD, ``clip_ratio_c`` = 10): for A < 0 the loss max(-Aρ, -A clip(ρ)) is capped at -cA.
Unbiased std: EasyR1's ``compute_grpo_outcome_advantage`` divides by ``torch.std`` (ddof 1).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from guilibra_jax import losses as L

# (ratio, advantage) per token; clip 0.2 / 0.2, c = 3. Hand-computed release losses:
#   ρ=5,  A=-1: max(5, 1.2) = 5, capped at -cA = 3  -> 3    (zero gradient: dual clip binds)
#   ρ=2,  A=-1: max(2, 1.2) = 2 < 3                  -> 2    (d/dlogp = -Aρ = 2)
#   ρ=.5, A=-1: max(.5, .8) = .8                      -> .8   (lower clip: zero gradient)
#   ρ=5,  A=+1: max(-5, -1.2) = -1.2                  -> -1.2 (upper clip: zero gradient)
#   ρ=.5, A=+1: max(-.5, -.8) = -.5                   -> -.5  (d/dlogp = -Aρ = -.5)
RATIOS = np.array([5.0, 2.0, 0.5, 5.0, 0.5])
ADV = np.array([-1.0, -1.0, -1.0, 1.0, 1.0])
DUAL_LOSS, DUAL_GRAD = [3.0, 2.0, 0.8, -1.2, -0.5], [0.0, 2.0, 0.0, 0.0, -0.5]
PLAIN_LOSS, PLAIN_GRAD = [5.0, 2.0, 0.8, -1.2, -0.5], [5.0, 2.0, 0.0, 0.0, -0.5]


def _run(loss_fn, dual_clip, **kw):
    old = jnp.zeros((5, 1))
    adv = jnp.asarray(ADV)
    mask = jnp.ones((5, 1))
    logp = jnp.log(jnp.asarray(RATIOS))[:, None]

    def f(lp):
        return loss_fn(lp, old, adv, mask, dual_clip=dual_clip, **kw)[0]
    return float(f(logp)), np.asarray(jax.grad(f)(logp))[:, 0], loss_fn(logp, old, adv, mask, dual_clip=dual_clip,
                                                                           **kw)[1]


def _grpo(lp, old, adv, mask, **kw):
    return L.grpo_loss(lp, old, old, adv, mask, kl_beta=0.0, **kw)


def _mopd(lp, old, adv, mask, **kw):
    return L.mopd_loss(lp, old, lp, adv, mask, jnp.zeros(5), beta=0.0, **kw)


@pytest.mark.parametrize("loss_fn", [_grpo, _mopd], ids=["grpo", "mopd"])
def test_dual_clip_matches_the_release_rows(loss_fn):
    kw = dict(clip_low=0.2, clip_high=0.2)
    loss, grad, aux = _run(loss_fn, 3.0, **kw)
    np.testing.assert_allclose(loss, np.mean(DUAL_LOSS), rtol=1e-6)
    np.testing.assert_allclose(grad, np.asarray(DUAL_GRAD) / 5, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(float(aux["clip_fraction"]), 3 / 5)   # tokens 1, 3, 4 have zero gradient
    loss, grad, aux = _run(loss_fn, None, **kw)                      # off: plain PPO clip
    np.testing.assert_allclose(loss, np.mean(PLAIN_LOSS), rtol=1e-6)
    np.testing.assert_allclose(grad, np.asarray(PLAIN_GRAD) / 5, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(float(aux["clip_fraction"]), 2 / 5)


def test_dual_clip_terms_equal_the_loss():
    logp = jnp.log(jnp.asarray(RATIOS))[:, None]
    z = jnp.zeros((5, 1))
    num, den, _ = L.grpo_loss_terms(logp, z, z, jnp.asarray(ADV), jnp.ones((5, 1)), kl_beta=0.0, dual_clip=3.0)
    np.testing.assert_allclose(float(num / den), np.mean(DUAL_LOSS), rtol=1e-6)


def test_unbiased_std_is_torch_std_and_population_std_stays_selectable():
    r = jnp.asarray([[1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.5, 0.5]])
    # Hand: mean .25, squared deviations .5625 + 3 x .0625 = .75; sample std sqrt(.75/3) = .5,
    # population std sqrt(.75/4) = .4330127. A constant group gives zeros either way.
    np.testing.assert_allclose(L.group_advantages(r, std_unbiased=True)[0], [1.5, -0.5, -0.5, -0.5], rtol=1e-5)
    pop = 0.75 / np.sqrt(0.75 / 4)
    np.testing.assert_allclose(L.group_advantages(r)[0, 0], pop, rtol=1e-5)
    np.testing.assert_array_equal(L.group_advantages(r, std_unbiased=True)[1], 0.0)
