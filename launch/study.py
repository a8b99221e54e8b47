"""Reproduce a paper's comparison on the synthetic world in one command:

    python -m launch.study --study=mopd --workdir=runs/study_mopd [--smoke]
    python -m launch.study --study=guilibra --workdir=runs/study_guilibra [--smoke]
    python -m launch.study --study=distill --workdir=runs/study_distill [--smoke]
    python -m launch.study --study=grpo --workdir=runs/study_grpo [--smoke]

A thin driver over the trainers (``launch.train``), ``launch.merge`` and ``launch.eval``:
the stages and their configs are the recipe ``configs/study_<study>.py`` (its
``plan()``); each stage runs in its own folder ``WORKDIR/<stage>`` with the library
calls those launchers make, in this one process. A stage that finished leaves
``study_stage.json`` there and is skipped by a rerun; an interrupted training stage
resumes from its latest checkpoint (the trainer's own resume), an interrupted merge or
evaluation starts again. When every stage is done the study writes ``results.json``,
``report.md`` and PNG figures into WORKDIR (``guilibra_jax.eval.study_report``).
``--smoke`` runs every stage for a couple of steps (tests). A stage's ``config`` may be a
function, called when the stage runs (a config chosen from earlier stages' results); a
``call`` stage runs a function of the recipe (e.g. choosing a sweep's arm). The workdir
records its study (``study.json``): another study's workdir is refused.
"""

from guilibra_jax.train import distributed

if __name__ == "__main__":
    distributed.reexec_with_hugepages()   # malloc in huge pages (glibc tunable, read at start-up)

import importlib
import json
import logging
import os
import time

from absl import flags

from guilibra_jax.eval.study_workdir import DONE, claim_workdir
from launch import cli, recipes

__doc__ += recipes.help_text("study")

STUDIES = ("mopd", "guilibra", "distill", "grpo")
_STUDY = flags.DEFINE_enum("study", None, list(STUDIES), "Which comparison: mopd (UI-MOPD's table), guilibra "
                           "(GUI-Libra's ablations), distill (on-policy distillation against its teachers) or "
                           "grpo (GRPO from an SFT start on dataset prompts and on live episodes).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Study folder: one subfolder per stage, the report.")
_SMOKE = flags.DEFINE_bool("smoke", False, "Every stage for a couple of steps, tiny evaluations (tests).")
_ONLY = flags.DEFINE_list("stages", None, "Run only these stages (and write no report); default: all.")
flags.mark_flags_as_required(["study", "workdir"])

LOG = "study_log.jsonl"


def _train(config, workdir: str) -> None:
    """What ``launch.train`` does with a config: validate, then the method's trainer."""
    import jax

    from guilibra_jax.errors import UserError
    from guilibra_jax.train import config as run_config
    from guilibra_jax.train.run import train

    run_config.validate(config)
    run_config.validate(config, jax.device_count(), jax.process_count())
    train(config, workdir)
    if config.train.export and not os.path.exists(os.path.join(config.train.export_dir or
                                                               os.path.join(workdir, "export"), "config.json")):
        raise UserError(f"stage {workdir}: the run stopped before its last step (no export); rerun the study to "
                        f"resume it")


def run_stage(stage: dict, root: str) -> dict:
    """Run ``stage`` (one entry of the recipe's plan) in ``root/<name>`` unless it is done."""
    from guilibra_jax.errors import UserError

    workdir = os.path.join(root, stage["name"])
    marker = os.path.join(workdir, DONE)
    if os.path.exists(marker):
        logging.info("study: %s done earlier, skipped", stage["name"])
        with open(marker) as f:
            return json.load(f)
    logging.info("study: %s (%s) ...", stage["name"], stage["kind"])
    t0 = time.time()
    if stage["kind"] == "train":
        config = stage["config"]
        _train(config() if callable(config) else config, workdir)
    elif stage["kind"] == "call":
        os.makedirs(workdir, exist_ok=True)
        stage["call"]()
    elif stage["kind"] == "merge":
        from guilibra_jax.train.merge import merge_folders
        merge_folders(stage["method"], stage["inputs"], workdir, weights=stage.get("weights"),
                      base=stage.get("base", ""), density=stage.get("density", 0.2))
    elif stage["kind"] == "eval":
        from guilibra_jax.eval.run import run_eval
        run_eval(stage["config"], workdir)
    else:
        raise UserError(f"study plan: stage {stage['name']!r} has unknown kind {stage['kind']!r}")
    done = {"stage": stage["name"], "kind": stage["kind"], "seconds": round(time.time() - t0, 1)}
    with open(marker, "w") as f:
        json.dump(done, f)
    with open(os.path.join(root, LOG), "a") as f:
        f.write(json.dumps({**done, "finished": time.strftime("%Y-%m-%dT%H:%M:%S")}) + "\n")
    logging.info("study: %s finished in %.0f s", stage["name"], done["seconds"])
    return done


def run_study(study: str, root: str, smoke: bool = False, only: list[str] | None = None) -> dict | None:
    """Every stage of ``configs/study_<study>.py`` in order, then the report (None when
    ``only`` names a subset of the stages)."""
    from guilibra_jax.errors import UserError
    from guilibra_jax.eval.study_report import REPORTS

    if study not in STUDIES:
        raise UserError(f"--study={study!r} is invalid: expected one of {STUDIES}")
    module = importlib.import_module(f"configs.study_{study}")
    root = os.path.abspath(root)
    stages = module.plan(root, smoke)
    names = [s["name"] for s in stages]
    claim_workdir(root, study, names)
    unknown = sorted(set(only or ()) - set(names))
    if unknown:
        raise UserError(f"--stages: {unknown} are not stages of the {study} study: {names}")
    for stage in stages:
        if only is None or stage["name"] in only:
            run_stage(stage, root)
    if only is not None:
        return None
    return REPORTS[study](root, module)


def main(argv):
    del argv
    logging.getLogger().setLevel(logging.INFO)
    for noisy in ("absl", "orbax", "jax", "grain"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    results = run_study(_STUDY.value, _WORKDIR.value, _SMOKE.value, _ONLY.value)
    if results is not None:
        print(os.path.join(os.path.abspath(_WORKDIR.value), "report.md"))


if __name__ == "__main__":
    cli.run(main)
