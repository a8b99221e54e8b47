"""Checks of one config value, for the rule table of :mod:`guilibra_jax.train.config`.

A :class:`Check` is a predicate and the words for what it allows; ``check(key, value)``
raises :class:`ConfigError` on one line: ``config key data.max_length = -1 is invalid:
expected an integer >= 1``. Only the standard library here: validation runs before jax,
flax or the models are imported.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import string
from typing import Any, Callable, Iterable

from guilibra_jax.errors import ConfigError


def fail(key: str, value: Any, expected: str) -> None:
    raise ConfigError(f"config key {key} = {value!r} is invalid: expected {expected}")


@dataclasses.dataclass(frozen=True)
class Check:
    """``ok(value)`` -> bool; ``expected``: what is allowed, in words."""

    ok: Callable[[Any], bool]
    expected: str

    def __call__(self, key: str, value: Any) -> None:
        try:
            good = self.ok(value)
        except (TypeError, ValueError, re.error):
            good = False
        if not good:
            fail(key, value, self.expected)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v  # not NaN


def _range_words(lo, hi, lo_open: bool, hi_open: bool) -> str:
    if lo is not None and hi is not None:
        return f"in {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
    if lo is not None:
        return f"{'>' if lo_open else '>='} {lo}"
    if hi is not None:
        return f"{'<' if hi_open else '<='} {hi}"
    return ""


def _in_range(v, lo, hi, lo_open: bool, hi_open: bool) -> bool:
    return ((lo is None or (v > lo if lo_open else v >= lo)) and
            (hi is None or (v < hi if hi_open else v <= hi)))


def integer(lo: int | None = None, hi: int | None = None, note: str = "") -> Check:
    words = " ".join(w for w in ("an integer", _range_words(lo, hi, False, False), note) if w)
    return Check(lambda v: _is_int(v) and _in_range(v, lo, hi, False, False), words)


def number(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False, hi_open: bool = False,
           note: str = "") -> Check:
    words = " ".join(w for w in ("a number", _range_words(lo, hi, lo_open, hi_open), note) if w)
    return Check(lambda v: _is_number(v) and _in_range(v, lo, hi, lo_open, hi_open), words)


def one_of(*choices: Any) -> Check:
    return Check(lambda v: v in choices, "one of " + ", ".join(repr(c) for c in choices))


def boolean() -> Check:
    return Check(lambda v: isinstance(v, bool), "True or False")


def text(note: str = "") -> Check:
    return Check(lambda v: isinstance(v, str), "a string" + (f" ({note})" if note else ""))


def folder_or_empty(what: str) -> Check:
    """'' or an existing local folder."""
    return Check(lambda v: isinstance(v, str) and (v == "" or os.path.isdir(v)),
                 f"'' or an existing local folder ({what})")


def _seq(v: Any) -> bool:
    return isinstance(v, (tuple, list))


def integers(lo: int | None = None, *, lengths: tuple[int, ...] | None = None, note: str = "") -> Check:
    """A tuple of integers (each >= lo; of one of ``lengths`` items when given)."""
    n = f" of {' or '.join(map(str, lengths))} items" if lengths else ""
    words = f"a tuple{n} of integers {_range_words(lo, None, False, False)}".rstrip() + (f" ({note})" if note else "")
    return Check(lambda v: _seq(v) and (lengths is None or len(v) in lengths)
                 and all(_is_int(x) and _in_range(x, lo, None, False, False) for x in v), words)


def strings(note: str = "", choices: Iterable[str] | None = None) -> Check:
    allowed = tuple(choices) if choices is not None else None
    words = "a tuple of strings" + (f" from {allowed}" if allowed else "") + (f" ({note})" if note else "")
    return Check(lambda v: _seq(v) and all(isinstance(x, str) and (allowed is None or x in allowed) for x in v),
                 words)


def _compiles(p: Any) -> bool:
    re.compile(p)
    return isinstance(p, str)


def regexes(note: str = "") -> Check:
    return Check(lambda v: _seq(v) and all(_compiles(p) for p in v),
                 "a tuple of valid regular expressions" + (f" ({note})" if note else ""))


def regex_to_number(lo: float = 0.0) -> Check:
    return Check(lambda v: hasattr(v, "items") and all(_compiles(k) and _is_number(x) and x >= lo
                                                       for k, x in v.items()),
                 f"a mapping of valid regular expressions to numbers >= {lo}")


def mapping_of_text(note: str = "") -> Check:
    return Check(lambda v: hasattr(v, "items") and all(isinstance(k, str) and isinstance(x, str)
                                                       for k, x in v.items()),
                 "a mapping of strings to strings" + (f" ({note})" if note else ""))


def probability_or(*words: str) -> Check:
    """One of ``words`` or a string holding a number in [0, 1] ("0.5")."""
    def ok(v):
        if v in words:
            return True
        return isinstance(v, str) and 0.0 <= float(v) <= 1.0
    return Check(ok, "one of " + ", ".join(repr(w) for w in words) + " or a probability such as '0.5'")


def template(fields: tuple[str, ...]) -> Check:
    """A str.format template using only ``fields`` ('' allowed)."""
    def ok(v):
        if not isinstance(v, str):
            return False
        used = [f for _, f, _, _ in string.Formatter().parse(v) if f is not None]
        return all(f in fields for f in used)
    return Check(ok, "a string whose {placeholders} are among " + ", ".join("{" + f + "}" for f in fields)
                 + " (write {{ and }} for literal braces)")


def host_port() -> Check:
    return Check(lambda v: isinstance(v, str) and (v == "" or re.fullmatch(r"[^:\s]+:\d+", v) is not None),
                 "'' or host:port")


def device_ids() -> Check:
    return Check(lambda v: isinstance(v, str) and re.fullmatch(r"(\d+(,\d+)*)?", v) is not None,
                 "'' or comma-separated device ids such as '0,1,2,3'")


def missing_inputs(patterns: Iterable[str]) -> list[str]:
    """The patterns (files, folders or globs) that match nothing on disk."""
    out = []
    for p in patterns:
        hit = glob.glob(p) if any(ch in p for ch in "*?[") else os.path.exists(p)
        if not hit:
            out.append(p)
    return out
