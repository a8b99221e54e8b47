"""Known label noise, to measure a filter: corrupt a share of clean records, curate, and
score the removals against what was corrupted.

Kinds of corruption (each keeps the record valid under the native schema):

* ``shift_point``: the label's point moves at least ``min_shift`` (unit space) away,
  staying on the screen (records with a point only);
* ``wrong_type``: another action type of the platform's GUI-Libra vocabulary, with a
  value and point of the kind that type takes.

:func:`as_sft_data` first strips what GUI-Libra's SFT data does not carry (element
boxes, alternative labels, tool calls), so that a match is decided by the point alone,
as it is for the data curation is meant for. :func:`filter_scores` gives precision and
recall of "removed" against "corrupted".
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from guilibra_jax import actions as A
from guilibra_jax.data import prompts as P
from guilibra_jax.data.native import StepRecord, StepTarget

KINDS = ("shift_point", "wrong_type")
_VALUES = {"Write": "hello world", "Select": "option two", "Scroll": "down", "Swipe": "up", "Answer": "forty two",
           "KeyboardPress": "enter", "Wait": "2", "OpenApp": "Calculator", "Terminate": "success"}


def as_sft_data(r: StepRecord, *, keep_reasoning: bool = True) -> StepRecord:
    """``r`` as GUI-Libra SFT data holds it: no boxes, alternatives or tool call."""
    t = dataclasses.replace(r.target, bbox=None, bbox2=None, tool_call=None)
    return dataclasses.replace(r, target=t, alternatives=(), reasoning=r.reasoning if keep_reasoning else None)


def shift_point(t: StepTarget, rng: np.random.Generator, min_shift: float = 0.25) -> StepTarget:
    """The target with its point moved >= ``min_shift`` away, inside [0.02, 0.98]^2."""
    x, y = t.point
    for _ in range(100):
        angle, dist = rng.uniform(0, 2 * math.pi), rng.uniform(min_shift, 2 * min_shift)
        nx, ny = x + dist * math.cos(angle), y + dist * math.sin(angle)
        if 0.02 <= nx <= 0.98 and 0.02 <= ny <= 0.98:
            return dataclasses.replace(t, point=(nx, ny))
    nx, ny = (0.02 if x > 0.5 else 0.98), (0.02 if y > 0.5 else 0.98)   # the far corner
    return dataclasses.replace(t, point=(nx, ny))


def wrong_type(t: StepTarget, platform: str, rng: np.random.Generator) -> StepTarget:
    """The target as another action type of ``platform``'s vocabulary."""
    choices = [a for a in A.PLATFORM_ACTION_TYPES[P.guilibra_platform(platform)] if a != t.action_type]
    new = str(rng.choice(choices))
    point = None
    if new in ("Click", "LongPress", "Select"):
        point = t.point if t.point is not None else (float(rng.uniform(0.1, 0.9)), float(rng.uniform(0.1, 0.9)))
    return dataclasses.replace(t, action_type=new, value=_VALUES.get(new), point=point, bbox=None, bbox2=None,
                               tool_call=None)


def corrupt(records: Sequence[StepRecord], fraction: float, *, kinds: Sequence[str] = KINDS, seed: int = 0,
            min_shift: float = 0.25) -> tuple[list[StepRecord], dict[int, str]]:
    """(records with ``fraction`` of them corrupted, {index: kind}). A record gets a
    kind it can take (``shift_point`` needs a point), chosen uniformly."""
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown or not kinds:
        raise ValueError(f"corruption kinds {list(kinds)}: expected a non-empty subset of {KINDS}")
    rng = np.random.default_rng(seed)
    n = int(round(fraction * len(records)))
    picked = sorted(rng.choice(len(records), size=n, replace=False).tolist()) if n else []
    out, done = list(records), {}
    for i in picked:
        r = records[i]
        ok = [k for k in kinds if k != "shift_point" or r.target.point is not None]
        if not ok:
            continue
        kind = str(rng.choice(ok))
        t = shift_point(r.target, rng, min_shift) if kind == "shift_point" else wrong_type(r.target, r.platform, rng)
        out[i] = dataclasses.replace(r, target=t)
        done[i] = kind
    return out, done


def filter_scores(removed: Iterable[int], corrupted: Mapping[int, str], ids: Iterable[int]) -> dict[str, Any]:
    """Precision and recall of removal as a detector of corruption over ``ids``:
    precision = corrupted share of the removed, recall = removed share of the corrupted
    (also per kind), and the share of clean records kept."""
    ids = list(ids)
    removed = set(removed) & set(ids)
    bad = {i for i in ids if i in corrupted}
    clean = len(ids) - len(bad)
    tp = len(removed & bad)
    out: dict[str, Any] = {
        "records": len(ids), "corrupted": len(bad), "removed": len(removed), "true_positives": tp,
        "precision": tp / len(removed) if removed else None,
        "recall": tp / len(bad) if bad else None,
        "clean_kept": (clean - len(removed - bad)) / clean if clean else None,
        "recall_by_kind": {},
    }
    for kind in sorted(set(corrupted.values())):
        mine = {i for i in bad if corrupted[i] == kind}
        out["recall_by_kind"][kind] = len(mine & removed) / len(mine) if mine else None
    return out


def write_corruption(path: str, corrupted: Mapping[int, str]) -> None:
    with open(path, "w") as f:
        json.dump({str(k): v for k, v in sorted(corrupted.items())}, f, indent=0)


def read_corruption(path: str) -> dict[int, str]:
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return {int(k): v for k, v in json.load(f).items()}
