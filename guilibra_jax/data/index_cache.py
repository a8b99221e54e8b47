"""On-disk cache of reader indexes (byte offsets of a JSON array's elements, a parquet
file's row groups), so that a large file is scanned once, not once per run.

An index is a few numpy arrays stored in ``<cache dir>/<kind>-<hash of the path>.npz``
with the data file's absolute path, size and modification time (ns) and the index
format's version: a file that changed (size or mtime) or a new index format rebuilds
it. Writes are atomic (temporary file + rename), so processes or hosts sharing the
cache folder may build the same index at once.

Cache folder: ``cache_dir`` when a reader is given one, else ``$GUILIBRA_JAX_INDEX_CACHE``,
else ``$XDG_CACHE_HOME/guilibra_jax/index`` (``~/.cache/guilibra_jax/index``). When the
folder cannot be written the index is built in memory and a warning says so.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from typing import Callable, Mapping

import numpy as np

log = logging.getLogger(__name__)

CACHE_ENV = "GUILIBRA_JAX_INDEX_CACHE"
_KEY = "__key__"


def default_cache_dir() -> str:
    """The folder indexes are cached in when a reader is given none."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return os.path.abspath(os.path.expanduser(env))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "guilibra_jax", "index")


def file_key(path: str, kind: str, version: int) -> dict:
    """What an index of ``path`` is valid for: path, size, mtime (ns), kind, version."""
    st = os.stat(path)
    return {"path": os.path.abspath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "kind": kind, "version": int(version)}


def cache_path(path: str, kind: str, cache_dir: str | None = None) -> str:
    """Where the ``kind`` index of ``path`` is cached."""
    digest = hashlib.sha1(os.path.abspath(path).encode("utf-8")).hexdigest()[:20]
    return os.path.join(cache_dir or default_cache_dir(), f"{kind}-{digest}.npz")


def _load(cpath: str, key: dict) -> dict[str, np.ndarray] | None:
    try:
        with np.load(cpath, allow_pickle=False) as z:
            if _KEY not in z.files or json.loads(str(z[_KEY])) != key:
                return None
            return {k: z[k] for k in z.files if k != _KEY}
    except (OSError, ValueError, KeyError, json.JSONDecodeError):
        return None


def _save(cpath: str, key: dict, arrays: Mapping[str, np.ndarray]) -> None:
    folder = os.path.dirname(cpath)
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".npz", dir=folder)
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, **{_KEY: np.asarray(json.dumps(key, sort_keys=True))}, **arrays)
            os.replace(tmp, cpath)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
    except OSError as e:
        log.warning("cannot cache the index of %s in %s (%s); it is rebuilt by every run. "
                    "Set %s to a writable folder.", key["path"], folder, e, CACHE_ENV)


def cached_arrays(path: str, kind: str, version: int, build: Callable[[], Mapping[str, np.ndarray]],
                  cache_dir: str | None = None) -> tuple[dict[str, np.ndarray], bool]:
    """(arrays, from_cache): the ``kind`` index of ``path``, loaded from the cache when it
    matches the file's size and mtime and ``version``, else ``build()`` and stored."""
    key = file_key(path, kind, version)
    key_json = json.loads(json.dumps(key, sort_keys=True))
    cpath = cache_path(path, kind, cache_dir)
    got = _load(cpath, key_json)
    if got is not None:
        return got, True
    arrays = {k: np.asarray(v) for k, v in build().items()}
    if file_key(path, kind, version) == key:  # the file did not change while we scanned it
        _save(cpath, key_json, arrays)
    return arrays, False
