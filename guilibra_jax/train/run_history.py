"""A run's config history: ``config.json`` is written once, by the run that creates the
workdir, and never overwritten; a rerun (a resume) whose config differs from it refuses
to start and names the differing keys, unless ``train.allow_config_change`` is set, in
which case each accepted change is appended to ``config_history.jsonl``:

    {"time": "2025-01-01T12:00:00", "changes": {"train.steps": [100, 200]}}

``launch.convert`` and ``launch.eval`` read ``config.json``: the config the run was
created with, which the model side of a run cannot change anyway (a checkpoint restores
only into the shapes it was saved with).
"""

from __future__ import annotations

import datetime
import json
import logging
import os
from typing import Any

from guilibra_jax.errors import ConfigError
from guilibra_jax.train.checkpoint import write_json
from guilibra_jax.train.config import base_config

log = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
HISTORY_FILE = "config_history.jsonl"
# Keys that may differ between the processes / jobs of one run and are never a change of
# the experiment: where the job runs (coordinator, process ids), how it reports, and the
# override switch itself.
IGNORED_PREFIXES = ("distributed.", "train.allow_config_change", "train.progress")
# Keys whose switching on or off changes what a checkpoint holds: refused on a rerun even
# with train.allow_config_change (the checkpoints could not restore).
STRUCTURAL = {"optim.ema_decay": "the parameters' moving average (in the optimizer state)"}


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; values normalised as JSON would store them."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = json.loads(json.dumps(v, default=str))
    return out


def config_changes(old: dict[str, Any], new: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Full key -> (old value, new value) for every key of two flattened configs that
    differs. A key the old config lacks (added to the code since) counts as unchanged
    when it holds today's default."""
    defaults = flatten(base_config().to_dict())
    missing = object()
    changes = {}
    for key in sorted(set(old) | set(new)):
        if key.startswith(IGNORED_PREFIXES):
            continue
        a, b = old.get(key, defaults.get(key, missing)), new.get(key, missing)
        if a != b:
            changes[key] = (None if a is missing else a, None if b is missing else b)
    return changes


def effective_config(workdir: str) -> dict[str, Any]:
    """The flattened config a run holds now: ``config.json`` with every accepted change
    of ``config_history.jsonl`` applied in order."""
    with open(os.path.join(workdir, CONFIG_FILE)) as f:
        flat = flatten(json.load(f))
    history = os.path.join(workdir, HISTORY_FILE)
    if os.path.exists(history):
        with open(history) as f:
            for line in f:
                if line.strip():
                    for key, (_, new) in json.loads(line)["changes"].items():
                        flat[key] = new
    return flat


def record_config(config, workdir: str, *, is_main: bool = True) -> None:
    """Write ``workdir/config.json`` on a run's first start; on a rerun, compare the
    config with the run's (``effective_config``): identical -> nothing; different ->
    :class:`ConfigError` naming each differing key with its old and new value, unless
    ``train.allow_config_change``, which appends the change to ``config_history.jsonl``
    (``config.json`` keeps the original). Every process checks; only ``is_main`` writes."""
    path = os.path.join(workdir, CONFIG_FILE)
    current = config.to_dict()
    if not os.path.exists(path):
        if is_main:
            write_json(path, current)
        return
    changes = config_changes(effective_config(workdir), flatten(current))
    if not changes:
        return
    listing = ", ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in ((k, *v) for k, v in changes.items()))
    for key, what in STRUCTURAL.items():
        if key in changes and bool(changes[key][0]) != bool(changes[key][1]):
            raise ConfigError(f"config key {key} cannot be switched {'on' if changes[key][1] else 'off'} in "
                              f"workdir {workdir}: its checkpoints {'lack' if changes[key][1] else 'hold'} {what}. "
                              f"Rerun with {key}={changes[key][0]!r} or use a new --workdir")
    if not config.train.allow_config_change:
        raise ConfigError(f"workdir {workdir} holds a run started with a different config ({path}); changed: "
                          f"{listing}. Rerun with the run's config, use a new --workdir, or pass "
                          f"--config.train.allow_config_change=True to accept the change (recorded in "
                          f"{HISTORY_FILE})")
    log.warning("config changed since the run started (%s), accepted by train.allow_config_change: %s", path, listing)
    if is_main:
        entry = {"time": datetime.datetime.now().isoformat(timespec="seconds"),
                 "changes": {k: list(v) for k, v in changes.items()}}
        with open(os.path.join(workdir, HISTORY_FILE), "a") as f:
            f.write(json.dumps(entry, default=str) + "\n")
