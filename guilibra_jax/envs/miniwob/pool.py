"""A pool of MiniWoB++ browsers in worker processes, for online RL and fast evaluation.

    pool = EnvPool(workers=4, scale=1.0, coord_space="norm1000")   # 4 processes, 1 Chromium each
    results = pool.reset([("click-button", 11), ("enter-text", 12)])  # one (task, seed) per slot
    results = pool.step(["<answer>...</answer>", None])               # None: leave that slot alone
    for r in results: r.observation(), r.done, r.success, r.step_reward, r.label
    snap = pool.state(); ...; pool.restore(snap)                      # JSON-able; replays actions
    pool.close()

Each worker process (spawned, so a parent that already runs JAX is never forked) owns one
:class:`Browser` and one :class:`MiniWobEnv`. Commands go to every addressed worker before
any answer is read, so the browsers work in parallel. A step answers, for its slot:

* ``observation`` (screenshot as PNG bytes, instruction, history, elements, ...);
* ``label``: the scripted expert's action in the observation's state (a native
  :class:`data.native.StepTarget` dict with the target box and alternatives, plus its
  reasoning; ``None`` once done): what the policy's next response is verified against;
* ``step_reward`` (step only): the GUI-Libra verifier reward of the response against the
  label of the state it answered (:func:`rewards.guilibra_reward`: format, action type,
  value, point in box; ``None`` when the expert had no action there), the per-step
  verifiable reward;
* ``done``, ``success`` (the page's verdict: raw reward > 0), ``raw_reward``, ``error``.

Resumable: :meth:`state` is, per slot, (task, seed, step, executed actions in pixel
space) and :meth:`restore` replays it, so an RL run checkpoints the pool with its model
and resumes mid-episode on any machine. :class:`EpisodeSchedule` hands out (task, seed)
pairs in a fixed order with a resumable counter.
"""

from __future__ import annotations

import dataclasses
import io
import multiprocessing as mp
from typing import Any, Sequence

from guilibra_jax.envs.export import task_seed, task_split


@dataclasses.dataclass
class SlotResult:
    """What one slot answers after reset / step (picklable)."""

    slot: int
    task: str
    seed: int
    step: int
    done: bool
    success: bool
    raw_reward: float | None
    error: str | None
    obs: dict                       # Observation fields, screenshot as "png" bytes
    label: dict | None = None       # expert's action in this observation's state (None when done)
    step_reward: dict | None = None  # the response's GuiLibraReward vs the previous state's label
    source: str = ""                # the record's source ("" = miniwob-<task>)

    def observation(self):
        """The :class:`envs.env.Observation` (screenshot decoded on first access)."""
        from PIL import Image
        from guilibra_jax.envs.env import Observation
        o = dict(self.obs)
        png = o.pop("png")
        return Observation(render=lambda: Image.open(io.BytesIO(png)).convert("RGB"), **o)

    def record(self, split: str = "train"):
        """This state as a native :class:`data.native.StepRecord` whose target is the expert's
        label (alternatives included; screenshot inline): what the RL data pipeline
        (``data.pipeline.make_rl_loader``) turns into a prompt with its reward target."""
        from guilibra_jax.data import native as N
        if self.label is None:
            raise ValueError(f"slot {self.slot} ({self.task}-{self.seed}, step {self.step}) has no label: "
                             f"the episode is over or the expert has no action here")
        lab = {k: v for k, v in self.label.items() if k not in ("alternatives", "reasoning")}
        o = self.obs
        return N.StepRecord(
            trajectory_id=o["task_id"], step=o["step"], platform=o["platform"], instruction=o["instruction"],
            history=tuple(o["history"]), image={"bytes": o["png"]}, image_size=tuple(o["screen_size"]),
            target=N.target_from_dict(lab), reasoning=self.label.get("reasoning"),
            alternatives=tuple(N.target_from_dict(a) for a in self.label.get("alternatives", ())),
            source=self.source or f"miniwob-{self.task}", split=split)


def _obs_payload(obs) -> dict:
    buf = io.BytesIO()
    obs.screenshot.save(buf, format="PNG", compress_level=1)
    return {"png": buf.getvalue(), "instruction": obs.instruction, "history": tuple(obs.history),
            "platform": obs.platform, "elements": tuple(obs.elements), "screen_size": tuple(obs.screen_size),
            "step": obs.step, "task_id": obs.task_id}


def _label(env) -> tuple[dict | None, Any]:
    """(label dict, rewards.Target) of the expert's action now, or (None, None)."""
    from guilibra_jax import rewards as R
    from guilibra_jax.envs.export import demo_target
    from guilibra_jax.envs.miniwob.experts import ExpertError
    try:
        step = env.expert_step()
    except ExpertError:
        return None, None
    main = demo_target(step.main)
    alts = tuple(demo_target(d) for d in step.alternatives)

    def target(t):
        return R.Target(t.action_type, t.value, t.point, t.bbox, None, tuple(env.screen_size))
    rt = dataclasses.replace(target(main), alternatives=tuple(target(a) for a in alts))
    return {**main.to_dict(), "alternatives": [a.to_dict() for a in alts], "reasoning": step.reasoning}, rt


def _result(slot: int, env, obs, info: dict | None = None, label=None, reward=None) -> SlotResult:
    info = info or {}
    return SlotResult(slot, env.task, env.seed, env.t, env.done, env.success(), env._meta.get("raw_reward"),
                      info.get("error"), _obs_payload(obs), label, reward)


def _detach_from_signals() -> None:
    """The owner alone ends a worker (``close``, or the pipe closing when it dies): a worker
    and its Chromium leave the owner's process group, so Ctrl-C, ``timeout`` or a scheduler
    signalling the trainer's group reach the trainer only, which can still read the pool's
    state for its preemption checkpoint; SIGINT / SIGTERM sent to the worker itself are
    ignored for the same reason."""
    import os
    import signal
    os.setpgrp()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _worker(slot: int, conn, scale: float, max_steps: int | None, coord_space: str, resized_size) -> None:
    _detach_from_signals()
    from guilibra_jax import rewards as R
    from guilibra_jax.envs.miniwob.browser import Browser
    from guilibra_jax.envs.miniwob.env import MiniWobEnv
    browser = env = None
    target = None                        # rewards.Target of the expert's action in the current state

    def answer(obs, info=None, reward=None):
        nonlocal target
        label, target = _label(env) if not env.done else (None, None)
        return _result(slot, env, obs, info, label, reward)
    try:
        browser = Browser(scale=scale)
        env = MiniWobEnv("click-test", browser=browser, max_steps=max_steps)
        conn.send(("ready", None))
        while True:
            cmd, arg = conn.recv()
            try:
                if cmd == "close":
                    break
                if cmd == "reset":
                    task, seed = arg
                    env = MiniWobEnv(task, seed, browser=browser, max_steps=max_steps)
                    conn.send(("ok", answer(env.reset())))
                elif cmd == "step":
                    reward = None
                    if target is not None:
                        reward = dataclasses.asdict(R.guilibra_reward(arg, target, coord_space=coord_space,
                                                                      resized_size=resized_size))
                    obs, _, info = env.step(arg, coord_space=coord_space, resized_size=resized_size)
                    conn.send(("ok", answer(obs, info, reward)))
                elif cmd == "state":
                    conn.send(("ok", env.state()))
                elif cmd == "restore":
                    env = MiniWobEnv(arg["task"], arg["seed"], browser=browser, max_steps=max_steps)
                    conn.send(("ok", answer(env.restore(arg))))
                else:
                    conn.send(("error", f"unknown command {cmd!r}"))
            except Exception as e:  # report, keep serving
                conn.send(("error", f"{type(e).__name__}: {e}"))
    except Exception as e:
        conn.send(("error", f"worker {slot} failed to start: {type(e).__name__}: {e}"))
    finally:
        if browser is not None:
            browser.close()
        conn.close()


class EnvPool:
    def __init__(self, workers: int, *, scale: float = 1.0, max_steps: int | None = None,
                 coord_space: str = "norm1000", resized_size: Sequence[int] | None = None,
                 start_timeout_s: float = 120.0):
        from guilibra_jax.envs.miniwob.browser import MiniWobUnavailable, available
        reason = available()
        if reason:
            raise MiniWobUnavailable(reason)
        ctx = mp.get_context("spawn")
        self.coord_space = coord_space
        self._conns, self._procs = [], []
        rs = None if resized_size is None else tuple(resized_size)
        for i in range(int(workers)):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker, args=(i, child, scale, max_steps, coord_space, rs), daemon=True)
            p.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(p)
        for i, c in enumerate(self._conns):
            if not c.poll(start_timeout_s):
                self.close()
                raise RuntimeError(f"pool worker {i} did not start in {start_timeout_s} s")
            status, msg = c.recv()
            if status != "ready":
                self.close()
                raise MiniWobUnavailable(msg)

    @property
    def size(self) -> int:
        return len(self._conns)

    def _call(self, requests: dict[int, tuple[str, Any]]) -> dict[int, Any]:
        for slot, req in requests.items():
            self._conns[slot].send(req)
        out = {}
        for slot in requests:
            status, payload = self._conns[slot].recv()
            if status != "ok":
                raise RuntimeError(f"pool slot {slot}: {payload}")
            out[slot] = payload
        return out

    def reset(self, jobs: Sequence[tuple[str, int] | None]) -> list[SlotResult | None]:
        """Start (task, seed) in slot i for each non-None ``jobs[i]``."""
        reqs = {i: ("reset", tuple(j)) for i, j in enumerate(jobs) if j is not None}
        got = self._call(reqs)
        return [got.get(i) for i in range(len(jobs))]

    def step(self, responses: Sequence[str | None]) -> list[SlotResult | None]:
        """Execute ``responses[i]`` (GUI-Libra text, points in the pool's coord_space) in slot i."""
        reqs = {i: ("step", r) for i, r in enumerate(responses) if r is not None}
        got = self._call(reqs)
        return [got.get(i) for i in range(len(responses))]

    def state(self) -> list[dict]:
        """Per slot: {task, seed, step, actions} (JSON-able)."""
        got = self._call({i: ("state", None) for i in range(self.size)})
        return [got[i] for i in range(self.size)]

    def restore(self, states: Sequence[dict]) -> list[SlotResult]:
        got = self._call({i: ("restore", s) for i, s in enumerate(states)})
        return [got[i] for i in range(len(states))]

    def close(self) -> None:
        for c in self._conns:
            try:
                c.send(("close", None))
            except (OSError, BrokenPipeError):
                pass
        for p in self._procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()                  # workers ignore SIGTERM (see _detach_from_signals)
        self._conns, self._procs = [], []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class EpisodeSchedule:
    """(task, seed) pairs for training episodes in a fixed order: round r plays every task
    (in order) on the r-th seed of dataset ``seed`` that falls in ``split``
    (:func:`envs.export.task_seed` / :func:`envs.export.task_split`), so "train" never
    yields a held-out evaluation seed. ``state()`` / ``set_state()`` hold the counter."""

    def __init__(self, tasks: Sequence[str], seed: int = 0, split: str = "train", split_fraction: float = 0.2):
        if not tasks:
            raise ValueError("EpisodeSchedule needs at least one task")
        self.tasks, self.seed, self.split, self.split_fraction = tuple(tasks), int(seed), split, split_fraction
        self.i = 0
        self._seeds: list[int] = []
        self._raw = 0

    def round_seed(self, r: int) -> int:
        while len(self._seeds) <= r:
            s = task_seed(self.seed, self._raw)
            self._raw += 1
            if task_split(s, self.split_fraction) == self.split:
                self._seeds.append(s)
        return self._seeds[r]

    def __next__(self) -> tuple[str, int]:
        r, k = divmod(self.i, len(self.tasks))
        self.i += 1
        return self.tasks[k], self.round_seed(r)

    def __iter__(self):
        return self

    def state(self) -> dict:
        return {"i": self.i}

    def set_state(self, state: dict) -> None:
        self.i = int(state["i"])
