"""What stops a run early, the same way for every trainer and every process.

* :class:`Preemption`: SIGTERM to *any* process asks the run to save and stop. Each step
  every process calls :meth:`Preemption.should_stop`, which agrees through a collective
  (an all-gather of the local flags), so all processes save the same step and exit
  together; a per-process flag would leave the others waiting in the next collective.
* :class:`Divergence`: ``train.max_skipped_updates`` consecutive non-finite updates stop
  the run with :class:`DivergenceError`, naming the steps, the count and the latest
  complete checkpoint (its parameters are finite: a skipped update leaves parameters and
  optimizer state unchanged, so going on would only burn compute).
"""

from __future__ import annotations

import logging
import signal

import jax
import numpy as np

log = logging.getLogger(__name__)


def agree_any(flag: bool) -> bool:
    """True on every process if ``flag`` is True on any (a collective: all processes call it)."""
    if jax.process_count() == 1:
        return bool(flag)
    from jax.experimental import multihost_utils
    return bool(np.max(multihost_utils.process_allgather(np.asarray([int(bool(flag))], np.int32))))


class Preemption:
    """Remembers a SIGTERM (installed for the ``with`` block) until the run saves and stops."""

    def __init__(self):
        self.requested = False
        self._previous = None

    def __enter__(self):
        try:
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        except ValueError:  # not the main thread
            self._previous = None
        return self

    def _handle(self, signum, frame):
        log.warning("SIGTERM received by process %d: saving a checkpoint and stopping", jax.process_index())
        self.requested = True

    def should_stop(self) -> bool:
        """Whether any process was asked to stop; call once per step on every process."""
        return agree_any(self.requested)

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


class DivergenceError(RuntimeError):
    """Too many consecutive non-finite updates."""


class Divergence:
    """Counts consecutive skipped (non-finite) updates; raises past ``max_skipped``
    (0 = never). ``last_checkpoint()`` gives the latest complete checkpoint step."""

    def __init__(self, max_skipped: int, last_checkpoint=lambda: None):
        self.max_skipped = int(max_skipped)
        self.streak = 0
        self.streak_start: int | None = None
        self._last_checkpoint = last_checkpoint

    def update(self, step: int, update_ok: bool) -> None:
        """Record optimizer update ``step`` (1-based); raise when the streak reaches the limit."""
        if update_ok:
            self.streak, self.streak_start = 0, None
            return
        if self.streak == 0:
            self.streak_start = step
        self.streak += 1
        log.warning("step %d: non-finite loss or gradient, update skipped (%d in a row)", step, self.streak)
        if self.max_skipped and self.streak >= self.max_skipped:
            last = self._last_checkpoint()
            where = f"step {last}" if last is not None else "none (no checkpoint was saved yet)"
            raise DivergenceError(
                f"training diverged: {self.streak} consecutive non-finite updates (steps {self.streak_start}-{step}; "
                f"train.max_skipped_updates = {self.max_skipped}). Latest complete checkpoint: {where} (its "
                f"parameters are finite: skipped updates leave them unchanged). Lower optim.lr, check the data of "
                f"those steps, or resume from that checkpoint.")
