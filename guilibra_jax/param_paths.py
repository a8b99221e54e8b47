"""Parameter paths: each leaf of a parameter tree named by its '/'-joined path, the names
that ``optim.freeze`` / ``optim.lr_multipliers`` and ``model.lora.targets`` regexes match."""

from __future__ import annotations

import re
from typing import Any

import jax

from guilibra_jax.quantize import is_quantized


def param_paths(params: Any) -> Any:
    """Same tree as ``params`` with each leaf replaced by its '/'-joined path (a quantized
    kernel, :class:`quantize.QuantizedKernel`, is one leaf)."""
    def name(path, _):
        return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
    return jax.tree_util.tree_map_with_path(name, params, is_leaf=is_quantized)


def unmatched_patterns(params: Any, patterns) -> list[str]:
    """The regexes among ``patterns`` that match no parameter path of ``params``."""
    paths = jax.tree.leaves(param_paths(params))
    return [p for p in patterns if not any(re.search(p, path) for path in paths)]
