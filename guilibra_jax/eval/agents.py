"""Agents for evaluation, and the registry that names them.

An agent is any callable ``obs -> response text`` (GUI-Libra ``<answer>`` JSON or a
UI-MOPD tool call). Optional hooks: ``reset(env)`` is called at the start of every
episode with the live :class:`envs.GuiEnv`; ``needs_world = True`` marks an agent that
reads the world's state through that env (the scripted agents below), so offline
evaluation replays the world for it instead of building observations from records;
``respond_batch(observations) -> list[str]`` (with ``batch_size``) answers many records
at once offline; ``coord_space`` / ``resized_size`` attributes, when set, are the space
its GUI-Libra points are scored in (default: the eval config's).

Adding an agent is one function::

    @register_agent("my_agent")
    def _mine(path: str, **kw) -> Agent:
        return MySamplerAgent(path, **kw)

A trained model is the ``checkpoint`` agent of :mod:`guilibra_jax.eval.model_agent`.

Built-ins: ``expert`` (the world's demonstrations), ``random`` (uniform over the
platform's actions), ``random_click`` (a click at a uniform point) and ``convention``
(the expert's plan, acted out with the *other*
platform's conventions; see :mod:`envs.expert`).
"""

from __future__ import annotations

import dataclasses
import random
from collections import defaultdict
from typing import Callable, Protocol, Sequence

from guilibra_jax import actions as A
from guilibra_jax.data import native as N
from guilibra_jax.envs import adapter as AD
from guilibra_jax.envs import tasks as T
from guilibra_jax.envs.env import GuiEnv, Observation, make_env
from guilibra_jax.envs.expert import OTHER_PLATFORM, convention_event

FORMATS = ("guilibra", "tool_call")


class Agent(Protocol):
    def __call__(self, obs: Observation) -> str: ...


AGENTS: dict[str, Callable[..., Agent]] = {}


def register_agent(name: str):
    """Decorator: register ``factory(**kwargs) -> Agent`` under ``name``."""
    def deco(factory):
        if name in AGENTS:
            raise ValueError(f"agent {name!r} is already registered")
        AGENTS[name] = factory
        return factory
    return deco


def make_agent(name: str, **kwargs) -> Agent:
    if name not in AGENTS:
        raise KeyError(f"unknown agent {name!r}; registered: {sorted(AGENTS)}")
    return AGENTS[name](**kwargs)


ResizedSize = Sequence[int] | Callable[[tuple[int, int]], Sequence[int]] | None


def render_action(action: A.Action, reasoning: str | None, coord_space: str,
                  image_size: Sequence[int], family: str = "qwen2_5_vl",
                  resized_size: ResizedSize = None) -> str:
    """GUI-Libra response text for an action whose point is in unit space, written in
    ``coord_space`` (``resized_size``: (w, h) or a function of the image size)."""
    if action.point_2d is not None:
        rs = resized_size(tuple(image_size)) if callable(resized_size) else resized_size
        action = dataclasses.replace(action, point_2d=A.from_unit(action.point_2d, coord_space,
                                                                  image_size=image_size, resized_size=rs))
    return A.render_response(action, reasoning, family=family)


def render_tool(call: A.ToolCall, reasoning: str | None, action_text: str | None) -> str:
    return A.render_tool_call_response(call, reasoning, action_text)


def _check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"unknown response format {fmt!r}; expected one of {FORMATS}")


class ExpertAgent:
    """Answers with the expert's main demonstration."""

    needs_world = True

    def __init__(self, fmt: str = "guilibra", coord_space: str = "norm1000", reasoning: bool = True,
                 resized_size: ResizedSize = None):
        _check_format(fmt)
        self.fmt, self.coord_space, self.reasoning = fmt, coord_space, reasoning
        self.resized_size = resized_size
        self.env: GuiEnv | None = None

    def reset(self, env: GuiEnv) -> None:
        self.env = env

    def __call__(self, obs: Observation) -> str:
        step = self.env.expert_step()
        why = step.reasoning if self.reasoning else None
        if self.fmt == "tool_call":
            return render_tool(step.main.tool_call, why, step.description)
        return render_action(step.main.action, why, self.coord_space, obs.screen_size,
                             resized_size=self.resized_size)


class ConventionAgent(ExpertAgent):
    """The expert's plan acted out with another platform's conventions (default: the
    other platform's): fails exactly the tasks whose plan has an intent the platform
    accepts only in its own convention (``env.needs_convention()``)."""

    def __init__(self, fmt: str = "guilibra", coord_space: str = "norm1000", reasoning: bool = True,
                 convention: str = "other", resized_size: ResizedSize = None):
        super().__init__(fmt, coord_space, reasoning, resized_size)
        self.convention = convention

    def __call__(self, obs: Observation) -> str:
        env = self.env
        step = env.expert_step()
        conv = OTHER_PLATFORM[env.platform] if self.convention == "other" else self.convention
        event = convention_event(step, env.world, conv)
        if event == step.event:
            return super().__call__(obs)
        why = f"Following the {conv} convention for '{step.intent}'." if self.reasoning else None
        action = AD.action_from_event(event, f"{step.intent} ({conv} style)")
        if self.fmt == "tool_call":
            call = (AD.tool_call_from_event(event, env.platform)
                    or AD.tool_call_from_event(event, conv))   # the other tool when ours cannot say it
            return render_tool(call, why, action.action_description)
        return render_action(action, why, self.coord_space, obs.screen_size,
                             resized_size=self.resized_size)


_RANDOM_KEYS = ("enter", "escape", "ctrl+w", "pagedown", "pageup")


class RandomAgent:
    """Uniform over event kinds the platform's vocabulary has, with uniform points and
    values drawn from the world's own words. Deterministic given ``seed``."""

    needs_world = False
    KINDS = {"desktop": ("click", "double_click", "right_click", "type", "key", "scroll", "answer",
                         "terminate"),
             "mobile": ("click", "long_press", "type", "swipe", "back", "home", "open_app", "answer",
                        "terminate"),
             "web": ("click", "type", "key", "scroll", "answer")}

    def __init__(self, fmt: str = "guilibra", coord_space: str = "norm1000", seed: int = 0,
                 resized_size: ResizedSize = None):
        _check_format(fmt)
        self.fmt, self.coord_space, self.resized_size = fmt, coord_space, resized_size
        self.rng = random.Random(seed)

    def reset(self, env: GuiEnv) -> None:
        pass

    def _event(self, platform: str) -> AD.Event:
        r = self.rng
        kind = r.choice(self.KINDS[platform])
        pt = (round(r.random(), 4), round(r.random(), 4))
        if kind in ("click", "double_click", "right_click", "long_press"):
            return AD.Event(kind, pt)
        if kind in ("type", "answer"):
            return AD.Event(kind, text=r.choice(T.WORDS + T.NAMES))
        if kind == "key":
            return AD.Event(kind, text=r.choice(_RANDOM_KEYS))
        if kind == "scroll":
            return AD.Event(kind, text=r.choice(("up", "down")))
        if kind == "swipe":
            return AD.Event(kind, pt, AD.swipe_end(pt, r.choice(AD.DIRECTIONS)))
        if kind == "open_app":
            return AD.Event(kind, text=r.choice(T.APPS))
        if kind == "terminate":
            return AD.Event(kind, text="success")
        return AD.Event(kind)

    def __call__(self, obs: Observation) -> str:
        event = self._event(obs.platform)
        if self.fmt == "tool_call":
            call = AD.tool_call_from_event(event, obs.platform)
            while call is None:              # e.g. OpenApp: mobile_use cannot say it; redraw
                call = AD.tool_call_from_event(self._event(obs.platform), obs.platform)
            return render_tool(call, None, "random action")
        action = AD.action_from_event(event, "random action")
        return render_action(action, None, self.coord_space, obs.screen_size,
                             resized_size=self.resized_size)


class RandomClickAgent:
    """Clicks a uniformly random point of the screenshot (any platform): the chance level
    of grounding. Deterministic given ``seed``."""

    needs_world = False

    def __init__(self, fmt: str = "guilibra", coord_space: str = "norm1000", seed: int = 0,
                 resized_size: ResizedSize = None):
        if fmt != "guilibra":
            raise ValueError(f"random_click answers in GUI-Libra format only, got fmt={fmt!r}")
        self.coord_space, self.resized_size = coord_space, resized_size
        self.rng = random.Random(seed)

    def reset(self, env) -> None:
        pass

    def __call__(self, obs: Observation) -> str:
        pt = (round(self.rng.random(), 4), round(self.rng.random(), 4))
        return render_action(A.Action("Click", "random click", None, pt), None, self.coord_space,
                             obs.screen_size, resized_size=self.resized_size)


@register_agent("expert")
def _expert(**kw) -> Agent:
    return ExpertAgent(**kw)


@register_agent("random")
def _random(**kw) -> Agent:
    return RandomAgent(**kw)


@register_agent("random_click")
def _random_click(**kw) -> Agent:
    return RandomClickAgent(**kw)


@register_agent("convention")
def _convention(**kw) -> Agent:
    return ConventionAgent(**kw)


# --------------------------------------------------------------------------------------
# Offline: one response per step record
# --------------------------------------------------------------------------------------

def parse_task_id(trajectory_id: str) -> tuple[str, int]:
    platform, _, seed = trajectory_id.rpartition("-")
    return platform, int(seed)


def observation_from_record(record: N.StepRecord, base_dir: str = "") -> Observation:
    """An observation built from a record alone (no elements): what a model sees."""
    from guilibra_jax.data.images import load_image
    img = load_image(record.image, base_dir or None)
    return Observation(render=lambda: img, instruction=record.instruction, history=record.history,
                       platform=record.platform, elements=(), screen_size=tuple(record.image_size),
                       step=record.step, task_id=record.trajectory_id)


def responses_for_records(agent: Agent, records: Sequence[N.StepRecord], base_dir: str = ""
                          ) -> list[str]:
    """The agent's response for each record, in order. World agents (``needs_world``)
    see the world replayed along the demonstration to each record's state; others see
    the record's screenshot, instruction and history, ``batch_size`` records per call of
    the agent's ``respond_batch(observations) -> list[str]`` when it has one."""
    if not getattr(agent, "needs_world", False):
        batch = getattr(agent, "respond_batch", None)
        if batch is None:
            return [agent(observation_from_record(r, base_dir)) for r in records]
        n = max(1, int(getattr(agent, "batch_size", 1)))
        return [text for i in range(0, len(records), n)
                for text in batch([observation_from_record(r, base_dir) for r in records[i:i + n]])]
    by_traj: dict[str, list[int]] = defaultdict(list)
    for k, r in enumerate(records):
        by_traj[r.trajectory_id].append(k)
    out: list[str | None] = [None] * len(records)
    for traj, idx in by_traj.items():
        platform, seed = parse_task_id(traj)
        idx.sort(key=lambda k: records[k].step)
        env = make_env(platform, seed, records[idx[0]].image_size)
        obs = env.reset()
        agent.reset(env)
        for k in idx:
            while env.t < records[k].step:           # teacher-force the demonstration
                obs, _, _ = env.step(env.expert_step().main.action, coord_space="unit")
            out[k] = agent(obs)
    return out  # type: ignore[return-value]
