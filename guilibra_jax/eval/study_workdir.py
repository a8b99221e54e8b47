"""A study's folder: one subfolder per stage, each marked ``study_stage.json`` when it
finished, and ``study.json`` naming the study, so a study never resumes in (and writes
over) another study's folder."""

from __future__ import annotations

import json
import os

from guilibra_jax.errors import UserError

DONE = "study_stage.json"   # in a stage's folder once the stage finished
MARKER = "study.json"       # in the study's folder: {"study": name}


def claim_workdir(root: str, study: str, stage_names) -> None:
    """Record ``study`` in ``root/study.json``; a folder of another study (its marker, or,
    written before markers, a finished stage this study does not have) is a UserError."""
    path = os.path.join(root, MARKER)
    if os.path.exists(path):
        with open(path) as f:
            other = json.load(f).get("study")
        if other != study:
            raise UserError(f"--workdir={root} holds the {other!r} study ({path}); use another folder for "
                            f"--study={study}")
        return
    foreign = sorted(d for d in (os.listdir(root) if os.path.isdir(root) else ())
                     if os.path.exists(os.path.join(root, d, DONE)) and d not in stage_names)
    if foreign:
        raise UserError(f"--workdir={root} holds stages of another study ({', '.join(foreign)}); use another "
                        f"folder for --study={study}")
    os.makedirs(root, exist_ok=True)
    with open(path, "w") as f:
        json.dump({"study": study}, f)
