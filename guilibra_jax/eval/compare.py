"""Paired comparison of two online evaluations of the same held-out episodes.

    compare_online(a, b)   # a, b: launch.eval's online_<agent>.json objects (synthetic or MiniWoB++)

Episodes are matched by (task or platform, task_id): launch.eval plays the first held-out
seeds of ``data.seed`` for every agent, so two runs with the same ``online.episodes`` and
tasks play the same episodes. The result is the success difference ``b - a`` over the
pairs with its paired bootstrap 95% interval, overall and per task (per platform in the
synthetic world). Two files whose episodes differ are an error that names what is missing
where: a comparison on a subset would read as one on the whole set.
"""

from __future__ import annotations

from typing import Any

from guilibra_jax.errors import UserError
from guilibra_jax.eval.stats import paired_bootstrap


def episode_outcomes(online: dict[str, Any], name: str = "online") -> dict[tuple[str, str], float]:
    """{(task or platform, task_id): success 0/1} of one online evaluation."""
    eps = online.get("episodes") if isinstance(online, dict) else None
    if not isinstance(eps, list):
        raise UserError(f"{name}: no 'episodes' list; expected an online_<agent>.json written by launch.eval")
    out = {}
    for i, e in enumerate(eps):
        try:
            key = (str(e.get("task") or e["platform"]), str(e["task_id"]))
            ok = float(bool(e["success"]))
        except (KeyError, TypeError, AttributeError) as err:
            raise UserError(f"{name}: episode {i} lacks {err}; expected task or platform, task_id, success") from None
        if key in out:
            raise UserError(f"{name}: episode {key[1]} ({key[0]}) appears twice")
        out[key] = ok
    return out


def compare_online(a: dict[str, Any], b: dict[str, Any], *, names: tuple[str, str] = ("a", "b"),
                   n_boot: int = 10_000, seed: int = 0) -> dict[str, Any]:
    """Success of ``b`` minus ``a`` on the same episodes, paired, overall and per group."""
    oa, ob = episode_outcomes(a, names[0]), episode_outcomes(b, names[1])
    for x, y, nx, ny in ((oa, ob, names[0], names[1]), (ob, oa, names[1], names[0])):
        missing = sorted(set(x) - set(y))
        if missing:
            shown = ", ".join(k[1] for k in missing[:5])
            raise UserError(f"{ny} lacks {len(missing)} of {nx}'s {len(x)} episodes ({shown}"
                            f"{', ...' if len(missing) > 5 else ''}): evaluate both with the same "
                            "online.episodes, data.seed and tasks")
    keys = sorted(oa)

    def summary(ks):
        xa, xb = [oa[k] for k in ks], [ob[k] for k in ks]
        d, lo, hi = paired_bootstrap(xa, xb, n_boot=n_boot, seed=seed)
        return {"pairs": len(ks), names[0]: sum(xa) / len(ks), names[1]: sum(xb) / len(ks),
                "difference": d, "interval95": [lo, hi]}

    groups = sorted({k[0] for k in keys})
    return {**summary(keys), "by_group": {g: summary([k for k in keys if k[0] == g]) for g in groups}}
