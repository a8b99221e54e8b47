"""Random access to records stored as byte ranges of a file, read with ``os.pread``:
:class:`JsonlIndex` (lines of a JSONL file); ``json_array.JsonArrayIndex`` (elements
of a JSON array) builds on the same :class:`ByteRanges`.

Thread-safe (pread never moves a shared file position) and picklable (the descriptor
is opened lazily per process and dropped on pickling), as grain's thread pool and
worker processes need.
"""

from __future__ import annotations

import json
import os
import threading

import numpy as np

LINE_PIECE = 1 << 20     # lines are scanned in pieces of this size (a huge line is never held)
SNIFF_ITEMS = 8          # items looked at to tell records from something else
SNIFF_BYTES = 1 << 16    # an item longer than this that starts with '{' passes unparsed

_KINDS = {dict: "object", list: "array", str: "string", int: "number", float: "number", bool: "boolean",
          type(None): "null"}


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

    def label(self, i: int) -> str:
        return f"item {i}"

    def not_objects(self) -> str | None:
        """None when one of the first items is a JSON object (or starts with '{' and is too
        long to parse here), else what the first item is instead: a reader of records
        tells a file of records from another kind of file before it counts bad records."""
        why = None
        for i in range(min(SNIFF_ITEMS, len(self))):
            start, end = int(self._starts[i]), int(self._ends[i])
            head = os.pread(self._get_fd(), min(end - start, SNIFF_BYTES), start)
            text = head.lstrip()
            if b"\x00" in head:
                reason = "binary data"
            elif not text.startswith(b"{"):
                reason = f"starts with {text[:24].decode('utf-8', 'replace')!r}, not '{{'" + (
                    " (a JSON array? data.format=guilibra_sft reads them from .json files)"
                    if text.startswith(b"[") else "")
            elif end - start > SNIFF_BYTES:
                return None
            else:
                try:
                    value = json.loads(head)
                except ValueError as e:    # JSONDecodeError, UnicodeDecodeError
                    reason = f"not valid JSON ({str(e)[:80]})"
                else:
                    if isinstance(value, dict):
                        return None
                    reason = f"a JSON {_KINDS.get(type(value), type(value).__name__)}, not an object"
            why = why or f"{self.label(i)}: {reason}"
        return why

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
    its 1-based line number in the file. Indexing reads the file in pieces of
    ``LINE_PIECE`` bytes, so a file without newlines (binary data) is not held whole."""

    def __init__(self, path: str):
        starts, ends, lines = [], [], []
        with open(path, "rb") as f:
            pos, lineno = 0, 0
            while True:
                piece = f.readline(LINE_PIECE)
                if not piece:
                    break
                lineno += 1
                start, blank = pos, not piece.strip()
                pos += len(piece)
                while not piece.endswith(b"\n"):
                    piece = f.readline(LINE_PIECE)
                    if not piece:
                        break
                    blank = blank and not piece.strip()
                    pos += len(piece)
                if not blank:
                    starts.append(start)
                    ends.append(pos - (len(piece) - len(piece.rstrip(b"\r\n"))))
                    lines.append(lineno)
        super().__init__(path, starts, ends)
        self._lines = np.asarray(lines, np.int64)

    def line_number(self, i: int) -> int:
        return int(self._lines[i])

    def label(self, i: int) -> str:
        return f"line {self.line_number(i)}"
