"""Live episodes of the synthetic world for online RL (``rl.world = "synthetic"``): the same
interface as the MiniWoB++ browser pool (:class:`envs.miniwob.pool.EnvPool`), in process.

    pool = SyntheticPool(4, coord_space="resized_pixels", resized_size=fn)   # fn(size, platform)
    results = pool.reset([("desktop", 11), ("mobile", 12), None, None])      # (platform, task seed)
    results = pool.step(["<answer>...</answer>", None, ...])                 # None: leave that slot
    snap = pool.state(); pool.restore(snap)                                  # JSON-able; replays

A slot's "task" is its platform and its seed a task seed of the world
(:func:`envs.export.task_seed`); the label of a state is the world's expert action there
(:meth:`envs.env.GuiEnv.expert_step`, main demo and alternatives), so a state the policy
reached by a mistake is labelled with the expert's recovery from it. ``step_reward`` is the
GUI-Libra verifier reward of the executed response against the label of the state it
answered; ``success`` is the world's goal at the end of the episode.
"""

from __future__ import annotations

import dataclasses
import io
from typing import Any, Callable, Sequence

from guilibra_jax.envs.env import DEFAULT_MAX_STEPS, GuiEnv, make_env
from guilibra_jax.envs.export import demo_target
from guilibra_jax.envs.miniwob.pool import SlotResult


def _payload(obs) -> dict:
    buf = io.BytesIO()
    obs.screenshot.save(buf, format="PNG", compress_level=1)
    return {"png": buf.getvalue(), "instruction": obs.instruction, "history": tuple(obs.history),
            "platform": obs.platform, "elements": tuple(obs.elements), "screen_size": tuple(obs.screen_size),
            "step": obs.step, "task_id": obs.task_id}


def _label(env: GuiEnv):
    """(label dict, rewards.Target) of the expert's action in ``env``'s state; (None, None)
    where the expert has none: a mistake made the task impossible (e.g. the item to open was
    deleted), and the trainer restarts the slot (``online/abandoned``)."""
    from guilibra_jax import rewards as R
    try:
        step = env.expert_step()
    except (ValueError, KeyError, AssertionError):   # the expert's plan cannot find its target
        return None, None
    main = demo_target(step.main)
    alts = tuple(demo_target(d) for d in step.alternatives)

    def target(t):
        return R.Target(t.action_type, t.value, t.point, t.bbox, t.bbox2, tuple(env.screen_size))

    rt = dataclasses.replace(target(main), alternatives=tuple(target(a) for a in alts))
    return {**main.to_dict(), "alternatives": [a.to_dict() for a in alts], "reasoning": step.reasoning}, rt


class SyntheticPool:
    """``size`` live synthetic-world episodes; responses are GUI-Libra text with points in
    ``coord_space`` (``resized_size``: (w, h), or a function of (screen size, platform) for
    "resized_pixels", as the policy's collate reports them)."""

    def __init__(self, size: int, *, coord_space: str = "norm1000",
                 resized_size: Sequence[int] | Callable | None = None, max_steps: int = 0):
        if int(size) < 1:
            raise ValueError(f"SyntheticPool needs at least one slot, got {size}")
        self.coord_space, self.resized_size = coord_space, resized_size
        self.max_steps = int(max_steps) or DEFAULT_MAX_STEPS
        self._envs: list[GuiEnv | None] = [None] * int(size)
        self._targets: list[Any] = [None] * int(size)
        self._actions: list[list[str]] = [[] for _ in range(int(size))]

    @property
    def size(self) -> int:
        return len(self._envs)

    def _resized(self, env: GuiEnv):
        from guilibra_jax.eval.offline import resized_size_of
        return resized_size_of(self.resized_size, tuple(env.screen_size), env.platform)

    def _answer(self, i: int, obs, info: dict | None = None, reward: dict | None = None) -> SlotResult:
        env = self._envs[i]
        label = None
        self._targets[i] = None
        if not env.done:
            label, self._targets[i] = _label(env)
        info = info or {}
        return SlotResult(i, env.platform, env.seed, env.t, env.done, env.success(), float(env.success()),
                          info.get("error"), _payload(obs), label, reward, source=f"synthetic-{env.platform}")

    def _start(self, i: int, platform: str, seed: int) -> SlotResult:
        self._envs[i] = make_env(platform, int(seed), max_steps=self.max_steps)
        self._actions[i] = []
        return self._answer(i, self._envs[i].reset())

    def reset(self, jobs: Sequence[tuple[str, int] | None]) -> list[SlotResult | None]:
        """Start (platform, task seed) in slot i for each non-None ``jobs[i]``."""
        return [None if j is None else self._start(i, *j) for i, j in enumerate(jobs)]

    def _step(self, i: int, response: str) -> SlotResult:
        from guilibra_jax import rewards as R
        env = self._envs[i]
        if env is None:
            raise RuntimeError(f"synthetic pool slot {i} has no episode: reset it first")
        rs = self._resized(env)
        reward = None
        if self._targets[i] is not None:
            reward = dataclasses.asdict(R.guilibra_reward(response, self._targets[i], coord_space=self.coord_space,
                                                          resized_size=rs))
        obs, _, info = env.step(response, coord_space=self.coord_space, resized_size=rs)
        self._actions[i].append(response)
        return self._answer(i, obs, info, reward)

    def step(self, responses: Sequence[str | None]) -> list[SlotResult | None]:
        """Execute ``responses[i]`` in slot i (None: leave slot i as it is)."""
        return [None if r is None else self._step(i, r) for i, r in enumerate(responses)]

    def state(self) -> list[dict]:
        """Per slot: {task, seed, step, actions} (JSON-able; the responses executed so far)."""
        out = []
        for env, acts in zip(self._envs, self._actions):
            if env is None:
                raise RuntimeError("synthetic pool: state() before every slot was reset")
            out.append({"task": env.platform, "seed": env.seed, "step": env.t, "actions": list(acts)})
        return out

    def restore(self, states: Sequence[dict]) -> list[SlotResult]:
        """Each slot's episode replayed from its start through its recorded responses."""
        if len(states) != self.size:
            raise ValueError(f"synthetic pool of {self.size} slots cannot restore {len(states)} slot states")
        out = []
        for i, s in enumerate(states):
            res = self._start(i, s["task"], s["seed"])
            for a in s["actions"]:
                res = self._step(i, a)
            out.append(res)
        return out

    def close(self) -> None:
        self._envs = [None] * self.size
