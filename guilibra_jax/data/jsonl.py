"""Random access to records stored as byte ranges of a file, read with ``os.pread``:
:class:`JsonlIndex` (lines of a JSONL file); ``json_array.JsonArrayIndex`` (elements
of a JSON array) builds on the same :class:`ByteRanges`.

Thread-safe (pread never moves a shared file position) and picklable (the descriptor
is opened lazily per process and dropped on pickling), as grain's thread pool and
worker processes need (NOTES.md).
"""

from __future__ import annotations

import os
import threading

import numpy as np


class ByteRanges:
    """Item ``i`` = bytes ``[starts[i], ends[i])`` of the file at ``path``."""

    def __init__(self, path: str, starts, ends):
        self.path = os.path.abspath(path)
        self._starts = np.asarray(starts, np.int64)
        self._ends = np.asarray(ends, np.int64)
        self._fd: int | None = None
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._starts)

    def _get_fd(self) -> int:
        if self._fd is None:
            with self._lock:
                if self._fd is None:
                    self._fd = os.open(self.path, os.O_RDONLY)
        return self._fd

    def read(self, i: int) -> bytes:
        start, end = int(self._starts[i]), int(self._ends[i])
        return os.pread(self._get_fd(), end - start, start)

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_fd"] = None
        del state["_lock"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __del__(self):
        fd = getattr(self, "_fd", None)
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass


class JsonlIndex(ByteRanges):
    """Line ``i`` (non-blank lines only) of a JSONL file as bytes; ``line_number(i)`` is
    its 1-based line number in the file."""

    def __init__(self, path: str):
        starts, ends, lines = [], [], []
        with open(path, "rb") as f:
            pos, lineno = 0, 0
            for raw in f:
                lineno += 1
                if raw.strip():
                    starts.append(pos)
                    ends.append(pos + len(raw.rstrip(b"\r\n")))
                    lines.append(lineno)
                pos += len(raw)
        super().__init__(path, starts, ends)
        self._lines = np.asarray(lines, np.int64)

    def line_number(self, i: int) -> int:
        return int(self._lines[i])
