"""An input file that cannot be read as its data format says, found while a reader opens
or indexes it (not a parquet file, a truncated footer, missing columns, not a JSON array,
not JSONL, no records, a folder with no matching files, no such file, permission denied).

Bad *records* inside a readable file are not errors: readers return ``bad_records.Dropped``
markers for them. :class:`DataFileError` is a ``UserError``: launchers print it on one
line; ``readers.open_source(..., config_key=)`` puts the config key in front.
"""

from __future__ import annotations

import errno

from guilibra_jax.errors import UserError


class DataFileError(UserError):
    """An input file, folder or glob that a reader cannot open or index; the message
    starts with the path."""


def one_line(text: str, limit: int = 300) -> str:
    """``text`` on one line (whitespace runs collapsed), cut at ``limit`` characters."""
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[:limit - 3] + "..."


def os_error_words(e: OSError) -> str:
    """What an ``OSError`` from opening or reading an input means, in a few words."""
    words = {errno.ENOENT: "no such file or folder", errno.EACCES: "permission denied",
             errno.EPERM: "permission denied", errno.EISDIR: "a folder, not a file",
             errno.ENOTDIR: "a path through something that is not a folder"}
    if e.errno in words:
        return words[e.errno]
    return one_line(e.strerror or str(e) or type(e).__name__)
