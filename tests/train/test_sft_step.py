"""The ASFT step: exact gradient accumulation, non-finite skipping, learning."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from guilibra_jax import models as M
from guilibra_jax.train import fake_batch as F
from guilibra_jax.train import optimizer, step_core
from guilibra_jax.train.sft import step as sft_step
from guilibra_jax.train.batching import stack_micro_batches

nnx.use_eager_sharding(False)


@pytest.fixture(scope="module")
def tiny():
    cfg = F.tiny_config()
    graphdef, pstate, _ = nnx.split(M.QwenVL(cfg, rngs=nnx.Rngs(0)), nnx.Param, ...)
    return cfg, graphdef, nnx.to_pure_dict(pstate)


def split_rows(batch, parts):
    n = batch["input_ids"].shape[0] // parts
    out = []
    for i in range(parts):
        rows = slice(i * n, (i + 1) * n)
        sub = {k: (v[:, rows] if k == "positions" else v[rows]) for k, v in batch.items()
               if k not in ("pixel_values", "vision")}
        out.append(sub)
    return out


@pytest.mark.parametrize("normalize", ["sample", "token"])
def test_two_micro_batches_give_the_full_batch_update(tiny, normalize):
    cfg, graphdef, params = tiny
    tx = optax.sgd(1.0)  # params move by exactly -grad: compares the accumulated gradient itself
    step = jax.jit(sft_step.make_sft_step(graphdef, tx, normalize=normalize))
    full = F.fake_sft_batch(cfg, batch=4, seq_len=32, image_hw=None, seed=3)
    # uneven loss-token counts across the halves make a naive mean of means wrong
    full["loss_segments"][:2, 20:] = 0
    s_full, m_full = step(step_core.init_state(params, tx), stack_micro_batches([full]))
    s_acc, m_acc = step(step_core.init_state(params, tx), stack_micro_batches(split_rows(full, 2)))
    np.testing.assert_allclose(m_acc["loss"], m_full["loss"], rtol=1e-6)
    np.testing.assert_allclose(m_acc["grad_norm"], m_full["grad_norm"], rtol=1e-5)
    for a, b in zip(jax.tree.leaves(s_acc["params"]), jax.tree.leaves(s_full["params"])):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_non_finite_batch_is_skipped_and_counted(tiny):
    cfg, graphdef, params = tiny
    tx, _ = optimizer.make_optimizer(params, lr=1e-2, total_steps=10)
    step = jax.jit(sft_step.make_sft_step(graphdef, tx))
    batch = F.fake_sft_batch(cfg, batch=2, seq_len=48, image_hw=(56, 56), seed=1)
    poisoned = dict(batch, pixel_values=batch["pixel_values"].copy())
    poisoned["pixel_values"][0, 0] = np.nan
    state = step_core.init_state(params, tx)
    state, metrics = step(state, stack_micro_batches([poisoned]))
    assert not np.isfinite(metrics["loss"]) and int(metrics["skipped"]) == 1
    for a, b in zip(jax.tree.leaves(state["params"]), jax.tree.leaves(params)):
        np.testing.assert_array_equal(a, b)  # parameters untouched
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(state["opt_state"]))
    state, metrics = step(state, stack_micro_batches([batch]))
    assert np.isfinite(metrics["loss"]) and int(metrics["skipped"]) == 1  # training goes on


def test_loss_falls_on_a_repeated_batch(tiny):
    cfg, graphdef, params = tiny
    tx, _ = optimizer.make_optimizer(params, lr=3e-3, total_steps=30, schedule="constant")
    step = jax.jit(sft_step.make_sft_step(graphdef, tx))
    batch = stack_micro_batches([F.fake_sft_batch(cfg, batch=2, seq_len=48, image_hw=(56, 56))])
    state = step_core.init_state(params, tx)
    losses = []
    for _ in range(15):
        state, m = step(state, batch)
        losses.append(float(m["loss"]))
    assert losses[-1] < 0.7 * losses[0]


def test_frozen_modules_do_not_move_and_multipliers_scale(tiny):
    cfg, graphdef, params = tiny
    tx, _ = optimizer.make_optimizer(params, lr=1e-2, total_steps=10, freeze=("^visual/",),
                                     lr_multipliers={"embed_tokens": 0.0})
    step = jax.jit(sft_step.make_sft_step(graphdef, tx))
    state, _ = step(step_core.init_state(params, tx),
                    stack_micro_batches([F.fake_sft_batch(cfg, batch=2, seq_len=48, image_hw=(56, 56))]))
    paths = optimizer.param_paths(params)
    moved = jax.tree.map(lambda a, b: bool(np.any(np.asarray(a) != np.asarray(b))), state["params"], params)
    flat = dict(zip(jax.tree.leaves(paths), jax.tree.leaves(moved)))
    assert any(p.startswith("visual/") for p in flat)
    assert not any(m for p, m in flat.items() if p.startswith("visual/"))
    assert not any(m for p, m in flat.items() if "embed_tokens" in p)
    assert any(m for p, m in flat.items() if "layers" in p and not p.startswith("visual/"))


def test_weight_decay_skips_biases_and_norms_of_any_rank():
    """q/k/v biases are [heads, head_dim] and the vision qkv bias is 3-D: rank does not
    decide decay, the parameter's role does. With lr > 0 and a zero gradient, AdamW's
    update is exactly -lr * wd * param on decayed leaves and 0 elsewhere."""
    import jax
    from flax import nnx

    from guilibra_jax import models as M
    from guilibra_jax.train import fake_batch as F
    from guilibra_jax.train.optimizer import make_optimizer, param_paths

    nnx.use_eager_sharding(False)
    params = nnx.to_pure_dict(nnx.state(M.QwenVL(F.tiny_config("qwen2_5_vl"), rngs=nnx.Rngs(0)), nnx.Param))
    tx, _ = make_optimizer(params, lr=0.1, total_steps=10, schedule="constant", weight_decay=0.5, clip_norm=None)
    updates, _ = jax.jit(lambda p: tx.update(jax.tree.map(jnp.zeros_like, p), tx.init(p), p))(params)
    seen = set()
    for path, u, p in zip(jax.tree.leaves(param_paths(params)), jax.tree.leaves(updates), jax.tree.leaves(params)):
        leaf = path.rsplit("/", 1)[-1]
        p = np.asarray(p)
        seen.add((leaf, p.ndim))
        want = -0.1 * 0.5 * p if leaf in ("kernel", "embedding") else np.zeros_like(p)
        np.testing.assert_allclose(np.asarray(u), want, rtol=1e-5, atol=1e-7, err_msg=path)
    assert ("bias", 2) in seen and ("bias", 3) in seen and ("scale", 1) in seen


@pytest.mark.parametrize("max_norm", [0.5, 100.0])   # clipping, and not
def test_clip_given_the_norm_equals_optax_clip_and_the_guarded_step_equals_optax(max_norm):
    """optimizer.clip_by_global_norm (the norm passed in by the step, or not) gives optax's
    clip_by_global_norm bit for bit, and one make_step update (lax.cond guard, gradients
    divided inside it) equals AdamW applied by optax's own chain to the mean gradient."""
    rng = np.random.default_rng(0)
    params = {"a": {"kernel": jnp.asarray(rng.standard_normal((8, 6)), jnp.float32)},
              "b": {"bias": jnp.asarray(rng.standard_normal((6,)), jnp.float32)}}
    grads = jax.tree.map(lambda p: p * 3.0 + 1.0, params)
    want, _ = optax.clip_by_global_norm(max_norm).update(grads, optax.EmptyState())
    ours = optimizer.clip_by_global_norm(max_norm)
    for kw in ({}, {"grad_norm": optax.tree.norm(grads)}):
        got, _ = ours.update(grads, ours.init(params), **kw)
        assert all(np.array_equal(g, w) for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)))

    tx, _ = optimizer.make_optimizer(params, lr=1e-2, total_steps=10, schedule="constant", weight_decay=0.1,
                                     clip_norm=max_norm)
    ref = optax.chain(optax.clip_by_global_norm(max_norm),
                      optax.adamw(1e-2, weight_decay=0.1, mask={"a": {"kernel": True}, "b": {"bias": False}}))
    x = jnp.asarray(rng.standard_normal((2, 3, 8)), jnp.float32)    # 2 micro-batches of 3 rows

    def micro_terms(p, micro):
        y = jnp.tanh(micro @ p["a"]["kernel"] + p["b"]["bias"])
        return jnp.sum(y ** 2), (jnp.float32(micro.shape[0]), {})

    state = step_core.init_state(params, tx)
    new, metrics, _ = jax.jit(step_core.make_step(micro_terms, tx, {}))(state, x)
    mean_loss = lambda p: sum(micro_terms(p, m)[0] for m in x) / 6.0
    g = jax.grad(mean_loss)(params)
    updates, _ = ref.update(g, ref.init(params), params)
    expect = optax.apply_updates(params, updates)
    assert float(metrics["update_ok"]) == 1.0
    np.testing.assert_allclose(float(metrics["grad_norm"]), float(optax.tree.norm(g)), rtol=1e-6)
    for got, w in zip(jax.tree.leaves(new["params"]), jax.tree.leaves(expect)):
        np.testing.assert_allclose(got, w, rtol=1e-6, atol=1e-7)
