"""Dataset export: the expert's demonstrations as native JSONL step records.

    export_dataset(out_dir, platforms=("desktop", "mobile"), n_tasks=100, seed=0,
                   split_fraction=0.2, screen_size=None)

writes ``out_dir/train.jsonl`` and ``out_dir/test.jsonl`` (one
:class:`data.native.StepRecord` per line) with PNG screenshots under ``out_dir/images/``
referenced by relative paths, plus ``out_dir/manifest.json``. ``n_tasks`` is per
platform, and every platform gets the same task seeds (same content and goal, per-platform
actions). The split is by task seed: a task's steps all land in one split, on every
platform, independent of ``n_tasks`` (:func:`task_split`). Targets carry point and bbox
in unit space, the alternatives, and the UI-MOPD tool call in the tool's own space.
GUI-Libra SFT JSON and RL parquet copies are written per split through
:mod:`guilibra_jax.data.writers` (``extra_formats``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import zlib
from typing import Any, Iterator, Mapping, Sequence

from guilibra_jax.data import native as N
from guilibra_jax.envs.env import GuiEnv, make_env
from guilibra_jax.envs.expert import Demo, ExpertStep

SPLIT_RESOLUTION = 10_000


def task_seed(seed: int, i: int) -> int:
    """The i-th task seed of dataset ``seed``."""
    return int(seed) * 1_000_003 + int(i)


def task_split(seed: int, split_fraction: float) -> str:
    """"test" for a ``split_fraction`` share of task seeds (a stable hash), else "train"."""
    if not 0.0 <= split_fraction <= 1.0:
        raise ValueError(f"split_fraction must be in [0, 1], got {split_fraction}")
    h = zlib.crc32(f"guilibra-world-split-{seed}".encode()) % SPLIT_RESOLUTION
    return "test" if h < split_fraction * SPLIT_RESOLUTION else "train"


def heldout_task_seeds(n: int, seed: int = 0, split_fraction: float = 0.2) -> list[int]:
    """The first ``n`` task seeds of dataset ``seed`` that fall in the test split (for
    online evaluation on tasks never exported to train)."""
    if split_fraction <= 0:
        raise ValueError("heldout_task_seeds needs split_fraction > 0")
    out, i = [], 0
    while len(out) < n:
        s = task_seed(seed, i)
        if task_split(s, split_fraction) == "test":
            out.append(s)
        i += 1
    return out


def _size_for(platform: str, screen_size: Any) -> tuple[int, int] | None:
    if screen_size is None:
        return None
    if isinstance(screen_size, Mapping):
        v = screen_size.get(platform)
        return None if v is None else (int(v[0]), int(v[1]))
    return int(screen_size[0]), int(screen_size[1])


def demo_target(demo: Demo) -> N.StepTarget:
    a = demo.action
    return N.StepTarget(action_type=a.action_type, action_description=a.action_description,
                        value=a.value, point=a.point_2d, bbox=demo.bbox, bbox2=demo.bbox2,
                        action_target=a.action_target, tool_call=demo.tool_call)


def step_record(env: GuiEnv, step: ExpertStep, image: Any, split: str) -> N.StepRecord:
    """The native record of the expert's ``step`` in ``env``'s current state."""
    return N.StepRecord(
        trajectory_id=env.task_id, step=env.t, platform=env.platform, instruction=env.instruction,
        history=tuple(env.history), image=image, image_size=tuple(env.screen_size),
        target=demo_target(step.main), reasoning=step.reasoning,
        alternatives=tuple(demo_target(d) for d in step.alternatives),
        source=f"synthetic-{env.platform}", split=split)


def expert_episode(platform: str, seed: int, screen_size: Sequence[int] | None = None
                   ) -> Iterator[tuple[GuiEnv, ExpertStep, Any]]:
    """Yields (env before the step, expert step, screenshot) along the expert's episode."""
    env = make_env(platform, seed, screen_size)
    obs = env.reset()
    while not env.done:
        step = env.expert_step()
        yield env, step, obs.screenshot
        obs, _, _ = env.step(step.main.action, coord_space="unit")
    if not env.success():
        raise AssertionError(f"expert failed task {env.task_id}: {env.instruction}")


def export_dataset(out_dir: str, platforms: Sequence[str] = ("desktop", "mobile"),
                   n_tasks: int | Mapping[str, int] = 100,
                   seed: int = 0, split_fraction: float = 0.2,
                   screen_size: Sequence[int] | Mapping[str, Sequence[int]] | None = None,
                   extra_formats: Sequence[str] = ("guilibra_sft", "guilibra_rl")) -> dict[str, Any]:
    """Write the dataset; returns the manifest (counts, paths, seconds).

    n_tasks: tasks per platform, one count for all or {platform: count} (each platform's
    tasks are the first ``count`` task seeds, held out by the same rule for any count).

    screen_size: None (each platform's small default), one (width, height) for all
    platforms, or {platform: (width, height)}. extra_formats: also write GUI-Libra SFT
    JSON / RL parquet per split (``()`` for native JSONL only)."""
    if isinstance(platforms, str):
        platforms = (platforms,)
    if isinstance(n_tasks, Mapping) and set(platforms) - set(n_tasks):
        raise ValueError(f"n_tasks {dict(n_tasks)} names no count for {sorted(set(platforms) - set(n_tasks))}")
    t0 = time.perf_counter()
    img_dir = os.path.join(out_dir, "images")
    os.makedirs(img_dir, exist_ok=True)
    paths = {s: os.path.join(out_dir, f"{s}.jsonl") for s in N.SPLITS}
    counts = {s: 0 for s in N.SPLITS}
    kept: dict[str, list[N.StepRecord]] = {s: [] for s in N.SPLITS}
    tasks = {s: 0 for s in N.SPLITS}
    kinds: dict[str, int] = {}
    files = {s: open(p, "w", encoding="utf-8") for s, p in paths.items()}
    try:
        for platform in platforms:
            for i in range(n_tasks[platform] if isinstance(n_tasks, Mapping) else n_tasks):
                ts = task_seed(seed, i)
                split = task_split(ts, split_fraction)
                tasks[split] += 1
                for env, step, shot in expert_episode(platform, ts, _size_for(platform, screen_size)):
                    rel = f"images/{env.task_id}-{env.t:02d}.png"
                    shot.save(os.path.join(out_dir, rel), format="PNG")
                    rec = step_record(env, step, rel, split)
                    files[split].write(rec.to_json() + "\n")
                    if extra_formats:
                        kept[split].append(rec)
                    counts[split] += 1
                    kinds[env.task.kind] = kinds.get(env.task.kind, 0) + 1
    finally:
        for f in files.values():
            f.close()
    manifest = {"platforms": list(platforms),
                "n_tasks_per_platform": dict(n_tasks) if isinstance(n_tasks, Mapping) else n_tasks, "seed": seed,
                "split_fraction": split_fraction,
                "screen_size": screen_size if not isinstance(screen_size, Mapping) else dict(screen_size),
                "records": counts, "tasks": tasks, "steps_by_task_kind": kinds,
                "files": {s: os.path.basename(p) for s, p in paths.items()},
                "seconds_native": round(time.perf_counter() - t0, 3)}
    manifest["extra_formats"] = _write_extra_formats(out_dir, kept, extra_formats)
    manifest["seconds"] = round(time.perf_counter() - t0, 3)
    with open(os.path.join(out_dir, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, default=list)
    return manifest


def _write_extra_formats(out_dir: str, records: dict[str, list[N.StepRecord]],
                         formats: Sequence[str]) -> dict[str, Any]:
    """GUI-Libra SFT JSON (``<split>_sft.json`` + ``<split>_sft_noreason.json``) and RL
    parquet (``<split>_rl.parquet``) through :mod:`guilibra_jax.data.writers`."""
    if not formats:
        return {}
    try:
        from guilibra_jax.data import writers as W
    except ImportError as e:      # the data module is optional for the world
        return {"skipped": f"guilibra_jax.data.writers is not importable ({e})"}
    done: dict[str, Any] = {}
    for split, recs in records.items():
        if not recs:
            continue
        if "guilibra_sft" in formats:        # image paths stay relative to out_dir
            name = f"{split}_sft.json"
            done[name] = W.native_to_guilibra_sft(recs, os.path.join(out_dir, name), noreason_twin=True)
        if "guilibra_rl" in formats:         # PNG bytes embedded; read from absolute paths
            absolute = [dataclasses.replace(r, image=os.path.join(os.path.abspath(out_dir), r.image))
                        for r in recs]
            name = f"{split}_rl.parquet"
            done[name] = W.native_to_guilibra_rl(absolute, os.path.join(out_dir, name))
    return done


def load_records(path: str) -> list[N.StepRecord]:
    """Read a native JSONL file (validated by :func:`data.native.record_from_dict`)."""
    out = []
    with open(path, encoding="utf-8") as f:
        for k, line in enumerate(f):
            if line.strip():
                out.append(N.record_from_dict(json.loads(line), f"{path}:{k + 1}"))
    return out
