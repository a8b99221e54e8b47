"""Online rollouts, saved trajectories, the report, and the launch/eval.py entry point."""

import json
import os
import subprocess
import sys

import pytest
from PIL import Image

from configs import eval_demo
from guilibra_jax.eval.agents import AGENTS, make_agent, register_agent
from guilibra_jax.eval.online import evaluate_online
from guilibra_jax.eval.report import build_report, pearson, write_report

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_online_saves_trajectories_with_screenshots(tmp_path):
    res = evaluate_online(make_agent("expert"), ("desktop", "mobile"), episodes=3, out_dir=str(tmp_path))
    assert res["by_platform"]["desktop"]["success_rate"] == res["by_platform"]["mobile"]["success_rate"] == 1.0
    for ep in res["episodes"]:
        d = tmp_path / ep["task_id"]
        traj = json.loads((d / "trajectory.json").read_text())
        assert traj["success"] and len(traj["trajectory"]) == ep["steps"]
        assert all("<answer>" in s["response"] for s in traj["trajectory"])
        pngs = sorted(p for p in os.listdir(d) if p.endswith(".png"))
        assert len(pngs) == ep["steps"] + 1
        assert Image.open(d / pngs[0]).size == ((128, 96) if ep["platform"] == "desktop" else (96, 128))


def test_any_callable_is_an_agent():
    res = evaluate_online(lambda obs: "<answer>not json</answer>", ("mobile",), episodes=2, max_steps=3)
    assert res["overall"]["success_rate"] == 0.0
    assert all(e["steps"] == 3 for e in res["episodes"])


def test_registering_an_agent_is_one_function():
    name = "test-constant"

    @register_agent(name)
    def _make(**kw):
        return lambda obs: '<answer>{"action_type": "Terminate", "action_description": "stop", ' \
                           '"value": "success", "point_2d": [-100, -100]}</answer>'
    try:
        res = evaluate_online(make_agent(name), ("desktop",), episodes=2)
        assert all(e["steps"] == 1 for e in res["episodes"])
        with pytest.raises(ValueError):
            register_agent(name)(_make)
    finally:
        AGENTS.pop(name)
    with pytest.raises(KeyError, match="registered"):
        make_agent(name)


def _entry(name, off, on):
    plat = {"desktop": {"step_success": off, "action_type_accuracy": off}}
    return {"name": name, "offline": {"overall": {}, "by_platform": plat, "by_action_type": {}},
            "online": {"overall": {}, "by_platform": {"desktop": {"success_rate": on}}}}


def test_report_points_and_correlation(tmp_path):
    entries = [_entry("a", 0.1, 0.0), _entry("b", 0.5, 0.4), _entry("c", 0.9, 0.8)]
    rep = build_report(entries)
    assert [(p["name"], p["offline_step_success"], p["online_success"]) for p in rep["points"]] == \
        [("a", 0.1, 0.0), ("b", 0.5, 0.4), ("c", 0.9, 0.8)]
    assert rep["pearson_offline_vs_online"] == pytest.approx(1.0)
    assert pearson([0, 1, 2], [2, 1, 0]) == pytest.approx(-1.0) and pearson([1, 1, 1], [0, 1, 2]) is None
    js, png = write_report(str(tmp_path), entries)
    assert json.loads(open(js).read())["points"] and Image.open(png).format == "PNG"


def test_launch_eval_writes_the_report(tmp_path):
    cmd = [sys.executable, "-m", "launch.eval", "--config=configs/eval_demo.py:smoke", f"--workdir={tmp_path}"]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, timeout=300)
    rep = json.loads((tmp_path / "report.json").read_text())
    by_name = {c["name"]: c for c in rep["checkpoints"]}
    assert set(by_name) == {"expert", "random", "convention"}
    assert by_name["expert"]["offline"]["overall"]["step_success"] == 1.0
    assert by_name["expert"]["online"]["overall"]["success_rate"] == 1.0
    assert (tmp_path / "report.png").exists() and (tmp_path / "data" / "manifest.json").exists()
    assert os.listdir(tmp_path / "trajectories" / "random")
    cfg = eval_demo.get_config()
    assert cfg.agents == ("expert", "random", "convention")
