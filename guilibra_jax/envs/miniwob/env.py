"""A MiniWoB++ task in headless Chromium with the synthetic world's episode API.

    env = MiniWobEnv("click-button", seed=3, scale=2.0)   # starts Chromium (about 1-5 s)
    obs = env.reset()                  # or env.reset(seed=7): a new problem, same browser
    obs, done, info = env.step(response_or_action, coord_space="norm1000")
    env.success(); env.expert_step(); env.close()

The same :class:`envs.env.Observation` (platform "web"; ``elements`` from the page's DOM
with boxes in screenshot pixels and unit space; the screenshot is the 160 x 210 CSS-pixel
task region at ``scale`` device pixels per CSS pixel, taken when the observation is made),
the same ``step`` inputs (GUI-Libra :class:`actions.Action` in ``coord_space``, or response
text; points are read in the screenshot's frame), and ``info`` with ``events``,
``changed``, ``error``, ``format``, ``success`` and the page's ``raw_reward``.

An episode ends when the page ends it (MiniWoB decides success: raw reward > 0), when the
agent answers or terminates, or after ``max_steps``. The page's 10 s timer is lifted
(:data:`browser.EPISODE_TIME_LIMIT_S`) so that slow agents are judged on what they do.
A problem is a function of (task, seed): the same seed gives the same page, and an
episode is a function of (task, seed, actions) (:meth:`state` / :meth:`restore`).
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from guilibra_jax import actions as A
from guilibra_jax.envs.env import Observation
from guilibra_jax.envs.miniwob import dom as D
from guilibra_jax.envs.miniwob import executor as X
from guilibra_jax.envs.miniwob.browser import Browser

DEFAULT_MAX_STEPS = 10
TASK_MAX_STEPS = {"click-checkboxes-large": 16}   # up to 12 boxes, then Submit
PLATFORM = "web"


def task_id(task: str, seed: int) -> str:
    return f"{task}-{seed}"


class MiniWobEnv:
    platform = PLATFORM

    def __init__(self, task: str, seed: int = 0, *, scale: float = 1.0, max_steps: int | None = None,
                 browser: Browser | None = None, screenshots: bool = True):
        self.task = task
        self.seed = int(seed)
        self._max_steps = max_steps
        self.screenshots = screenshots
        self._own_browser = browser is None
        self.browser = browser if browser is not None else Browser(scale=scale)
        self.screen_size = self.browser.screen_size
        self.history: list[str] = []
        self.actions: list[str] = []          # what was executed, as response text (for restore)
        self.t = 0
        self.done = False
        self.instruction = ""
        self._started = False
        self._dom: dict | None = None
        self._meta: dict = {}
        self.stopped_by_agent = False

    @property
    def max_steps(self) -> int:
        """The step budget: the one given, else the task's (:data:`TASK_MAX_STEPS`, default 10)."""
        return int(self._max_steps or TASK_MAX_STEPS.get(self.task, DEFAULT_MAX_STEPS))

    @property
    def task_id(self) -> str:
        return task_id(self.task, self.seed)

    # ------------------------------------------------------------------ episode
    def reset(self, seed: int | None = None, task: str | None = None) -> Observation:
        """A new episode (optionally of another task or seed) in the same browser."""
        if task is not None:
            self.task = task
        if seed is not None:
            self.seed = int(seed)
        self.browser.open(self.task)
        self.browser.start_episode(self.seed)
        X.settle(self.browser)
        self.instruction = self.browser.utterance()
        self.history, self.actions, self.t, self.done = [], [], 0, False
        self.stopped_by_agent = False
        self._started = True
        self._meta = self.browser.metadata()
        return self.observation()

    def _need_started(self) -> None:
        if not self._started:
            raise RuntimeError("call env.reset() before using the environment")

    def observation(self) -> Observation:
        self._need_started()
        self._dom = self.browser.dom()
        image = self.browser.screenshot() if self.screenshots else None

        def render():
            if image is None:
                raise RuntimeError("this MiniWobEnv was made with screenshots=False")
            return image
        return Observation(render=render, instruction=self.instruction, history=tuple(self.history),
                           platform=PLATFORM, elements=tuple(self.elements()), screen_size=self.screen_size,
                           step=self.t, task_id=self.task_id)

    def elements(self) -> list[dict]:
        return D.flatten(self._dom, self.browser.scale)

    def to_events(self, action: A.Action | str, coord_space: str = "pixels",
                  resized_size: Sequence[int] | None = None):
        """(events, history line, error or None, format) for an action or response text."""
        if isinstance(action, str):
            parsed = A.parse_response(action)
            if parsed.action is None:
                return [X.Event("noop", text=parsed.error)], "Invalid action", parsed.error, "guilibra"
            action = parsed.action
        if not isinstance(action, A.Action):
            raise TypeError(f"MiniWobEnv.step expects actions.Action or GUI-Libra response text, "
                            f"got {type(action).__name__} (tool calls are not a web format)")
        events = X.web_events(action, coord_space=coord_space, image_size=self.screen_size,
                              resized_size=resized_size)
        err = next((e.text for e in events if e.kind == "noop"), None)
        desc = action.action_description or _describe(action)
        return events, desc, err, "guilibra"

    def step(self, action: A.Action | str, coord_space: str = "pixels",
             resized_size: Sequence[int] | None = None) -> tuple[Observation, bool, dict[str, Any]]:
        self._need_started()
        if self.done:
            return self.observation(), True, {"events": [], "changed": False, "error": "episode is over",
                                              "format": None, "success": self.success(),
                                              "raw_reward": self._meta.get("raw_reward")}
        events, desc, err, fmt = self.to_events(action, coord_space, resized_size)
        before = json.dumps(self._dom, sort_keys=True)
        for ev in events:
            e = X.apply_event(self.browser, ev)
            err = err or e
            if ev.kind in X.ENDS_EPISODE:
                self.stopped_by_agent = True
        X.settle(self.browser)
        self.history.append(desc)
        self.actions.append(self._replayable(action, coord_space, resized_size))
        self.t += 1
        self._meta = self.browser.metadata()
        self.done = bool(self._meta.get("done")) or self.stopped_by_agent or self.t >= self.max_steps
        obs = self.observation()
        info = {"events": X.as_dicts(events), "changed": json.dumps(self._dom, sort_keys=True) != before,
                "error": err, "format": fmt, "success": self.success(),
                "raw_reward": self._meta.get("raw_reward"), "page_done": bool(self._meta.get("done"))}
        return obs, self.done, info

    def _replayable(self, action, coord_space, resized_size) -> str:
        """The executed action as response text with its point in screenshot pixels."""
        parsed = A.parse_response(action).action if isinstance(action, str) else action
        if parsed is None:
            return action
        if parsed.point_2d is not None:
            unit = A.to_unit(parsed.point_2d, coord_space, image_size=self.screen_size, resized_size=resized_size)
            point = A.from_unit(unit, "pixels", image_size=self.screen_size, round_to_int=False)
            parsed = A.Action(parsed.action_type, parsed.action_description, parsed.value, point,
                              parsed.action_target)
        return A.render_response(parsed)

    def success(self) -> bool:
        """The page ended the episode with a positive raw reward."""
        self._need_started()
        return bool(self._meta.get("done")) and float(self._meta.get("raw_reward") or 0.0) > 0.0

    def needs_convention(self, fmt: str = "guilibra") -> bool:
        return False               # one platform: no conventions to mix up

    # ------------------------------------------------------------------ the expert
    def expert_step(self):
        """The scripted DOM expert's next step in the current state (:mod:`.experts`)."""
        from guilibra_jax.envs.miniwob.experts import expert_step
        self._need_started()
        return expert_step(self)

    # ------------------------------------------------------------------ resumable state
    def state(self) -> dict[str, Any]:
        """JSON-able (task, seed, step, executed actions): :meth:`restore` replays it."""
        return {"task": self.task, "seed": self.seed, "step": self.t, "actions": list(self.actions),
                "coord_space": "pixels"}

    def restore(self, state: dict[str, Any]) -> Observation:
        """Reset to ``state``'s task and seed and replay its actions (pixel coordinates)."""
        obs = self.reset(seed=state["seed"], task=state["task"])
        for a in state["actions"]:
            obs, _, _ = self.step(a, coord_space="pixels")
        return obs

    def close(self) -> None:
        if self._own_browser:
            self.browser.close()


def _describe(action: A.Action) -> str:
    v = "" if action.value is None else f" {action.value}"
    return f"{action.action_type}{v}"
