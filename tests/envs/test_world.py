"""The synthetic world: the expert solves every task, conventions bite where they should,
alternatives work online, and everything is a function of the seed."""

import dataclasses

import pytest

from guilibra_jax import actions as A
from guilibra_jax.envs import TASK_KINDS, make_env
from guilibra_jax.envs import adapter as AD
from guilibra_jax.eval.agents import make_agent
from guilibra_jax.eval.online import evaluate_online, run_episode

SEEDS = range(120)
PLATFORMS = ("desktop", "mobile")


def _replay(env, steps):
    env.reset()
    for s in steps:
        env.step(s.main.action, coord_space="unit")
    return env


@pytest.mark.parametrize("platform", PLATFORMS)
def test_expert_succeeds_on_every_task_with_guilibra_actions_and_tool_calls(platform):
    kinds = set()
    for seed in SEEDS:
        env = make_env(platform, seed)
        env.reset()
        steps = env.expert_trajectory()          # raises unless the goal holds at the end
        kinds.add(env.task.kind)
        assert steps[-1].intent in ("terminate", "answer")
        env.reset()
        for s in steps:                           # the same plan, as UI-MOPD tool calls
            assert s.main.tool_call.name == A.TOOL_FOR_PLATFORM[platform]
            _, done, info = env.step(s.main.tool_call)
            assert info["error"] is None
        assert done and env.success(), env.instruction
    assert kinds == set(TASK_KINDS)


@pytest.mark.parametrize("platform,size", [("desktop", (1920, 1080)), ("mobile", (1080, 2400)),
                                           ("desktop", (112, 112)), ("mobile", (112, 112))])
def test_expert_succeeds_at_other_screen_sizes(platform, size):
    for kind in TASK_KINDS:
        env = make_env(platform, 5, size, task_kind=kind)
        obs = env.reset()
        assert obs.screenshot.size == size
        env.expert_trajectory()


def test_same_task_on_both_platforms_needs_different_actions():
    env_d, env_m = make_env("desktop", 0, task_kind="go_back"), make_env("mobile", 0, task_kind="go_back")
    assert env_d.instruction == env_m.instruction
    env_d.reset(), env_m.reset()
    first_d, first_m = env_d.expert_step(), env_m.expert_step()
    assert first_d.intent == first_m.intent == "back"
    assert (first_d.main.action.action_type, first_m.main.action.action_type) == ("Click", "NavigateBack")


def _first_step_of_intent(platform, intent, fmt="guilibra"):
    for seed in range(200):
        env = make_env(platform, seed)
        env.reset()
        for s in env.expert_trajectory():
            if s.intent == intent:
                return env, s
            env.step(s.main.action, coord_space="unit")
    raise AssertionError(f"no {intent} step found on {platform}")


@pytest.mark.parametrize("platform,intent,wrong", [
    ("desktop", "open_app", lambda s: AD.Event("click", s.event.point)),       # single click selects only
    ("desktop", "back", lambda s: AD.Event("back")),
    ("desktop", "scroll", lambda s: AD.Event("swipe", (0.6, 0.8), (0.6, 0.4))),
    ("desktop", "context", lambda s: AD.Event("long_press", s.event.point)),
    ("mobile", "open_app", lambda s: AD.Event("double_click", s.event.point)),
    ("mobile", "back", lambda s: AD.Event("key", text="ctrl+w")),
    ("mobile", "home", lambda s: AD.Event("key", text="ctrl+w")),
    ("mobile", "context", lambda s: AD.Event("right_click", s.event.point)),
])
def test_other_platform_convention_leaves_the_task_state_unchanged(platform, intent, wrong):
    env, step = _first_step_of_intent(platform, intent)
    before = repr(dataclasses.replace(env.world.state, selected_icon=None))
    env.world.apply(wrong(step))
    assert repr(dataclasses.replace(env.world.state, selected_icon=None)) == before
    assert env.world.apply(step.event)           # the platform's own convention works


@pytest.mark.parametrize("fmt", ["guilibra", "tool_call"])
def test_convention_agent_fails_exactly_the_tasks_that_need_the_convention(fmt):
    agent = make_agent("convention", fmt=fmt)
    for platform in PLATFORMS:
        needs = {True: 0, False: 0}
        for seed in range(60):
            r = run_episode(agent, platform, seed, max_steps=12)
            assert r["success"] == (not r["needs_convention"]), r
            needs[r["needs_convention"]] += 1
        assert needs[True] > 5 and needs[False] > 5


def test_random_agent_is_near_zero_and_expert_is_perfect_online():
    for fmt in ("guilibra", "tool_call"):
        res = evaluate_online(make_agent("random", fmt=fmt, seed=1), PLATFORMS, episodes=40)
        assert res["overall"]["success_rate"] <= 0.08
        res = evaluate_online(make_agent("expert", fmt=fmt), PLATFORMS, episodes=25)
        assert res["overall"]["success_rate"] == 1.0


def test_alternative_actions_are_accepted_by_the_world():
    n_alts = {"guilibra": 0, "tool_call": 0}
    for platform in PLATFORMS:
        for seed in range(40):
            env = make_env(platform, seed)
            env.reset()
            steps = env.expert_trajectory()
            for k, s in enumerate(steps):
                for alt in s.alternatives:
                    inputs = [("guilibra", alt.action)] + ([("tool_call", alt.tool_call)] if alt.tool_call else [])
                    for fmt, inp in inputs:
                        e = _replay(make_env(platform, seed), steps[:k])
                        _, _, info = e.step(inp, coord_space="unit")
                        assert info["error"] is None and info["changed"], (platform, seed, alt)
                        while not e.done:                      # the expert finishes from there
                            e.step(e.expert_step().main.action, coord_space="unit")
                        assert e.success(), (platform, seed, k, alt.action)
                        n_alts[fmt] += 1
    assert n_alts["guilibra"] > 50 and n_alts["tool_call"] > 20


def test_same_seed_same_screenshots_and_steps():
    for platform in PLATFORMS:
        for seed in (3, 17):
            a, b = make_env(platform, seed), make_env(platform, seed)
            oa, ob = a.reset(), b.reset()
            while not a.done:
                assert oa.screenshot.tobytes() == ob.screenshot.tobytes() and oa.elements == ob.elements
                sa, sb = a.expert_step(), b.expert_step()
                assert sa == sb
                oa, _, _ = a.step(sa.main.action, coord_space="unit")
                ob, _, _ = b.step(sb.main.action, coord_space="unit")
    assert make_env("mobile", 1).instruction != make_env("mobile", 2).instruction or \
        make_env("mobile", 1).task != make_env("mobile", 2).task


def test_step_accepts_response_text_in_both_formats_and_all_coordinate_spaces():
    env = make_env("mobile", 7)
    env.reset()
    steps = env.expert_trajectory()
    for space in ("pixels", "norm1000", "unit"):
        env.reset()
        for s in steps:
            a = s.main.action
            if a.point_2d is not None:
                a = dataclasses.replace(a, point_2d=A.from_unit(a.point_2d, space, image_size=env.screen_size,
                                                                round_to_int=space != "unit"))
            env.step(A.render_response(a, s.reasoning), coord_space=space)
        assert env.success()
    env.reset()
    for s in steps:
        env.step(A.render_tool_call_response(s.main.tool_call, s.reasoning, s.description))
    assert env.success()


def test_invalid_inputs_are_noops_with_an_error():
    env = make_env("mobile", 0)
    obs = env.reset()
    _, _, info = env.step("no answer here")
    assert info["error"] and not info["changed"]
    _, _, info = env.step(A.ToolCall("computer_use", {"action": "left_click", "coordinate": [5, 5]}))
    assert "computer_use" in info["error"] and not info["changed"]
    _, _, info = env.step(A.Action("Click"))
    assert info["error"] and env.t == 3


def test_observation_carries_what_an_agent_sees():
    env = make_env("desktop", 4)
    obs = env.reset()
    assert obs.screenshot.size == (128, 96) and obs.platform == "desktop" and obs.history == ()
    assert obs.instruction == env.task.instruction
    ids = {e["id"] for e in obs.elements}
    assert {f"icon:{a}" for a in ("Mail", "Notes", "Files", "People", "Settings")} <= ids
    for e in obs.elements:
        x1, y1, x2, y2 = e["box"]
        assert 0 <= x1 <= x2 <= 128 and 0 <= y1 <= y2 <= 96
    s = env.expert_step()
    obs, _, _ = env.step(s.main.action, coord_space="unit")
    assert obs.history == (s.description,) and obs.step == 1


def test_adapter_round_trips_expert_events_through_both_formats():
    for platform in PLATFORMS:
        for seed in range(30):
            env = make_env(platform, seed)
            env.reset()
            for s in env.expert_trajectory():
                ev = AD.events_from_tool_call(s.main.tool_call, platform)
                assert len(ev) == 1 and ev[0].kind == s.event.kind and ev[0].text == s.event.text
                if s.event.point is not None and s.event.kind != "type":   # type: at the focus
                    assert abs(ev[0].point[0] - s.event.point[0]) < 2e-3
                back = AD.action_from_tool_call(s.main.tool_call)
                assert back.action_type == s.main.action.action_type and back.value == s.main.action.value


def test_a_short_agent_budget_does_not_fail_the_expert_plan():
    """online.max_steps below the expert's trajectory length: needs_convention (run for every
    online episode) plans with the expert's own budget instead of raising."""
    for platform in ("desktop", "mobile"):
        for seed in range(6):
            full = make_env(platform, seed)
            short = make_env(platform, seed, max_steps=1)
            assert short.needs_convention() == full.needs_convention()
            assert len(short.expert_trajectory()) == len(full.expert_trajectory())
