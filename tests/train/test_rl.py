"""Stage-2 pieces against independent references: rollout sequences re-scored equal the
sampler's own log-probs; identical policy and reference give zero KL and zero KL
gradient; MOPD routes each sequence to its platform's teacher (checked row by row); the
adaptive KL mask switches the KL gradient off exactly for groups above tau; GRPO updates
raise the reward of a bandit."""
import functools

import jax
import jax.numpy as jnp
import ml_collections as mlc
import numpy as np
import optax
import pytest
from flax import nnx

from guilibra_jax import generate as G
from guilibra_jax import models as M
from guilibra_jax import sharding as S
from guilibra_jax.train import fake_batch as F
from guilibra_jax.errors import ConfigError
from guilibra_jax.train.config import base_config
from guilibra_jax.train.rl import advantages as ADV
from guilibra_jax.train.rl import frozen as FZ
from guilibra_jax.train.rl import phases as PH
from guilibra_jax.train.rl import setup as RS
from guilibra_jax.train.rl import rollout as RO
from guilibra_jax.train.batching import stack_micro_batches
from guilibra_jax.train.rl.step import make_rl_step
from guilibra_jax.train.step_core import init_state

GROUP = 2
PATCH_BUCKET = 64


def sharpen(params, seed):
    """Larger random weights, so that tiny models' distributions depend on their inputs."""
    leaves, tdef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return jax.tree.unflatten(tdef, [0.15 * jax.random.normal(k, x.shape) if x.ndim > 1 else x
                                     for x, k in zip(leaves, keys)])


@functools.lru_cache(maxsize=None)
def tiny():
    nnx.use_eager_sharding(False)
    cfg = F.tiny_config("qwen2_5_vl")
    graphdef, state, _ = nnx.split(M.QwenVL(cfg, rngs=nnx.Rngs(0)), nnx.Param, ...)
    return cfg, graphdef, sharpen(nnx.to_pure_dict(state), 1)


def rl_batch(cfg, n_prompts=3, seed=0, platforms=("desktop", "mobile", "desktop")):
    """An RL batch like collate_rl's: left-padded prompts, each with one image."""
    rng = np.random.default_rng(seed)
    vc = cfg.vision
    grid = (1, 56 // vc.patch_size, 84 // vc.patch_size)
    n_img = grid[1] * grid[2] // vc.merge_unit
    prompts = []
    for i in range(n_prompts):
        ids = ([cfg.vision_start_token_id] + [cfg.image_token_id] * n_img + [cfg.vision_end_token_id]
               + rng.integers(0, cfg.text.vocab_size - 8, 3 + 2 * i).tolist())
        pix = rng.standard_normal((grid[1] * grid[2], vc.patch_dim)).astype(np.float32)
        prompts.append((ids, np.array([grid]), pix))
    p = G.prepare_prompts(prompts, cfg, pad_id=0)
    return {"prompt_ids": p["prompt_ids"], "prompt_mask": p["prompt_mask"], "positions": p["positions"],
            "rope_deltas": p["rope_deltas"], "pixel_values": p["pixel_values"], "image_grid_thw": p["image_grid_thw"],
            "row_valid": np.ones(n_prompts, bool), "reward_targets": [None] * n_prompts,
            "platform": list(platforms[:n_prompts]), "resized_size": [(84, 56)] * n_prompts}


def device(host):
    host = dict(host)
    vision = host.pop("vision", None)
    out = {k: jnp.asarray(v) for k, v in host.items() if v is not None}
    out["vision"] = None if vision is None else jax.tree.map(jnp.asarray, M.vision.device_vision_inputs(vision))
    out.setdefault("pixel_values", None)
    return out


def sample(cfg, graphdef, params, ro, n_new=5, temperature=1.0, seed=0):
    inp = device(RO.prompt_inputs(ro, cfg, PATCH_BUCKET))
    sc = G.SamplingConfig(temperature=temperature, max_new_tokens=n_new, stop_token_ids=(cfg.text.vocab_size - 1,),
                          banned_token_ids=RO.vision_token_ids(cfg))
    out = G.generate(graphdef, params, inp["prompt_ids"], inp["prompt_mask"], inp["positions"], inp["rope_deltas"],
                     inp["pixel_values"], inp["vision"], jax.random.PRNGKey(seed), sc)
    ro.tokens, ro.lengths = (np.asarray(x) for x in jax.device_get((out.tokens, out.lengths)))
    return out


def score_rows(cfg, graphdef, params, ro, rows, n_slots=None):
    seq = device(RO.sequence_batch(ro, rows, cfg, PATCH_BUCKET, 0, n_slots))
    return np.asarray(G.score(graphdef, params, seq["input_ids"], seq["positions"], seq["segment_ids"],
                              seq["pixel_values"], seq["vision"], seq["response_mask"],
                              banned_token_ids=RO.vision_token_ids(cfg)))


def test_rescored_rollout_equals_the_samplers_log_probs():
    cfg, graphdef, params = tiny()
    ro = RO.expand_groups(rl_batch(cfg), GROUP)
    out = sample(cfg, graphdef, params, ro)
    assert ro.rows == 3 * GROUP and len(set(map(tuple, ro.tokens))) > 1
    host = RO.sequence_batch(ro, np.arange(ro.rows), cfg, PATCH_BUCKET, 0)
    lp = score_rows(cfg, graphdef, params, ro, np.arange(ro.rows))
    Tp = ro.prompt_ids.shape[1]
    for r in range(ro.rows):
        n = ro.lengths[r]
        assert host["response_mask"][r].sum() == n
        np.testing.assert_allclose(lp[r, Tp - 1:Tp - 1 + n], np.asarray(out.logprobs)[r, :n], atol=2e-5)
        assert np.all(lp[r, Tp - 1 + n:] == 0)
    ro.sample_logp = np.asarray(out.logprobs)        # what rl.old_logprobs="auto" uses instead of lp
    np.testing.assert_allclose(RO.sampler_log_probs(ro, lp.shape[1] - Tp), lp, atol=2e-5)


def update_batch(cfg, graphdef, params, ro, ref_params=None, advantages=None, kl_mask=None):
    rows = np.arange(ro.rows)
    host = RO.sequence_batch(ro, rows, cfg, PATCH_BUCKET, 0)
    old = score_rows(cfg, graphdef, params, ro, rows)
    ref = old if ref_params is None else score_rows(cfg, graphdef, ref_params, ro, rows)
    host.update(old_logp=old, ref_logp=ref,
                advantages=np.zeros(ro.rows, np.float32) if advantages is None else advantages,
                kl_mask=np.ones(ro.rows, np.float32) if kl_mask is None else kl_mask)
    return host


def run_step(graphdef, params, host, loss, loss_kwargs, lr=1.0):
    tx = optax.sgd(lr)
    step = jax.jit(make_rl_step(graphdef, tx, loss=loss, loss_kwargs=loss_kwargs,
                                banned_token_ids=RO.vision_token_ids(F.tiny_config("qwen2_5_vl"))))
    state, metrics = step(init_state(params, tx), device(stack_micro_batches([host])) | {
        "vision": jax.tree.map(lambda x: jnp.asarray(x)[None],
                               M.vision.device_vision_inputs(host["vision"]))})
    return state, jax.device_get(metrics)


@pytest.mark.parametrize("kind", ["k2", "k3"])
def test_identical_policy_and_reference_give_zero_kl_and_zero_gradient(kind):
    cfg, graphdef, params = tiny()
    ro = RO.expand_groups(rl_batch(cfg), GROUP)
    sample(cfg, graphdef, params, ro)
    host = update_batch(cfg, graphdef, params, ro)
    kw = dict(kl_beta=1.0, kl_kind=kind)
    _, m = run_step(graphdef, params, host, "grpo", kw)
    # k1's per-token gradient is ∇log π (zero only in expectation): the scale to compare with.
    _, m1 = run_step(graphdef, params, host, "grpo", dict(kl_beta=1.0, kl_kind="k1"))
    assert m1["grad_norm"] > 1e-2
    # Zero up to the float rounding between the scorer's and the update's log-probs.
    assert abs(m["kl"]) < 1e-9 and m["grad_norm"] < 1e-4 * m1["grad_norm"], (m, m1)
    other = update_batch(cfg, graphdef, params, ro, ref_params=sharpen(params, 7))
    _, m2 = run_step(graphdef, params, other, "grpo", kw)
    assert m2["kl"] > 1e-3 and m2["grad_norm"] > 1e-3


def test_each_sequence_is_scored_by_its_platform_teacher():
    cfg, graphdef, params = tiny()
    teachers = {label: FZ.Frozen(label, graphdef, sharpen(params, seed), cfg)
                for label, seed in (("desktop", 11), ("mobile", 12))}
    ro = RO.expand_groups(rl_batch(cfg), GROUP)
    sample(cfg, graphdef, params, ro)
    n_slots = RO.sequence_batch(ro, np.arange(ro.rows), cfg, PATCH_BUCKET, 0)["input_ids"].shape[1] - ro.prompt_ids.shape[1]
    calls = []

    def score_teacher(f, rows):
        calls.append((f.name, len(rows)))
        return score_rows(cfg, f.graphdef, f.params, ro, rows, n_slots)

    out = lambda: np.zeros((ro.rows, ro.prompt_ids.shape[1] + n_slots), np.float32)
    got = FZ.score_by_platform(ro.platform, ro.valid, teachers, score_teacher, 1, out())
    # desktop has 4 of 6 rows -> padded to the next fixed size (6); mobile 2 -> 3 (6 // 2)
    assert calls == [("desktop", 6), ("mobile", 3)]
    for r in range(ro.rows):
        t = teachers[ro.platform[r]]
        want = score_rows(cfg, t.graphdef, t.params, ro, [r], n_slots)[0]
        np.testing.assert_allclose(got[r], want, atol=2e-5, err_msg=f"row {r} ({ro.platform[r]})")
        wrong = teachers["mobile" if ro.platform[r] == "desktop" else "desktop"]
        assert np.abs(score_rows(cfg, wrong.graphdef, wrong.params, ro, [r], n_slots)[0] - got[r]).max() > 1e-3
    with pytest.raises(ConfigError, match="rl.teachers has no teacher for platform labels"):
        FZ.score_by_platform(ro.platform, ro.valid, {"desktop": teachers["desktop"]}, score_teacher, 1, out())
    fallback = FZ.score_by_platform(ro.platform, ro.valid, {"desktop": teachers["desktop"], "*": teachers["mobile"]},
                                    score_teacher, 1, out())
    np.testing.assert_allclose(fallback, got, atol=2e-5)


def rl_config(**kw):
    rl = base_config().rl   # every key at its default (callers never re-default a key)
    rl.update(dict(normalize_std=False, sngs=dict(enabled=True, lambda0=0.5, kappa=1.5, signal="mean_reward"),
                   mopd=dict(kl_mask_tau=0.1, pass_floor=0.01, kl_mask="paper")))
    rl.update(kw)
    return rl


def test_advantages_sngs_pass_floor_and_kl_mask_by_hand():
    # GRPO (GUI-Libra rewards in [0, 1]); two groups of 4, advantages r - mean (normalize_std off)
    rewards = np.array([1.0, 0.0, 0.0, 0.0, 0.1, 0.1, 0.0, 0.1])
    grpo = ADV.compute(rewards, rewards >= 1.0, 4, "grpo", rl_config())
    lam0, lam1 = 0.5 + 1.5 * 0.25, 0.5 + 1.5 * 0.075          # min(lambda0 + kappa * mean, 1)
    np.testing.assert_allclose(grpo["advantages"], [0.75, -0.25 * lam0, -0.25 * lam0, -0.25 * lam0,
                                                    0.025, 0.025, -0.075 * lam1, 0.025], rtol=1e-5)
    np.testing.assert_allclose(grpo["lambda"], [lam0] * 4 + [lam1] * 4, rtol=1e-6)
    assert np.all(grpo["kl_mask"] == 1)
    # MOPD rewards (1 / -0.5 / -1): group 0 pass rate 0.25 > tau 0.1 -> KL off, advantages
    # kept; group 1 pass rate 0 < floor 0.01 -> advantages zeroed, KL on.
    rewards = np.array([1.0, -0.5, -0.5, -0.5, -0.5, -0.5, -1.0, -0.5])
    mopd = ADV.compute(rewards, rewards >= 1.0, 4, "mopd", rl_config())
    np.testing.assert_allclose(mopd["advantages"], [1.125, -0.375, -0.375, -0.375, 0, 0, 0, 0])
    np.testing.assert_array_equal(mopd["kl_mask"], [0, 0, 0, 0, 1, 1, 1, 1])


def test_kl_mask_off_keeps_the_kl_and_the_advantages_everywhere():
    """The UI-MOPD release script: no KL mask and no pass-rate floor."""
    rewards = np.array([1.0, -0.5, -0.5, -0.5, -0.5, -0.5, -1.0, -0.5])
    off = ADV.compute(rewards, rewards >= 1.0, 4, "mopd", rl_config(mopd=dict(kl_mask_tau=0.1,
                                                                                   pass_floor=0.01, kl_mask="off")))
    np.testing.assert_allclose(off["advantages"], [1.125, -0.375, -0.375, -0.375, 0.125, 0.125, -0.375, 0.125])
    np.testing.assert_array_equal(off["kl_mask"], np.ones(8))


def test_release_kl_mask_weights_by_hand():
    """release: KL token mean over unmasked sequences x unmasked fraction of sequences.
    Rows: tokens 4, 2, 3, 1; mask 1, 0, 1, 0 -> N = 10, N_on = 7, n = 4, n_on = 2; weight
    of an unmasked sequence = (10 / 7) * (2 / 4), so that sum_on(k3) * w / N = sum_on(k3) / 7 * 1/2."""
    mask = np.array([1.0, 0.0, 1.0, 0.0])
    counts = np.array([4, 2, 3, 1])
    totals = ADV.kl_totals(mask, counts)
    np.testing.assert_array_equal(totals, [10, 7, 4, 2])
    np.testing.assert_allclose(ADV.kl_weights(mask, "release", totals), [10 / 7 * 0.5, 0, 10 / 7 * 0.5, 0])
    np.testing.assert_array_equal(ADV.kl_weights(mask, "paper"), mask)
    np.testing.assert_array_equal(ADV.kl_weights(mask, "off"), np.ones(4))
    # the loss's KL term with these weights equals the release's formula on any per-token k3
    k3 = [np.arange(1, n + 1, dtype=float) for n in counts]
    w = ADV.kl_weights(mask, "release", totals)
    ours = sum(wi * x.sum() for wi, x in zip(w, k3)) / counts.sum()
    release = sum(x.sum() for x, m in zip(k3, mask) if m) / 7 * (2 / 4)
    np.testing.assert_allclose(ours, release)


def test_group_filter_keeps_groups_strictly_between_zero_and_one():
    success = np.array([1, 1, 1, 1,  1, 0, 0, 0,  0, 0, 0, 0,  1, 0, 1, 1], bool)
    valid = np.array([True] * 12 + [False] * 4)
    np.testing.assert_array_equal(ADV.keep_groups(success, valid, 4), [False, True, False, False])


def test_kl_mask_switches_the_kl_gradient_off_exactly_for_masked_groups():
    cfg, graphdef, params = tiny()
    ro = RO.expand_groups(rl_batch(cfg), GROUP)
    sample(cfg, graphdef, params, ro)
    teacher = sharpen(params, 21)
    mask = np.repeat(np.array([0.0, 1.0, 0.0], np.float32), GROUP)   # group 1 below tau
    kw = dict(beta=1.0)
    base = update_batch(cfg, graphdef, params, ro, ref_params=teacher, kl_mask=mask)
    new_base, _ = run_step(graphdef, params, base, "mopd", kw)
    for rows, moves in ((mask == 0, False), (mask == 1, True)):
        host = dict(base, ref_logp=np.where(rows[:, None], base["ref_logp"] - 0.7, base["ref_logp"]))
        new, _ = run_step(graphdef, params, host, "mopd", kw)
        diff = max(float(jnp.abs(a - b).max()) for a, b in
                   zip(jax.tree.leaves(new["params"]), jax.tree.leaves(new_base["params"])))
        assert (diff > 1e-6) == moves, (rows, diff)


def test_grpo_updates_raise_the_reward_of_a_bandit():
    """Reward 1 when the first sampled token is in a fixed set of 16 of 248 tokens: a few
    GRPO steps (rollout, rewards, advantages, scoring, update) must raise the mean reward."""
    cfg, graphdef, params = tiny()
    good = set(range(100, 116))
    batch = rl_batch(cfg, n_prompts=2, platforms=("desktop", "desktop"))
    rl = rl_config(normalize_std=True)
    tx = optax.adam(3e-2)
    step = jax.jit(make_rl_step(graphdef, tx, loss="grpo", loss_kwargs=dict(kl_beta=0.0),
                                banned_token_ids=RO.vision_token_ids(cfg)))
    state = init_state(params, tx)
    means = []
    for it in range(12):
        ro = RO.expand_groups(batch, 8)
        sample(cfg, graphdef, state["params"], ro, n_new=2, seed=it)
        reward = np.array([float(t in good) for t in ro.tokens[:, 0]], np.float32)
        means.append(reward.mean())
        adv = ADV.compute(reward, reward > 0, 8, "grpo", rl)
        host = update_batch(cfg, graphdef, state["params"], ro, advantages=adv["advantages"])
        stacked = device(stack_micro_batches([host])) | {
            "vision": jax.tree.map(lambda x: jnp.asarray(x)[None], M.vision.device_vision_inputs(host["vision"]))}
        state, _ = step(state, stacked)
    assert np.mean(means[-3:]) > np.mean(means[:3]) + 0.3, means


def _fake_stage(monkeypatch, successes_per_round, update_groups, max_rounds, group=2, greedy_per_round=None):
    """collect() over rounds whose per-row successes are given (2 prompts of G=2 per round);
    ``greedy_per_round``: each prompt's greedy success (rl.group_filter.greedy_wrong on)."""
    rounds = iter(successes_per_round)
    greedy_rounds = iter(greedy_per_round or [])

    def fake_rollout(s, params, batch, key, group_size=group, sampling=None):
        assert (group_size == 1) == (sampling is not None and sampling.temperature == 0.0)
        n = len(batch["ids"]) * group_size
        ro = RO.Rollout(group_size=group_size, prompt_ids=np.zeros((n, 3), np.int32), prompt_mask=np.ones((n, 3), np.int32),
                        positions=np.zeros((3, n, 3), np.int32), rope_deltas=np.zeros(n, np.int32),
                        grids=[None] * n, pixels=[None] * n, valid=np.ones(n, bool), targets=[None] * n,
                        platform=["desktop"] * n, resized_size=[(8, 8)] * n,
                        tokens=np.repeat(np.asarray(batch["ids"]), group_size)[:, None].astype(np.int32),
                        lengths=np.ones(n, np.int32))
        ro.texts = [""] * n
        return ro

    def fake_reward(s, ro):
        ok = np.asarray(next(greedy_rounds if ro.group_size == 1 else rounds), bool)
        return RO.Scored(ok.astype(np.float32), ok, {})

    monkeypatch.setattr(PH, "rollout", fake_rollout)
    monkeypatch.setattr(PH, "reward", fake_reward)
    config = mlc.ConfigDict(dict(data=dict(batch_size=2), rl=dict(
        group_size=group, update_groups=update_groups, online=dict(play="first"),
        group_filter=dict(enabled=True, max_rounds=max_rounds, greedy_wrong=greedy_per_round is not None))))
    stage = RS.Stage2(config, *([None] * 4), G.SamplingConfig(temperature=1.0), *([None] * 5), row_multiple=1)
    prompts = iter([{"ids": [10 * r, 10 * r + 1]} for r in range(10)])
    return PH.collect(stage, None, prompts, 0, jax.random.PRNGKey(0))


def test_group_filter_samples_more_rounds_until_the_update_is_full(monkeypatch):
    # round 0: group 0 all pass (dropped), group 1 mixed (kept); round 1: group 0 all fail
    # (dropped), group 1 mixed (kept) -> 2 groups kept after 2 rounds, prompts 1 and 11.
    c = _fake_stage(monkeypatch, [[1, 1, 1, 0], [0, 0, 0, 1]], update_groups=2, max_rounds=0)
    assert (c.rounds, c.kept_groups, c.dropped_groups, c.short_groups) == (2, 2, 2, 0)
    np.testing.assert_array_equal(c.ro.tokens[:, 0], [1, 1, 11, 11])
    assert c.ro.valid.all()


def test_group_filter_round_limit_completes_the_update_with_lossless_groups(monkeypatch):
    c = _fake_stage(monkeypatch, [[1, 1, 0, 0], [0, 0, 1, 1]], update_groups=2, max_rounds=2)
    assert (c.rounds, c.kept_groups, c.short_groups) == (2, 0, 2)
    assert not c.ro.valid.any() and c.ro.rows == 4      # shapes kept, no loss, logged as short


def test_greedy_wrong_keeps_only_mixed_groups_whose_greedy_response_fails(monkeypatch):
    # round 0: both groups mixed, prompt 0's greedy passes (dropped), prompt 1's fails (kept);
    # round 1: group 0 mixed with a failing greedy (kept), group 1 all fail (dropped).
    c = _fake_stage(monkeypatch, [[1, 0, 0, 1], [0, 1, 0, 0]], update_groups=2, max_rounds=0,
                    greedy_per_round=[[1, 0], [0, 0]])
    assert (c.rounds, c.kept_groups, c.dropped_groups, c.short_groups, c.greedy_right) == (2, 2, 2, 0, 1)
    np.testing.assert_array_equal(c.ro.tokens[:, 0], [1, 1, 10, 10])
    assert c.ro.valid.all()


def _stage(generation_rows=0, score_rows=0, old_logprobs="recompute", share_prefill=True, group=GROUP,
           row_multiple=1):
    """A real Stage2 of the tiny model on one device (GRPO, the reference a sharpened copy)."""
    cfg, graphdef, params = tiny()
    config = mlc.ConfigDict(dict(method="grpo", data=dict(batch_size=3, patch_bucket=PATCH_BUCKET), rl=dict(
        group_size=group, temperature=1.0, top_p=1.0, top_k=0, score_chunk=0, old_logprobs=old_logprobs,
        generation_rows=generation_rows, score_rows=score_rows, share_prefill=share_prefill)))
    mesh = S.make_mesh({"data": -1, "fsdp": 1, "tensor": 1}, devices=jax.devices()[:1])
    banned = RO.vision_token_ids(cfg)
    sampling = G.SamplingConfig(temperature=1.0, max_new_tokens=5, stop_token_ids=(cfg.text.vocab_size - 1,),
                                banned_token_ids=banned)
    ref = FZ.Frozen("reference", graphdef, sharpen(params, 2), cfg)

    class Tok:
        def decode(self, ids, **kw):
            return " ".join(map(str, ids))

    s = RS.Stage2(config, mesh, graphdef, cfg, Tok(), sampling, {"reference": ref}, None, 0,
                       (cfg.text.vocab_size - 1,), banned, row_multiple=row_multiple)
    return s, params


@pytest.mark.parametrize("share", [True, False], ids=["shared_prompts", "whole_rows"])
def test_rollout_and_scoring_in_row_chunks(share):
    """rl.generation_rows / rl.score_rows: a round sampled 2 rows per call still pairs each
    row's tokens with its own log-probs (they equal a rescoring of that row), and scoring in
    calls of 2 rows gives the one-call log-probs (in both scoring layouts, rl.share_prefill)."""
    cfg = tiny()[0]
    s, params = _stage(generation_rows=2)
    ro = PH.rollout(s, params, rl_batch(cfg), jax.random.PRNGKey(3))
    assert ro.rows == 3 * GROUP and ro.tokens.shape == (ro.rows, 5)
    whole = PH.score(_stage(share_prefill=share)[0], params, ro)
    chunked = PH.score(_stage(score_rows=2, share_prefill=share)[0], params, ro)
    np.testing.assert_allclose(chunked.old_logp, whole.old_logp, atol=1e-5)   # other batch shapes: float noise
    np.testing.assert_allclose(chunked.ref_logp, whole.ref_logp, atol=1e-5)
    assert np.abs(whole.ref_logp - whole.old_logp).max() > 1e-3          # the reference is another model
    sampler = RO.sampler_log_probs(ro, whole.n_slots)
    if share:
        sampler = RO.to_response_columns(sampler, ro.prompt_ids.shape[1], whole.n_slots)
    np.testing.assert_allclose(sampler, whole.old_logp, atol=2e-5)
    reused = PH.score(_stage(old_logprobs="auto", share_prefill=share)[0], params, ro)   # top_p 1: the sampler's
    np.testing.assert_array_equal(reused.old_logp, sampler)


@pytest.mark.parametrize("generation_rows", [0, 8])
def test_rollout_shares_each_prompts_prefill_with_its_group(monkeypatch, generation_rows):
    """rl.share_prefill: each sampler call passes one prompt row per group (its image once)
    and generate(copies=G); the rollout's tokens and lengths equal the unshared rollout's
    (every row its own prompt, same key), its log-probs within 2e-5 (the prefill runs at
    fewer rows: float32 rounding, see test_generate). Prompt 1 is dropped (row_valid False):
    its group samples prompt 0, as expand_groups has it, and stays invalid."""
    cfg, _, params = tiny()
    group = 4
    batch = rl_batch(cfg)
    batch["row_valid"] = np.array([True, False, True])
    calls = []
    generate = G.generate

    def spy(graphdef, params, prompt_ids, *args, copies=1, **kw):
        pixels = args[3]   # in put_batch's slot layout [slots, slot patches, D]
        calls.append((prompt_ids.shape[0], copies, pixels.size // pixels.shape[-1]))
        return generate(graphdef, params, prompt_ids, *args, copies=copies, **kw)

    monkeypatch.setattr(PH.G, "generate", spy)
    key = jax.random.PRNGKey(7)
    shared = PH.rollout(_stage(generation_rows, group=group)[0], params, batch, key)
    assert [(rows, copies) for rows, copies, _ in calls] == ([(3, 4)] if not generation_rows else [(2, 4), (1, 4)])
    shared_patches = sum(p for _, _, p in calls)
    calls.clear()
    plain = PH.rollout(_stage(generation_rows, group=group, share_prefill=False)[0], params, batch, key)
    assert [(rows, copies) for rows, copies, _ in calls] == ([(12, 1)] if not generation_rows else [(8, 1), (4, 1)])
    n_img = np.prod(batch["image_grid_thw"][0])     # patches of one prompt's image
    assert shared_patches < 12 * n_img <= sum(p for _, _, p in calls)   # the tower sees each image once, not G times
    assert shared.rows == plain.rows == 12
    np.testing.assert_array_equal(shared.tokens, plain.tokens)
    np.testing.assert_array_equal(shared.lengths, plain.lengths)
    np.testing.assert_allclose(shared.sample_logp, plain.sample_logp, atol=2e-5, rtol=0)
    assert shared.texts == plain.texts
    np.testing.assert_array_equal(shared.valid, np.repeat([True, False, True], group))
    np.testing.assert_array_equal(shared.prompt_ids[4:8], np.repeat(batch["prompt_ids"][:1], group, axis=0))
    assert len({tuple(t) for t in shared.tokens[:4]}) > 1     # a group's rows sampled different responses


def test_prompt_copies_divide_the_groups_over_the_batch_devices():
    """Device copies per prompt: G when the distinct prompts divide over the devices, else the
    largest divisor of G that keeps the prompt rows a multiple of the process's row multiple."""
    assert RO.prompt_copies(12, 4, 1) == 4        # 3 prompts on one device
    assert RO.prompt_copies(12, 4, 2) == 2        # 3 prompts do not split over 2 devices; 6 rows do
    assert RO.prompt_copies(16, 8, 2) == 8        # 2 prompts over 2 devices
    assert RO.prompt_copies(4, 4, 4) == 1         # 1 prompt over 4 devices: no sharing possible
    assert RO.prompt_copies(24, 8, 4) == 2        # 3 prompts, 12 rows over 4 devices
    with pytest.raises(ValueError, match="whole groups"):
        RO.prompt_copies(6, 4, 1)


def test_generation_rows_must_hold_whole_groups_of_every_process():
    """rl.generation_rows that split a group (or a process's groups) is a ConfigError naming it."""
    import importlib
    from guilibra_jax.train import config as run_config

    c = importlib.import_module("configs.grpo_demo").get_config("smoke")   # 2 prompts x G = 4
    c.rl.generation_rows = 4
    run_config.validate(c, 1, 1)
    with pytest.raises(ConfigError, match=r"rl\.generation_rows.*rl\.group_size x processes = 4 x 2"):
        run_config.validate(c, 2, 2)        # 2 rows of a group on each process
    c.rl.generation_rows = 2                # divides the round's 8 rows, but half a group
    with pytest.raises(ConfigError, match=r"rl\.generation_rows"):
        run_config.validate(c, 1, 1)
