"""A checkpoint sweep (agent_kwargs.checkpoint.steps): one entry per checkpoint step, in
step order, each scored exactly as that step evaluated alone, joined as one series in
the report next to unconnected agents; the model is built once; bad steps are named."""

import json

import jax
import numpy as np
import pytest
from PIL import ImageDraw

from configs import eval_demo
from eval_fixtures import BATCH, N_NEW, STEP_SEEDS, doc_commands, parse_eval_flags
from guilibra_jax.eval import model_agent as MA
from guilibra_jax.eval.agents import make_agent
from guilibra_jax.eval.report import PLATFORM_COLORS, build_report, write_report
from guilibra_jax.eval.run import run_eval

STEPS = sorted(STEP_SEEDS)        # [1, 2, 3]


def eval_config(run, **checkpoint):
    config = eval_demo.get_config("smoke")
    config.agent_kwargs.checkpoint.update(dict(workdir=run.workdir, max_new_tokens=N_NEW, batch_size=BATCH,
                                               **checkpoint))
    config.data.n_tasks = run.config.data.synthetic.tasks
    config.platforms = ("desktop",)
    config.online.episodes = 1
    return config


def read(path):
    return json.loads(path.read_text())


def without_time(results):
    return {k: v for k, v in results.items() if k != "seconds"}     # online's wall time


def responses(traj_dir):
    """Every response of an entry's saved online episodes, in order."""
    return [s["response"] for ep in sorted(traj_dir.iterdir())
            for s in read(ep / "trajectory.json")["trajectory"]]


def test_a_sweep_scores_each_step_as_that_step_alone(run, tmp_path, monkeypatch):
    builds = []
    build_model = MA.MF.build_model
    monkeypatch.setattr(MA.MF, "build_model", lambda *a, **k: builds.append(1) or build_model(*a, **k))
    config = eval_config(run, steps=("all",))         # what --config.agent_kwargs.checkpoint.steps=all gives
    config.agents = ("expert", "checkpoint")
    out = run_eval(config, str(tmp_path / "sweep"))
    assert len(builds) == 1, "the sweep builds the model once; only the parameters change"
    names = [f"checkpoint@{s}" for s in STEPS]
    assert list(out["summary"]) == ["expert", *names]

    rep = read(tmp_path / "sweep" / "report.json")
    assert [(c["name"], c["series"]) for c in rep["checkpoints"]] == \
        [("expert", None)] + [(n, "checkpoint") for n in names]
    assert rep["series"] == {"checkpoint": names}                       # joined in step order
    assert {p["series"] for p in rep["points"] if p["name"] == "expert"} == {None}

    monkeypatch.undo()
    data_dir = str(tmp_path / "sweep" / "data")
    for step in STEPS:
        alone = tmp_path / f"alone{step}"
        config = eval_config(run, step=step)
        config.agents, config.data.dir = ("checkpoint",), data_dir
        run_eval(config, str(alone))
        for kind in ("offline", "online"):
            got = read(tmp_path / "sweep" / f"{kind}_checkpoint@{step}.json")
            assert without_time(got) == without_time(read(alone / f"{kind}_checkpoint.json"))
        assert responses(tmp_path / "sweep" / "trajectories" / f"checkpoint@{step}") == \
            responses(alone / "trajectories" / "checkpoint")
    # the steps' parameters differ, so equal results above are not equal by accident
    per_step = [responses(tmp_path / "sweep" / "trajectories" / n) for n in names]
    assert len({tuple(r) for r in per_step}) == len(STEPS)


def test_sweep_agents_share_the_model_and_hold_their_steps_params(run):
    agents = list(MA.checkpoint_sweep((3, 1), workdir=run.workdir, batch_size=BATCH))
    assert [a.step for a in agents] == [1, 3]
    for a in agents:
        assert a.graphdef is agents[0].graphdef and a.tokenizer is agents[0].tokenizer
        jax.tree.map(np.testing.assert_array_equal, a.params, run.step_params[a.step])
        assert all(x.devices() == {jax.devices()[0]} for x in jax.tree.leaves(a.params))   # as make_agent's


def test_bad_steps_are_named(run):
    def sweep(steps, **kw):
        return list(MA.checkpoint_sweep(steps, **{"workdir": run.workdir, **kw}))
    with pytest.raises(FileNotFoundError, match=r"checkpoint\.steps: no checkpoint step 7 .*complete steps there: "
                                                r"\[1, 2, 3\]"):
        sweep((2, 7))
    with pytest.raises(ValueError, match=r"agent_kwargs\.checkpoint\.steps=\('all',\): hf_path=.* no "
                                         r"checkpoint steps"):
        sweep(("all",), workdir="", hf_path=run.hf)
    with pytest.raises(ValueError, match=r"set step \(2\) or steps"):
        sweep((1,), step=2)
    with pytest.raises(ValueError, match=r"checkpoint\.steps: expected checkpoint steps \(ints\) or 'all'"):
        sweep(("latest",))
    with pytest.raises(ValueError, match=r"checkpoint\.steps=\(1,\) makes one agent per step"):
        make_agent("checkpoint", workdir=run.workdir, steps=(1,))
    with pytest.raises(FileNotFoundError, match=r"checkpoint\.steps: no checkpoint step 9"):
        make_agent("checkpoint", workdir=run.workdir, step=1).at_step(9)


def test_eval_demo_documents_a_sweep_that_launch_eval_parses():
    (sweep,) = [c for c in doc_commands() if any(a.startswith("--config.agent_kwargs.checkpoint.steps=")
                                                 for a in c)]
    agents, kw = parse_eval_flags(sweep)
    assert agents == ["expert", "checkpoint"] and kw["workdir"] and kw["steps"] == ["all"]
    base = [a for a in sweep if not a.startswith("--config.agent_kwargs.checkpoint.steps=")]
    _, kw = parse_eval_flags([*base, "--config.agent_kwargs.checkpoint.steps=(100,200,300)"])
    assert kw["steps"] == [100, 200, 300]     # the tuple form the docstring names


def _entry(name, off, on, **extra):
    plat = {"desktop": {"step_success": off, "action_type_accuracy": off}}
    return {"name": name, "offline": {"overall": {}, "by_platform": plat, "by_action_type": {}},
            "online": {"overall": {}, "by_platform": {"desktop": {"success_rate": on}}}, **extra}


def test_report_joins_each_series_in_order_and_leaves_agents_apart(tmp_path, monkeypatch):
    entries = [_entry("expert", 1.0, 1.0), _entry("ckpt@1", 0.1, 0.0, series="ckpt"),
               _entry("random", 0.0, 0.0), _entry("ckpt@2", 0.5, 0.4, series="ckpt"),
               _entry("ckpt@3", 0.9, 0.7, series="ckpt")]
    rep = build_report(entries, connect=False)
    assert rep["series"] == {"ckpt": ["ckpt@1", "ckpt@2", "ckpt@3"]}
    assert [c["series"] for c in rep["checkpoints"]] == [None, "ckpt", None, "ckpt", "ckpt"]
    assert rep["pearson_offline_vs_online"] is not None                  # over all points, as before
    lines = []
    line = ImageDraw.ImageDraw.line
    monkeypatch.setattr(ImageDraw.ImageDraw, "line", lambda self, xy, fill=None, width=0, **k:
                        (fill == PLATFORM_COLORS["desktop"] and lines.append(list(xy))) or
                        line(self, xy, fill=fill, width=width, **k))
    write_report(str(tmp_path), entries, connect=False)
    assert len(lines) == 1 and len(lines[0]) == 3                           # one polyline: the series,
    assert [x for x, _ in lines[0]] == sorted(x for x, _ in lines[0])       # in order (x: 0.1, 0.5, 0.9)
    # without series, connect=True still treats all entries as one run's checkpoints
    assert build_report([_entry("a", 0.1, 0.0), _entry("b", 0.5, 0.4)])["series"] == {"checkpoints": ["a", "b"]}
    assert build_report([_entry("a", 0.1, 0.0)], connect=False)["series"] == {}
