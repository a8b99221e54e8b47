"""Skipped records: reasons, a picklable marker, and the run-level log with its threshold.

A reader or a pipeline stage that cannot use a record returns a :class:`Dropped`
marker instead of raising; the loader counts markers in a :class:`BadRecordLog` and
stops with :class:`TooManyBadRecords` only when the bad fraction passes a threshold.
Filters (length, mixing, rebalancing) also drop records, but those are counted in
``filtered`` and never count as bad.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from typing import Any, Iterable, Mapping

from guilibra_jax.errors import UserError

log = logging.getLogger(__name__)

# Reasons a record is bad.
INVALID_JSON = "invalid_json"
UNREADABLE_IMAGE = "unreadable_image"
UNKNOWN_ACTION = "unknown_action"
COORDS_OUTSIDE_IMAGE = "coords_outside_image"
MISSING_FIELD = "missing_field"
INVALID_RECORD = "invalid_record"  # anything else that breaks the schema
BAD_REASONS = (INVALID_JSON, UNREADABLE_IMAGE, UNKNOWN_ACTION, COORDS_OUTSIDE_IMAGE, MISSING_FIELD,
               INVALID_RECORD)


@dataclasses.dataclass(frozen=True)
class Dropped:
    """A record that yields no sample. ``bad`` False: a filter chose to drop it."""

    reason: str
    where: str
    message: str = ""
    bad: bool = True


def classify_record_error(message: str) -> str:
    """Bad-record reason of a ``native.RecordError`` / parse error message."""
    m = message.lower()
    if "unknown action" in m or "unknown tool" in m or "unknown computer_use" in m or "unknown mobile_use" in m:
        return UNKNOWN_ACTION
    if "outside the image" in m or "outside the screen" in m:
        return COORDS_OUTSIDE_IMAGE
    if "missing field" in m or "misses" in m:
        return MISSING_FIELD
    if "not valid json" in m or "invalid json" in m:
        return INVALID_JSON
    return INVALID_RECORD


class TooManyBadRecords(UserError, RuntimeError):
    """The bad fraction passed ``BadRecordLog.threshold`` (a user's data problem: the
    launchers print it on one line)."""


class BadRecordLog:
    """Counts of bad records by reason (``counts``) and of filtered ones (``filtered``).

    ``update`` takes the markers of one batch and the number of samples it kept; it
    logs each bad record with its file and index, and raises :class:`TooManyBadRecords`
    once ``seen >= min_seen`` and ``bad / seen > threshold``.
    """

    def __init__(self, threshold: float = 0.05, min_seen: int = 100, max_logged: int = 1000):
        self.threshold = float(threshold)
        self.min_seen = int(min_seen)
        self.max_logged = int(max_logged)
        self.counts: collections.Counter[str] = collections.Counter()
        self.filtered: collections.Counter[str] = collections.Counter()
        self.kept = 0
        self.examples: list[tuple[str, str, str]] = []  # (reason, where, message), first max_logged

    @property
    def bad(self) -> int:
        return sum(self.counts.values())

    @property
    def seen(self) -> int:
        """Records read: kept, filtered (valid) and bad."""
        return self.kept + self.bad + sum(self.filtered.values())

    def add(self, d: Dropped) -> None:
        if not d.bad:
            self.filtered[d.reason] += 1
            return
        self.counts[d.reason] += 1
        if len(self.examples) < self.max_logged:
            self.examples.append((d.reason, d.where, d.message))
            log.warning("skipping bad record %s (%s): %s", d.where, d.reason, d.message)

    def update(self, dropped: Iterable[Dropped], kept: int) -> None:
        for d in dropped:
            self.add(d)
        self.kept += int(kept)
        self.check()

    def check(self, final: bool = False) -> None:
        seen = self.seen
        if seen and (final or seen >= self.min_seen) and self.bad / seen > self.threshold:
            worst = ", ".join(f"{k}={v}" for k, v in self.counts.most_common())
            first = "; ".join(f"{w}: {r}: {m[:100]}" for r, w, m in self.examples[:5])
            raise TooManyBadRecords(
                f"{self.bad} of {seen} records are bad ({self.bad / seen:.1%} > the allowed {self.threshold:.1%}: "
                f"config key data.max_bad_fraction, DataConfig.bad_record_threshold). By reason: {worst}. "
                f"First: {first}")

    def get_state(self) -> dict[str, Any]:
        return {"counts": dict(self.counts), "filtered": dict(self.filtered), "kept": self.kept}

    def set_state(self, state: Mapping[str, Any]) -> None:
        self.counts = collections.Counter(state.get("counts", {}))
        self.filtered = collections.Counter(state.get("filtered", {}))
        self.kept = int(state.get("kept", 0))

    def summary(self) -> dict[str, Any]:
        return {"kept": self.kept, "bad": dict(self.counts), "filtered": dict(self.filtered)}

    def as_metrics(self, prefix: str = "data/") -> dict[str, int]:
        """Flat counters for a metrics row: ``data/kept``, ``data/bad``, ``data/filtered``
        and one ``data/bad/<reason>`` / ``data/filtered/<reason>`` per reason seen."""
        out = {f"{prefix}kept": self.kept, f"{prefix}bad": self.bad,
               f"{prefix}filtered": sum(self.filtered.values())}
        out.update({f"{prefix}bad/{k}": v for k, v in sorted(self.counts.items())})
        out.update({f"{prefix}filtered/{k}": v for k, v in sorted(self.filtered.items())})
        return out

    def report(self) -> str:
        """One line for the end of a run: kept, bad and filtered counts by reason."""
        def by(c):
            return ", ".join(f"{k}={v}" for k, v in sorted(c.items())) or "none"
        return (f"{self.kept} samples used, {self.bad} bad records skipped ({by(self.counts)}), "
                f"{sum(self.filtered.values())} filtered ({by(self.filtered)})")
