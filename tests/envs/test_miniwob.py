"""MiniWoB++ in a real headless Chromium: each GUI-Libra web action does what it says on
a real page (judged by the page's own DOM and its own reward, not by our code), the
scripted experts solve held-out seeds, episodes replay from their state, demos record,
the evaluator runs, and the browser pool steps in parallel processes.

Skipped (with the reason) when the optional ``[miniwob]`` extra or Chromium/chromedriver
is missing: ``pip install -e '.[miniwob]'`` and ``apt-get install chromium chromium-driver``."""

import json
import os

import pytest

from guilibra_jax import actions as A
from guilibra_jax.envs.miniwob.browser import available

REASON = available()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"MiniWoB++ unavailable: {REASON}")

SCALE = 2.0


@pytest.fixture(scope="module")
def browser():
    from guilibra_jax.envs.miniwob import Browser
    b = Browser(scale=SCALE)
    yield b
    b.close()


def _env(browser, task, seed=0, **kw):
    from guilibra_jax.envs.miniwob import MiniWobEnv
    env = MiniWobEnv(task, seed, browser=browser, **kw)
    return env, env.reset()


def _el(obs, html_id=None, role=None, text=None):
    for e in obs.elements:
        if (html_id is None or e["html_id"] == html_id) and (role is None or e["role"] == role) \
                and (text is None or e["text"] == text):
            return e
    raise AssertionError(f"no element {html_id or role or text} in {[e['html_id'] or e['role'] for e in obs.elements]}")


def _centre_px(e):
    x1, y1, x2, y2 = e["box"]
    return (x1 + x2) / 2, (y1 + y2) / 2


def test_screenshot_is_the_task_region_at_the_device_scale(browser):
    env, obs = _env(browser, "click-test")
    assert obs.platform == "web" and obs.screen_size == (320, 420) == obs.screenshot.size
    btn = _el(obs, "subbtn")
    assert btn["box"] == tuple(round(c * SCALE, 2) for c in btn["css"])
    # the button is drawn where its box says: its centre differs from the blank page
    px = obs.screenshot.getpixel(tuple(int(c) for c in _centre_px(btn)))
    assert px != obs.screenshot.getpixel((5, 400))


def test_click_at_a_point_clicks_the_element_under_it(browser):
    env, obs = _env(browser, "click-test")
    obs, done, info = env.step(A.Action("Click", "", None, (5, 300)))          # blank page: nothing
    assert not done and not env.success() and info["error"] is None
    obs, done, info = env.step(A.Action("Click", "", None, _centre_px(_el(obs, "subbtn"))))
    assert done and env.success() and info["raw_reward"] > 0                    # the page's own verdict


def test_write_replaces_the_field_and_without_point_types_at_the_focus(browser):
    env, obs = _env(browser, "enter-text", seed=3)
    field = _centre_px(_el(obs, "tt"))
    value = lambda: browser.js("return document.getElementById('tt').value;")  # noqa: E731
    env.step(A.Action("Write", "", "abc", field))
    assert value() == "abc"
    env.step(A.Action("Write", "", "xyz", field))
    assert value() == "xyz"                                                    # replaced, not appended
    env.step(A.Action("Write", "", "q", None))
    assert value() == "xyzq"                                                   # typed at the focus


def test_key_press_acts_on_the_focused_field(browser):
    env, obs = _env(browser, "enter-text", seed=4)
    env.step(A.Action("Write", "", "abc", _centre_px(_el(obs, "tt"))))
    _, _, info = env.step(A.Action("KeyboardPress", "", "backspace"))
    assert info["error"] is None and browser.js("return document.getElementById('tt').value;") == "ab"
    env.step(A.Action("KeyboardPress", "", "ctrl+a"))
    env.step(A.Action("Write", "", "Z", None))
    assert browser.js("return document.getElementById('tt').value;") == "Z"   # select-all then type
    _, _, info = env.step(A.Action("KeyboardPress", "", "hyperspace"))
    assert "unknown key" in info["error"]


def test_select_picks_the_option_and_the_page_accepts_it(browser):
    env, obs = _env(browser, "choose-list", seed=5)
    want = env.instruction.split("Select ")[1].split(" from the list")[0]
    sel = _centre_px(_el(obs, "options"))
    _, _, info = env.step(A.Action("Select", "", "no such option", sel))
    assert "has no option" in info["error"]
    _, _, info = env.step(A.Action("Select", "", want.upper(), sel))           # case folded
    assert info["error"] is None
    assert browser.js("var e = document.getElementById('options'); return e.options[e.selectedIndex].text;") == want
    obs, done, _ = env.step(A.Action("Click", "", None, _centre_px(_el(obs, role="button", text="Submit"))))
    assert done and env.success()


def test_scroll_moves_the_container_under_the_point(browser):
    env, obs = _env(browser, "scroll-text", seed=1)
    area = _centre_px(_el(obs, "text-area"))
    top = lambda: browser.js("return document.getElementById('text-area').scrollTop;")  # noqa: E731
    assert top() == 0
    _, _, info = env.step(A.Action("Scroll", "", "down", area))
    assert info["error"] is None and top() > 0
    down = top()
    env.step(A.Action("Scroll", "", "up", area))
    assert top() < down


def test_unusable_actions_are_noops_with_an_error(browser):
    env, obs = _env(browser, "click-test")
    for action, why in [("not a response", "no <answer>"), (A.Action("LongPress", "", None, (9, 9)), "not a web"),
                        (A.Action("Click", "", None, (999, 999)), "outside the screenshot")]:
        _, done, info = env.step(action)
        assert why in info["error"] and not done
    _, done, _ = env.step(A.Action("Terminate", "", "success"))
    assert done and not env.success()                                          # the page decides success


def test_restore_replays_an_episode_to_the_same_page(browser):
    env, obs = _env(browser, "enter-password", seed=7)
    for _ in range(2):
        obs, _, _ = env.step(env.expert_step().main.action, coord_space="unit")
    state = json.loads(json.dumps(env.state()))
    env.reset(seed=8, task="click-test")
    again = env.restore(state)
    assert again.elements == obs.elements and again.instruction == obs.instruction
    assert list(again.screenshot.getdata()) == list(obs.screenshot.getdata())


def test_a_click_renders_alike_in_a_fresh_browser_and_after_other_episodes(browser):
    """The pointer stays where an episode left it unless reset puts it back: it then hovered
    over the next page and one pixel of click-button's "Ok" button came out a grey level off,
    so a resumed online-RL run did not replay the pages of the run it resumed."""
    from guilibra_jax.envs.miniwob import Browser
    click = A.Action("Click", "", None, (30, 120))

    def clicked(b):
        env, _ = _env(b, "click-button", seed=1)
        return list(env.step(click, coord_space="resized_pixels", resized_size=(140, 196))[0].screenshot.getdata())
    def same() -> bool:
        fresh = Browser(scale=SCALE)
        try:
            first = clicked(fresh)
        finally:
            fresh.close()
        clicked(browser)     # leaves the pointer over the page of the next episode (without the reset)
        return clicked(browser) == first

    # Without the reset both comparisons differ (3 of 3 runs, checked). With it the pages are equal,
    # but now and then one pixel comes out a few grey levels off (one full-suite run at 441f651 and
    # one of three runs of this test alone; cause not established): a second comparison tells that
    # from a regression.
    assert same() or same()


def test_a_focused_field_renders_alike_whenever_it_is_captured(browser):
    """A text caret blinks on a timer (about 0.5 s on, 0.5 s off): two screenshots of one
    focused field differed by the caret's two pixel columns, so a restored online-RL source
    did not replay the pages it saved (CI caught it). The caret is held still, and drawn."""
    import time
    env, obs = _env(browser, "enter-text", seed=3)
    before = obs.screenshot
    obs, _, _ = env.step(A.Action("Click", "", None, _centre_px(_el(obs, "tt"))))
    shots = []
    for _ in range(8):                                   # 1.2 s: both phases of a blink
        shots.append(list(browser.screenshot().getdata()))
        time.sleep(0.15)
    assert all(s == shots[0] for s in shots)
    if browser.steady_caret_visible:                     # Chromium >= 139: the caret is still there
        assert shots[0] != list(before.getdata())


def test_experts_succeed_on_held_out_seeds(browser):
    from guilibra_jax.envs.export import heldout_task_seeds
    from guilibra_jax.envs.miniwob import TASKS, MiniWobEnv
    assert len(TASKS) >= 20
    failed = []
    for task in TASKS:
        env = MiniWobEnv(task, browser=browser, screenshots=False)
        for seed in heldout_task_seeds(2, seed=0, split_fraction=0.2):
            env.reset(seed=seed)
            while not env.done:
                env.step(env.expert_step().main.action, coord_space="unit")
            if not env.success():
                failed.append((task, seed, env.history))
    assert not failed


def test_record_demos_writes_native_and_sft_json_with_target_boxes(tmp_path, browser):
    from guilibra_jax import rewards as R
    from guilibra_jax.data import readers as RD
    from guilibra_jax.envs.export import load_records
    from guilibra_jax.envs.miniwob.record import record_demos
    m = record_demos(str(tmp_path), ("choose-list", "login-user"), episodes=3, seed=0, split_fraction=0.5,
                     browser=browser)
    assert m["per_task"]["choose-list"]["expert_success"] == 1.0
    recs = load_records(str(tmp_path / "train.jsonl")) + load_records(str(tmp_path / "test.jsonl"))
    assert len(recs) == m["records"]["train"] + m["records"]["test"] > 0
    for r in recs:
        assert r.platform == "web" and r.reasoning and r.target.bbox is not None
        assert R.point_in_box(r.target.point, r.target.bbox)
        assert r.target.action_type in ("Click", "Write", "Select")
    split = "train" if m["records"]["train"] else "test"
    sft = RD.open_source([str(tmp_path / f"{split}_sft.json")], "guilibra_sft")
    assert len(sft) == m["records"][split]
    first = load_records(str(tmp_path / f"{split}.jsonl"))[0]
    assert sft[0].target.action_type == first.target.action_type
    assert sft[0].target.point == pytest.approx(first.target.point, abs=1e-6)


def test_launch_eval_runs_agents_on_miniwob(tmp_path):
    from configs import eval_demo
    from guilibra_jax.eval.run import run_eval
    c = eval_demo.get_config()
    c.world = "miniwob"
    c.miniwob.tasks = ("click-test-2", "enter-text")
    c.online.episodes = 2
    c.online.save_trajectories = False
    c.agents = ("expert", "random_click")
    out = run_eval(c, str(tmp_path))
    assert out["summary"]["expert"]["online_macro_success"] == 1.0
    rep = json.load(open(tmp_path / "report.json"))
    assert [e["name"] for e in rep["entries"]] == ["expert", "random_click"]
    assert set(rep["entries"][0]["by_task"]) == {"click-test-2", "enter-text"}


def _label_response(label):
    return A.render_response(A.Action(label["action_type"], "", label["value"],
                                      None if label["point"] is None else A.from_unit(label["point"], "norm1000")))


def test_pool_steps_browsers_in_parallel_with_verifiable_step_rewards():
    from guilibra_jax.envs.miniwob.pool import EnvPool
    with EnvPool(2, coord_space="norm1000") as pool:
        res = pool.reset([("choose-list", 11), ("login-user", 12)])
        assert [r.task for r in res] == ["choose-list", "login-user"] and all(r.label for r in res)
        wrong = A.render_response(A.Action("Click", "", None, (999, 999)))
        res = pool.step([wrong, wrong])                       # off-target: verified and scored 0
        assert all(r.step_reward["accuracy"] == 0.0 and r.step_reward["format"] == 1.0 for r in res)
        state = pool.state()
        rewards = []
        from guilibra_jax import rewards as R
        rec = res[0].record()                                 # the state as a native record, label as target
        assert R.guilibra_reward(_label_response(res[0].label), rec.reward_target()).accuracy == 1.0
        assert rec.image_size == (160, 210) and rec.platform == "web"
        while not all(r.done for r in res):
            out = pool.step([None if r.done else _label_response(r.label) for r in res])
            rewards += [o.step_reward["accuracy"] for o in out if o is not None]
            res = [r if o is None else o for o, r in zip(out, res)]
        assert all(r.success for r in res) and rewards and all(a == 1.0 for a in rewards)
        again = pool.restore(state)                           # back to step 1 of both episodes
        assert [(r.task, r.seed, r.step, r.done) for r in again] == [("choose-list", 11, 1, False),
                                                                    ("login-user", 12, 1, False)]


@pytest.mark.slow
def test_sft_on_recorded_demos_then_the_checkpoint_plays_in_the_browser(tmp_path, browser):
    """configs/miniwob.py:smoke trains on recorded demos; the checkpoint agent then plays.
    Slow (minutes: a training compile and a generate compile); the default run covers the
    pieces: recording here, training in tests/train, the checkpoint agent in tests/eval."""
    import subprocess
    import sys
    from guilibra_jax.envs.miniwob.record import record_demos
    from guilibra_jax.eval import model_agent  # noqa: F401  (registers the "checkpoint" agent)
    from guilibra_jax.eval.agents import make_agent
    from guilibra_jax.eval.online_miniwob import evaluate_miniwob
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    demos = tmp_path / "demos"
    record_demos(str(demos), ("click-test", "enter-text"), episodes=4, seed=0, split_fraction=0.25, browser=browser)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    work = tmp_path / "sft"
    p = subprocess.run([sys.executable, "-m", "launch.train", "--config=configs/miniwob.py:smoke",
                        f"--workdir={work}", f"--config.data.train_files=('{demos}/train.jsonl',)",
                        f"--config.data.eval_files=('{demos}/test.jsonl',)"],
                       cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    agent = make_agent("checkpoint", workdir=str(work), max_new_tokens=48)
    out = evaluate_miniwob(agent, ("click-test",), 1, max_steps=2, coord_space=agent.coord_space,
                           resized_size=agent.resized_size, browser=browser)
    ep = out["episodes"][0]
    assert ep["task"] == "click-test" and 1 <= ep["steps"] <= 2     # a 4-step model: any outcome


def test_the_browser_resolves_no_host_name(browser):
    """Chromium's resolver maps every name to nothing: a web address gives Chromium's error
    page without any traffic leaving the machine; the task pages are file:// URLs."""
    from selenium.common.exceptions import WebDriverException
    browser.task = None                      # the next open() reloads the task page
    with pytest.raises(WebDriverException, match="ERR_NAME_NOT_RESOLVED"):
        browser.driver.get("http://example.com/")
