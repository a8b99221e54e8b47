"""Online evaluation: an agent plays K held-out tasks per platform in the world.

    evaluate_online(agent, platforms=("desktop", "mobile"), episodes=20, max_steps=15,
                    seed=0, split_fraction=0.2, out_dir=None)

Tasks are the first ``episodes`` held-out task seeds of dataset ``seed``
(:func:`envs.export.heldout_task_seeds`), so they never appear in a train split exported
with the same ``seed`` and ``split_fraction``. An episode ends when the agent answers or
terminates, or after ``max_steps``; it succeeds when the world's goal holds at the end.
With ``out_dir``, each episode is saved under ``out_dir/<task_id>/``: one PNG per step
(``step_00.png`` is the start) and ``trajectory.json`` (instruction, responses, events,
errors, success).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Sequence

from guilibra_jax.envs.env import make_env
from guilibra_jax.envs.export import heldout_task_seeds
from guilibra_jax.eval.offline import resized_size_of

ResizedSize = Sequence[int] | Callable[..., Sequence[int]] | None


def run_episode(agent, platform: str, seed: int, *, max_steps: int = 15,
                screen_size: Sequence[int] | None = None, coord_space: str = "norm1000",
                resized_size: ResizedSize = None, save_dir: str | None = None) -> dict[str, Any]:
    """One episode; ``coord_space`` is the space of GUI-Libra responses' point_2d
    (``resized_size``: (w, h) or a function (screen size, platform), for "resized_pixels")."""
    env = make_env(platform, seed, screen_size, max_steps=max_steps)
    rs = resized_size_of(resized_size, tuple(env.screen_size), platform)
    obs = env.reset()
    if hasattr(agent, "reset"):
        agent.reset(env)
    steps: list[dict[str, Any]] = []
    shots = [obs.screenshot]
    done = False
    while not done:
        response = agent(obs)
        obs, done, info = env.step(response, coord_space=coord_space, resized_size=rs)
        shots.append(obs.screenshot)
        steps.append({"response": response, "history_line": obs.history[-1], "error": info["error"],
                      "changed": info["changed"], "events": info["events"],
                      "format": info["format"]})
    formats = [s["format"] for s in steps]
    fmt = max(set(formats), key=formats.count) if formats else "guilibra"
    result = {"task_id": env.task_id, "platform": platform, "seed": seed, "kind": env.task.kind,
              "instruction": env.instruction, "success": env.success(), "steps": len(steps),
              "format": fmt, "needs_convention": env.needs_convention(fmt)}
    if save_dir is not None:
        save_episode(os.path.join(save_dir, env.task_id), shots, result, steps)
    return result


def save_episode(folder: str, shots, result: dict[str, Any], steps: list[dict[str, Any]]) -> None:
    """``folder/step_KK.png`` per screenshot (00 is the start) and ``trajectory.json``."""
    os.makedirs(folder, exist_ok=True)
    for k, img in enumerate(shots):
        img.save(os.path.join(folder, f"step_{k:02d}.png"))
    with open(os.path.join(folder, "trajectory.json"), "w", encoding="utf-8") as f:
        json.dump({**result, "trajectory": steps}, f, indent=1)


def _rate(results: list[dict[str, Any]]) -> float | None:
    return sum(r["success"] for r in results) / len(results) if results else None


def evaluate_online(agent, platforms: Sequence[str] = ("desktop", "mobile"), episodes: int = 20, *,
                    max_steps: int = 15, seed: int = 0, split_fraction: float = 0.2,
                    screen_size: Sequence[int] | dict | None = None, coord_space: str = "norm1000",
                    resized_size: ResizedSize = None, out_dir: str | None = None) -> dict[str, Any]:
    """Task success rate per platform (and per task kind, and on the tasks that do /
    do not need the platform's own conventions)."""
    t0 = time.perf_counter()
    seeds = heldout_task_seeds(episodes, seed, split_fraction)
    results = []
    for platform in platforms:
        size = screen_size.get(platform) if isinstance(screen_size, dict) else screen_size
        for s in seeds:
            results.append(run_episode(agent, platform, s, max_steps=max_steps, screen_size=size,
                                       coord_space=coord_space, resized_size=resized_size,
                                       save_dir=out_dir))
    by_platform = {}
    for p in platforms:
        rs = [r for r in results if r["platform"] == p]
        by_platform[p] = {
            "episodes": len(rs), "success_rate": _rate(rs),
            "mean_steps": sum(r["steps"] for r in rs) / len(rs) if rs else None,
            "success_needs_convention": _rate([r for r in rs if r["needs_convention"]]),
            "success_no_convention": _rate([r for r in rs if not r["needs_convention"]]),
            "by_kind": {k: _rate([r for r in rs if r["kind"] == k])
                        for k in sorted({r["kind"] for r in rs})},
        }
    return {"overall": {"episodes": len(results), "success_rate": _rate(results)},
            "by_platform": by_platform, "episodes": results,
            "seconds": round(time.perf_counter() - t0, 3)}
