"""Random access to the elements of a JSON array file without loading the array.

:func:`scan_json_array` finds the byte range of each top-level element in one
streaming pass over fixed-size chunks (memory: one chunk plus the longest element),
and :class:`JsonArrayIndex` caches those offsets (``index_cache``) and reads element
``i`` with ``os.pread``. A file that is not one JSON array (an element that does not
parse, a comma out of place, text after the array, invalid UTF-8) raises
:class:`JsonArrayError` (a ``file_errors.DataFileError``, a ``UserError``) naming the
file and byte offset, as loading it whole did.
"""

from __future__ import annotations

import codecs
import json
import re
from typing import BinaryIO

import numpy as np

from guilibra_jax.data import index_cache
from guilibra_jax.data.file_errors import DataFileError
from guilibra_jax.data.jsonl import ByteRanges

INDEX_KIND = "json-array"
INDEX_VERSION = 1
CHUNK_BYTES = 1 << 22
MAX_ELEMENT_BYTES = 1 << 26   # an element that does not parse within this many bytes is an error

_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


class JsonArrayError(DataFileError):
    """A file that is not one JSON array."""


def _utf8_len(s: str) -> int:
    return len(s) if s.isascii() else len(s.encode("utf-8"))


def scan_json_array(f: BinaryIO, name: str = "<file>", chunk_bytes: int = CHUNK_BYTES
                    ) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends): byte ranges of the top-level elements of the JSON array read from
    the binary file ``f``, without separators or surrounding whitespace.

    Each element is parsed once with the json module's C decoder (``raw_decode``) to
    find its end and then dropped, so memory is one chunk plus the longest element."""
    starts: list[int] = []
    ends: list[int] = []
    dec = codecs.getincrementaldecoder("utf-8")()
    text, tpos, bpos = "", 0, 0          # decoded window, position in it, its file byte offset
    state = "start"                      # start | first (after '[') | elem (after ',') | sep | done
    eof = False

    def fail(msg: str, offset: int):
        raise JsonArrayError(f"{name}: not a JSON array of records: {msg} at byte {offset}")

    def more() -> bool:
        nonlocal text, tpos, eof
        if eof:
            return False
        chunk = f.read(max(chunk_bytes, len(text) - tpos))
        eof = not chunk
        try:
            decoded = dec.decode(chunk, final=eof)
        except UnicodeDecodeError as e:
            fail(f"invalid UTF-8 ({e.reason})", bpos + _utf8_len(text[tpos:]) + e.start)
        text, tpos = text[tpos:] + decoded, 0
        return bool(decoded) or not eof

    while True:
        ws_end = _WS.match(text, tpos).end()
        bpos += ws_end - tpos             # JSON whitespace is ASCII
        tpos = ws_end
        if tpos == len(text):
            if more():
                continue
            break
        ch = text[tpos]
        if state == "start":
            if ch == "\ufeff" and bpos == 0:        # a UTF-8 byte order mark
                tpos, bpos = tpos + 1, 3
                continue
            if ch != "[":
                fail(f"expected '[', found {text[tpos:tpos + 20]!r}", bpos)
            tpos, bpos, state = tpos + 1, bpos + 1, "first"
        elif state in ("first", "elem"):
            if ch == "]" and state == "first":
                tpos, bpos, state = tpos + 1, bpos + 1, "done"
                continue
            if ch in ",]":
                fail("trailing comma" if ch == "]" else "empty element", bpos)
            try:
                _, end = _DECODER.raw_decode(text, tpos)
            except json.JSONDecodeError as e:
                if _utf8_len(text[tpos:]) < MAX_ELEMENT_BYTES and more():
                    continue              # the element runs past the window: read on
                fail(f"element {len(starts)} is not valid JSON ({e.msg}, "
                     f"{_utf8_len(text[tpos:e.pos])} bytes into it)", bpos)
            nxt = _WS.match(text, end).end()
            if ((nxt == len(text) or text[nxt] not in ",]")
                    and _utf8_len(text[tpos:]) < MAX_ELEMENT_BYTES and more()):
                continue                  # e.g. a number that goes on in the next chunk: parse again
            starts.append(bpos)
            bpos += _utf8_len(text[tpos:end])
            ends.append(bpos)
            tpos, state = end, "sep"
        elif state == "sep":
            if ch not in ",]":
                fail(f"expected ',' or ']' after element {len(starts) - 1}, found {text[tpos:tpos + 20]!r}", bpos)
            tpos, bpos, state = tpos + 1, bpos + 1, ("elem" if ch == "," else "done")
        else:
            fail(f"text after the array ({text[tpos:tpos + 20]!r})", bpos)
    if state != "done":
        fail("no array found" if state == "start" else "the array is not closed (truncated file?)", bpos)
    return np.asarray(starts, np.int64), np.asarray(ends, np.int64)


class JsonArrayIndex(ByteRanges):
    """Element ``i`` of the JSON array in ``path`` as bytes (``read(i)``). The offsets
    are built once per file version and cached (``index_cache``); ``from_cache`` says
    whether this instance found them there."""

    def __init__(self, path: str, cache_dir: str | None = None):
        def build():
            with open(path, "rb") as f:
                s, e = scan_json_array(f, path, CHUNK_BYTES)
            return {"starts": s, "ends": e}

        arrays, self.from_cache = index_cache.cached_arrays(path, INDEX_KIND, INDEX_VERSION, build, cache_dir)
        super().__init__(path, arrays["starts"], arrays["ends"])

    def label(self, i: int) -> str:
        return f"element {i}"
