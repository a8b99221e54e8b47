"""Expert demonstrations on MiniWoB++ as training data.

    record_demos(out_dir, tasks=TASKS, episodes=20, seed=0, split_fraction=0.2, scale=1.0)

writes, like the synthetic world's :func:`envs.export.export_dataset`:
``out_dir/{train,test}.jsonl`` (native :class:`data.native.StepRecord` lines, platform
"web", target point and the target element's bounding box in unit space, alternatives,
reasoning), PNG screenshots under ``out_dir/images/``, GUI-Libra SFT JSON per split
(``<split>_sft.json`` and its ``_noreason`` twin) and ``manifest.json`` with counts and
the expert's success rate per task. Episode seeds are :func:`envs.export.task_seed`
``(seed, i)`` and their split :func:`envs.export.task_split` (a stable hash), so the
held-out seeds of :func:`envs.export.heldout_task_seeds` never reach a train split.
Only episodes the expert solved are written; the others are counted per task.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Sequence

from guilibra_jax.data import native as N
from guilibra_jax.envs.export import demo_target, task_seed, task_split
from guilibra_jax.envs.miniwob.browser import Browser
from guilibra_jax.envs.miniwob.env import MiniWobEnv
from guilibra_jax.envs.miniwob.experts import TASKS, ExpertError


def expert_episode(env: MiniWobEnv, seed: int) -> tuple[list[tuple[Any, Any, Any]], bool, str | None]:
    """Play the expert on (env.task, seed): ([(observation, expert step, history)], success, error)."""
    obs = env.reset(seed=seed)
    steps = []
    try:
        while not env.done:
            step = env.expert_step()
            steps.append((obs, step, tuple(env.history)))
            obs, _, info = env.step(step.main.action, coord_space="unit")
            if info["error"]:
                return steps, False, info["error"]
    except ExpertError as e:
        return steps, False, str(e)
    return steps, env.success(), None if env.success() else f"page reward {env._meta.get('raw_reward')}"


def step_record(env: MiniWobEnv, obs, step, image: Any, split: str) -> N.StepRecord:
    return N.StepRecord(
        trajectory_id=obs.task_id, step=obs.step, platform="web", instruction=obs.instruction,
        history=tuple(obs.history), image=image, image_size=tuple(obs.screen_size),
        target=demo_target(step.main), reasoning=step.reasoning,
        alternatives=tuple(demo_target(d) for d in step.alternatives), source=f"miniwob-{env.task}", split=split)


def record_demos(out_dir: str, tasks: Sequence[str] = TASKS, episodes: int = 20, seed: int = 0,
                 split_fraction: float = 0.2, scale: float = 1.0, sft_json: bool = True,
                 browser: Browser | None = None) -> dict[str, Any]:
    """Record ``episodes`` expert episodes per task; returns (and writes) the manifest."""
    t0 = time.perf_counter()
    os.makedirs(os.path.join(out_dir, "images"), exist_ok=True)
    own = browser is None
    browser = browser or Browser(scale=scale)
    kept: dict[str, list[N.StepRecord]] = {s: [] for s in N.SPLITS}
    per_task: dict[str, dict[str, Any]] = {}
    try:
        for task in tasks:
            env = MiniWobEnv(task, browser=browser)
            ok, errors = 0, []
            for i in range(episodes):
                s = task_seed(seed, i)
                split = task_split(s, split_fraction)
                steps, success, err = expert_episode(env, s)
                ok += success
                if not success:
                    errors.append(f"seed {s}: {err}")
                    continue
                for obs, step, _ in steps:
                    rel = f"images/{obs.task_id}-{obs.step:02d}.png"
                    obs.screenshot.save(os.path.join(out_dir, rel), format="PNG")
                    kept[split].append(step_record(env, obs, step, rel, split))
            per_task[task] = {"episodes": episodes, "expert_success": ok / episodes if episodes else None,
                              "errors": errors[:5]}
    finally:
        if own:
            browser.close()
    counts = {}
    for split, recs in kept.items():
        with open(os.path.join(out_dir, f"{split}.jsonl"), "w", encoding="utf-8") as f:
            for r in recs:
                f.write(r.to_json() + "\n")
        counts[split] = len(recs)
    extra = {}
    if sft_json:
        from guilibra_jax.data import writers as W
        for split, recs in kept.items():
            if recs:
                name = f"{split}_sft.json"
                extra[name] = W.native_to_guilibra_sft(recs, os.path.join(out_dir, name), noreason_twin=True)
    rates = [v["expert_success"] for v in per_task.values() if v["expert_success"] is not None]
    manifest = {"world": "miniwob", "tasks": list(tasks), "episodes_per_task": episodes, "seed": seed,
                "split_fraction": split_fraction, "scale": scale, "screen_size": list(browser.screen_size),
                "records": counts, "extra_formats": extra,
                "expert_success_macro": sum(rates) / len(rates) if rates else None,
                "per_task": per_task, "seconds": round(time.perf_counter() - t0, 2)}
    with open(os.path.join(out_dir, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
    return manifest
