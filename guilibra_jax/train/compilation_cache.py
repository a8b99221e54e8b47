"""JAX's persistent compilation cache for training runs (``train.compilation_cache_dir``).

A resumed or repeated run loads its compiled programs from disk instead of compiling
them again (minutes for a large model on GPUs). ``"auto"`` (the default) keeps the
cache in ``WORKDIR/compilation_cache``: resumed runs and every process of a multi-host
run (the workdir is on shared storage) find it; a path shares one cache between runs;
``""`` turns it off. With ``JAX_COMPILATION_CACHE_DIR`` set in the environment, ``"auto"``
uses that folder instead (one cache for a cluster's jobs). JAX writes only programs that took at least
``jax_persistent_cache_min_compile_time_secs`` (1 s by default) to compile.

The cache is trusted code: do not point it at a folder others can write to.
"""

from __future__ import annotations

import logging
import os

import jax
from jax.experimental.compilation_cache import compilation_cache as cc

log = logging.getLogger(__name__)


def cache_dir_for_run(setting: str, workdir: str) -> str | None:
    """The cache folder ``train.compilation_cache_dir`` names for ``workdir`` (None: off)."""
    if not setting:
        return None
    if setting == "auto":
        if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
            return os.path.abspath(os.environ["JAX_COMPILATION_CACHE_DIR"])
        return os.path.join(os.path.abspath(workdir), "compilation_cache")
    return os.path.abspath(os.path.expanduser(setting))


def enable(setting: str, workdir: str) -> str | None:
    """Point JAX's persistent compilation cache at the run's folder (before the first
    compilation it should serve); returns the folder, or None when off."""
    path = cache_dir_for_run(setting, workdir)
    if path is None:
        return None
    os.makedirs(path, exist_ok=True)
    if jax.config.jax_compilation_cache_dir != path:
        cc.set_cache_dir(path)
        cc.reset_cache()        # a process that already used another folder switches to this one
        log.info("persistent compilation cache: %s", path)
    return path
