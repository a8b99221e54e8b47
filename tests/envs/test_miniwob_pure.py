"""MiniWoB++ pieces that need no browser: action mapping, DOM flattening, the episode
schedule, and the launcher's one-line error when Chromium is missing."""

import os
import subprocess
import sys

import pytest

from guilibra_jax import actions as A
from guilibra_jax.envs.export import heldout_task_seeds, task_split
from guilibra_jax.envs.miniwob import dom as D
from guilibra_jax.envs.miniwob import executor as X
from guilibra_jax.envs.miniwob.pool import EpisodeSchedule

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_select_is_one_operation_on_the_element_under_the_point():
    ev = X.web_events(A.Action("Select", "", "Bob", (80, 105)), coord_space="pixels", image_size=(160, 210))
    assert [(e.kind, e.point, e.text) for e in ev] == [("select", (0.5, 0.5), "Bob")]


def test_write_at_a_point_clicks_then_replaces_and_without_point_types_at_focus():
    ev = X.web_events(A.Action("Write", "", "hi", (500, 500)), coord_space="norm1000")
    assert [(e.kind, e.point, e.text) for e in ev] == [("click", (0.5, 0.5), None), ("type", (0.5, 0.5), "hi")]
    ev = X.web_events(A.Action("Write", "", "hi", None))
    assert [(e.kind, e.point, e.text) for e in ev] == [("type", None, "hi")]


@pytest.mark.parametrize("action", [A.Action("LongPress", "", None, (1, 1)), A.Action("NavigateBack"),
                                    A.Action("OpenApp", "", "Mail"), A.Action("Swipe", "", "up", (5, 5))])
def test_mobile_actions_are_noops_on_the_web(action):
    ev = X.web_events(action, coord_space="pixels", image_size=(160, 210))
    assert [e.kind for e in ev] == ["noop"] and "not a web action" in ev[0].text


def test_key_combos_map_to_webdriver_codes():
    pytest.importorskip("selenium", reason="selenium is in the optional [miniwob] extra")
    from selenium.webdriver.common.keys import Keys
    assert X.webdriver_keys("ctrl+a") == [Keys.CONTROL, "a"]
    assert X.webdriver_keys("enter") == [Keys.ENTER]
    assert X.webdriver_keys("hyperspace") is None


def test_flatten_scales_and_clips_boxes_to_the_task_region():
    root = {"tag": "BODY", "left": 0, "top": 0, "width": 500, "height": 210, "children": [
        {"tag": "BUTTON", "ref": 4, "id": "b", "text": "OK", "left": 150, "top": 200, "width": 40, "height": 20,
         "children": []},
        {"tag": "DIV", "ref": 5, "left": 300, "top": 0, "width": 10, "height": 10, "children": []}]}
    els = D.flatten(root, scale=2.0)
    assert [e["id"] for e in els] == [4]                  # body dropped; the div lies outside the task
    assert els[0]["css"] == (150.0, 200.0, 160.0, 210.0)  # clipped to 160 x 210
    assert els[0]["box"] == (300.0, 400.0, 320.0, 420.0)
    assert els[0]["box_unit"] == pytest.approx((150 / 160, 200 / 210, 1.0, 1.0), abs=1e-6)


def test_schedule_never_yields_a_heldout_seed_and_resumes_exactly():
    s = EpisodeSchedule(["a", "b", "c"], seed=0, split_fraction=0.2)
    first = [next(s) for _ in range(30)]
    held = set(heldout_task_seeds(50, 0, 0.2))
    assert all(task_split(seed, 0.2) == "train" and seed not in held for _, seed in first)
    assert [t for t, _ in first[:6]] == ["a", "b", "c", "a", "b", "c"]
    assert len({seed for _, seed in first}) == 10          # one seed per round of the three tasks
    state = s.state()
    cont = [next(s) for _ in range(7)]
    resumed = EpisodeSchedule(["a", "b", "c"], seed=0, split_fraction=0.2)
    resumed.set_state(state)
    assert [next(resumed) for _ in range(7)] == cont


def test_record_demos_says_in_one_line_what_is_missing(tmp_path):
    env = {**os.environ, "MINIWOB_CHROME_BINARY": str(tmp_path / "no-chromium"),
           "MINIWOB_CHROMEDRIVER": str(tmp_path / "no-chromedriver")}
    p = subprocess.run([sys.executable, "-m", "launch.record_demos", "--world=miniwob", f"--out={tmp_path}/o"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    line = p.stderr.strip().splitlines()[-1]
    assert line.startswith("error:") and ("chromedriver" in line or "[miniwob]" in line)


def test_miniwob_recipes_validate_and_name_real_model_sizes():
    from configs import miniwob
    from guilibra_jax.models.config import named_config
    from guilibra_jax.train.config import validate
    for arg in ("cpu", "smoke", "qwen2_5_vl_3b", "qwen3_vl_4b"):
        c = miniwob.get_config(arg)
        validate(c, planning=True)   # the demos are recorded by an earlier command
        assert c.data.train_files and c.data.method == "guilibra"
    for arg, family in (("qwen2_5_vl_3b", "qwen2_5_vl"), ("qwen3_vl_4b", "qwen3_vl")):
        c = miniwob.get_config(arg)
        assert c.model.tiny.family == family and named_config(c.model.name).family == family
    with pytest.raises(ValueError, match="unknown recipe"):
        miniwob.get_config("qwen9")
