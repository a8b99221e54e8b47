"""Composable sample-level stages: the reasoning / direct-action mix, RL subset
rebalancing, per-process sharding. Each works on the record metadata
(:meth:`readers.StepSource.meta`) and returns an index, so the grain pipeline stays a
plain ``MapDataset`` over a fixed list of (record, variant) pairs: deterministic for
any number of workers and cheap to checkpoint.
"""

from __future__ import annotations

import collections
from typing import Any, Mapping, Sequence

import numpy as np

from guilibra_jax.data.readers import RecordMeta
from guilibra_jax.data.samples import DIRECT_VARIANT, REASONING_VARIANT


def mix_index(metas: Sequence[RecordMeta | None], mix: str | float = "both", seed: int = 0) -> np.ndarray:
    """[S, 2] (record index, variant) pairs.

    mix: "both" (default, 1:1: a record with reasoning yields its reasoning sample and
    its direct-action twin), "reasoning" (the reasoning sample where there is one),
    "direct" (direct-action only), or p in [0, 1] (each record with reasoning yields
    the reasoning sample with probability p, else its twin; seeded). Records without
    reasoning, and records whose metadata cannot be read (they are counted as bad
    when read), always yield one direct sample.
    """
    rng = np.random.default_rng(seed)
    out: list[tuple[int, int]] = []
    if isinstance(mix, str) and mix not in ("both", "reasoning", "direct"):
        try:
            mix = float(mix)
        except ValueError:
            raise ValueError(f"mix must be 'both', 'reasoning', 'direct' or a probability, got {mix!r}") from None
    if not isinstance(mix, str) and not 0.0 <= float(mix) <= 1.0:
        raise ValueError(f"mix probability must lie in [0, 1], got {mix}")
    for i, m in enumerate(metas):
        has = m is not None and m.has_reasoning
        if not has or mix == "direct":
            out.append((i, DIRECT_VARIANT))
        elif mix == "both":
            out.extend([(i, REASONING_VARIANT), (i, DIRECT_VARIANT)])
        elif mix == "reasoning":
            out.append((i, REASONING_VARIANT))
        else:
            out.append((i, REASONING_VARIANT if rng.random() < float(mix) else DIRECT_VARIANT))
    return np.asarray(out, np.int64).reshape(-1, 2)


def _step_bucket(step: int, cap: int = 5) -> str:
    return str(step) if step < cap else f"{cap}+"


def distribution(metas: Sequence[RecordMeta | None], indices: Sequence[int] | None = None) -> dict[str, Any]:
    """Counts by platform, source and step (steps >= 5 pooled) of the selected records."""
    idx = range(len(metas)) if indices is None else indices
    plat, src, step = collections.Counter(), collections.Counter(), collections.Counter()
    n = 0
    for i in idx:
        m = metas[i]
        if m is None:
            continue
        n += 1
        plat[m.platform] += 1
        src[m.source] += 1
        step[_step_bucket(m.step)] += 1
    return {"n": n, "platform": dict(sorted(plat.items())), "source": dict(sorted(src.items())),
            "step": dict(sorted(step.items(), key=lambda kv: (len(kv[0]), kv[0])))}


def rebalance(metas: Sequence[RecordMeta | None], *, step_keep: Mapping[int, float] | None = None,
              max_share: Mapping[str, float] | None = None, domain_key: str = "platform",
              seed: int = 0) -> tuple[np.ndarray, dict[str, Any]]:
    """GUI-Libra's RL subset: down-sample early steps and over-represented domains.

    step_keep: keep probability per step index, e.g. {0: 0.3, 1: 0.6} (unlisted: 1).
    max_share: the largest share a domain may hold after rebalancing, e.g.
    {"mobile": 0.5}; its records are down-sampled uniformly to reach it.
    domain_key: the metadata field that names the domain ("platform" or "source").
    Returns (sorted kept record indices, {"before": distribution, "after": distribution}).
    Records without metadata are kept (they are counted as bad when read).
    """
    rng = np.random.default_rng(seed)
    step_keep = dict(step_keep or {})
    kept = [i for i, m in enumerate(metas)
            if m is None or rng.random() < float(step_keep.get(m.step, 1.0))]
    for dom, share in (max_share or {}).items():
        if not 0.0 < share < 1.0:
            raise ValueError(f"max_share[{dom!r}] must lie in (0, 1), got {share}")
        mine = [i for i in kept if metas[i] is not None and getattr(metas[i], domain_key) == dom]
        others = len(kept) - len(mine)
        allowed = int(share * others / (1.0 - share))
        if len(mine) > allowed:
            keep_mine = set(rng.choice(np.asarray(mine), size=allowed, replace=False).tolist())
            mine_set = set(mine)
            kept = [i for i in kept if i not in mine_set or i in keep_mine]
    kept_arr = np.asarray(sorted(kept), np.int64)
    return kept_arr, {"before": distribution(metas), "after": distribution(metas, kept_arr)}


def shard(index: np.ndarray, shard_index: int, shard_count: int, equalize: bool = True) -> np.ndarray:
    """Rows ``shard_index::shard_count`` of ``index``; with ``equalize`` every shard gets
    the same count (the last ``len % shard_count`` rows are left out), so all processes
    run the same number of steps."""
    if not 0 <= shard_index < shard_count:
        raise ValueError(f"shard_index {shard_index} must lie in [0, shard_count={shard_count})")
    n = (len(index) // shard_count) * shard_count if equalize else len(index)
    return index[:n][shard_index::shard_count]
