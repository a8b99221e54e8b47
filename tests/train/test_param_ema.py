"""``optim.ema_decay``: a moving average of the trained parameters, exported in their place.

- the optimizer's average equals the closed form ``d^k p0 + (1-d) sum_j d^(k-j) p_j`` over
  a known trajectory (SGD on a quadratic), in float32 even for bf16 parameters;
- an update the step's guard skips (non-finite loss) leaves the average untouched, and the
  average is sharded like the parameters;
- in a real ASFT run every checkpoint's average is the previous one moved towards that
  checkpoint's parameters, the run's export is the last average (and not the last
  parameters), ``launch.convert`` writes either, and the checkpoint agent and a frozen
  model read from the workdir hold the export's weights;
- a GRPO run with LoRA (its memory plan included) averages the adapters: the PEFT folder
  holds the average, and the merged export is launch.convert's merge of it;
- a run resumed from its step-2 checkpoint ends bitwise equal to the uninterrupted one;
- switching the average on or off on a rerun, and asking a checkpoint without one for it,
  are one-line errors naming the key.
"""
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from safetensors.numpy import load_file

from guilibra_jax.errors import ConfigError
from guilibra_jax.train.optimizer import averaged, ema_of, param_ema
from guilibra_jax.train.step_core import init_state, make_step
from tests.chance_reward import chance_reward

DECAY = 0.5
STEPS = 4


def test_the_average_follows_the_closed_form_over_a_known_trajectory():
    lr, target = 0.3, np.array([1.0, -2.0, 0.5])
    p0 = np.array([0.0, 1.0, 4.0])
    tx = param_ema(optax.sgd(lr), 0.8)
    params = {"w": jnp.asarray(p0, jnp.float32)}
    state = tx.init(params)
    for _ in range(5):
        grads = {"w": params["w"] - target}                    # d/dp 0.5 |p - target|^2
        updates, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, updates)
    traj = [target + (1 - lr) ** k * (p0 - target) for k in range(6)]   # p_k, exactly
    want = 0.8 ** 5 * traj[0] + sum(0.2 * 0.8 ** (5 - j) * traj[j] for j in range(1, 6))
    np.testing.assert_allclose(np.asarray(state.ema["w"]), want, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(params["w"]), traj[5], rtol=1e-6)   # the updates are sgd's own


def test_a_bf16_model_keeps_a_float32_average_that_moves():
    params = {"w": jnp.ones((4,), jnp.bfloat16)}
    tx = param_ema(optax.sgd(2.0 ** -7), 0.999)     # a step bf16 holds exactly: 1 -> 1 - 2^-7
    state = tx.init(params)
    updates, state = tx.update({"w": jnp.ones((4,), jnp.bfloat16)}, state, params)
    assert state.ema["w"].dtype == jnp.float32
    moved = 1.0 - float(state.ema["w"][0])           # 0.001 x 2^-7: below bf16's resolution at 1
    np.testing.assert_allclose(moved, 0.001 * 2.0 ** -7, rtol=1e-3)
    assert ema_of(state, params)["w"].dtype == jnp.bfloat16
    assert ema_of(optax.sgd(1.0).init(params), params) is None


def test_a_skipped_update_leaves_the_average_untouched():
    tx = param_ema(optax.sgd(0.1), 0.5)

    def micro_terms(params, micro):
        return jnp.sum(params["w"] * micro["x"]), (jnp.ones(()), {})

    step = jax.jit(make_step(micro_terms, tx, {}))
    state = init_state({"w": jnp.ones((3,), jnp.float32)}, tx)
    bad, _, _ = step(state, {"x": jnp.full((1, 3), jnp.nan)})
    assert int(bad["skipped"]) == 1
    np.testing.assert_array_equal(np.asarray(bad["opt_state"].ema["w"]), np.ones(3))
    good, _, _ = step(bad, {"x": jnp.ones((1, 3))})
    np.testing.assert_allclose(np.asarray(good["opt_state"].ema["w"]), 0.5 * 1.0 + 0.5 * 0.9, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(averaged(good)["params"]["w"]), 0.95, rtol=1e-6)


def test_the_average_is_sharded_like_the_parameters():
    from jax.sharding import Mesh
    from guilibra_jax import sharding as S
    from guilibra_jax.train.optimizer import make_optimizer
    params = {"a": {"kernel": jnp.ones((8, 4))}, "b": {"scale": jnp.ones((4,))}}
    tags = {"a": {"kernel": "fsdp-sharded"}, "b": {"scale": "replicated"}}     # stand-ins for NamedShardings
    tx, _ = make_optimizer(params, lr=1e-3, total_steps=10, ema_decay=0.9)
    shardings = S.opt_state_shardings(tx, params, tags, Mesh(np.array(jax.devices()[:1]), ("data",)))
    assert shardings.ema == tags


def _config(**over):
    from configs import demo
    c = demo.get_config("smoke")
    c.optim.ema_decay = DECAY
    c.train.steps = STEPS
    c.train.checkpoint_every = 1
    c.train.keep_checkpoints = STEPS
    c.train.tensorboard = c.train.curves = False
    for k, v in over.items():
        section, key = k.split("__")
        setattr(getattr(c, section), key, v)
    return c


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from guilibra_jax.train.run import train
    workdir = str(tmp_path_factory.mktemp("ema") / "run")
    train(_config(), workdir)
    return workdir


def _weights(folder):
    return load_file(os.path.join(folder, "model.safetensors"))


def test_every_checkpoint_moves_the_average_and_the_export_is_the_last_one(run_dir, tmp_path):
    from guilibra_jax.train.model_factory import export_checkpoint as convert
    ema = {s: _weights(convert(run_dir, str(tmp_path / f"e{s}"), s, "ema")) for s in (2, 3, 4)}
    params = {s: _weights(convert(run_dir, str(tmp_path / f"p{s}"), s, "params")) for s in (3, 4)}
    default = _weights(convert(run_dir, str(tmp_path / "default"), STEPS))
    export = _weights(os.path.join(run_dir, "export"))
    assert set(export) == set(ema[4])
    moved = 0.0
    for k in export:
        np.testing.assert_array_equal(export[k], ema[4][k], err_msg=k)
        np.testing.assert_array_equal(default[k], ema[4][k], err_msg=k)
        for s in (3, 4):
            np.testing.assert_allclose(ema[s][k], DECAY * ema[s - 1][k] + (1 - DECAY) * params[s][k],
                                       rtol=1e-5, atol=1e-7, err_msg=f"{k} step {s}")
        moved = max(moved, float(np.abs(export[k] - params[4][k]).max()))
    assert moved > 1e-5, moved        # the export is not the last parameters


def test_a_run_resumed_from_its_step_2_checkpoint_ends_bitwise_equal(run_dir, tmp_path):
    from guilibra_jax.train.run import train
    resumed = str(tmp_path / "resumed")
    shutil.copytree(run_dir, resumed)
    for gone in ("checkpoints/3", "checkpoints/4", "export"):
        shutil.rmtree(os.path.join(resumed, gone))
    train(_config(), resumed)
    want, got = _weights(os.path.join(run_dir, "export")), _weights(os.path.join(resumed, "export"))
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


@pytest.mark.parametrize("decay", [0.0, 0.9])
def test_switching_the_average_on_a_rerun_names_the_key(run_dir, tmp_path, decay):
    from guilibra_jax.train.run import train
    rerun = str(tmp_path / "rerun")
    shutil.copytree(run_dir, rerun)
    if decay:     # a run without the average, switched on
        from guilibra_jax.train.run_history import CONFIG_FILE
        import json
        path = os.path.join(rerun, CONFIG_FILE)
        cfg = json.load(open(path))
        cfg["optim"]["ema_decay"] = 0.0
        json.dump(cfg, open(path, "w"))
    with pytest.raises(ConfigError, match=r"optim\.ema_decay cannot be switched"):
        train(_config(optim__ema_decay=decay, train__allow_config_change=True), rerun)


def test_asking_a_checkpoint_without_an_average_for_it_names_the_key(tmp_path):
    from guilibra_jax.train import checkpoint as C
    ckpt = C.Checkpointer(str(tmp_path / "checkpoints"), async_save=False)
    params = {"w": jnp.ones((3,))}
    ckpt.save(1, init_state(params, optax.sgd(0.1)), force=True)
    ckpt.close()
    with pytest.raises(FileNotFoundError, match=r"checkpoint step 1 under .* holds no opt_state/ema"):
        C.restore_params_only(str(tmp_path / "checkpoints"), params, key=("opt_state", "ema"))
    np.testing.assert_array_equal(C.restore_params_only(str(tmp_path / "checkpoints"), params)[1]["w"], np.ones(3))


def test_a_grpo_lora_run_exports_the_average_of_its_adapters(tmp_path, monkeypatch):
    """GRPO's update (and its memory plan) with the average; with LoRA it is the adapters':
    the PEFT folder holds the average's matrices, and the merged export is what
    launch.convert merges from the average, not from the last adapters."""
    from configs import grpo_demo
    from guilibra_jax import rewards
    from guilibra_jax.param_paths import param_paths
    from guilibra_jax.train import checkpoint as C
    from guilibra_jax.train.run import train
    from guilibra_jax.train.model_factory import export_checkpoint as convert
    monkeypatch.setattr(rewards, "guilibra_reward", chance_reward)
    c = grpo_demo.get_config("smoke")
    c.optim.ema_decay, c.optim.lr, c.optim.warmup_steps = DECAY, 1e-2, 0
    c.model.lora.rank, c.model.lora.alpha = 4, 8.0
    c.train.steps, c.train.memory_plan = 2, True
    c.train.tensorboard = c.train.curves = False
    workdir = str(tmp_path / "grpo_lora")
    train(c, workdir)
    ckpts = os.path.join(workdir, "checkpoints")
    ckpt = C.Checkpointer(ckpts)
    abstract = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype),
                            dict(ckpt._manager.item_metadata(2)["state"]["params"]))
    ckpt.close()
    flat = lambda t: dict(zip(jax.tree.leaves(param_paths(t)), map(np.asarray, jax.tree.leaves(t))))
    live = flat(C.restore_params_only(ckpts, abstract, 2)[1])
    ema = flat(C.restore_params_only(ckpts, abstract, 2, key=("opt_state", "ema"))[1])
    assert any(np.abs(live[k] - ema[k]).max() > 1e-6 for k in ema)
    peft = load_file(os.path.join(workdir, "adapter", "adapter_model.safetensors"))
    b_ema = [v for k, v in ema.items() if k.endswith("lora_b")]
    b_out = [v for k, v in peft.items() if "lora_B" in k]
    assert len(b_out) == len(b_ema) and max(np.abs(a).max() for a in b_ema) > 0
    for got, want in zip(sorted(np.sort(v.ravel()).tobytes() for v in b_out),
                         sorted(np.sort(v.ravel()).tobytes() for v in b_ema)):
        assert got == want          # the PEFT folder's B matrices are the average's (as multisets: layouts differ)
    export = _weights(os.path.join(workdir, "export"))
    merged_ema = _weights(convert(workdir, str(tmp_path / "e")))
    merged_live = _weights(convert(workdir, str(tmp_path / "p"), None, "params"))
    for k in export:
        np.testing.assert_array_equal(export[k], merged_ema[k], err_msg=k)
    assert max(float(np.abs(export[k] - merged_live[k]).max()) for k in export) > 1e-6


def test_an_evaluated_or_scored_workdir_is_its_average(run_dir):
    """The checkpoint agent (launch.eval) and a frozen model read from the workdir (a GRPO
    reference, a teacher, a merge input) hold what the export holds; ``at_step`` another
    checkpoint's average."""
    import guilibra_jax.eval.model_agent  # noqa: F401  (registers "checkpoint")
    from guilibra_jax.eval.agents import make_agent
    from guilibra_jax.param_paths import param_paths
    from guilibra_jax.train import model_factory as MF
    flat = lambda t: dict(zip(jax.tree.leaves(param_paths(t)), map(np.asarray, jax.tree.leaves(t))))
    export = flat(MF.load_frozen(os.path.join(run_dir, "export"), dtype="float32", param_dtype="float32")[1])
    frozen = flat(MF.load_frozen(run_dir, dtype="float32", param_dtype="float32")[1])
    agent = make_agent("checkpoint", workdir=run_dir)
    at_3 = flat(agent.at_step(3).params)
    got = flat(agent.params)
    for k in export:
        np.testing.assert_array_equal(got[k], export[k], err_msg=k)
        np.testing.assert_array_equal(frozen[k], export[k], err_msg=k)
    assert any(np.abs(at_3[k] - export[k]).max() > 1e-6 for k in export)
