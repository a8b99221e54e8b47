"""checkpoint.restore_params_only reads the parameters of a train checkpoint and never
the optimizer state: orbax's array reader is asked for the parameter arrays only, and
what comes back equals what was saved."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

from guilibra_jax.train import checkpoint as C


@pytest.fixture
def saved(tmp_path):
    params = {"embed": jnp.arange(64 * 32, dtype=jnp.float32).reshape(64, 32), "head": {"b": jnp.ones(7)}}
    tx = optax.adam(1e-3)
    opt_state = tx.init(params)
    opt_state = jax.tree.map(lambda x: x + 1 if x.dtype == jnp.float32 else x, opt_state)   # not equal to params
    state = {"step": jnp.int32(5), "params": params, "opt_state": opt_state, "skipped": jnp.int32(0)}
    ck = C.Checkpointer(str(tmp_path / "checkpoints"), async_save=False)
    ck.save(5, state, {"pos": 3}, force=True)
    ck.save(9, jax.tree.map(lambda x: x * 2, state), {"pos": 4}, force=True)
    ck.close()
    return str(tmp_path / "checkpoints"), params


def _reads(monkeypatch):
    """Names of the arrays orbax deserialises from here on."""
    seen = []
    for handler in (ocp.type_handlers.ArrayHandler, ocp.type_handlers.NumpyHandler):
        original = handler.deserialize

        async def spy(self, infos, args=None, _original=original):
            seen.extend(i.name for i in infos)
            return await _original(self, infos, args)
        monkeypatch.setattr(handler, "deserialize", spy)
    return seen


def test_only_parameter_arrays_are_read(saved, monkeypatch):
    directory, params = saved
    seen = _reads(monkeypatch)
    step, restored = C.restore_params_only(directory, params, step=5)
    assert step == 5
    assert sorted(seen) == ["params.embed", "params.head.b"]
    assert jax.tree.structure(restored) == jax.tree.structure(params)
    jax.tree.map(np.testing.assert_array_equal, restored, params)


def test_the_full_restore_reads_the_optimizer_state_too(saved, monkeypatch):
    """The contrast: restoring the whole state reads mu and nu (2x the parameters)."""
    directory, params = saved
    seen = _reads(monkeypatch)
    C.restore_params(directory, params, step=5)
    assert any(name.startswith("opt_state.") and name.endswith("mu.embed") for name in seen)


def test_latest_step_and_abstract_targets(saved):
    directory, params = saved
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
    step, restored = C.restore_params_only(directory, abstract)
    assert step == 9
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, 2 * b), restored, params)


def test_a_missing_step_names_the_complete_ones(saved):
    directory, params = saved
    with pytest.raises(FileNotFoundError, match=r"step 7 .*\[5, 9\]"):
        C.restore_params_only(directory, params, step=7)
