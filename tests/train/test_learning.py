"""Known-answer learning tests of stage 2, through the real path: the trainer's step
(``rl/trainer.py``: PH.collect -> ADV.compute -> PH.score -> PH.update with the jitted
update that ``setup.rl_step`` builds from the config keys a user sets), on a policy whose
response distribution is known exactly.

The policy is the tiny model of tests/train/test_rl.py with ``rl.max_new_tokens = 1`` and
every token but the K = 4 of ``ALLOWED`` banned (sampler, scorers and update alike, as
setup bans the vision tokens): a response is one token a, and the exact response
distribution of prompt x is π(a | x) = softmax of the model's logits at the prompt's last
position over ALLOWED (:func:`exact_logp`, a direct forward pass independent of the
scorers' alignment). Rewards are a function of the sampled token (``PH.reward``
monkeypatched). Expected reward and KLs are then exact sums over the 4 tokens.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import time

import jax
import jax.numpy as jnp
import ml_collections as mlc
import numpy as np
import optax
import pytest
from flax import nnx

from guilibra_jax import generate as G
from guilibra_jax import losses as L
from guilibra_jax import sharding as S
from guilibra_jax.errors import ConfigError
from guilibra_jax.train import config as run_config
from guilibra_jax.train.rl import frozen as FZ
from guilibra_jax.train.rl import phases as PH
from guilibra_jax.train.rl import rollout as RO
from guilibra_jax.train.rl import setup as RS
from guilibra_jax.train.rl.trainer import RLTrainer
from guilibra_jax.train.state import optimizer_from_config
from guilibra_jax.train.step_core import init_state
from tests.train.test_rl import PATCH_BUCKET, device, rl_batch, sharpen, tiny

ALLOWED = np.array([40, 41, 42, 43])
GROUP = 8


def banned(cfg) -> tuple[int, ...]:
    return tuple(i for i in range(cfg.text.vocab_size) if i not in set(ALLOWED.tolist()))


def make_config(method: str, *, lr: float, steps: int, warmup: int = 0, **rl) -> mlc.ConfigDict:
    """base_config with the keys a user sets for a tiny stage-2 run (AdamW at ``lr``, constant
    after ``warmup`` linear warmup steps)."""
    c = run_config.base_config()
    c.method = method
    c.data.method = "guilibra" if method == "grpo" else "mopd"
    c.data.batch_size = 2
    c.data.patch_bucket = PATCH_BUCKET
    c.rl.update(group_size=GROUP, max_new_tokens=1, top_p=1.0, temperature=1.0)
    c.optim.update(lr=lr, schedule="constant", warmup_steps=warmup)
    c.train.steps = steps
    for key, value in rl.items():      # dotted keys under rl, e.g. "mopd.estimator"
        node = c.rl
        *path, last = key.split(".")
        for p in path:
            node = node[p]
        node[last] = value
    return c


class Tok:
    def decode(self, ids, **kw):
        return " ".join(map(str, ids))


def make_stage(config, frozen: dict, tx=None):
    """(Stage2, train state) of the tiny policy, built as ``setup.setup`` builds it (the
    update from ``setup.rl_step``), without loading models: ``frozen`` given."""
    cfg, graphdef, params = tiny()
    mesh = S.make_mesh({"data": -1, "fsdp": 1, "tensor": 1}, devices=jax.devices()[:1])
    ban = banned(cfg)
    schedule = None
    if tx is None:
        tx, schedule = optimizer_from_config(config, params, config.train.steps)
    step_fn, teacher_params = RS.rl_step(config, graphdef, cfg, tx, ban, frozen, schedule)
    update_fn = RS.with_teachers(jax.jit(step_fn), teacher_params)
    rl = config.rl
    stop = (cfg.text.vocab_size - 1,)
    sampling = G.SamplingConfig(temperature=rl.temperature, top_p=rl.top_p, top_k=rl.top_k,
                                max_new_tokens=rl.max_new_tokens, stop_token_ids=stop, pad_token_id=0,
                                banned_token_ids=ban)
    s = RS.Stage2(config, mesh, graphdef, cfg, Tok(), sampling, frozen, update_fn, 0, stop, ban, row_multiple=1)
    # committed to the device as the jitted update's outputs are: one compile, not two
    return s, jax.device_put(init_state(params, tx), jax.devices()[0])


def prompts(platforms=("desktop", "desktop")):
    cfg = tiny()[0]
    return rl_batch(cfg, n_prompts=len(platforms), platforms=platforms)


@functools.lru_cache(maxsize=None)
def _exact_fn():
    cfg, graphdef, _ = tiny()

    @jax.jit
    def fn(params, seq):
        model = nnx.merge(graphdef, params)
        h = model.hidden_states(seq["input_ids"], seq["positions"], seq["segment_ids"], seq["pixel_values"],
                                seq["vision"])
        logits = G.ban_tokens(model.logits_from_hidden(h).astype(jnp.float32), banned(cfg))
        return jax.nn.log_softmax(logits, axis=-1)    # [R, T, V]: position p's distribution of token p + 1

    return fn


def _sequences(ro):
    n = ro.tokens.shape[1]
    return device(RO.sequence_batch(ro, np.arange(ro.rows), tiny()[0], PATCH_BUCKET, 0, n)), ro.prompt_ids.shape[1], n


def exact_rows(params, ro) -> np.ndarray:
    """[R, n + 1, K]: exact log π(· | prompt, response[:j]) over ALLOWED for j = 0..n of each
    rollout row (its n response tokens): a direct forward pass over the whole sequence."""
    seq, Tp, n = _sequences(ro)
    return np.asarray(_exact_fn()(params, seq))[:, Tp - 1:Tp + n][..., ALLOWED]


def exact_logp(params, batch) -> np.ndarray:
    """[P, K]: the exact response distribution (log) of each prompt of ``batch``."""
    ro = RO.expand_groups(batch, 1)
    ro.tokens = np.full((ro.rows, 1), ALLOWED[0], np.int32)
    ro.lengths = np.ones(ro.rows, np.int32)
    return exact_rows(params, ro)[:, 0]


def hand_grad(params, batch, weights) -> dict:
    """∇ params of Σ_{p, k} weights[p, k] · log π(ALLOWED[k] | prompt p), by the direct pass."""
    ro = RO.expand_groups(batch, 1)
    ro.tokens = np.full((ro.rows, 1), ALLOWED[0], np.int32)
    ro.lengths = np.ones(ro.rows, np.int32)
    seq, Tp, _ = _sequences(ro)
    f = lambda p: jnp.sum(jnp.asarray(weights) * _exact_fn()(p, seq)[:, Tp - 1][:, ALLOWED])
    return jax.grad(f)(params)


def kl(lp, lq) -> np.ndarray:
    """KL(p || q) per row of log-prob arrays [..., K]."""
    return np.sum(np.exp(lp) * (lp - lq), axis=-1)


def token_reward(values):
    """PH.reward replacement: reward values[k] for ALLOWED[k] as the response's token (any
    other token: 0); success when the reward is 1 (both methods' full credit)."""
    values = np.asarray(values, np.float32)
    lookup = {int(a): float(v) for a, v in zip(ALLOWED, values)}

    def reward(s, ro):
        r = np.array([lookup.get(int(t), 0.0) if v else 0.0 for t, v in zip(ro.tokens[:, 0], ro.valid)], np.float32)
        return RO.Scored(r, (r >= 1.0) & ro.valid, {})

    return reward


def train(s, state, n_steps, probe, *, batch=None):
    """Run the trainer's step ``n_steps`` times on the same prompts; ``probe(params)`` after
    each (and before the first). Returns (state, [probe values], [metric rows], seconds)."""
    t0 = time.time()
    trainer = RLTrainer(s, "/nonexistent", None)
    trainer.prompts = itertools.repeat(prompts() if batch is None else batch)
    values, rows = [probe(state["params"])], []
    for step in range(n_steps):
        state, row, applied = trainer.step(state, step)
        assert all(applied), row
        rows.append(row)
        values.append(probe(state["params"]))
    return state, values, rows, time.time() - t0


class patched_reward:
    """PH.reward replaced while inside (for cached runs that outlive a test's monkeypatch)."""

    def __init__(self, fn):
        self.fn = fn

    def __enter__(self):
        self.saved, PH.reward = PH.reward, self.fn

    def __exit__(self, *exc):
        PH.reward = self.saved


def frozen_model(name, params):
    cfg, graphdef, _ = tiny()
    return FZ.Frozen(name, graphdef, params, cfg)


# ----------------------------------------------------------------------------- GRPO

TARGET_REWARD = np.array([0.0, 0.0, 0.0, 1.0])   # reward 1 for ALLOWED[3], the start's least likely token


@functools.lru_cache(maxsize=None)
def grpo_run(kl_beta: float, lr: float = 3e-4, n_steps: int = 40):
    """GRPO (defaults: std-normalised advantages, SNGS, k3 KL to the starting policy; Adam
    with 10 warmup steps: Adam's first step moves every weight by the full lr whatever its
    gradient, a KL jump of ~1 on this model that no beta can prevent) for ``n_steps``
    trainer steps: (exact expected reward per step, exact max-over-prompts KL to the
    reference per step, seconds)."""
    _, _, params = tiny()
    batch = prompts()
    lp_ref = exact_logp(params, batch)
    s, state = make_stage(make_config("grpo", lr=lr, steps=n_steps, warmup=10, kl_beta=kl_beta),
                          {"reference": frozen_model("reference", params)})

    def probe(p):
        lp = exact_logp(p, batch)
        return float((np.exp(lp) @ TARGET_REWARD).mean()), float(kl(lp, lp_ref).max())

    with patched_reward(token_reward(TARGET_REWARD)):
        _, values, _, secs = train(s, state, n_steps, probe, batch=batch)
    reward, kl_ref = (np.array(v) for v in zip(*values))
    return reward, kl_ref, secs


def test_grpo_raises_the_exact_expected_reward():
    """Reward 1 for one of the 4 tokens: the exact expected reward rises from 0.06 to >= 0.9
    within 15 steps (Adam 3e-4 after 10 warmup steps, kl_beta 0.01, G = 8, 2 prompts) and
    ends >= 0.95."""
    reward, _, secs = grpo_run(0.01)
    print(f"\nGRPO expected reward: start {reward[0]:.3f}, step 15 {reward[15]:.3f}, end {reward[-1]:.3f} "
          f"(first >= 0.9 at step {int(np.argmax(reward >= 0.9))}; {secs:.1f} s)")
    assert reward[0] < 0.1
    assert reward[:16].max() >= 0.9 and reward[-1] >= 0.95, reward.round(3)


def lora_stage(config):
    """(Stage2, train state, base params) of the tiny policy with LoRA (``model.lora.*`` of
    ``config``), built as ``setup.setup`` builds it: the adapters train, the update gets
    the frozen base with every batch, and GRPO's reference is the base itself."""
    from guilibra_jax.train.lora_state import FrozenBase
    cfg, graphdef, params = tiny()
    mesh = S.make_mesh({"data": -1, "fsdp": 1, "tensor": 1}, devices=jax.devices()[:1])
    rep = jax.tree.map(lambda _: S.replicated(mesh), params)
    lora = FrozenBase.build(config, params, rep, mesh)
    tx, schedule = optimizer_from_config(config, lora.adapters, config.train.steps)
    frozen = {"reference": FZ.Frozen("reference", graphdef, lora.base, cfg)}
    step_fn, teacher_params = RS.rl_step(config, graphdef, cfg, tx, banned(cfg), frozen, schedule, lora.spec)
    update_fn = RS.with_teachers(jax.jit(step_fn), teacher_params, lora.base)
    rl = config.rl
    stop = (cfg.text.vocab_size - 1,)
    sampling = G.SamplingConfig(temperature=rl.temperature, top_p=rl.top_p, top_k=rl.top_k,
                                max_new_tokens=rl.max_new_tokens, stop_token_ids=stop, pad_token_id=0,
                                banned_token_ids=banned(cfg))
    s = RS.Stage2(config, mesh, graphdef, cfg, Tok(), sampling, frozen, update_fn, 0, stop, banned(cfg),
                  row_multiple=1, lora=lora)
    return s, jax.device_put(init_state(lora.adapters, tx), jax.devices()[0]), params


def test_grpo_with_lora_raises_the_exact_expected_reward_from_the_frozen_base():
    """The same GRPO run with LoRA rank 2 on every text Linear (the base frozen, the
    reference the base itself): the policy starts exactly at the base (KL 0 at step 0), the
    exact expected reward rises from 0.06 to >= 0.9 within 40 steps, and the base's
    parameters are untouched."""
    from guilibra_jax import lora as LORA
    config = make_config("grpo", lr=3e-3, steps=40, warmup=10, kl_beta=0.01)
    config.model.lora.update(rank=2, alpha=4.0, targets=(r"^language_model/.*/kernel$",))
    s, state, params = lora_stage(config)
    before = jax.tree.map(np.asarray, params)
    batch = prompts()
    lp_ref = exact_logp(params, batch)

    def probe(adapters):
        lp = exact_logp(LORA.merge(s.lora.base, adapters, s.lora.spec), batch)
        return float((np.exp(lp) @ TARGET_REWARD).mean()), float(kl(lp, lp_ref).max())

    with patched_reward(token_reward(TARGET_REWARD)):
        _, values, rows, secs = train(s, state, 40, probe, batch=batch)
    reward, kl_ref = (np.array(v) for v in zip(*values))
    print(f"\nGRPO + LoRA expected reward: start {reward[0]:.3f}, end {reward[-1]:.3f} "
          f"(first >= 0.9 at step {int(np.argmax(reward >= 0.9))}; {secs:.1f} s)")
    assert kl_ref[0] == 0.0 and abs(rows[0]["kl"]) < 1e-9       # B = 0: the policy is the base, the reference
    assert reward[0] < 0.1 and reward.max() >= 0.9, reward.round(3)
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, s.lora.base), before)


def test_grpo_kl_to_the_reference_is_bounded_tighter_as_beta_grows():
    """The exact KL(π || π_ref) at every one of 40 steps, max over the 2 prompts. Without an
    effective penalty (beta = 0.01, the run above) the policy goes deterministic on the
    rewarded token: KL -> log 1 / π_ref(target) = 3.27, the beta -> 0 limit. With beta = 1
    the KL stays under 2.2 and with beta = 3 under 0.5, the expected reward traded for it
    (<= 0.75 and <= 0.35). (Measured: max 1.85 and 0.26; for free logits, G -> inf and no
    SNGS, the fixed point of the expected update, π = (c e_t + beta π_ref) / (c + beta) with
    c = sqrt(p / (1 - p)), p = π(target), has KL 1.11 and 0.13.)"""
    _, _, params = tiny()
    limit = float(np.max(-exact_logp(params, prompts())[:, 3]))
    _, kl_0, _ = grpo_run(0.01)
    r_1, kl_1, t_1 = grpo_run(1.0)
    r_3, kl_3, t_3 = grpo_run(3.0)
    print(f"\nGRPO max KL to ref: beta 0.01 -> {kl_0.max():.3f} (limit {limit:.3f}); beta 1 -> {kl_1.max():.3f} "
          f"(reward max {r_1.max():.3f}; {t_1:.1f} s); beta 3 -> {kl_3.max():.3f} (reward max {r_3.max():.3f}; "
          f"{t_3:.1f} s)")
    assert 0.9 * limit <= kl_0.max() <= limit + 0.05
    assert kl_1.max() <= 2.2 and r_1.max() <= 0.75
    assert kl_3.max() <= 0.5 and r_3.max() <= 0.35
    assert kl_3.max() < kl_1.max() / 3 and kl_1.max() < kl_0.max() / 1.5


def test_sngs_scales_exactly_the_negative_advantage_rows_of_the_gradient():
    """One trainer step (SGD lr 1, kl_beta 0, so the update is minus the gradient) with
    SNGS on and off on the same rollout. By hand: A = (r - mean) / (std + 1e-6) per group,
    λ = min(0.5 + 1.5 · mean r, 1); the token-mean PG gradient at ρ = 1 is
    -(1/N) Σ_i Ã_i ∇log π(a_i | x_i) with Ã = A where A >= 0 and λA where A < 0. The
    update's gradient equals the by-hand one in both runs, and the two differ by exactly
    (λ - 1) times the negative rows' part."""
    _, _, params = tiny()
    batch = prompts()
    values = np.array([1.0, 0.0, 0.5, 0.0])
    config = make_config("grpo", lr=1.0, steps=1, kl_beta=0.0)
    s, state0 = make_stage(config, {"reference": frozen_model("reference", params)}, tx=optax.sgd(1.0))
    seen = {}
    update = PH.update

    def spy(s_, state, ro, adv, scores):
        seen["tokens"], seen["adv"] = ro.tokens[:, 0].copy(), adv["advantages"].copy()
        return update(s_, state, ro, adv, scores)

    grads = {}
    with patched_reward(token_reward(values)):
        PH.update = spy
        try:
            for on in (True, False):
                s.config.rl.sngs.enabled = on
                state, _, _, _ = train(s, jax.tree.map(jnp.copy, state0), 1, lambda p: None, batch=batch)
                grads[on] = jax.tree.map(lambda a, b: np.asarray(a) - np.asarray(b), state0["params"], state["params"])
                seen[on] = dict(seen)
        finally:
            PH.update = update
    np.testing.assert_array_equal(seen[True]["tokens"], seen[False]["tokens"])   # the same rollout
    k = np.searchsorted(ALLOWED, seen[True]["tokens"]).reshape(2, GROUP)
    r = values[k]
    a = (r - r.mean(1, keepdims=True)) / (r.std(1, keepdims=True) + 1e-6)
    lam = np.minimum(0.5 + 1.5 * r.mean(1), 1.0)[:, None]
    assert (a < 0).any() and (lam < 1).any() and (a > 0).any()
    np.testing.assert_allclose(seen[True]["adv"].reshape(2, GROUP), np.where(a < 0, lam * a, a), rtol=1e-5, atol=1e-6)

    def weights(adv):   # W[p, k] = -(1/N) Σ_{i in group p, a_i = k} adv_i
        w = np.zeros((2, len(ALLOWED)))
        np.add.at(w, (np.repeat(np.arange(2), GROUP), k.reshape(-1)), -adv.reshape(-1) / adv.size)
        return w

    flat = lambda g: np.concatenate([np.ravel(x) for x in jax.tree.leaves(g)])
    g_pos = flat(hand_grad(params, batch, weights(np.where(a > 0, a, 0.0))))
    g_neg = flat(hand_grad(params, batch, weights(np.where(a < 0, a, 0.0))))
    g_neg_scaled = flat(hand_grad(params, batch, weights(np.where(a < 0, lam * a, 0.0))))
    on, off = flat(grads[True]), flat(grads[False])
    err = lambda x, y: np.linalg.norm(x - y) / np.linalg.norm(y)
    print(f"\nSNGS: |update - hand| / |hand| on {err(on, g_pos + g_neg_scaled):.2e}, off {err(off, g_pos + g_neg):.2e}; "
          f"lambda {lam.ravel()}")
    assert err(on, g_pos + g_neg_scaled) < 1e-3 and err(off, g_pos + g_neg) < 1e-3
    assert err(on - off, g_neg_scaled - g_neg) < 1e-3 and np.linalg.norm(on - off) > 0.03 * np.linalg.norm(off)


# ----------------------------------------------------------------------------- MOPD

DESKTOP_TEACHER, MOBILE_TEACHER = 5, 12    # sharpen() seeds: teachers that disagree on both prompts


def teacher(seed):
    return sharpen(tiny()[2], seed)


@functools.lru_cache(maxsize=None)
def mopd_run(estimator: str, lr: float, n_steps: int, routes: tuple, kl_mask: str = "off",
             rewards: tuple = (("desktop", 0.0), ("mobile", 0.0)), beta: float = 1.0):
    """MOPD trainer steps on one desktop and one mobile prompt. ``routes``: ((label,
    teacher seed), ...) as rl.teachers; rewards per platform (the same for every response:
    with 0 everywhere the task reward is off, advantages 0). Returns ([steps + 1, 2 prompts,
    2 teachers] exact KL(π_student || teacher seed DESKTOP_TEACHER / MOBILE_TEACHER), seconds)."""
    batch = prompts(("desktop", "mobile"))
    seeds = (DESKTOP_TEACHER, MOBILE_TEACHER)
    lp_t = [exact_logp(teacher(sd), batch) for sd in seeds]
    config = make_config("mopd", lr=lr, steps=n_steps, normalize_std=False, **{
        "mopd.estimator": estimator, "mopd.beta": beta, "mopd.kl_mask": kl_mask})
    config.rl.teachers = {label: f"random:{sd}" for label, sd in routes}   # what they stand for (not loaded)
    s, state = make_stage(config, {label: frozen_model(f"teacher_{label}", teacher(sd)) for label, sd in routes})
    reward_of = dict(rewards)

    def reward(s_, ro):
        r = np.array([reward_of[p] if v else 0.0 for p, v in zip(ro.platform, ro.valid)], np.float32)
        return RO.Scored(r, (r >= 1.0) & ro.valid, {})

    def probe(p):
        lp = exact_logp(p, batch)
        return np.stack([kl(lp, t) for t in lp_t], axis=1)      # [prompt, teacher]

    with patched_reward(reward):
        _, values, _, secs = train(s, state, n_steps, probe, batch=batch)
    return np.array(values), secs


DISTILL_LR, DISTILL_STEPS = 3e-4, 20


@pytest.mark.parametrize("estimator", L.MOPD_ESTIMATORS)
def test_on_policy_distillation_without_task_reward_cuts_the_exact_kl_tenfold(estimator):
    """One teacher for every platform ('*'), all rewards equal (advantages 0), beta 1, KL
    mask off, Adam 3e-4: the exact KL(student || teacher), mean over the 2 prompts, falls
    at least 10x and stays there over the last 5 of 20 steps, with each estimator. First
    step at 10x (measured): full_kl 3, logratio_advantage 6, k3 8."""
    kls, secs = mopd_run(estimator, DISTILL_LR, DISTILL_STEPS, (("*", DESKTOP_TEACHER),))
    own = kls[:, :, 0].mean(1)                     # to the one teacher, mean over prompts
    first = int(np.argmax(own <= own[0] / 10))
    print(f"\n{estimator}: KL {own[0]:.3f} -> {own[-1]:.4f} ({own[0] / max(own[-1], 1e-9):.0f}x; first 10x at step "
          f"{first}; {secs:.1f} s)")
    assert own[0] > 0.5
    assert np.all(own[-5:] <= own[0] / 10), own.round(4)


def routed_as_its_platform(kls) -> bool:
    """Each platform's prompt: the exact KL to its own platform's teacher falls >= 5x, the
    KL to the other platform's teacher does not fall (ends >= its start)."""
    own = kls[:, [0, 1], [0, 1]]      # desktop prompt -> desktop teacher, mobile -> mobile
    other = kls[:, [0, 1], [1, 0]]
    return bool(np.all(own[-1] <= own[0] / 5) and np.all(other[-1] >= other[0]))


def test_mopd_routes_each_platform_to_its_own_teacher():
    """Two teachers (rl.teachers desktop / mobile) that disagree; rewards off; full_kl
    (the fastest estimator above). Each prompt's student distribution moves to its own
    platform's teacher and away from the other. The same run with the routing swapped
    (desktop rows scored by the mobile teacher and back) fails the check."""
    routes = (("desktop", DESKTOP_TEACHER), ("mobile", MOBILE_TEACHER))
    kls, secs = mopd_run("full_kl", DISTILL_LR, DISTILL_STEPS, routes)
    swapped, _ = mopd_run("full_kl", DISTILL_LR, DISTILL_STEPS, (("desktop", MOBILE_TEACHER), ("mobile", DESKTOP_TEACHER)))
    fmt = lambda k: "; ".join(f"{p} prompt: own {k[0, i, i]:.3f} -> {k[-1, i, i]:.4f}, other {k[0, i, 1 - i]:.3f} -> "
                              f"{k[-1, i, 1 - i]:.3f}" for i, p in enumerate(("desktop", "mobile")))
    print(f"\nrouted: {fmt(kls)} ({secs:.1f} s)\nswapped: {fmt(swapped)}")
    assert routed_as_its_platform(kls)
    assert not routed_as_its_platform(swapped)


def test_adaptive_kl_mask_turns_the_teacher_off_for_solved_groups():
    """Desktop responses all succeed (reward 1: pass rate 1 > rl.mopd.kl_mask_tau), mobile
    ones all fail (-1). With rl.mopd.kl_mask = "paper" the desktop group's KL weight is 0:
    its KL to the desktop teacher stays (>= 0.5x its start) while the mobile prompt's falls
    >= 5x; with "off" both fall >= 5x."""
    routes = (("desktop", DESKTOP_TEACHER), ("mobile", MOBILE_TEACHER))
    rewards = (("desktop", 1.0), ("mobile", -1.0))
    res = {mode: mopd_run("full_kl", DISTILL_LR, DISTILL_STEPS, routes, kl_mask=mode, rewards=rewards)
           for mode in ("paper", "off")}
    own = {mode: k[:, [0, 1], [0, 1]] for mode, (k, _) in res.items()}
    print("\n" + "; ".join(f"kl_mask={m}: desktop {o[0, 0]:.3f} -> {o[-1, 0]:.4f}, mobile {o[0, 1]:.3f} -> "
                           f"{o[-1, 1]:.4f} ({res[m][1]:.1f} s)" for m, o in own.items()))
    assert own["paper"][-1, 0] >= 0.5 * own["paper"][0, 0] and own["paper"][-1, 1] <= own["paper"][0, 1] / 5
    assert np.all(own["off"][-1] <= own["off"][0] / 5)


# ----------------------------------------------------------------------------- alignment


def _k3(logp, ref, clamp=run_config.base_config().rl.kl_clamp):
    """K3 of the sampled tokens, clipped at rl.kl_clamp as the loss clips it (a sampled token
    the teacher finds unlikely lies past it)."""
    d = ref - logp
    return np.minimum(np.exp(d) - d - 1, clamp)


# The full_kl cases are slow-marked (~35 s): full_kl's teacher logits are checked exactly by
# test_full_kl_in_position_chunks_is_exact_and_never_forms_whole_logits, both layouts above.
@pytest.mark.parametrize("method,estimator,share", [
    ("grpo", "k3", True), ("mopd", "k3", False),
    pytest.param("mopd", "full_kl", True, marks=pytest.mark.slow),
    pytest.param("mopd", "full_kl", False, marks=pytest.mark.slow)],
    ids=["grpo-shared", "mopd_k3-whole_rows", "mopd_full_kl-shared", "mopd_full_kl-whole_rows"])
def test_every_log_prob_is_taken_on_the_same_response_tokens(method, estimator, share):
    """Two-token responses. PH.score's old (the sampler's, rl.old_logprobs=auto, and a
    rescoring) and reference / platform-teacher log-probs equal, token by token, the exact
    log π(y_j | prompt, y_<j) of a direct forward pass; the update's new log-probs give
    ρ = 1 and its KL metric equals the by-hand KL between the exact new and frozen
    distributions at the same positions (K3 of the sampled tokens, or full_kl's exact KL
    per position). Each of them shifted by one position fails these checks (constructed
    below: the check is not vacuous)."""
    cfg, _, params = tiny()
    batch = prompts(("desktop", "mobile"))
    if method == "grpo":
        frozen = {"reference": frozen_model("reference", teacher(7))}
        config = make_config("grpo", lr=1e-3, steps=1, max_new_tokens=2, kl_beta=0.5, share_prefill=share)
    else:
        frozen = {"desktop": frozen_model("teacher_desktop", teacher(DESKTOP_TEACHER)),
                  "mobile": frozen_model("teacher_mobile", teacher(MOBILE_TEACHER))}
        config = make_config("mopd", lr=1e-3, steps=1, max_new_tokens=2, share_prefill=share,
                             **{"mopd.estimator": estimator, "mopd.kl_mask": "off"})
    s, state = make_stage(config, frozen)
    ro = PH.rollout(s, params, batch, jax.random.PRNGKey(5))
    assert ro.tokens.shape[1] == 2 and np.all(ro.lengths == 2) and len({tuple(t) for t in ro.tokens}) > 2
    scores = PH.score(s, params, ro)
    recompute = PH.score(dataclasses.replace(s, config=make_config(
        method, lr=1e-3, steps=1, max_new_tokens=2, share_prefill=share, old_logprobs="recompute")), params, ro)
    Tp = ro.prompt_ids.shape[1]
    cols = (lambda x: np.asarray(x)) if scores.shared else (lambda x: RO.to_response_columns(x, Tp, scores.n_slots))
    uncols = (lambda x: x) if scores.shared else (
        lambda x: np.pad(x, ((0, 0), (Tp - 1, scores.old_logp.shape[1] - Tp + 1 - x.shape[1]))))
    # exact distributions after each prefix [R, 3, K] and the sampled tokens' log-probs [R, 2]
    k = np.searchsorted(ALLOWED, ro.tokens)
    pick = lambda e: np.take_along_axis(e[:, :2], k[..., None], axis=-1)[..., 0]
    ex_new = exact_rows(params, ro)
    frozen_of_row = ([frozen["reference"]] * ro.rows if method == "grpo" else [frozen[p] for p in ro.platform])
    ex_ref = np.stack([exact_rows(f.params, RO.take_rows(ro, np.array([r])))[0] for r, f in enumerate(frozen_of_row)])
    shift = lambda x: np.roll(x, 1, axis=1)
    check = lambda got, want: float(np.abs(cols(got)[:, :2] - want).max())
    assert check(scores.old_logp, pick(ex_new)) < 2e-5 and check(recompute.old_logp, pick(ex_new)) < 2e-5
    assert check(uncols(shift(cols(scores.old_logp))), pick(ex_new)) > 0.1       # a shifted one fails
    if estimator == "full_kl":   # the update runs the teachers: scoring runs none (reference = old)
        assert np.array_equal(scores.ref_logp, scores.old_logp) and check(scores.ref_logp, pick(ex_ref)) > 0.1
    else:
        assert check(scores.ref_logp, pick(ex_ref)) < 2e-5
        assert check(uncols(shift(cols(scores.ref_logp))), pick(ex_ref)) > 0.1

    adv = {"advantages": np.zeros(ro.rows, np.float32), "kl_mask": np.ones(ro.rows, np.float32)}
    run = lambda sc: PH.update(s, jax.tree.map(jnp.copy, state), ro, adv, sc)[1]
    m = run(scores)
    if estimator == "full_kl":    # exact KL(new || teacher) at each response position
        want = kl(ex_new[:, :2], ex_ref[:, :2]).mean()
        wrong = kl(ex_new[:, :2], ex_ref[:, 1:3]).mean()      # the teacher one position later
    else:
        want = _k3(pick(ex_new), pick(ex_ref)).mean()
        wrong = _k3(pick(ex_new), shift(pick(ex_ref))).mean()
    print(f"\n{method}/{estimator}: ratio {m['ratio_mean']:.6f}, kl {m['kl']:.5f} (by hand {want:.5f}; "
          f"shifted {wrong:.5f})")
    assert abs(m["ratio_mean"] - 1) < 1e-5 and abs(m["kl"] - want) < 1e-4 * max(1.0, want)
    assert abs(wrong - want) > 0.05 * want
    shifted_old = dataclasses.replace(scores, old_logp=uncols(shift(cols(scores.old_logp))))
    assert abs(run(shifted_old)["ratio_mean"] - 1) > 1e-2
    if estimator != "full_kl":   # full_kl reads the teachers' logits in the update, not ref_logp
        shifted_ref = dataclasses.replace(scores, ref_logp=uncols(shift(cols(scores.ref_logp))))
        assert abs(run(shifted_ref)["kl"] - want) > 0.05 * want


def test_full_kl_scoring_runs_no_teacher_and_still_names_an_unserved_platform():
    """rl.mopd.estimator full_kl: the update computes the exact KL from the teachers' logits,
    so PH.score runs no teacher (the reference log-probs are the old ones: rescored, they
    differ), and a platform without a teacher is still a one-line ConfigError at scoring."""
    cfg, _, params = tiny()
    frozen = {"desktop": frozen_model("teacher_desktop", teacher(DESKTOP_TEACHER)),
              "mobile": frozen_model("teacher_mobile", teacher(MOBILE_TEACHER))}
    config = make_config("mopd", lr=1e-3, steps=1, max_new_tokens=2, share_prefill=True,
                         **{"mopd.estimator": "full_kl", "mopd.kl_mask": "off"})
    s, _ = make_stage(config, frozen)
    ro = PH.rollout(s, params, prompts(("desktop", "mobile")), jax.random.PRNGKey(5))
    scores = PH.score(s, params, ro)
    assert np.array_equal(scores.ref_logp, scores.old_logp)
    k3 = PH.score(dataclasses.replace(s, config=make_config(
        "mopd", lr=1e-3, steps=1, max_new_tokens=2, share_prefill=True, **{"mopd.kl_mask": "off"})), params, ro)
    assert np.abs(k3.ref_logp - k3.old_logp).max() > 0.1     # a teacher scored: its log-probs differ
    with pytest.raises(ConfigError, match=r"rl.teachers has no teacher for platform labels \['mobile'\]"):
        PH.score(dataclasses.replace(s, frozen={"desktop": frozen["desktop"]}), params, ro)


# ----------------------------------------------------------------------------- config


def test_estimator_key_is_validated_and_full_kl_needs_compatible_teachers():
    """rl.mopd.estimator takes exactly losses.MOPD_ESTIMATORS (default k3); full_kl with a
    teacher whose vocabulary (or input layout) differs from the policy's is a one-line
    ConfigError naming the key, raised where the update is built; k3 builds."""
    import importlib
    from guilibra_jax.train import fake_batch as F

    c = importlib.import_module("configs.mopd_demo").get_config("smoke")
    assert c.rl.mopd.estimator == "k3"
    for est in L.MOPD_ESTIMATORS:
        c.rl.mopd.estimator = est
        run_config.validate(c, 1, 1)
    c.rl.mopd.estimator = "k4"
    with pytest.raises(ConfigError, match=r"rl\.mopd\.estimator"):
        run_config.validate(c, 1, 1)
    cfg, graphdef, params = tiny()
    other = F.tiny_config("qwen2_5_vl", vocab=512)
    frozen = {"desktop": frozen_model("teacher_desktop", params), "mobile": FZ.Frozen("teacher_mobile", graphdef,
                                                                                     params, other)}
    config = make_config("mopd", lr=1e-3, steps=1, **{"mopd.estimator": "full_kl"})
    with pytest.raises(ConfigError) as e:
        RS.rl_step(config, graphdef, cfg, optax.sgd(1.0), banned(cfg), frozen)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("config key rl.mopd.estimator = 'full_kl' is invalid for teacher 'mobile'")
    assert "vocab_size 512 != 256" in msg
    config.rl.mopd.estimator = "k3"
    RS.rl_step(config, graphdef, cfg, optax.sgd(1.0), banned(cfg), frozen)     # sampled-token estimators build


def _avals(jaxpr):
    """Every intermediate's abstract value in a (closed) jaxpr, sub-jaxprs included."""
    for eqn in jaxpr.eqns:
        yield from (v.aval for v in eqn.outvars)
        for p in eqn.params.values():
            for sub in (p if isinstance(p, (tuple, list)) else (p,)):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from _avals(inner)


def test_full_kl_in_position_chunks_is_exact_and_never_forms_whole_logits():
    """step.full_kl_terms over T = 17 positions in chunks of 4 (the last one padded) equals
    one chunk: log-probs, entropy, the exact KL per position (against a by-hand KL of the
    two models' full logits) and the gradient wrt the student's parameters; and the full_kl
    update's program over whole rows holds no [.., T, V] array with chunks (it does with one
    chunk: the check can fail)."""
    from tests.train.test_rl import sample, update_batch
    from guilibra_jax.train.batching import stack_micro_batches
    from guilibra_jax.train.rl.step import full_kl_terms, make_rl_step
    from guilibra_jax import models as M

    cfg, graphdef, params = tiny()
    ban = RO.vision_token_ids(cfg)
    B, T, D, V = 3, 17, cfg.text.hidden_size, cfg.text.vocab_size
    rng = np.random.default_rng(0)
    h, th = (jnp.asarray(rng.normal(size=(2, B, T, D)), jnp.float32))
    targets = jnp.asarray(rng.integers(0, V - 8, (B, T)), jnp.int32)
    valid = jnp.asarray(rng.random((B, T)) < 0.8)
    index = jnp.array([0, 1, 0])
    teachers = [nnx.merge(graphdef, teacher(sd)) for sd in (DESKTOP_TEACHER, MOBILE_TEACHER)]
    w = jnp.asarray(rng.normal(size=(3, B, T)), jnp.float32)

    def f(p, chunk):
        out = full_kl_terms(nnx.merge(graphdef, p), h, teachers, [th, th * 0.5], index, targets, valid,
                            temperature=0.7, chunk_size=chunk, banned=ban)
        return sum(jnp.sum(wi * x) for wi, x in zip(w, out)), out

    (v4, out4), g4 = jax.jit(jax.value_and_grad(lambda p: f(p, 4), has_aux=True))(params)
    (v1, out1), g1 = jax.jit(jax.value_and_grad(lambda p: f(p, T), has_aux=True))(params)
    lg = lambda m, x: G.ban_tokens(m.logits_from_hidden(x), ban) / 0.7
    student = nnx.merge(graphdef, params)
    lt = jnp.where((index == 1)[:, None, None], lg(teachers[1], th * 0.5), lg(teachers[0], th))
    by_hand = jnp.where(valid, L.reverse_kl_from_logits(lg(student, h), lt), 0.0)
    np.testing.assert_allclose(out4[2], by_hand, rtol=1e-5, atol=1e-6)
    assert float(jnp.max(by_hand)) > 1e-2
    for a, b in zip(out4, out1):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(jax.tree.leaves(g4), jax.tree.leaves(g1)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)

    ro = RO.expand_groups(prompts(("desktop", "mobile")), 2)
    sample(cfg, graphdef, params, ro, n_new=4)
    host = update_batch(cfg, graphdef, params, ro)
    host["teacher_index"] = FZ.teacher_index(ro.platform, ["desktop", "mobile"])
    batch = device(stack_micro_batches([host])) | {
        "vision": jax.tree.map(lambda x: jnp.asarray(x)[None], M.vision.device_vision_inputs(host["vision"])),
        "teacher_params": (teacher(DESKTOP_TEACHER), teacher(MOBILE_TEACHER))}
    T = host["input_ids"].shape[1]
    whole = {}
    for chunk in (4, None):
        step = make_rl_step(graphdef, optax.sgd(1.0), loss="mopd", loss_kwargs=dict(beta=1.0, estimator="full_kl"),
                            chunk_size=chunk, banned_token_ids=ban, teacher_graphdefs=(graphdef, graphdef))
        jaxpr = jax.make_jaxpr(step)(init_state(params, optax.sgd(1.0)), batch).jaxpr
        whole[chunk] = [a.shape for a in _avals(jaxpr) if len(a.shape) >= 2 and a.shape[-1] == V and a.shape[-2] >= T]
    assert T > 4 and not whole[4] and whole[None], (T, whole)
