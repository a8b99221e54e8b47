"""Outputs that appear whole or not at all: exports, merges, converted data.

    with writing_folder(out) as tmp:     # an export, a merge: write every file into tmp
        ...
    with writing_file(path) as tmp:      # a converted data file
        ...
    check_complete(path, "model.hf_path")   # readers of model folders

**Folders.** Written into a temporary sibling ``<out>.tmp-<pid>`` that holds, from its
first moment, the sentinel ``guilibra_incomplete.json`` (the writer's host, pid and
start, and the folder it is for). When every file is written (and flushed to disk), the
sentinel gives way to the completion marker ``guilibra_complete.json`` (each file's
size), and the folder is renamed to ``<out>``; an older ``<out>`` is first renamed to
``<out>.old-<pid>`` and deleted after. A kill at any moment leaves the old complete
``<out>`` (or, between the two renames, none, the old one kept as ``.old-<pid>``) and a
``.tmp-<pid>`` folder, which the next writer of ``<out>`` on this machine removes once
its process is gone. An existing ``<out>`` is replaced only when it looks like a model
folder (empty, or flat with a ``config.json`` or our marker): a ``--out`` naming a
workdir or a data folder is an error, not a deletion. An ``<out>`` that is a symbolic link
is written next to the folder it points to (the link stays).

**Readers** (:func:`check_complete`) refuse, with one line naming the folder: a
``.tmp-<pid>`` folder; a folder holding the sentinel (a temporary folder renamed or
copied by hand); a folder whose completion marker lists a file that is missing or has
another size (a partial copy); and a missing folder next to which a ``.tmp-<pid>`` is
left (naming it). A folder with neither sentinel nor marker (``save_pretrained`` of
transformers, a Hub snapshot, an export of an older version) is not ours to judge and
loads as before.

**Files** (converted data): written as ``<path>.tmp-<pid>`` and renamed to ``<path>``
when complete, so the name appears only on a complete file; the readers' patterns
(``*.jsonl``, ``*.json``, ``*.parquet``) never match a temporary name. Outputs made of
several files (a GUI-Libra SFT JSON and its images folder) are published with
:func:`publish_together`: the main file is removed first and renamed into place last.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import shutil
import time

from guilibra_jax import process_id as P
from guilibra_jax.errors import UserError

INCOMPLETE = "guilibra_incomplete.json"
COMPLETE = "guilibra_complete.json"
TMP = re.compile(r"\.tmp-(\d+)$")


def temp_name(path: str) -> str:
    return f"{path}.tmp-{os.getpid()}"


def _fsync(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:   # a directory on a file system that cannot sync one
        pass
    finally:
        os.close(fd)


def _clean(path: str) -> str:
    return os.path.normpath(os.fspath(path))


# ----------------------------------------------------------------------------- folders

def check_replaceable(out: str, flag: str = "--out") -> None:
    """UserError unless ``out`` is absent or looks like a model folder (module docstring)."""
    out = _clean(out)
    if not os.path.lexists(out):
        return
    if not os.path.isdir(out):
        raise UserError(f"{flag}: {out} exists and is not a folder: refusing to replace it")
    names = os.listdir(out)
    subdirs = [n for n in names if os.path.isdir(os.path.join(out, n))]
    if names and (subdirs or not ({"config.json", COMPLETE} & set(names))):
        what = f"it holds the folder {subdirs[0]}/" if subdirs else "it has no config.json"
        raise UserError(f"{flag}: {out} exists and is not a model folder ({what}): refusing to replace it with "
                        f"the output; give another path or remove it")


def _sweep(out: str) -> None:
    """Remove ``<out>.tmp-<pid>`` folders left by writers of this machine that are gone."""
    for tmp in glob.glob(glob.escape(out) + ".tmp-*"):
        writer = _sentinel(tmp)
        if os.path.isdir(tmp) and TMP.search(tmp) and writer and P.is_running(writer) is False:
            shutil.rmtree(tmp, ignore_errors=True)


def _sentinel(folder: str) -> dict | None:
    try:
        with open(os.path.join(folder, INCOMPLETE)) as f:
            info = json.load(f)
        return info if isinstance(info, dict) else {}
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}


def _write_json(path: str, obj) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())


@contextlib.contextmanager
def writing_folder(out: str, flag: str = "--out"):
    """Yield a temporary folder to write the folder ``out`` into; published when the
    block ends without an error, removed when it raises (module docstring)."""
    out = _clean(out)
    if os.path.islink(out):   # write next to the folder it points to; the link stays
        out = os.path.realpath(out)
    check_replaceable(out, flag)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    _sweep(out)
    tmp = temp_name(out)
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    _write_json(os.path.join(tmp, INCOMPLETE), {**P.this_process(), "for": os.path.abspath(out)})
    try:
        yield tmp
        publish_folder(tmp, out, flag)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def publish_folder(tmp: str, out: str, flag: str = "--out") -> None:
    """Mark the written folder ``tmp`` complete and rename it to ``out``."""
    files = {}
    for root, _, names in os.walk(tmp):
        for n in names:
            p = os.path.join(root, n)
            if n != INCOMPLETE:
                _fsync(p)
                files[os.path.relpath(p, tmp)] = os.path.getsize(p)
    _write_json(os.path.join(tmp, COMPLETE), {"files": files, "finished": time.time(), "writer": P.this_process()})
    os.remove(os.path.join(tmp, INCOMPLETE))
    _fsync(tmp)
    old = None
    if os.path.lexists(out):
        check_replaceable(out, flag)
        old = f"{out}.old-{os.getpid()}"
        shutil.rmtree(old, ignore_errors=True)
        os.replace(out, old)
    os.replace(tmp, out)
    _fsync(os.path.dirname(os.path.abspath(out)))
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def check_complete(path: str, what: str = "") -> None:
    """UserError (one line, naming ``path`` and ``what``: a config key or a flag) when
    ``path`` is an output of ours that is not complete (module docstring); nothing for a
    complete one, a folder of anyone else, or a path that does not exist."""
    if not path:
        return
    p = _clean(path)
    where = f"{what}: " if what else ""
    again = "write it again (rerun the export, merge or conversion that makes it)"
    if os.path.isdir(p) and (TMP.search(p) or os.path.exists(os.path.join(p, INCOMPLETE))):
        writer = _sentinel(p)
        by = f" by {P.describe(writer)}" if writer else ""
        final = f" for {writer['for']}" if writer and writer.get("for") else ""
        raise UserError(f"{where}{path} is an incomplete output{final}, left by a writer that did not finish{by}: "
                        f"{again}")
    if not os.path.exists(p):
        left = sorted(t for t in glob.glob(glob.escape(p) + ".tmp-*") if TMP.search(t))
        if left:
            raise UserError(f"{where}{path} does not exist; {left[-1]} next to it is an incomplete one left by a "
                            f"writer that did not finish: {again}")
        return
    marker = os.path.join(p, COMPLETE)
    if os.path.isdir(p) and os.path.exists(marker):
        try:
            with open(marker) as f:
                files = json.load(f)["files"]
        except (OSError, ValueError, KeyError, TypeError):
            raise UserError(f"{where}{path}: its completion marker {COMPLETE} is unreadable: {again}") from None
        for name, size in sorted(files.items()):
            f = os.path.join(p, name)
            if not os.path.exists(f) or os.path.getsize(f) != size:
                got = "is missing" if not os.path.exists(f) else f"has {os.path.getsize(f)} bytes, not {size}"
                raise UserError(f"{where}{path} is incomplete: {name} {got} (listed in its {COMPLETE}; a partial "
                                f"copy?): copy or {again}")


# ----------------------------------------------------------------------------- files

@contextlib.contextmanager
def writing_file(path: str):
    """Yield a temporary path to write the file ``path`` into; renamed to ``path`` when
    the block ends without an error (if anything was written), removed when it raises."""
    tmp = temp_name(_clean(path))
    discard(tmp)
    try:
        yield tmp
    except BaseException:
        discard(tmp)
        raise
    publish_file(tmp, path)


def discard(tmp: str) -> None:
    """Remove a temporary file or folder, if there is one."""
    if os.path.isdir(tmp) and not os.path.islink(tmp):
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)


def publish_file(tmp: str, path: str) -> None:
    """Rename the written ``tmp`` to ``path`` (nothing when nothing was written)."""
    if os.path.lexists(tmp):
        publish_together([(tmp, _clean(path))])


def publish_together(pairs: list[tuple[str, str]]) -> None:
    """Rename written ``(temporary, final)`` files or folders into place; the last pair
    is the main file, whose old version is removed first and which is renamed last, so
    that a kill leaves the old complete output or none of it under the main name."""
    *rest, (main_tmp, main) = pairs
    for tmp, _ in pairs:
        _fsync(tmp)
    if rest and os.path.lexists(main):
        os.remove(main)
    for tmp, final in rest:
        if os.path.isdir(final) and not os.path.islink(final):
            shutil.rmtree(final)
        os.replace(tmp, final)
    os.replace(main_tmp, main)
    _fsync(os.path.dirname(os.path.abspath(main)))
