"""A ``jax.profiler`` trace of chosen training steps (``train.profile_steps``).

    profiler = StepProfiler(workdir, (10, 13))   # steps 10, 11 and 12
    profiler.before(step)            # step: the number of the step about to run (1-based)
    state, metrics = jit_step(...)
    profiler.after(step, state)      # waits for the step before stopping the trace
    profiler.close()

The trace lands in ``workdir/profile/plugins/profile/<run>/`` (``*.xplane.pb``, and a
Perfetto ``*.trace.json.gz``): open it with TensorBoard's profile plugin
(``tensorboard --logdir WORKDIR/profile``, ``pip install tensorboard-plugin-profile``)
or at ui.perfetto.dev. Steps are numbered as in ``metrics.jsonl``. Only process 0
traces unless ``all_processes``.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Sequence

import jax

from guilibra_jax.errors import ConfigError

log = logging.getLogger(__name__)


def parse_steps(value: Any) -> tuple[int, int] | None:
    """``train.profile_steps``: () / None = off, else (start, stop) with 1 <= start < stop."""
    if value is None or (isinstance(value, Sequence) and len(value) == 0):
        return None
    try:
        start, stop = (int(v) for v in value)
    except (TypeError, ValueError):
        start, stop = 0, 0
    if not 1 <= start < stop:
        raise ConfigError(f"config key train.profile_steps = {value!r} is invalid: expected () or (start, stop) "
                          f"with 1 <= start < stop: the steps start .. stop - 1 are traced")
    return start, stop


class StepProfiler:
    """Starts a trace before step ``start`` and stops it after step ``stop - 1``."""

    def __init__(self, workdir: str, steps: Any, *, enabled: bool = True):
        self.range = parse_steps(steps) if enabled else None
        self.dir = os.path.join(workdir, "profile")
        self.active = False

    def before(self, step: int) -> None:
        if self.range and step == self.range[0] and not self.active:
            jax.profiler.start_trace(self.dir)
            self.active = True
            log.info("profiling steps %d..%d into %s", self.range[0], self.range[1] - 1, self.dir)

    def after(self, step: int, outputs: Any = None) -> None:
        if self.active and step >= self.range[1] - 1:
            self._stop(outputs)

    def _stop(self, outputs: Any = None) -> None:
        if outputs is not None:
            jax.block_until_ready(outputs)
        jax.profiler.stop_trace()
        self.active = False
        log.info("profile written to %s", self.dir)

    def close(self) -> None:
        if self.active:         # the run stopped inside the window (preemption, error)
            self._stop()
