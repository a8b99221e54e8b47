"""Run logging: metrics.jsonl always, TensorBoard when installed, a progress line."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Any, Mapping


def _scalar(v: Any) -> float | int | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return int(f) if f.is_integer() and abs(f) < 2**53 else f


class MetricsWriter:
    """Appends one JSON object per logged step to ``workdir/metrics.jsonl``."""

    def __init__(self, workdir: str, *, enabled: bool = True, tensorboard: bool = True):
        self.enabled = enabled
        self.path = os.path.join(workdir, "metrics.jsonl")
        self._tb = _tensorboard_writer(os.path.join(workdir, "tensorboard")) if enabled and tensorboard else None

    def write(self, step: int, metrics: Mapping[str, Any]) -> dict:
        row = {"step": int(step)}
        for k, v in metrics.items():
            s = _scalar(v)
            if s is not None and (not isinstance(s, float) or math.isfinite(s)):
                row[k] = s
            elif s is not None:
                row[k] = str(s)  # nan / inf stay visible in the log
        if self.enabled:
            with open(self.path, "a") as f:
                f.write(json.dumps(row) + "\n")
            if self._tb is not None:
                self._tb.add_scalars({k: v for k, v in row.items() if k != "step" and isinstance(v, (int, float))},
                                     step)
        return row

    def close(self):
        if self._tb is not None:
            self._tb.close()


class _EventWriter:
    """TensorBoard scalars through the ``tensorboard`` package's own event-file writer
    (no TensorFlow, torch or tensorboardX needed)."""

    def __init__(self, logdir: str):
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
        self._event, self._summary = Event, Summary
        self._writer = EventFileWriter(logdir)

    def add_scalars(self, values: Mapping[str, float], step: int) -> None:
        summary = self._summary(value=[self._summary.Value(tag=k, simple_value=float(v)) for k, v in values.items()])
        self._writer.add_event(self._event(wall_time=time.time(), step=int(step), summary=summary))
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def _tensorboard_writer(logdir: str):
    """A scalar writer when ``tensorboard`` is installed, else None (metrics.jsonl only)."""
    try:
        return _EventWriter(logdir)
    except ImportError:
        return None


class Progress:
    """A progress bar with ETA on a terminal, plain log lines otherwise."""

    def __init__(self, total: int, start: int = 0, *, enabled: bool = True, stream=None):
        self.total, self.start = total, start
        self.t0 = time.time()
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()

    def update(self, step: int, row: Mapping[str, Any]) -> None:
        if not self.enabled:
            return
        done = step - self.start
        rate = done / max(time.time() - self.t0, 1e-9)
        eta = (self.total - step) / rate if rate > 0 else float("inf")
        loss = row.get("loss")
        loss_s = f"{loss:.4f}" if isinstance(loss, (int, float)) else str(loss)
        msg = f"step {step}/{self.total} loss {loss_s} | {rate:.2f} it/s | eta {_fmt(eta)}"
        if self.tty:
            width = 24
            filled = int(width * step / max(self.total, 1))
            self.stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {msg}   ")
        else:
            self.stream.write(msg + "\n")
        self.stream.flush()

    def close(self):
        if self.tty:
            self.stream.write("\n")


def _fmt(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"
