"""Small statistics of evaluation results: Wilson score intervals, Spearman's rank
correlation and a paired bootstrap of a difference (pure functions, no scipy)."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from guilibra_jax.eval.report import pearson

Z95 = 1.959963984540054     # the standard normal's 97.5% quantile


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval (default 95%) of a success rate ``successes / n``;
    (0, 1) when ``n`` is 0."""
    if n <= 0:
        return 0.0, 1.0
    if not 0 <= successes <= n:
        raise ValueError(f"wilson: {successes} successes out of {n}")
    p = successes / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def ranks(xs: Sequence[float]) -> list[float]:
    """1-based ranks, ties given their average rank."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    out = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman's rho (Pearson's r of the tie-averaged ranks); None for fewer than 3
    points or a constant side."""
    if len(xs) != len(ys):
        raise ValueError(f"spearman: {len(xs)} x values but {len(ys)} y values")
    return pearson(ranks(xs), ranks(ys))


def _resamples(n: int, n_boot: int, seed: int):
    """``n_boot`` bootstrap index rows over ``n`` pairs, 1,000 at a time (the whole
    [n_boot, n] index array is 96 MB at 10,000 x 1,200)."""
    rng = np.random.default_rng(seed)
    for i in range(0, n_boot, 1000):
        yield rng.integers(0, n, size=(min(1000, n_boot - i), n))


def paired_bootstrap(a: Sequence[float], b: Sequence[float], n_boot: int = 10_000, seed: int = 0,
                     level: float = 0.95) -> tuple[float, float, float]:
    """The mean of ``b - a`` over paired outcomes (one task seed played by both models) and
    its percentile bootstrap interval (pairs resampled together, ``n_boot`` draws)."""
    if len(a) != len(b):
        raise ValueError(f"paired_bootstrap: {len(a)} outcomes against {len(b)}")
    if not len(a):
        raise ValueError("paired_bootstrap: no paired outcomes")
    d = np.asarray(b, np.float64) - np.asarray(a, np.float64)
    means = np.concatenate([d[idx].mean(axis=1) for idx in _resamples(len(d), n_boot, seed)])
    tail = (1 - level) / 2
    return float(d.mean()), float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))


def paired_ratio_bootstrap(a: Sequence[float], b: Sequence[float], n_boot: int = 10_000, seed: int = 0,
                           level: float = 0.95) -> tuple[float, float, float]:
    """mean(a) / mean(b) over paired outcomes (one held-out step scored for both models: a
    student and its teacher) and its percentile bootstrap interval (pairs resampled together;
    draws whose mean(b) is 0 are dropped)."""
    if len(a) != len(b):
        raise ValueError(f"paired_ratio_bootstrap: {len(a)} outcomes against {len(b)}")
    x, y = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if not len(x) or not y.mean():
        raise ValueError("paired_ratio_bootstrap: no paired outcomes, or mean(b) = 0")
    parts = []
    for idx in _resamples(len(x), n_boot, seed):
        num, den = x[idx].mean(axis=1), y[idx].mean(axis=1)
        parts.append(num[den > 0] / den[den > 0])
    ratios = np.concatenate(parts)
    tail = (1 - level) / 2
    return float(x.mean() / y.mean()), float(np.quantile(ratios, tail)), float(np.quantile(ratios, 1 - tail))


def spearman_difference(pos: Sequence[tuple[np.ndarray, np.ndarray]], neg: Sequence[tuple[np.ndarray, np.ndarray]],
                        n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> dict:
    """How much better offline scores rank online ones in the ``pos`` runs than in the
    ``neg`` runs. Each run is (offline [checkpoints, steps], online [checkpoints, episodes])
    of 0/1 outcomes, every run scored on the same held-out steps and episodes (columns
    aligned). A run's rho is Spearman's between its checkpoints' offline and online rates;
    the difference is mean rho over ``pos`` minus mean rho over ``neg``, with a percentile
    bootstrap interval that resamples steps and episodes (the same draw for every run and
    checkpoint: the measurement noise of the scores, checkpoints fixed). Draws where a run's
    rho is undefined (a constant side) are dropped and counted."""
    runs = [(np.asarray(o, np.float64), np.asarray(e, np.float64)) for o, e in (*pos, *neg)]
    n_off, n_on = runs[0][0].shape[1], runs[0][1].shape[1]
    if any(o.shape[1] != n_off or e.shape[1] != n_on for o, e in runs):
        raise ValueError("spearman_difference: every run must be scored on the same steps and episodes")

    def diff(i_off, i_on):
        rhos = [spearman(list(o[:, i_off].mean(1)), list(e[:, i_on].mean(1))) for o, e in runs]
        if any(r is None for r in rhos):
            return None, rhos
        return float(np.mean(rhos[:len(pos)]) - np.mean(rhos[len(pos):])), rhos

    d, rhos = diff(np.arange(n_off), np.arange(n_on))
    rng = np.random.default_rng(seed)
    draws = [diff(rng.integers(0, n_off, n_off), rng.integers(0, n_on, n_on))[0] for _ in range(n_boot)]
    kept = np.array([x for x in draws if x is not None])
    tail = (1 - level) / 2
    lo, hi = (float(np.quantile(kept, tail)), float(np.quantile(kept, 1 - tail))) if len(kept) else (None, None)
    return {"difference": d, "ci95": [lo, hi], "rho": rhos, "draws": n_boot, "undefined_draws": n_boot - len(kept)}
