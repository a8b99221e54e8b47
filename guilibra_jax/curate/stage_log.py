"""A stage's results on disk: one JSON line per record id, appended block by block and
flushed, read back on restart so that a killed run continues where it stopped.

A line is ``{"id": <record index>, "reason": ..., ...}``. Reading keeps, per id, the last
line written for it (a block redone after a kill writes its lines again) and drops a
torn last line (a kill in the middle of a write), truncating the file there. Only
the small fields stay in memory; fields named in ``big`` (responses, reasoning text)
are read back from the file by byte offset when asked for (:meth:`StageLog.full`).
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterable


class StageLog:
    """Results of one stage, keyed by record id (see module doc)."""

    def __init__(self, path: str, big: Iterable[str] = ()):
        self.path = path
        self.big = frozenset(big)
        self.rows: dict[int, dict[str, Any]] = {}
        self._offsets: dict[int, int] = {}
        self.torn_lines = 0
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        if os.path.exists(path):
            self._read()

    def _read(self) -> None:
        good_end = 0
        with open(self.path, "rb") as f:
            offset = 0
            for raw in f:
                line_start, offset = offset, offset + len(raw)
                if not raw.endswith(b"\n"):
                    self.torn_lines += 1       # the last line, cut by a kill
                    break
                try:
                    row = json.loads(raw)
                except ValueError:
                    self.torn_lines += 1       # a torn line followed by later appends
                    good_end = offset
                    continue
                self._remember(row, line_start)
                good_end = offset
        if good_end < os.path.getsize(self.path):
            with open(self.path, "r+b") as f:
                f.truncate(good_end)

    def _remember(self, row: dict[str, Any], offset: int | None) -> None:
        i = int(row["id"])
        self.rows[i] = {k: v for k, v in row.items() if k not in self.big}
        if offset is not None:
            self._offsets[i] = offset
        else:
            self._offsets.pop(i, None)
            self.rows[i]["_full"] = row

    def __contains__(self, i: int) -> bool:
        return i in self.rows

    def __len__(self) -> int:
        return len(self.rows)

    def get(self, i: int) -> dict[str, Any]:
        return self.rows[i]

    def full(self, i: int) -> dict[str, Any]:
        """The whole line of record ``i`` (``big`` fields included)."""
        row = self.rows[i]
        if "_full" in row:
            return row["_full"]
        with open(self.path, "rb") as f:
            f.seek(self._offsets[i])
            return json.loads(f.readline())

    def append(self, rows: list[dict[str, Any]], *, write: bool = True) -> None:
        """Record ``rows`` (one per id); with ``write`` append them to the file in one
        write and flush it (only the writing process passes write=True; the others keep
        them in memory)."""
        if not rows:
            return
        if not write:
            for row in rows:
                self._remember(row, None)
            return
        lines = [json.dumps(row, ensure_ascii=False, sort_keys=True).encode("utf-8") + b"\n" for row in rows]
        with open(self.path, "ab") as f:
            start = f.tell()
            f.write(b"".join(lines))
            f.flush()
            os.fsync(f.fileno())
        for row, line in zip(rows, lines):
            self._remember(row, start)
            start += len(line)
