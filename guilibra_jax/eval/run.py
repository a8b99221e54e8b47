"""Offline + online evaluation of the configured agents, with a report (launch/eval.py).

Each agent in ``config.agents`` is one entry named for it, except the ``"checkpoint"``
agent with ``agent_kwargs.checkpoint.steps`` set: one entry ``checkpoint@<step>`` per
checkpoint of the run, in step order (``model_agent.checkpoint_sweep``: the model is
built once, only the parameters change), joined as one series in the report.

``config.world`` = "miniwob" plays MiniWoB++ tasks in headless Chromium instead (online
only: per-task and macro success; ``config.miniwob``; :mod:`eval.online_miniwob`).

Writes into the workdir: ``config.json`` (resolved), ``data/`` (when the config asks
for the world's dataset to be exported), ``offline_<entry>.json`` (full offline
metrics), ``online_<entry>.json`` (per-episode results), ``trajectories/<entry>/``
(screenshots and responses per episode), ``report.json`` and ``report.png``.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Callable, Iterator

from guilibra_jax import actions as A
from guilibra_jax.envs.export import export_dataset, load_records
from guilibra_jax.errors import ConfigError, UserError
from guilibra_jax.eval import agents as AG
from guilibra_jax.eval import endpoint_agent  # noqa: F401 (registers the "endpoint" agent)
from guilibra_jax.eval import model_agent  # also registers the "checkpoint" agent
from guilibra_jax.eval.offline import evaluate_offline
from guilibra_jax.eval.online import evaluate_online
from guilibra_jax.eval.report import write_report


def _screen_size(config) -> tuple[int, int] | None:
    w, h = int(config.screen_width), int(config.screen_height)
    if (w == 0) != (h == 0):
        raise ValueError(f"config.screen_width/screen_height: set both or neither, got {w}x{h}")
    return (w, h) if w else None


def resized_size_fn(config) -> Callable[[tuple[int, int]], tuple[int, int]] | None:
    """(w, h) -> the model's resized image size, for coord_space "resized_pixels"."""
    if config.coord_space != "resized_pixels":
        return None
    r = config.resize
    kw = {k: int(r[k]) for k in ("min_pixels", "max_pixels") if int(r[k]) > 0}
    return lambda size, platform=None: A.resized_size_for(size, r.family, **kw)


def _dataset(config, workdir: str) -> tuple[list, str]:
    d = config.data
    data_dir = d.dir
    if not data_dir:
        data_dir = os.path.join(workdir, "data")
        if not os.path.exists(os.path.join(data_dir, "manifest.json")):
            export_dataset(data_dir, tuple(config.platforms), d.n_tasks, d.seed, d.split_fraction,
                           _screen_size(config))
    path = os.path.join(data_dir, f"{d.split}.jsonl")
    if not os.path.exists(path):
        raise FileNotFoundError(f"config.data.dir={data_dir!r}: no {d.split}.jsonl there")
    return load_records(path), data_dir


def _agent_kwargs(config, name: str) -> dict[str, Any]:
    """Factories get ``fmt`` and ``coord_space`` (and ``resized_size``, a function of
    the image size, for "resized_pixels") unless agent_kwargs.<name> sets them."""
    kw = dict(config.agent_kwargs.get(name, {}) or {})
    kw.setdefault("fmt", config.response_format)
    kw.setdefault("coord_space", config.coord_space)
    resize = resized_size_fn(config)
    if resize is not None:
        kw.setdefault("resized_size", resize)
    return kw


def _agents(config) -> Iterator[tuple[str, Any, str | None]]:
    """(entry name, agent, report series) per entry, in order, each made when its turn
    comes: a checkpoint sweep is one series of ``checkpoint@<step>`` entries, any other
    agent one unconnected entry."""
    for name in config.agents:
        kw = _agent_kwargs(config, name)
        if name == "checkpoint" and kw.get("steps"):
            for agent in model_agent.checkpoint_sweep(**kw):
                yield f"{name}@{agent.step}", agent, name
        else:
            yield name, AG.make_agent(name, **kw), None


def _scoring_space(config, agent) -> tuple[str, Callable | None]:
    """The space an agent's GUI-Libra points are read in: its own ``coord_space`` /
    ``resized_size`` when it has them (a model answers in its training space; the
    built-in agents take the config's), else the eval config's."""
    if hasattr(agent, "coord_space"):
        return agent.coord_space, getattr(agent, "resized_size", None)
    return config.coord_space, resized_size_fn(config)


def _evaluate(config, workdir: str, name: str, agent, records, data_dir: str) -> dict[str, Any]:
    """Offline and online results of one entry, also written to its files."""
    space, resize = _scoring_space(config, agent)
    responses = AG.responses_for_records(agent, records, data_dir)
    offline = {**evaluate_offline(records, responses, space, resize), "coord_space": space}
    if hasattr(agent, "stats"):      # e.g. the endpoint agent's requests by outcome
        offline["requests"] = agent.stats()
    traj_dir = os.path.join(workdir, "trajectories", name) if config.online.save_trajectories else None
    online = evaluate_online(agent, tuple(config.platforms), config.online.episodes,
                             max_steps=config.online.max_steps, seed=config.data.seed,
                             split_fraction=config.data.split_fraction,
                             screen_size=_screen_size(config), coord_space=space,
                             resized_size=resize, out_dir=traj_dir)
    for kind, obj in (("offline", offline), ("online", online)):
        with open(os.path.join(workdir, f"{kind}_{name}.json"), "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=1)
    logging.info("%s: offline step success %s, online success %s", name,
                 _rate(offline["overall"]["step_success"]), _rate(online["overall"]["success_rate"]))
    return {"name": name, "offline": offline, "online": online}


WORLDS = ("synthetic", "miniwob")


def _run_eval_miniwob(config, workdir: str) -> dict[str, Any]:
    """Online success per MiniWoB++ task for each agent (``config.miniwob``; episodes from
    ``online.episodes``, held-out seeds from ``data.seed`` / ``data.split_fraction``).
    Writes ``online_<entry>.json`` and ``report.json`` (per-task and macro success)."""
    from guilibra_jax.envs import miniwob as MW
    from guilibra_jax.eval.online_miniwob import evaluate_miniwob
    reason = MW.available()
    if reason:
        raise UserError(f"config.world=miniwob: {reason}")
    m = config.miniwob
    tasks = tuple(m.tasks) or MW.TASKS
    unknown = sorted(set(tasks) - set(MW.TASKS))
    if unknown:
        raise ConfigError(f"config key miniwob.tasks has tasks without an expert: {unknown}; "
                          f"expected some of {list(MW.TASKS)}")
    browser = MW.Browser(scale=float(m.scale))
    summary, report = {}, {"world": "miniwob", "tasks": list(tasks), "entries": []}
    try:
        for name, agent, series in _agents(config):
            space, resize = _scoring_space(config, agent)
            traj_dir = os.path.join(workdir, "trajectories", name) if config.online.save_trajectories else None
            online = evaluate_miniwob(agent, tasks, config.online.episodes, seed=config.data.seed,
                                      split_fraction=config.data.split_fraction, max_steps=int(m.max_steps),
                                      coord_space=space, resized_size=resize, out_dir=traj_dir, browser=browser)
            with open(os.path.join(workdir, f"online_{name}.json"), "w", encoding="utf-8") as f:
                json.dump(online, f, indent=1)
            o = online["overall"]
            logging.info("%s: macro success %.3f over %d tasks", name, o["macro_success"], len(tasks))
            summary[name] = {"online_macro_success": o["macro_success"], "online_micro_success": o["micro_success"]}
            report["entries"].append({"name": name, "series": series, "seeds": online["seeds"],
                                      "seconds": online["seconds"], **o})
    finally:
        browser.close()
    path = os.path.join(workdir, "report.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    return {"report": path, "summary": summary}


def run_eval(config, workdir: str) -> dict[str, Any]:
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "config.json"), "w", encoding="utf-8") as f:
        f.write(config.to_json(indent=1))
    world = config.get("world", "synthetic")
    if world not in WORLDS:
        raise ConfigError(f"config key world = {world!r} is invalid: expected one of {WORLDS}")
    if world == "miniwob":
        return _run_eval_miniwob(config, workdir)
    records, data_dir = _dataset(config, workdir)
    entries = []
    for name, agent, series in _agents(config):
        entry = _evaluate(config, workdir, name, agent, records, data_dir)
        entries.append({**entry, "series": series} if series else entry)
    # checkpoint series joined in step order; the other agents are unrelated points
    json_path, png_path = write_report(workdir, entries, connect=False)
    return {"report": json_path, "plot": png_path,
            "summary": {e["name"]: {"offline_step_success": e["offline"]["overall"]["step_success"],
                                    "online_success": e["online"]["overall"]["success_rate"]}
                        for e in entries}}


def _rate(value) -> str:
    """A rate for the log: three decimals, or n/a (no episodes / steps evaluated)."""
    return "n/a" if value is None else f"{value:.3f}"
