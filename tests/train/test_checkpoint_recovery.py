"""A damaged newest checkpoint (a truncated or deleted file, a step folder missing an
item, a save that never finished) is skipped with a warning naming it, and the run
resumes from the previous complete step, with that step's arrays and data-iterator
state; when none restores, the error says so and nothing starts over from step 0."""
import glob
import logging
import os
import types

import jax.numpy as jnp
import numpy as np
import pytest

from guilibra_jax.train import checkpoint as C
from guilibra_jax.train.run import open_checkpoints


def _state(step: int) -> dict:
    return {"step": jnp.asarray(step, jnp.int32), "params": {"w": jnp.arange(20000, dtype=jnp.float32) + step,
                                                            "b": jnp.full((7, 3), step, jnp.float32)}}


def _saved(tmp_path, steps=(1, 2, 3)) -> str:
    d = str(tmp_path / "checkpoints")
    ckpt = C.Checkpointer(d, max_to_keep=5, async_save=False)
    for s in steps:
        ckpt.save(s, _state(s), {"pos": s}, force=True)
    ckpt.close()
    return d


def _largest_file(folder: str) -> str:
    files = [f for f in glob.glob(os.path.join(folder, "**"), recursive=True) if os.path.isfile(f)]
    return max(files, key=os.path.getsize)


def _truncate(path: str) -> None:
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


DAMAGES = {
    "truncated array file": lambda d: _truncate(_largest_file(os.path.join(d, "3", "state"))),
    "deleted array manifest": lambda d: os.remove(os.path.join(d, "3", "state", "manifest.ocdbt")),
    "deleted data-iterator state": lambda d: os.remove(os.path.join(d, "3", "data", "metadata")),
    "step folder without its data item": lambda d: __import__("shutil").rmtree(os.path.join(d, "3", "data")),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_damaged_latest_is_skipped_with_a_warning_and_the_previous_step_restores(tmp_path, caplog, damage):
    d = _saved(tmp_path)
    DAMAGES[damage](d)
    ckpt = C.Checkpointer(d, max_to_keep=5, async_save=False)
    with caplog.at_level(logging.WARNING):
        step, state, data_state = ckpt.restore_latest(_state(0))
    assert step == 2 and data_state == {"pos": 2}
    np.testing.assert_array_equal(state["params"]["w"], np.arange(20000, dtype=np.float32) + 2)
    assert int(state["step"]) == 2
    warned = " ".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
    assert f"{os.path.join(d, '3')} is damaged" in warned
    # Moved aside (kept, not deleted), so that step 3 can be saved again by the resumed run.
    assert os.path.isdir(os.path.join(d + ".damaged", "3")) and not os.path.exists(os.path.join(d, "3"))
    ckpt.save(3, _state(3), {"pos": 3}, force=True)
    ckpt.wait()
    assert ckpt.restore_latest(_state(0))[0] == 3
    ckpt.close()


def test_an_unfinished_save_is_removed_with_a_warning_and_never_restored(tmp_path, caplog):
    d = _saved(tmp_path)
    unfinished = os.path.join(d, "4.orbax-checkpoint-tmp-1234567")
    os.rename(os.path.join(d, "3"), unfinished)   # what a kill during the save of step 4 leaves
    ckpt = C.Checkpointer(d, max_to_keep=5, async_save=False)
    with caplog.at_level(logging.WARNING):
        step, _, data_state = ckpt.restore_latest(_state(0))
    assert (step, data_state) == (2, {"pos": 2})
    assert not os.path.exists(unfinished)
    assert any(unfinished in r.getMessage() and "never finished" in r.getMessage() for r in caplog.records)
    ckpt.close()


def test_no_usable_checkpoint_is_a_clear_error_never_a_fresh_start(tmp_path):
    d = _saved(tmp_path, steps=(1, 2))
    for s in (1, 2):
        _truncate(_largest_file(os.path.join(d, str(s), "state")))
    ckpt = C.Checkpointer(d, max_to_keep=5, async_save=False)
    with pytest.raises(C.NoUsableCheckpoint) as e:
        ckpt.restore_latest(_state(0))
    msg = str(e.value)
    assert os.path.join(d, "1") in msg and os.path.join(d, "2") in msg and "step 0" in msg and "\n" not in msg
    assert sorted(os.listdir(d)) == ["1", "2"]  # nothing moved or deleted
    ckpt.close()


class _Data:
    def __init__(self):
        self.state = None

    def set_state(self, state):
        self.state = state


def test_open_checkpoints_logs_the_step_it_resumed_from(tmp_path, caplog):
    tc = types.SimpleNamespace(keep_checkpoints=5, async_checkpoints=False)
    workdir = str(tmp_path)
    data = _Data()
    with caplog.at_level(logging.INFO):
        ckpt, start, _ = open_checkpoints(workdir, tc, _state(0), data)
    ckpt.close()
    assert start == 0 and data.state is None and "starting from step 0" in caplog.text
    _saved(tmp_path)
    DAMAGES["truncated array file"](os.path.join(workdir, "checkpoints"))
    caplog.clear()
    with caplog.at_level(logging.INFO):
        ckpt, start, state = open_checkpoints(workdir, tc, _state(0), data)
    ckpt.close()
    assert start == 2 and data.state == {"pos": 2} and int(state["step"]) == 2
    assert "resumed from step 2" in caplog.text and "is damaged" in caplog.text
