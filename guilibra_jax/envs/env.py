"""Gym-like episode API over the synthetic world.

    env = make_env("mobile", seed=3)            # 96x128 by default; screen_size=(1080, 2400)
    obs = env.reset()
    obs, done, info = env.step(action)         # actions.Action, actions.ToolCall or response text
    env.success()

Coordinates: a GUI-Libra :class:`actions.Action` (and a GUI-Libra response string) is
read in ``coord_space`` (default "pixels" of the screenshot; "unit", "norm1000" or
"resized_pixels" with ``resized_size``); a :class:`actions.ToolCall` is always in its
tool's own space (computer_use 0-1000, mobile_use 0-999).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

from PIL import Image

from guilibra_jax import actions as A
from guilibra_jax.envs import adapter as AD
from guilibra_jax.envs import tasks as T
from guilibra_jax.envs.expert import CRITICAL_INTENTS, Expert, ExpertStep
from guilibra_jax.envs.world import DEFAULT_SCREEN_SIZE, World

DEFAULT_MAX_STEPS = 30


@dataclasses.dataclass(frozen=True)
class Observation:
    """What an agent sees. ``screenshot`` is drawn on first access (then cached)."""

    render: Callable[[], Image.Image] = dataclasses.field(repr=False, compare=False)
    instruction: str
    history: tuple[str, ...]          # descriptions of the previous actions, oldest first
    platform: str                     # "desktop" | "mobile"
    elements: tuple[dict, ...]        # {"id", "role", "text", "box" (pixels), "box_unit", "state"}
    screen_size: tuple[int, int]      # (width, height)
    step: int
    task_id: str

    @functools.cached_property
    def screenshot(self) -> Image.Image:
        return self.render()


def task_id(platform: str, seed: int) -> str:
    return f"{platform}-{seed}"


class GuiEnv:
    def __init__(self, platform: str, seed: int, screen_size: Sequence[int] | None = None,
                 max_steps: int = DEFAULT_MAX_STEPS, task_kind: str | None = None):
        if platform not in DEFAULT_SCREEN_SIZE:
            raise ValueError(f"unknown platform {platform!r}; expected 'desktop' or 'mobile'")
        self.platform = platform
        self.seed = int(seed)
        self.screen_size = tuple(int(v) for v in (screen_size or DEFAULT_SCREEN_SIZE[platform]))
        self.max_steps = int(max_steps)
        self.task = T.make_task(self.seed, task_kind)
        self.world: World | None = None
        self.history: list[str] = []
        self.t = 0
        self.done = False

    @property
    def instruction(self) -> str:
        return self.task.instruction

    @property
    def task_id(self) -> str:
        return task_id(self.platform, self.seed)

    def reset(self) -> Observation:
        self.world = World(self.platform, self.task, self.screen_size)
        self.history, self.t, self.done = [], 0, False
        return self.observation()

    def observation(self) -> Observation:
        w = self._need_world()
        return Observation(
            render=w.screenshot_fn(), instruction=self.task.instruction, history=tuple(self.history),
            platform=self.platform,
            elements=tuple(e.to_dict(w.size) for e in w.elements() if e.role not in ("desktop_bg", "mobile_bg")),
            screen_size=w.size, step=self.t, task_id=self.task_id)

    def _need_world(self) -> World:
        if self.world is None:
            raise RuntimeError("call env.reset() before using the environment")
        return self.world

    def to_events(self, action: A.Action | A.ToolCall | str, coord_space: str = "pixels",
                  resized_size: Sequence[int] | None = None) -> tuple[list[AD.Event], str, str | None, str]:
        """(events, history line, error or None, format) for any accepted input."""
        size = self.screen_size
        if isinstance(action, str):
            if "<tool_call>" in action:
                parsed = A.parse_tool_call_response(action)
                if parsed.call is None:
                    return [AD.Event("noop", text=parsed.error)], "Invalid action", parsed.error, "tool_call"
                events, desc, err, _ = self.to_events(parsed.call)
                return events, parsed.action_text or desc, err, "tool_call"
            parsed = A.parse_response(action)
            if parsed.action is None:
                return [AD.Event("noop", text=parsed.error)], "Invalid action", parsed.error, "guilibra"
            events, desc, err, _ = self.to_events(parsed.action, coord_space, resized_size)
            return events, desc, err, "guilibra"
        if isinstance(action, A.ToolCall):
            events = AD.events_from_tool_call(action, self.platform)
            desc = describe_events(events)
            fmt = "tool_call"
        elif isinstance(action, A.Action):
            events = AD.events_from_action(action, coord_space=coord_space, image_size=size,
                                           resized_size=resized_size)
            desc = action.action_description or describe_events(events)
            fmt = "guilibra"
        else:
            raise TypeError(f"env.step expects actions.Action, actions.ToolCall or str, "
                            f"got {type(action).__name__}")
        err = next((e.text for e in events if e.kind == "noop"), None)
        return events, desc, err, fmt

    def step(self, action: A.Action | A.ToolCall | str, coord_space: str = "pixels",
             resized_size: Sequence[int] | None = None) -> tuple[Observation, bool, dict[str, Any]]:
        w = self._need_world()
        if self.done:
            return self.observation(), True, {"events": [], "changed": False, "error": "episode is over",
                                              "format": None, "success": self.success()}
        events, desc, err, fmt = self.to_events(action, coord_space, resized_size)
        changed = False
        for ev in events:
            changed |= w.apply(ev)
        self.history.append(desc)
        self.t += 1
        self.done = (w.state.terminated is not None or w.state.answer is not None
                     or self.t >= self.max_steps)
        info = {"events": [dataclasses.asdict(e) for e in events], "changed": changed, "error": err,
                "format": fmt, "success": self.success()}
        return self.observation(), self.done, info

    def success(self) -> bool:
        return self._need_world().goal_reached()

    # -- the expert ---------------------------------------------------------------------
    def expert_step(self) -> ExpertStep:
        return Expert(self._need_world()).step()

    def expert_trajectory(self) -> list[ExpertStep]:
        """The expert's steps from the task's start (on a fresh copy of this env)."""
        # the expert's own step budget: an agent's shorter one (online.max_steps) must not fail it
        env = GuiEnv(self.platform, self.seed, self.screen_size, max(self.max_steps, DEFAULT_MAX_STEPS))
        env.task = self.task
        env.reset()
        steps = []
        while not env.done:
            s = env.expert_step()
            steps.append(s)
            env.step(s.main.action, coord_space="unit")
        if not env.success():
            raise AssertionError(f"expert failed task {env.task_id}: {env.instruction}")
        return steps

    def needs_convention(self, fmt: str = "guilibra") -> bool:
        """Whether the expert's plan has an intent this platform only accepts in its own
        convention when acting in response format ``fmt`` ("guilibra" | "tool_call"), so
        that an agent following the other platform's convention fails the task."""
        critical = CRITICAL_INTENTS[(self.platform, fmt)]
        return any(s.intent in critical for s in self.expert_trajectory())


def describe_events(events: list[AD.Event]) -> str:
    names = {"click": "Click", "double_click": "Double-click", "right_click": "Right-click",
             "long_press": "Long-press", "type": "Type", "key": "Press", "scroll": "Scroll",
             "swipe": "Swipe", "back": "Press Back", "home": "Press Home", "open_app": "Open",
             "answer": "Answer", "wait": "Wait", "terminate": "Finish", "noop": "Invalid action",
             "select": "Select"}
    parts = []
    for e in events:
        s = names.get(e.kind, e.kind)
        if e.kind in ("type", "key", "scroll", "open_app", "answer", "select") and e.text:
            s += f" {e.text}"
        parts.append(s)
    return ", ".join(parts)


def make_env(platform: str, seed: int, screen_size: Sequence[int] | None = None,
             max_steps: int = DEFAULT_MAX_STEPS, task_kind: str | None = None) -> GuiEnv:
    """A world episode for ``platform`` ("desktop" | "mobile") and task ``seed``.
    ``screen_size`` = (width, height); small by default (desktop 128x96, mobile
    96x128); e.g. (1920, 1080) / (1080, 2400) for realistic sizes."""
    return GuiEnv(platform, seed, screen_size, max_steps, task_kind)
