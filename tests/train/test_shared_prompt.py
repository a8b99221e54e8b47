"""The shared-prompt layout of stage-2 scoring and updates (rl.share_prefill): each prompt's
vision tower and layers run once for the rows of its group that a call holds, and the LM
head only at response positions. Checked against the whole-row computation it replaces
(itself checked against transformers): log-probs, an RL loss and every gradient equal, for
both families, scanned and unrolled layers; the copies per prompt follow the rows' groups;
stage-2 scoring and a GRPO update give the same log-probs, metrics and parameters."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from guilibra_jax import generate as G
from guilibra_jax import models as M
from guilibra_jax.train import fake_batch as F
from guilibra_jax.train.rl import phases as PH
from guilibra_jax.train.rl import rollout as RO
from tests.train.test_rl import PATCH_BUCKET, _stage, device, rl_batch, sharpen, tiny

HW = {"qwen2_5_vl": (56, 84), "qwen3_vl": (64, 96)}


def _rollout(cfg, group, n_new=6, seed=0):
    """3 prompts x ``group`` rows with random responses of random lengths (one row invalid)."""
    # rl_batch's 56 x 84 image is not whole merged units of Qwen3-VL's 32 px
    batch = _qwen3_batch(cfg) if cfg.family == "qwen3_vl" else rl_batch(cfg)
    ro = RO.expand_groups(batch, group)
    rng = np.random.default_rng(seed)
    ro.tokens = rng.integers(0, cfg.text.vocab_size - 8, (ro.rows, n_new)).astype(np.int32)
    ro.lengths = rng.integers(1, n_new + 1, ro.rows).astype(np.int32)
    ro.valid = ro.valid.copy()
    ro.valid[1] = False
    return ro


def _qwen3_batch(cfg):
    rng = np.random.default_rng(1)
    vc = cfg.vision
    h, w = HW["qwen3_vl"]
    grid = (1, h // vc.patch_size, w // vc.patch_size)
    n_img = grid[1] * grid[2] // vc.merge_unit
    prompts = []
    for i in range(3):
        ids = ([cfg.vision_start_token_id] + [cfg.image_token_id] * n_img + [cfg.vision_end_token_id]
               + rng.integers(0, cfg.text.vocab_size - 8, 3 + 2 * i).tolist())
        prompts.append((ids, np.array([grid]), rng.standard_normal((grid[1] * grid[2], vc.patch_dim)).astype(np.float32)))
    p = G.prepare_prompts(prompts, cfg, pad_id=0)
    return {"prompt_ids": p["prompt_ids"], "prompt_mask": p["prompt_mask"], "positions": p["positions"],
            "rope_deltas": p["rope_deltas"], "pixel_values": p["pixel_values"], "image_grid_thw": p["image_grid_thw"],
            "row_valid": np.ones(3, bool), "reward_targets": [None] * 3, "platform": ["desktop"] * 3,
            "resized_size": [(w, h)] * 3}


def _model(family, scan):
    nnx.use_eager_sharding(False)
    cfg = F.tiny_config(family)
    model = M.QwenVL(cfg, scan_layers=scan, remat="full" if scan else "none", rngs=nnx.Rngs(0))
    gdef, state, _ = nnx.split(model, nnx.Param, ...)
    return cfg, gdef, sharpen(nnx.to_pure_dict(state), 3)


@pytest.mark.parametrize("family,scan,copies", [("qwen2_5_vl", False, 4), ("qwen2_5_vl", False, 1),
                                                ("qwen3_vl", False, 4), ("qwen3_vl", True, 4)])
def test_shared_prompt_log_probs_and_gradients_equal_whole_rows(family, scan, copies):
    cfg, gdef, params = _model(family, scan)
    ro = _rollout(cfg, group=4)
    rows = np.arange(ro.rows)
    n = ro.tokens.shape[1]
    Tp = ro.prompt_ids.shape[1]
    whole = device(RO.sequence_batch(ro, rows, cfg, PATCH_BUCKET, 0, n))
    shared = device(RO.shared_batch(ro, rows, cfg, PATCH_BUCKET, 0, n, copies))
    assert shared["prompt_ids"].shape[0] == ro.rows // copies
    adv = jnp.asarray(np.random.default_rng(2).standard_normal(ro.rows), jnp.float32)

    def whole_loss(p):
        lp, valid, ent = G.token_logprobs(nnx.merge(gdef, p), whole["input_ids"], whole["positions"],
                                          whole["segment_ids"], whole["pixel_values"], whole["vision"],
                                          whole["response_mask"], temperature=0.7, with_entropy=True)
        lp, valid, ent = (x[:, Tp - 1:Tp - 1 + n] for x in (lp, valid, ent))
        return jnp.sum(adv[:, None] * lp) + 0.1 * jnp.sum(ent), (lp, valid)

    def shared_loss(p):
        lp, valid, ent = G.shared_token_logprobs(nnx.merge(gdef, p), shared, temperature=0.7, with_entropy=True)
        return jnp.sum(adv[:, None] * lp) + 0.1 * jnp.sum(ent), (lp, valid)

    (lw, (lp_w, v_w)), g_w = jax.jit(jax.value_and_grad(whole_loss, has_aux=True))(params)
    (ls, (lp_s, v_s)), g_s = jax.jit(jax.value_and_grad(shared_loss, has_aux=True))(params)
    np.testing.assert_array_equal(np.asarray(v_s), np.asarray(v_w))
    assert np.asarray(v_s).sum() == ro.lengths[ro.valid].sum() and not np.asarray(v_s)[1].any()
    np.testing.assert_allclose(np.asarray(lp_s), np.asarray(lp_w), atol=2e-5, rtol=0)
    assert np.abs(np.asarray(lp_w)).max() > 0.5          # not trivially zero
    np.testing.assert_allclose(float(ls), float(lw), rtol=2e-5)
    flat_w, flat_s = jax.tree.leaves(g_w), jax.tree.leaves(g_s)
    assert len(flat_w) == len(flat_s)
    for a, b in zip(flat_s, flat_w):
        scale = max(float(jnp.abs(b).max()), 1e-3)
        np.testing.assert_allclose(np.asarray(a) / scale, np.asarray(b) / scale, atol=2e-5)


def test_shared_copies_follow_the_groups_and_the_devices():
    cfg = tiny()[0]
    ro = _rollout(cfg, group=4)                          # 12 rows, groups of 4
    assert RO.shared_copies(ro, np.arange(12)) == 4
    assert RO.shared_copies(ro, np.arange(12), row_multiple=3) == 4   # 3 prompts over 3 devices
    assert RO.shared_copies(ro, np.arange(12), row_multiple=2) == 2   # 3 prompts do not split over 2
    assert RO.shared_copies(ro, np.arange(0, 12, 2)) == 2             # minibatch 0 of 2: 2 rows per group
    assert RO.shared_copies(ro, np.arange(2, 10)) == 2                # runs cut at the group boundary
    assert RO.shared_copies(ro, np.array([0, 4, 8, 1])) == 1
    assert RO.shared_copies(ro, np.array([0, 0, 0, 0])) == 4          # MOPD teacher padding: one row repeated
    ro.prompt_ids = ro.prompt_ids.copy()
    ro.prompt_ids[1, -1] += 1                                         # rows of a group must share the prompt
    assert RO.shared_copies(ro, np.arange(4)) == 1


@pytest.mark.parametrize("old_logprobs", ["recompute", "auto"])
def test_stage2_scoring_and_update_equal_the_whole_row_layout(old_logprobs):
    """PH.score and PH.update with rl.share_prefill on and off: the same log-probs
    (response columns), update metrics and updated parameters."""
    import optax
    from guilibra_jax.train.rl.step import make_rl_step
    from guilibra_jax.train.step_core import init_state
    cfg, graphdef, params = tiny()
    s_on, _ = _stage(old_logprobs=old_logprobs)
    s_off, _ = _stage(old_logprobs=old_logprobs, share_prefill=False)
    ro = PH.rollout(s_on, params, rl_batch(cfg), jax.random.PRNGKey(4))
    sc_on, sc_off = PH.score(s_on, params, ro), PH.score(s_off, params, ro)
    Tp, n = ro.prompt_ids.shape[1], sc_on.n_slots
    assert sc_on.shared and not sc_off.shared and sc_on.old_logp.shape == (ro.rows, n)
    for a, b in ((sc_on.old_logp, sc_off.old_logp), (sc_on.ref_logp, sc_off.ref_logp)):
        np.testing.assert_allclose(a, RO.to_response_columns(b, Tp, n), atol=2e-5, rtol=0)
    adv = {"advantages": np.linspace(-1, 1, ro.rows).astype(np.float32), "kl_mask": np.ones(ro.rows, np.float32)}
    tx = optax.sgd(0.5)
    out = {}
    for name, s, sc in (("on", s_on, sc_on), ("off", s_off, sc_off)):
        step = make_rl_step(graphdef, tx, loss="grpo", loss_kwargs=dict(kl_beta=0.1), banned_token_ids=s.banned)
        s = dataclasses.replace(s, update_fn=jax.jit(step), config=s.config.copy_and_resolve_references())
        s.config.train = dict(grad_accum=2)
        s.config.rl.update(ppo_epochs=1, minibatches=1)
        state, metrics, applied = PH.update(s, init_state(params, tx), ro, adv, sc)
        out[name] = (state["params"], metrics, applied)
    (p_on, m_on, a_on), (p_off, m_off, a_off) = out["on"], out["off"]
    assert a_on == a_off == [True]
    for k in ("loss", "grad_norm", "kl", "entropy", "update_tokens", "clip_fraction"):
        np.testing.assert_allclose(float(m_on[k]), float(m_off[k]), rtol=1e-4, atol=1e-6, err_msg=k)
    for a, b in zip(jax.tree.leaves(p_on), jax.tree.leaves(p_off)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-6)
