"""Orbax checkpoints of the train state together with the data iterator state.

Saves are asynchronous and keep the last N. Orbax writes each step to a temporary
folder and renames it when complete, so a checkpoint left half-written by a crash is
never listed by ``latest_step`` and never restored. A complete checkpoint damaged later
(a truncated or deleted file) fails to restore: ``Checkpointer.restore_latest`` then
moves it aside with a warning and falls back to the previous one, and never starts
over silently when checkpoints exist but none restores.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from typing import Any

import jax
import orbax.checkpoint as ocp

from guilibra_jax.errors import UserError

log = logging.getLogger(__name__)

UNFINISHED_SUFFIX = ".orbax-checkpoint-tmp"  # orbax's temporary folder of a save in progress


class NoUsableCheckpoint(UserError):
    """Checkpoints exist under a run's directory but none of them restores."""


class Checkpointer:
    """``save(step, state, data_state)`` / ``restore(abstract_state)`` under ``directory``.

    ``data_state`` is any JSON-able object (the grain iterator's ``get_state()``); it
    is stored per step beside the arrays.
    """

    def __init__(self, directory: str, *, max_to_keep: int = 2, async_save: bool = True):
        self.directory = os.path.abspath(directory)
        options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, enable_async_checkpointing=async_save,
                                               create=True)
        self._manager = ocp.CheckpointManager(
            self.directory, options=options,
            item_handlers={"state": ocp.StandardCheckpointHandler(), "data": ocp.JsonCheckpointHandler()})

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def save(self, step: int, state: Any, data_state: Any = None, *, force: bool = False) -> bool:
        args = ocp.args.Composite(state=ocp.args.StandardSave(state),
                                  data=ocp.args.JsonSave({"iterator": data_state}))
        return self._manager.save(step, args=args, force=force)

    def restore(self, abstract_state: Any, step: int | None = None) -> tuple[int, Any, Any]:
        """(step, state, data_state) restored into the shardings of ``abstract_state``
        (a tree of ``jax.ShapeDtypeStruct`` with ``sharding`` set, or of arrays)."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no complete checkpoint under {self.directory}")
        target = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)), abstract_state)
        out = self._manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(target), data=ocp.args.JsonRestore()))
        logging.info("restored checkpoint step %d from %s", step, self.directory)
        return step, out["state"], (out["data"] or {}).get("iterator")

    def restore_latest(self, abstract_state: Any) -> tuple[int, Any, Any] | None:
        """(step, state, data_state) of the newest checkpoint that restores, or None when
        the directory holds no complete checkpoint.

        A checkpoint that fails to restore (a truncated or missing file) is skipped with
        a warning naming its folder and the error, and the next older one is tried; once
        one restores, the damaged newer ones are moved to ``<directory>.damaged/`` (so
        their steps can be saved again). Folders of saves that never finished are
        removed with a warning. Raises :class:`NoUsableCheckpoint` when checkpoints
        exist but none restores: a run never starts over from step 0 on top of them.
        """
        self._remove_unfinished()
        failed: list[tuple[int, str]] = []
        for step in sorted(self.all_steps(), reverse=True):
            try:
                restored = self.restore(abstract_state, step)
            except Exception as e:  # noqa: BLE001 - any failure to read marks the step damaged
                why = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
                log.warning("checkpoint %s is damaged and skipped (%s)", self.step_dir(step), why)
                failed.append((step, why))
                continue
            if failed:
                self._set_aside([s for s, _ in failed])
            return restored
        if failed:
            listing = "; ".join(f"{self.step_dir(s)}: {why}" for s, why in failed)
            raise NoUsableCheckpoint(
                f"none of the {len(failed)} checkpoints under {self.directory} restores ({listing}). Refusing to "
                f"start over from step 0 on top of them: move {self.directory} away to restart, or fix the files")
        return None

    def step_dir(self, step: int) -> str:
        return os.path.join(self.directory, str(step))

    def _remove_unfinished(self) -> None:
        if not os.path.isdir(self.directory) or jax.process_index() != 0:
            return
        for name in sorted(os.listdir(self.directory)):
            if UNFINISHED_SUFFIX in name:
                path = os.path.join(self.directory, name)
                log.warning("removing %s: a checkpoint save that never finished (the run stopped during it)", path)
                shutil.rmtree(path, ignore_errors=True)

    def _set_aside(self, steps: list[int]) -> None:
        """Move damaged step folders to ``<directory>.damaged/<step>[-k]`` and re-list."""
        if jax.process_index() == 0:
            aside = self.directory + ".damaged"
            os.makedirs(aside, exist_ok=True)
            for step in steps:
                dest, k = os.path.join(aside, str(step)), 1
                while os.path.exists(dest):
                    dest, k = os.path.join(aside, f"{step}-{k}"), k + 1
                shutil.move(self.step_dir(step), dest)
                log.warning("moved damaged checkpoint %s to %s", self.step_dir(step), dest)
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils
            multihost_utils.sync_global_devices("guilibra_checkpoint_set_aside")
        self._manager.reload()

    def wait(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()


def restore_params(directory: str, abstract_params: Any, step: int | None = None, shardings: Any = None
                   ) -> tuple[int, Any]:
    """Only the parameters of a train checkpoint (for export, evaluation and frozen models),
    into ``shardings`` (a tree like the params) when given."""
    manager = ocp.CheckpointManager(os.path.abspath(directory),
                                    item_handlers={"state": ocp.StandardCheckpointHandler()})
    step = manager.latest_step() if step is None else step
    if step is None:
        raise FileNotFoundError(f"no complete checkpoint under {directory}")
    meta = manager.item_metadata(step)
    tree = meta["state"] if isinstance(meta, dict) or hasattr(meta, "__getitem__") else meta.state
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), dict(tree))
    if shardings is None:
        target["params"] = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), abstract_params)
    else:
        target["params"] = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                                        abstract_params, shardings)
    out = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target)))
    manager.close()
    return step, out["state"]["params"]


def write_json(path: str, obj: Any) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True, default=str)
    os.replace(tmp, path)


def restore_params_only(directory: str, abstract_params: Any, step: int | None = None,
                        key: tuple[str, ...] = ("params",)) -> tuple[int, Any]:
    """(step, params) of a train checkpoint, reading the parameters and nothing else
    (orbax partial restore): the optimizer state (two more copies of the parameters
    for Adam) is never read or held. For export, evaluation, references and teachers.

    ``abstract_params``: the parameter tree (arrays or ``jax.ShapeDtypeStruct``, with
    ``sharding`` to restore sharded; host arrays otherwise), restored in its dtypes.
    ``key``: where the tree sits in the state; ``("opt_state", "ema")`` reads the
    parameter average of ``optim.ema_decay`` instead."""
    directory = os.path.abspath(directory)
    manager = ocp.CheckpointManager(directory, item_handlers={"state": ocp.PyTreeCheckpointHandler()})
    try:
        step = manager.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no complete checkpoint under {directory}")
        if step not in manager.all_steps():
            raise FileNotFoundError(f"no complete checkpoint step {step} under {directory} "
                                    f"(complete steps: {sorted(manager.all_steps())})")
        target = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)), abstract_params)
        for name in reversed(key):
            target = {name: target}
        if key != ("params",):
            _check_saved(manager, step, key, directory)
        restore_args = ocp.checkpoint_utils.construct_restore_args(target)
        out = manager.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
            item=target, restore_args=restore_args, partial_restore=True)))
    finally:
        manager.close()
    out = out["state"]
    for name in key:
        out = out[name]
    return step, out


def _check_saved(manager, step: int, key: tuple[str, ...], directory: str) -> None:
    """FileNotFoundError naming ``key`` when checkpoint ``step`` does not hold it."""
    tree = manager.item_metadata(step)["state"]
    tree = getattr(tree, "tree", tree)
    for name in key:
        if not hasattr(tree, "get") or tree.get(name) is None:
            raise FileNotFoundError(f"checkpoint step {step} under {directory} holds no {'/'.join(key)}")
        tree = tree[name]
