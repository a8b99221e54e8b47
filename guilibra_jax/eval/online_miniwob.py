"""Online evaluation on MiniWoB++: an agent plays held-out seeds of each task in one
headless Chromium.

    evaluate_miniwob(agent, tasks=TASKS, episodes=10, seed=0, split_fraction=0.2, scale=1.0,
                     max_steps=0, coord_space="norm1000", resized_size=None, out_dir=None)

Episode seeds are the first ``episodes`` held-out seeds of dataset ``seed``
(:func:`envs.export.heldout_task_seeds`), the seeds ``launch.record_demos`` with the same
``seed`` / ``split_fraction`` puts in its test split and never in train. Success is the
page's own verdict (raw reward > 0). Results: per task, the macro mean over tasks, and per
episode; with ``out_dir``, each episode's screenshots and responses under
``out_dir/<task>-<seed>/`` (as :mod:`eval.online`).
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Sequence

from guilibra_jax.envs.export import heldout_task_seeds
from guilibra_jax.eval.online import save_episode

ResizedSize = Sequence[int] | Callable[[tuple[int, int]], Sequence[int]] | None


def play(agent, env, *, seed: int, coord_space: str = "norm1000", resized_size: ResizedSize = None,
         save_dir: str | None = None) -> dict[str, Any]:
    """One episode of ``agent`` in ``env`` (a reused :class:`MiniWobEnv`) from ``seed``."""
    obs = env.reset(seed=seed)
    rs = resized_size(env.screen_size) if callable(resized_size) else resized_size
    if hasattr(agent, "reset"):
        agent.reset(env)
    steps, shots, done = [], [obs.screenshot], False
    while not done:
        response = agent(obs)
        obs, done, info = env.step(response, coord_space=coord_space, resized_size=rs)
        shots.append(obs.screenshot)
        steps.append({"response": response, "history_line": obs.history[-1], "error": info["error"],
                      "changed": info["changed"], "events": info["events"]})
    result = {"task_id": env.task_id, "task": env.task, "seed": seed, "instruction": env.instruction,
              "success": env.success(), "steps": len(steps), "raw_reward": env._meta.get("raw_reward"),
              "invalid_steps": sum(s["error"] is not None for s in steps)}
    if save_dir is not None:
        save_episode(os.path.join(save_dir, env.task_id), shots, result, steps)
    return result


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    tasks = sorted({r["task"] for r in results}, key=[r["task"] for r in results].index)
    by_task = {}
    for t in tasks:
        rs = [r for r in results if r["task"] == t]
        by_task[t] = {"episodes": len(rs), "success_rate": sum(r["success"] for r in rs) / len(rs),
                      "mean_steps": sum(r["steps"] for r in rs) / len(rs),
                      "invalid_steps": sum(r["invalid_steps"] for r in rs)}
    rates = [v["success_rate"] for v in by_task.values()]
    return {"episodes": len(results), "macro_success": sum(rates) / len(rates) if rates else None,
            "micro_success": sum(r["success"] for r in results) / len(results) if results else None,
            "steps": sum(r["steps"] for r in results),
            "invalid_steps": sum(r["invalid_steps"] for r in results), "by_task": by_task}


def evaluate_miniwob(agent, tasks: Sequence[str] | None = None, episodes: int = 10, *, seed: int = 0,
                     split_fraction: float = 0.2, scale: float = 1.0, max_steps: int = 0,
                     coord_space: str = "norm1000", resized_size: ResizedSize = None,
                     out_dir: str | None = None, browser=None) -> dict[str, Any]:
    from guilibra_jax.envs.miniwob import TASKS, Browser, MiniWobEnv
    t0 = time.perf_counter()
    tasks = tuple(tasks or TASKS)
    seeds = heldout_task_seeds(episodes, seed, split_fraction)
    own = browser is None
    browser = browser or Browser(scale=scale)
    results = []
    try:
        for task in tasks:
            env = MiniWobEnv(task, browser=browser, max_steps=max_steps or None)
            for s in seeds:
                results.append(play(agent, env, seed=s, coord_space=coord_space, resized_size=resized_size,
                                    save_dir=out_dir))
    finally:
        if own:
            browser.close()
    return {"overall": summarize(results), "seeds": seeds, "episodes": results,
            "seconds": round(time.perf_counter() - t0, 3)}
