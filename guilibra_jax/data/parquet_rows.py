"""Random access to the rows of a parquet file, one row group at a time.

Parquet's unit of reading is the row group: :class:`ParquetRows` keeps an index of
where each row group starts (its first row, rows and bytes; built once from the
footer and cached by ``index_cache``), and ``row(i, columns)`` reads only the row
group that holds row ``i`` and only the columns asked for, then slices out the row.
The last group read per column set is kept, so neighbouring rows cost one read.

Memory per process is therefore bounded by the largest row group (times the reading
threads), whatever the size of the file: reading a group holds about 5 times its bytes
while pyarrow decodes it (measured, pyarrow 26: ~50 MB for a group of 8 MB, ~1 GB for
one of 200 MB; ``tests/data/test_reader_memory.py`` checks that opening a file and
reading a row costs the same for 20 and 200 rows of 1 MB). A file whose row groups exceed
``max_row_group_mb`` raises :class:`RowGroupTooLarge`, whose message gives the
``launch.convert_data`` command that rewrites the file with smaller row groups. A file
pyarrow cannot open (not parquet, a truncated footer) raises ``DataFileError`` naming it.

Worker-safe: the file is opened lazily in each process and dropped on pickling;
reads through one open file are serialised by a lock.
"""

from __future__ import annotations

import logging
import os
import shlex
import threading
from typing import Any, BinaryIO, Callable, Sequence

import numpy as np

from guilibra_jax.data import index_cache
from guilibra_jax.data.file_errors import DataFileError, one_line, os_error_words

log = logging.getLogger(__name__)

INDEX_KIND = "parquet-row-groups"
INDEX_VERSION = 2          # 2: column types
DEFAULT_MAX_ROW_GROUP_MB = 256.0   # refuse row groups larger than this (read one at a time)
SLOW_ROW_GROUP_MB = 64.0           # larger groups read fine but cost that much I/O per sample
# Row groups written here (writers, launch.convert_data): reading a row costs about 1 ms of
# CPU per MB of its group, and the footer every reader holds costs ~1 KB per group, so
# ~8 MB (a few screenshots) keeps both small: ~7 ms a row, ~4 MB of footer at 25,000 rows.
DEFAULT_ROW_GROUP_MB = 8


class RowGroupTooLarge(DataFileError):
    """A parquet file whose row groups are too large to read one at a time."""


def rewrite_command(path: str, row_group_mb: int = DEFAULT_ROW_GROUP_MB) -> str:
    """The shell command that rewrites GUI-Libra RL parquet ``path`` with smaller row groups."""
    stem, _ = os.path.splitext(path)
    out = f"{stem}.rg{row_group_mb}mb.parquet"
    return (f"python -m launch.convert_data --input={shlex.quote(path)} --format=guilibra_rl --to=guilibra_rl "
            f"--output={shlex.quote(out)} --row_group_mb={row_group_mb}")


def parquet_error_words(e: Exception) -> str:
    """What pyarrow's error on opening a file says about it, in a few words."""
    msg = one_line(str(e), 200)
    low = msg.lower()
    if "magic bytes not found" in low:
        return f"not a parquet file ({msg})"
    if "size is 0 bytes" in low:
        return "an empty file, not a parquet file"
    if isinstance(e, OSError) and e.errno is not None:
        return os_error_words(e)
    if any(w in low for w in ("thrift", "footer", "metadata", "deserialize", "out of bounds", "truncated")):
        return f"a truncated or corrupt parquet file ({msg})"
    return f"cannot be read as parquet ({type(e).__name__}: {msg})"


def _build_index(path: str) -> dict[str, np.ndarray]:
    import pyarrow as pa
    import pyarrow.parquet as pq
    if os.path.isdir(path):
        raise DataFileError(f"{path}: a folder, not a parquet file")
    try:
        pf = pq.ParquetFile(path)
        md = pf.metadata
        schema = pf.schema_arrow
    except (OSError, ValueError, NotImplementedError, pa.ArrowException) as e:
        raise DataFileError(f"{path}: {parquet_error_words(e)}") from e
    rows = np.asarray([md.row_group(g).num_rows for g in range(md.num_row_groups)], np.int64)
    nbytes = np.asarray([md.row_group(g).total_byte_size for g in range(md.num_row_groups)], np.int64)
    return {"starts": np.concatenate([[0], np.cumsum(rows)]).astype(np.int64), "bytes": nbytes,
            "columns": np.asarray(schema.names, dtype=str),
            "types": np.asarray([str(f.type) for f in schema], dtype=str)}


class ParquetRows:
    """Rows of the parquet file ``path`` as dicts, read one row group at a time.

    ``open_file`` (a callable path -> binary file object) replaces the plain path when
    pyarrow opens the file, e.g. to count the bytes read."""

    def __init__(self, path: str, *, max_row_group_mb: float = DEFAULT_MAX_ROW_GROUP_MB,
                 cache_dir: str | None = None, open_file: Callable[[str], BinaryIO] | None = None):
        self.path = os.path.abspath(path)
        arrays, self.from_cache = index_cache.cached_arrays(
            self.path, INDEX_KIND, INDEX_VERSION, lambda: _build_index(self.path), cache_dir)
        self._starts = arrays["starts"]
        self._bytes = arrays["bytes"]
        self.columns: list[str] = [str(c) for c in arrays["columns"]]
        self.types: dict[str, str] = dict(zip(self.columns, (str(t) for t in arrays["types"])))
        self.max_row_group_mb = float(max_row_group_mb)
        self.open_file = open_file
        self._check_sizes()
        self._pf = None
        self._file = None
        self._lock = threading.Lock()
        self._last: dict[tuple[str, ...], tuple[int, Any]] = {}

    def _check_sizes(self) -> None:
        if not len(self._bytes):
            return
        g = int(np.argmax(self._bytes))
        mb = self._bytes[g] / 2 ** 20
        if mb > self.max_row_group_mb:
            raise RowGroupTooLarge(
                f"{self.path}: row group {g} holds {self.group_rows(g)} rows in {mb:,.0f} MB, more than "
                f"max_row_group_mb={self.max_row_group_mb:g}: a reader loads a whole row group to read one "
                f"row. Rewrite the file with smaller row groups: {rewrite_command(self.path)}")
        if mb > SLOW_ROW_GROUP_MB:
            log.warning("%s: row groups up to %.0f MB: each sample read loads its whole row group; "
                        "smaller groups read faster: %s", self.path, mb, rewrite_command(self.path))

    def __len__(self) -> int:
        return int(self._starts[-1])

    @property
    def num_row_groups(self) -> int:
        return len(self._bytes)

    def group_of(self, i: int) -> int:
        """The row group that holds row ``i``."""
        if not 0 <= i < len(self):
            raise IndexError(f"row {i} out of range for {len(self)} rows of {self.path}")
        return int(np.searchsorted(self._starts, i, side="right") - 1)

    def group_rows(self, g: int) -> int:
        return int(self._starts[g + 1] - self._starts[g])

    def largest_group_mb(self) -> float:
        return float(self._bytes.max() / 2 ** 20) if len(self._bytes) else 0.0

    def _parquet_file(self):
        if self._pf is None:
            import pyarrow.parquet as pq
            # One coalesced read per column chunk (no pre-buffering) and no decoding threads:
            # ~15% less CPU per row group of screenshots (grain already reads in threads).
            source = self.open_file(self.path) if self.open_file is not None else self.path
            self._file = source if self.open_file is not None else None
            self._pf = pq.ParquetFile(source, pre_buffer=False)
        return self._pf

    def _cached(self, key: tuple, g: int, make):
        with self._lock:
            last = self._last.get(key)
            if last is not None and last[0] == g:
                return last[1]
            value = make()
            self._last[key] = (g, value)
        return value

    def read_group(self, g: int, columns: Sequence[str] | None = None):
        """Row group ``g`` (only ``columns``, all when None) as a pyarrow Table; the
        last group read per column set is kept."""
        cols = None if columns is None else list(columns)
        return self._cached(("table",) + tuple(cols or ("*",)), g,
                            lambda: self._parquet_file().read_row_group(g, columns=cols, use_threads=False))

    def row(self, i: int, columns: Sequence[str] | None = None) -> dict[str, Any]:
        """Row ``i`` (only ``columns``) as a dict of Python values."""
        g = self.group_of(i)
        table = self.read_group(g, columns)
        return table.slice(i - int(self._starts[g]), 1).to_pylist()[0]

    def row_via_group(self, i: int, columns: Sequence[str]) -> dict[str, Any]:
        """Row ``i`` (only ``columns``), converting its whole row group to Python once
        and keeping it: for a pass over every row of small columns (metadata)."""
        g = self.group_of(i)
        cols = list(columns)
        rows = self._cached(("pylist",) + tuple(cols), g,
                            lambda: self._parquet_file().read_row_group(g, columns=cols, use_threads=False).to_pylist())
        return rows[i - int(self._starts[g])]

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_pf"] = None
        state["_file"] = None
        state["_last"] = {}
        del state["_lock"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()
