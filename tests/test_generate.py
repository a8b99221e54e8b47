"""The jitted sampler against independent references: the full (uncached) forward, exact
renormalised sampling distributions, and log_softmax of the full forward for score()."""
import functools
import json
import os
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from scipy import stats

from guilibra_jax import generate as G
from guilibra_jax import models as M
from guilibra_jax.train import fake_batch as F

IMAGE_HW = {"qwen2_5_vl": (56, 84), "qwen3_vl": (64, 96)}
N_NEW = 6
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sharpen(params, seed=1):
    """Re-draw the random init with larger weights: at the default 0.02 std the tiny tied-embedding
    model just repeats its last input token, so greedy decoding would not depend on positions,
    images or the cache at all. Here attention and MLPs dominate the residual stream."""
    leaves, tdef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    out = [0.15 * jax.random.normal(k, x.shape) if x.ndim > 1 else x + 0.1 * jax.random.normal(k, x.shape)
           for x, k in zip(leaves, keys)]
    return jax.tree.unflatten(tdef, out)


@functools.lru_cache(maxsize=None)
def tiny(family):
    """(ModelConfig, graphdef, pure params) of a tiny random model."""
    nnx.use_eager_sharding(False)
    cfg = F.tiny_config(family)
    graphdef, state, _ = nnx.split(M.QwenVL(cfg, rngs=nnx.Rngs(0)), nnx.Param, ...)
    return cfg, graphdef, sharpen(nnx.to_pure_dict(state))


@functools.partial(jax.jit, static_argnums=0)
def full_forward(graphdef, params, ids, positions, segment_ids, pixel_values, vision):
    return nnx.merge(graphdef, params)(ids, positions, segment_ids, pixel_values, vision)


def prompts_for(cfg, family, seed=0):
    """Four prompts of different lengths (so three are left-padded): image + text, text only,
    image + text, text only. Tokens avoid the vision specials at the top of the vocabulary."""
    rng = np.random.default_rng(seed)
    vc = cfg.vision
    h, w = IMAGE_HW[family]
    grid = (1, h // vc.patch_size, w // vc.patch_size)
    n_img = grid[1] * grid[2] // vc.merge_unit
    image = [cfg.vision_start_token_id] + [cfg.image_token_id] * n_img + [cfg.vision_end_token_id]
    text = lambda n: rng.integers(0, cfg.text.vocab_size - 8, n).tolist()  # noqa: E731
    pix = lambda: rng.standard_normal((grid[1] * grid[2], vc.patch_dim)).astype(np.float32)  # noqa: E731
    return [(text(3) + image + text(5), [grid], pix()),
            (text(4), None, None),
            (text(1) + image + text(2), [grid], pix()),
            (text(7), None, None)]


def run_generate(family, config, rng=0, rope_deltas=None):
    cfg, graphdef, params = tiny(family)
    p = G.prepare_prompts(prompts_for(cfg, family), cfg, pad_id=0)
    deltas = p["rope_deltas"] if rope_deltas is None else rope_deltas
    out = G.generate(graphdef, params, p["prompt_ids"], p["prompt_mask"], p["positions"], deltas,
                     p["pixel_values"], p["vision"], jax.random.key(rng), config)
    return p, jax.tree.map(np.asarray, out)


@functools.lru_cache(maxsize=None)
def greedy_run(family):
    """(prompts dict, output) of plain greedy decoding; shared by several tests."""
    return run_generate(family, G.SamplingConfig(temperature=0.0, max_new_tokens=N_NEW, pad_token_id=0))


def forward_on(family, p, tokens):
    """Full forward on prompt + generated tokens, with positions recomputed by get_rope_index
    on the whole sequence. Returns (logits predicting generated token i [B, N, V], positions)."""
    cfg, graphdef, params = tiny(family)
    ids = np.concatenate([p["prompt_ids"], tokens], axis=1)
    mask = np.concatenate([p["prompt_mask"], np.ones_like(tokens)], axis=1)
    positions, _ = M.get_rope_index(ids, mask, p["image_grid_thw"], cfg)
    logits = np.asarray(full_forward(graphdef, params, ids, positions, mask, p["pixel_values"], p["vision"]))
    t = p["prompt_ids"].shape[1]
    return logits[:, t - 1:t - 1 + tokens.shape[1]], positions[:, :, t:]


def log_softmax(x):
    x = np.asarray(x, np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def reference_distribution(logits, temperature, top_p=1.0, top_k=0):
    """Exact sampling distribution [..., V] (float64): temperature, then top-k, then the
    smallest most-likely set with mass >= top_p, renormalised."""
    p = np.exp(log_softmax(np.asarray(logits, np.float64) / temperature))
    out = np.zeros_like(p)
    for idx in np.ndindex(p.shape[:-1]):
        row = p[idx]
        order = np.argsort(-row, kind="stable")
        keep = order[:top_k] if top_k else order
        q = row[keep] / row[keep].sum()
        n = int(np.searchsorted(np.cumsum(q), top_p - 1e-12)) + 1 if top_p < 1 else len(keep)
        keep = keep[:n]
        out[idx + (keep,)] = row[keep] / row[keep].sum()
    return out


# ----------------------------------------------------------------------------- greedy vs full forward
@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_greedy_equals_argmax_of_full_forward(family):
    cfg = tiny(family)[0]
    p, out = greedy_run(family)
    assert p["prompt_mask"][:, 0].tolist() == [1, 0, 0, 0]  # left padding on rows 1-3
    tokens = out.tokens
    assert tokens.shape == (4, N_NEW) and out.lengths.tolist() == [N_NEW] * 4
    assert not out.done.any() and int(out.steps) == N_NEW - 1
    specials = [cfg.image_token_id, cfg.video_token_id, cfg.vision_start_token_id, cfg.vision_end_token_id]
    assert not np.isin(tokens, specials).any(), "pick another seed: a vision special was generated"

    logits, gen_positions = forward_on(family, p, tokens)
    # The decode positions (n_real + delta + i on every axis) are what get_rope_index gives
    # the generated tokens when run on the whole sequence.
    want_pos = np.asarray(G.decode_positions(p["prompt_mask"], p["rope_deltas"]))[:, None] + np.arange(N_NEW)
    np.testing.assert_array_equal(gen_positions, np.broadcast_to(want_pos, gen_positions.shape))

    scale = np.abs(logits).max()
    for b in range(4):
        for i in range(N_NEW):
            row = logits[b, i]
            top2 = np.sort(row)[-2:]
            if top2[1] - top2[0] > 1e-4 * scale:  # unambiguous argmax: must be equal
                assert tokens[b, i] == row.argmax(), (b, i)
            else:
                assert row[tokens[b, i]] >= top2[1] - 1e-4 * scale, (b, i)
    want_lp = np.take_along_axis(log_softmax(logits), tokens[..., None], -1)[..., 0]
    np.testing.assert_allclose(out.logprobs, want_lp, atol=2e-4, rtol=0)
    assert len(set(tokens.ravel().tolist())) > 6  # the model is not degenerate

    # Sensitivity: wrong decode positions change the log-probs (the check above can fail).
    config = G.SamplingConfig(temperature=0.0, max_new_tokens=N_NEW, pad_token_id=0)
    _, wrong = run_generate(family, config, rope_deltas=p["rope_deltas"] + 1)
    assert np.abs(wrong.logprobs - out.logprobs).max() > 1e-2


def test_greedy_without_logprobs_gives_the_same_tokens():
    """SamplingConfig(logprobs=False), as evaluation asks: the greedy tokens, lengths and
    stops of the default call, and log-probs of 0."""
    _, out = greedy_run("qwen2_5_vl")
    _, bare = run_generate("qwen2_5_vl", G.SamplingConfig(temperature=0.0, max_new_tokens=N_NEW, pad_token_id=0,
                                                           logprobs=False))
    np.testing.assert_array_equal(bare.tokens, out.tokens)
    np.testing.assert_array_equal(bare.lengths, out.lengths)
    assert not bare.logprobs.any() and out.logprobs.all()


# (top-k / top-p move the vocabulary last before filtering: the sample_token test above covers them)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_both_logit_layouts_generate_the_same_tokens(temperature):
    """SamplingConfig.vocab_major True / False: the decode head as [V, B] or [B, V] (the
    program's logits have that shape) gives the same tokens, lengths and log-probs; the
    default takes [V, B] on CPU up to VOCAB_MAJOR_MAX_ROWS rows."""
    family = "qwen2_5_vl"
    cfg, graphdef, params = tiny(family)
    outs, shapes = {}, {}
    for major in (True, False):
        config = G.SamplingConfig(temperature=temperature, max_new_tokens=N_NEW, pad_token_id=0,
                                  banned_token_ids=(cfg.image_token_id,), vocab_major=major)
        p, outs[major] = run_generate(family, config, rng=5)
        hlo = G.lower_generate(graphdef, params, p["prompt_ids"], p["prompt_mask"], p["positions"],
                               p["rope_deltas"], p["pixel_values"], p["vision"], jax.random.key(5), config).as_text()
        shapes[major] = {(4, cfg.text.vocab_size), (cfg.text.vocab_size, 4)} & {
            tuple(int(d) for d in m.split("x")) for m in re.findall(r"tensor<(\d+x\d+)xf32>", hlo)}
    v = cfg.text.vocab_size
    assert shapes == {True: {(v, 4)}, False: {(4, v)}}, shapes
    np.testing.assert_array_equal(outs[True].tokens, outs[False].tokens)
    np.testing.assert_array_equal(outs[True].lengths, outs[False].lengths)
    np.testing.assert_allclose(outs[True].logprobs, outs[False].logprobs, atol=1e-5, rtol=0)
    on_cpu = jax.default_backend() == "cpu"
    assert G.vocab_major_logits(G.SamplingConfig(), G.VOCAB_MAJOR_MAX_ROWS) == on_cpu
    assert not G.vocab_major_logits(G.SamplingConfig(), G.VOCAB_MAJOR_MAX_ROWS + 1)


def test_sampled_logprobs_follow_filtered_full_forward():
    family = "qwen2_5_vl"
    config = G.SamplingConfig(temperature=0.8, top_p=0.9, top_k=40, max_new_tokens=N_NEW, pad_token_id=0)
    p, out = run_generate(family, config, rng=3)
    cfg = tiny(family)[0]
    assert not np.isin(out.tokens, [cfg.image_token_id, cfg.vision_start_token_id]).any()
    logits, _ = forward_on(family, p, out.tokens)
    dist = reference_distribution(logits, 0.8, top_p=0.9, top_k=40)
    picked = np.take_along_axis(dist, out.tokens[..., None], -1)[..., 0]
    assert (picked > 0).all(), "a token outside the top-k / nucleus set was sampled"
    np.testing.assert_allclose(out.logprobs, np.log(picked), atol=2e-4, rtol=0)
    compiled = G._generate_jit._cache_size()
    _, again = run_generate(family, config, rng=3)
    np.testing.assert_array_equal(again.tokens, out.tokens)
    _, other = run_generate(family, config, rng=4)
    assert (other.tokens != out.tokens).any()
    assert G._generate_jit._cache_size() == compiled  # new rng / prompt arrays: no recompilation


# ----------------------------------------------------------------------------- stop tokens
def test_rows_stop_independently_and_loop_exits_early():
    family = "qwen3_vl"
    _, free = greedy_run(family)
    free_tokens = free.tokens
    stops = tuple(sorted({int(free_tokens[0, 2]), int(free_tokens[1, 1]), int(free_tokens[2, 3]),
                          int(free_tokens[3, 2])}))
    pad = 7
    config = G.SamplingConfig(temperature=0.0, max_new_tokens=N_NEW, stop_token_ids=stops, pad_token_id=pad)
    _, out = run_generate(family, config)
    want_len = []
    for b in range(4):
        hits = np.flatnonzero(np.isin(free_tokens[b], stops))
        n = int(hits[0]) + 1 if len(hits) else N_NEW
        want_len.append(n)
        np.testing.assert_array_equal(out.tokens[b, :n], free_tokens[b, :n])
        np.testing.assert_allclose(out.logprobs[b, :n], free.logprobs[b, :n], atol=1e-5, rtol=0)
        assert (out.tokens[b, n:] == pad).all() and (out.logprobs[b, n:] == 0).all()
    assert out.lengths.tolist() == want_len
    assert max(want_len) <= 4 and len(set(want_len)) > 1  # rows stop at different steps
    assert out.done.all()
    assert int(out.steps) == max(want_len) - 1 < N_NEW - 1  # early exit once every row is done


# ----------------------------------------------------------------------------- shared prefill (copies)
COPIES = 3


def shared_and_repeated(config, copies=COPIES, family="qwen2_5_vl"):
    """(host-repeated prompts dict, generate on it, distinct prompts dict, generate with copies):
    the reference repeats every prompt (its image included) ``copies`` times on the host, row
    p * copies + j = prompt p, as rollout.expand_groups; both calls use the same key."""
    cfg, graphdef, params = tiny(family)
    prompts = prompts_for(cfg, family)
    shared = G.prepare_prompts(prompts, cfg, pad_id=0)
    repeated = G.prepare_prompts([p for p in prompts for _ in range(copies)], cfg, pad_id=0)

    def call(p, c):
        return jax.tree.map(np.asarray, G.generate(graphdef, params, p["prompt_ids"], p["prompt_mask"],
                                                   p["positions"], p["rope_deltas"], p["pixel_values"], p["vision"],
                                                   jax.random.key(5), config, copies=c))
    return repeated, call(repeated, 1), shared, call(shared, copies)


@pytest.mark.parametrize("temperature,top_p,top_k", [(0.0, 1.0, 0), (1.0, 1.0, 0), (0.7, 0.9, 20)])
def test_shared_prefill_equals_generate_on_repeated_prompts(temperature, top_p, top_k):
    """generate(copies=3) on 4 distinct prompts (two with an image) = generate on the 12
    host-repeated rows: the same tokens, lengths and stops. Log-probs: atol 2e-5, because the
    prefill runs at 4 rows instead of 12 and XLA's CPU matmuls block the row dimension
    differently per batch size, so a row's activations may differ in the last float32 bits
    (measured 3e-6 on log-probs of size ~5; float32 eps x 5 = 6e-7, through 2 layers and a
    256-way log-softmax). The decode loop runs at 12 rows in both."""
    config = G.SamplingConfig(temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=N_NEW,
                              pad_token_id=0)
    repeated, want, shared, got = shared_and_repeated(config)
    assert shared["pixel_values"].shape[0] * COPIES == repeated["pixel_values"].shape[0]   # images once per prompt
    assert got.tokens.shape == want.tokens.shape == (4 * COPIES, N_NEW)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_array_equal(got.lengths, want.lengths)
    np.testing.assert_array_equal(got.done, want.done)
    np.testing.assert_allclose(got.logprobs, want.logprobs, atol=2e-5, rtol=0)
    # the prompts differ, and (sampled) the copies of a prompt drew different responses
    assert len({tuple(r) for r in got.tokens[::COPIES]}) == 4
    if temperature > 0:
        assert all(len({tuple(r) for r in got.tokens[p * COPIES:(p + 1) * COPIES]}) > 1 for p in range(4))


@pytest.mark.parametrize("family,scan_layers", [("qwen2_5_vl", False), ("qwen3_vl", True)])
def test_prompt_held_once_samples_as_the_per_row_copies(family, scan_layers):
    """SamplingConfig.shared_prefix (the default: each prompt's keys and values held once for its
    rows, attention.cascade_attention) against shared_prefix=False (a copy in every row's cache):
    the same tokens at temperature 0.7 with top-p / top-k, log-probs to float rounding; the
    program of the default holds no [L, 12, K, H, T + N - 1] row cache, the per-row one does.
    Unrolled and scanned layers (every recipe scans: the layer's prompt keys are then a traced slice)."""
    cfg = F.tiny_config(family)
    nnx.use_eager_sharding(False)
    graphdef, state, _ = nnx.split(M.QwenVL(cfg, scan_layers=scan_layers, rngs=nnx.Rngs(0)), nnx.Param, ...)
    params = sharpen(nnx.to_pure_dict(state))
    p = G.prepare_prompts(prompts_for(cfg, family), cfg, pad_id=0)
    args = (p["prompt_ids"], p["prompt_mask"], p["positions"], p["rope_deltas"], p["pixel_values"], p["vision"])
    outs, jaxprs = [], []
    for held_once in (True, False):
        config = G.SamplingConfig(temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=N_NEW, pad_token_id=0,
                                  shared_prefix=held_once)
        run = lambda params, *xs: G.generate(graphdef, params, *xs, jax.random.key(3), config, copies=COPIES)  # noqa: E731
        outs.append(jax.tree.map(np.asarray, run(params, *args)))
        jaxprs.append(str(jax.make_jaxpr(run)(params, *args)))
    np.testing.assert_array_equal(outs[0].tokens, outs[1].tokens)
    np.testing.assert_array_equal(outs[0].lengths, outs[1].lengths)
    np.testing.assert_allclose(outs[0].logprobs, outs[1].logprobs, atol=2e-5, rtol=0)
    tc = cfg.text
    row_cache = f"f32[{tc.num_layers},{4 * COPIES},{tc.num_kv_heads},{tc.head_dim},{p['prompt_ids'].shape[1] + N_NEW - 1}]"
    assert row_cache not in jaxprs[0] and row_cache in jaxprs[1]


def test_shared_prefill_runs_the_prompt_at_the_distinct_rows():
    """The traced program of generate(copies=3) holds the prompt's hidden states [4, T, D]
    (vision features merged in) and never [12, T, D]: the prefill runs once per distinct
    prompt. The same check on the host-repeated call finds [12, T, D], so it can fail."""
    cfg, graphdef, params = tiny("qwen2_5_vl")
    config = G.SamplingConfig(temperature=1.0, max_new_tokens=N_NEW, pad_token_id=0)
    t, d = 19, cfg.text.hidden_size   # a prompt width no weight or head shape has
    p = G.prepare_prompts(prompts_for(cfg, "qwen2_5_vl"), cfg, pad_id=0, bucket_len=t)
    reps = G.prepare_prompts([q for q in prompts_for(cfg, "qwen2_5_vl") for _ in range(COPIES)], cfg, pad_id=0,
                             bucket_len=t)

    def prompt_row_counts(q, copies):
        def run(params, *xs):
            return G.generate(graphdef, params, *xs, jax.random.key(0), config, copies=copies)
        jaxpr = jax.make_jaxpr(run)(params, q["prompt_ids"], q["prompt_mask"], q["positions"], q["rope_deltas"],
                                    q["pixel_values"], q["vision"])
        out_rows = jaxpr.out_avals[0].shape[0]
        return out_rows, {int(m) for m in re.findall(rf"f32\[(\d+),{t},{d}\]", str(jaxpr))}

    assert prompt_row_counts(p, COPIES) == (4 * COPIES, {4})
    assert prompt_row_counts(reps, 1) == (4 * COPIES, {4 * COPIES})
    with pytest.raises(ValueError, match="copies"):
        G.generate(graphdef, params, p["prompt_ids"], p["prompt_mask"], p["positions"], p["rope_deltas"],
                   p["pixel_values"], p["vision"], jax.random.key(0), config, copies=0)


# ----------------------------------------------------------------------------- sample_token statistics
PROBS = np.array([0.07, 0.3, 0.005, 0.15, 0.03, 0.2, 0.08, 0.015, 0.1, 0.05])
DRAWS = 20_000


CASES = [(1.0, 1.0, 0), (0.5, 1.0, 0), (2.0, 1.0, 4), (1.0, 0.7, 0), (0.7, 0.8, 5), (1.3, 0.95, 0)]


def test_sample_token_statistics():
    """Empirical frequencies of DRAWS independent draws (one row each) against the exact
    renormalised distribution, per (temperature, top_p, top_k) case."""
    logits = np.log(PROBS).astype(np.float32) + 3.0  # any offset: softmax is shift invariant
    batch = jnp.broadcast_to(jnp.asarray(logits), (DRAWS, len(PROBS)))

    @jax.jit
    def draw_all(batch, key):  # one compilation for all cases
        return [G.sample_token(batch, jax.random.fold_in(key, i), *case) for i, case in enumerate(CASES)]

    for (temperature, top_p, top_k), (tok, lp) in zip(CASES, draw_all(batch, jax.random.key(0))):
        tok, lp = np.asarray(tok), np.asarray(lp)
        want = reference_distribution(logits, temperature, top_p, top_k)
        support = np.flatnonzero(want > 0)
        if top_k:
            assert len(support) <= top_k
        if top_p < 1:  # the nucleus is a strict subset here: its tail must never be drawn
            assert len(support) < (top_k or len(PROBS))
        counts = np.bincount(tok, minlength=len(PROBS))
        assert set(np.flatnonzero(counts)) == set(support), (temperature, top_p, top_k, counts)
        expected = DRAWS * want[support]
        chi2 = ((counts[support] - expected) ** 2 / expected).sum()
        assert chi2 < stats.chi2.ppf(1 - 1e-4, max(len(support) - 1, 1)), (temperature, top_p, top_k, counts)
        np.testing.assert_allclose(lp, np.log(want[tok]), atol=1e-5, rtol=0)


def test_inverse_cdf_sample_over_many_blocks():
    """G.inverse_cdf_sample with blocks of 3 over a 16-entry distribution with never-drawn
    (-inf) entries, one a whole block: chi-square against the exact distribution, no draw
    of a -inf entry, exact log-probs; the same key draws the same tokens with one block
    (a flat inversion), so the block size is not part of the distribution."""
    probs = np.array([0.1, 0, 0.2, 0, 0, 0, 0.05, 0.15, 0.1, 0.02, 0.08, 0.1, 0.05, 0.1, 0.05, 0])
    logits = np.where(probs > 0, np.log(np.maximum(probs, 1e-30)) + 1.5, -np.inf).astype(np.float32)
    batch = jnp.broadcast_to(jnp.asarray(logits), (DRAWS, len(probs)))
    draw = jax.jit(G.inverse_cdf_sample, static_argnames=("block", "axis"))
    tok, lp = (np.asarray(x) for x in draw(jax.random.key(3), batch, block=3))
    flat, _ = draw(jax.random.key(3), batch, block=len(probs))
    assert np.mean(np.asarray(flat) == tok) > 0.999
    major, major_lp = draw(jax.random.key(3), batch.T, block=3, axis=0)   # vocabulary-major: the same draws
    np.testing.assert_array_equal(np.asarray(major), tok)
    np.testing.assert_allclose(np.asarray(major_lp), lp, atol=1e-6, rtol=0)
    counts = np.bincount(tok, minlength=len(probs))
    support = np.flatnonzero(probs > 0)
    assert set(np.flatnonzero(counts)) == set(support)
    expected = DRAWS * probs[support]
    assert ((counts[support] - expected) ** 2 / expected).sum() < stats.chi2.ppf(1 - 1e-4, len(support) - 1)
    np.testing.assert_allclose(lp, np.log(probs[tok]), atol=1e-5, rtol=0)


def test_blocked_argmax_is_argmax():
    """G.blocked_argmax equals jnp.argmax on rows with ties (the lowest index wins, across and
    within blocks), all -inf, all +inf, a vocabulary that is not a multiple of the block
    (padded) and one that is."""
    rng = np.random.default_rng(0)
    for v in (1000, 1024):
        x = rng.normal(size=(7, v)).astype(np.float32)
        x[1, [5, 700]] = x[1, [3, 900]] = 9.0       # ties in different blocks
        x[2, [130, 131]] = 9.0                      # a tie inside one block
        x[3], x[4] = -np.inf, np.inf
        x[5, -1] = 10.0                             # the last entry (the padded block)
        want = np.argmax(x, -1)
        assert want.tolist()[1:4] == [3, 130, 0]
        np.testing.assert_array_equal(np.asarray(jax.jit(G.blocked_argmax)(jnp.asarray(x))), want)
        np.testing.assert_array_equal(np.asarray(G.blocked_argmax(jnp.asarray(x), block=7)), want)
        np.testing.assert_array_equal(np.asarray(G.blocked_argmax(jnp.asarray(x.T), axis=0)), want)


def test_top_p_and_top_k_sets_exact():
    """Nucleus boundaries on a large random vocabulary, checked per row."""
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(64, 500)).astype(np.float32) * 3
    for top_p, top_k in [(0.5, 0), (0.9, 50), (1.0, 7)]:
        scores, index = G.sampling_logits(jnp.asarray(logits), 1.0, top_p, top_k)
        kept = np.zeros(logits.shape, bool)
        np.put_along_axis(kept, np.asarray(index), np.isfinite(np.asarray(scores)), -1)
        want = reference_distribution(logits, 1.0, top_p, top_k) > 0
        np.testing.assert_array_equal(kept, want)
        if top_k:
            assert (kept.sum(-1) <= top_k).all()
        if top_k and top_p == 1.0:
            assert (kept.sum(-1) == top_k).all()


def test_sample_token_draws_the_same_tokens_in_either_logit_layout():
    """Logits [B, V] and the sampler's vocabulary-major [V, B] (axis=0), a banned token, every
    sampling case and greedy: the same key draws the same tokens with the same log-probs."""
    rng = np.random.default_rng(1)
    logits = jnp.asarray(rng.normal(size=(64, 1000)).astype(np.float32) * 3)
    logits = logits.at[:, 500].set(1e4)        # banned below: never drawn in either layout
    banned = (500,)

    @jax.jit
    def both(logits, key):
        rows, major = G.ban_tokens(logits, banned), G.ban_tokens(logits.T, banned, axis=0)
        return [(G.sample_token(rows, jax.random.fold_in(key, i), *case),
                 G.sample_token(major, jax.random.fold_in(key, i), *case, axis=0))
                for i, case in enumerate(CASES + [(0.0, 1.0, 0)])]

    for (tok, lp), (tok_t, lp_t) in both(logits, jax.random.key(0)):
        assert not np.isin(np.asarray(tok), banned).any()
        np.testing.assert_array_equal(np.asarray(tok_t), np.asarray(tok))
        np.testing.assert_allclose(np.asarray(lp_t), np.asarray(lp), atol=1e-5, rtol=0)


def test_greedy_sample_token():
    logits = jnp.asarray([[0.0, 2.0, 1.0], [3.0, -1.0, 3.0]])
    tok, lp = G.sample_token(logits, jax.random.key(0), 0.0, 0.5, 1)
    assert np.asarray(tok).tolist() == [1, 0]
    np.testing.assert_allclose(lp, np.take_along_axis(log_softmax(logits), np.asarray(tok)[:, None], -1)[:, 0],
                               atol=1e-6)


# ----------------------------------------------------------------------------- score
def test_score_equals_full_forward_log_softmax():
    family = "qwen2_5_vl"
    cfg, graphdef, params = tiny(family)
    b = F.fake_sft_batch(cfg, batch=2, seq_len=32, image_hw=IMAGE_HW[family], seed=1, left_pad=3)
    seg = b["segment_ids"].copy()
    seg[1, 20:] = 2  # a second packed sample in row 1: no target across the boundary
    args = (b["input_ids"], b["positions"], seg, b["pixel_values"], b["vision"])
    logits = np.asarray(full_forward(graphdef, params, *args))
    targets = np.concatenate([b["input_ids"][:, 1:], b["input_ids"][:, :1]], axis=1)
    want = np.take_along_axis(log_softmax(logits), targets[..., None], -1)[..., 0]
    valid = (seg > 0) & (np.concatenate([seg[:, 1:], seg[:, :1] * 0], 1) == seg)
    want = np.where(valid, want, 0.0)
    got = np.asarray(G.score(graphdef, params, *args))
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    assert got[0, :3].tolist() == [0, 0, 0] and got[1, 19] == 0 and (got[:, -1] == 0).all()

    response = np.zeros_like(seg)
    response[:, 16:] = 1
    tempered = np.take_along_axis(log_softmax(logits / 0.5), targets[..., None], -1)[..., 0]
    got = np.asarray(G.score(graphdef, params, *args, response_mask=response, temperature=0.5, chunk_size=7))
    np.testing.assert_allclose(got, np.where(valid & (response > 0), tempered, 0.0), atol=2e-4, rtol=0)


# ----------------------------------------------------------------------------- host helper
def test_prepare_prompts_padding_buckets_and_errors():
    family = "qwen3_vl"
    cfg = tiny(family)[0]
    prompts = prompts_for(cfg, family)
    p = G.prepare_prompts(prompts, cfg, pad_id=5, bucket_len=(8, 32, 64), num_patches=64)
    lens = [len(x[0]) for x in prompts]
    assert p["prompt_ids"].shape == (4, 32) and p["prompt_lens"].tolist() == lens
    for r, (ids, _, _) in enumerate(prompts):
        assert p["prompt_ids"][r, 32 - lens[r]:].tolist() == ids
        assert (p["prompt_ids"][r, :32 - lens[r]] == 5).all() and p["prompt_mask"][r].sum() == lens[r]
    grid = np.asarray([prompts[0][1][0], prompts[2][1][0]])
    pos, deltas = M.get_rope_index(p["prompt_ids"], p["prompt_mask"], grid, cfg)
    np.testing.assert_array_equal(p["positions"], pos)
    np.testing.assert_array_equal(p["rope_deltas"], deltas)
    np.testing.assert_array_equal(p["image_grid_thw"], grid)
    assert p["pixel_values"].shape == (64, cfg.vision.patch_dim)
    np.testing.assert_array_equal(p["pixel_values"][:24], prompts[0][2])
    np.testing.assert_array_equal(p["pixel_values"][24:48], prompts[2][2])
    assert (p["pixel_values"][48:] == 0).all() and p["vision"]["patch_index"].max() < 48  # padding: no slot

    text_only = G.prepare_prompts([([1, 2, 3], None, None)], cfg, pad_id=0)
    assert text_only["pixel_values"] is None and text_only["vision"] is None
    with pytest.raises(ValueError, match="bucket"):
        G.prepare_prompts(prompts, cfg, pad_id=0, bucket_len=12)
    with pytest.raises(ValueError, match="pixel rows"):
        G.prepare_prompts([(prompts[0][0], prompts[0][1], prompts[0][2][:-4])], cfg, pad_id=0)
    with pytest.raises(ValueError):
        G.SamplingConfig(top_p=0.0)


# ----------------------------------------------------------------------------- sharded params
def test_generate_with_sharded_params(tmp_path):
    """Greedy decoding with params sharded over a (1, 2, 2) mesh of 4 CPU devices and the
    batch over (data, fsdp) gives the unsharded tokens, and no host transfer happens inside
    the jitted call (a fresh process: fake devices must be set before jax starts). With
    copies=2 (4 prompts, 8 rows) it gives the tokens of the host-repeated prompts, and the
    compiled program (XLA's dump) keeps the repeated KV cache's rows sharded: 4 rows per
    device [L, 4, S, kv/2, hd], never all 8."""
    dump = str(tmp_path / "hlo")
    script = textwrap.dedent(f"""
        import os, sys, json
        os.environ["XLA_FLAGS"] = ("--xla_force_host_platform_device_count=4 --xla_dump_to={dump} "
                                   "--xla_dump_hlo_as_text --xla_dump_hlo_module_re=.*generate.*")
        os.environ["JAX_PLATFORMS"] = "cpu"
        sys.path.insert(0, {REPO!r})
        sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
        import jax, numpy as np
        from flax import nnx
        from guilibra_jax import sharding as S
        from guilibra_jax import models as M
        from test_generate import G, N_NEW, prompts_for, tiny
        family = "qwen2_5_vl"
        cfg, graphdef, params = tiny(family)
        p = G.prepare_prompts(prompts_for(cfg, family), cfg, pad_id=0)
        mesh = S.make_mesh((1, 2, 2))
        state = nnx.state(M.QwenVL(cfg, rngs=nnx.Rngs(0)), nnx.Param)
        params = jax.device_put(params, S.param_shardings(state, mesh, log=False))
        n_sharded = sum(1 for x in jax.tree.leaves(params) if not x.sharding.is_fully_replicated)
        rows = S.batch_sharding(mesh)
        args = [jax.device_put(p["prompt_ids"], rows), jax.device_put(p["prompt_mask"], rows),
                jax.device_put(p["positions"], S.batch_sharding(mesh, 3, 1)),
                jax.device_put(p["rope_deltas"], S.batch_sharding(mesh, 1)),
                *jax.device_put([p["pixel_values"], p["vision"]], S.replicated(mesh)),
                jax.device_put(jax.random.key(0), S.replicated(mesh))]
        config = G.SamplingConfig(temperature=0.0, max_new_tokens=N_NEW, pad_token_id=0)
        G.generate(graphdef, params, *args, config)  # compile
        with jax.transfer_guard("disallow"):
            out = jax.block_until_ready(G.generate(graphdef, params, *args, config))
        before = set(os.listdir({dump!r}))
        shared = G.generate(graphdef, params, *args, config, copies=2)
        hlo = [f for f in set(os.listdir({dump!r})) - before if f.endswith("after_optimizations.txt")]
        print(json.dumps({{"tokens": np.asarray(out.tokens).tolist(), "logprobs": np.asarray(out.logprobs).tolist(),
                          "n_sharded": n_sharded, "devices": len(jax.devices()),
                          "shared_tokens": np.asarray(shared.tokens).tolist(),
                          "shared_logprobs": np.asarray(shared.logprobs).tolist(), "shared_hlo": hlo}}))
        """)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env,
                         cwd=REPO)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["devices"] == 4 and got["n_sharded"] > 10
    _, want = greedy_run("qwen2_5_vl")
    np.testing.assert_array_equal(np.asarray(got["tokens"]), want.tokens)
    np.testing.assert_allclose(np.asarray(got["logprobs"]), want.logprobs, atol=1e-4, rtol=0)
    # copies=2: the host-repeated prompts' tokens, the cache's rows sharded over fsdp = 2
    _, reference, _, _ = shared_and_repeated(G.SamplingConfig(temperature=0.0, max_new_tokens=N_NEW, pad_token_id=0),
                                             copies=2)
    np.testing.assert_array_equal(np.asarray(got["shared_tokens"]), reference.tokens)
    np.testing.assert_allclose(np.asarray(got["shared_logprobs"]), reference.logprobs, atol=1e-4, rtol=0)
    cfg = tiny("qwen2_5_vl")[0]
    prompt_len = G.prepare_prompts(prompts_for(cfg, "qwen2_5_vl"), cfg, pad_id=0)["prompt_ids"].shape[1]
    assert len(got["shared_hlo"]) == 1, got["shared_hlo"]
    with open(os.path.join(dump, got["shared_hlo"][0])) as f:
        hlo = f.read()
    # key caches, [L, rows, K, H, S] (models/text.py init_cache): the rows' own (S = N_NEW - 1) and the
    # prompts' held once (S = the prompt length, generate.share_prefix), each sharded over fsdp = 2
    def cache_rows(slots):
        return {int(r) for r in re.findall(rf"f32\[{cfg.text.num_layers},(\d+),\d+,{cfg.text.head_dim},{slots}\]", hlo)}
    assert max(cache_rows(N_NEW - 1)) == 4, cache_rows(N_NEW - 1)     # 8 rows / fsdp 2
    assert max(cache_rows(prompt_len)) == 2, cache_rows(prompt_len)   # 4 prompts / fsdp 2
