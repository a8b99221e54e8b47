"""Run logging: one writer for ``metrics.jsonl`` (always), TensorBoard and Weights &
Biases (optional), and a progress bar.

* TensorBoard scalars go through ``tensorboardX`` (a maintained, framework-free event
  writer: numpy + protobuf; ``pip install -e .[tensorboard]``). ``train.tensorboard``:
  ``"auto"`` writes them when tensorboardX is installed and warns once, naming the
  install, when it is not; ``True`` makes a missing package an error; ``False`` is off.
  (``clu.metric_writers`` was the other candidate: its package imports TensorFlow for
  TensorBoard, or torch.)
* W&B (``pip install -e .[wandb]``) when ``train.wandb.project`` is set: the run's
  config, every logged row, ``mode="offline"`` needs no network (``wandb sync`` later).
  The W&B run id is kept in the workdir, so a resumed run continues the same W&B run.
* :class:`Progress`: a tqdm bar with the loss, tokens/s and the ETA on a terminal, the
  same line (one per log step) in a log file.
"""

from __future__ import annotations

import json
import logging
import math
import os
import secrets
import sys
import time
from typing import Any, Mapping

from guilibra_jax.choices import WANDB_MODES
from guilibra_jax.errors import ConfigError

log = logging.getLogger(__name__)

TENSORBOARD_MODES = ("auto", True, False)


def _scalar(v: Any) -> float | int | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return int(f) if f.is_integer() and abs(f) < 2**53 else f


def _tensorboard_mode(value: Any) -> Any:
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if value not in TENSORBOARD_MODES or isinstance(value, (int, float)) and not isinstance(value, bool):
        raise ConfigError(f"config key train.tensorboard = {value!r} is invalid: expected 'auto', True or False")
    return value


class MetricsWriter:
    """Appends one JSON object per logged step to ``workdir/metrics.jsonl`` and sends
    the numeric values to TensorBoard and W&B when configured (module docstring).

    ``wandb``: a mapping with ``project`` (empty: off), ``entity``, ``name``, ``mode``
    (online | offline | disabled), ``tags``; ``config``: the run config W&B records.
    """

    def __init__(self, workdir: str, *, enabled: bool = True, tensorboard: Any = "auto",
                 wandb: Mapping[str, Any] | None = None, config: Any = None):
        self.enabled = enabled
        self.workdir = workdir
        self.path = os.path.join(workdir, "metrics.jsonl")
        mode = _tensorboard_mode(tensorboard)
        self._tb = _tensorboard_writer(os.path.join(workdir, "tensorboard"), mode) if enabled and mode else None
        self._wandb = _wandb_run(workdir, wandb, config) if enabled and wandb and wandb.get("project") else None

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
            numeric = {k: v for k, v in row.items() if k != "step" and isinstance(v, (int, float))}
            if self._tb is not None:
                for k, v in numeric.items():
                    self._tb.add_scalar(k, v, step)
                self._tb.flush()
            if self._wandb is not None:
                self._wandb.log(numeric, step=int(step))
        return row

    def close(self):
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def _tensorboard_writer(logdir: str, mode: Any):
    """A tensorboardX SummaryWriter, or None (``"auto"`` without the package: warned)."""
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        msg = ("TensorBoard logging needs the tensorboardX package: pip install 'guilibra_jax[tensorboard]' "
               "(or pip install tensorboardX)")
        if mode is True:
            raise ConfigError(f"config key train.tensorboard = True: {msg}; or set train.tensorboard=auto / False")
        log.warning("%s; metrics go to metrics.jsonl only (train.tensorboard=False silences this)", msg)
        return None
    return SummaryWriter(logdir=logdir, flush_secs=30)


def _wandb_run(workdir: str, cfg: Mapping[str, Any], config: Any):
    try:
        import wandb
    except ImportError:
        raise ConfigError(f"config key train.wandb.project = {cfg.get('project')!r} asks for Weights & Biases, "
                          f"which is not installed: pip install 'guilibra_jax[wandb]' (or pip install wandb)") from None
    mode = cfg.get("mode") or "online"
    if mode not in WANDB_MODES:
        raise ConfigError(f"config key train.wandb.mode = {mode!r} is invalid: expected one of {WANDB_MODES}")
    id_path = os.path.join(workdir, "wandb_run_id.txt")
    if os.path.exists(id_path):
        with open(id_path) as f:
            run_id = f.read().strip()
    else:
        run_id = secrets.token_hex(4)     # W&B ids: lowercase letters and digits
        with open(id_path, "w") as f:
            f.write(run_id)
    config_dict = config.to_dict() if hasattr(config, "to_dict") else (dict(config) if config else None)
    return wandb.init(project=cfg["project"], entity=cfg.get("entity") or None,
                      name=cfg.get("name") or os.path.basename(os.path.abspath(workdir)),
                      tags=list(cfg.get("tags") or ()) or None, dir=workdir, mode=mode, id=run_id,
                      resume="allow", config=config_dict)


def writer_for_run(config: Any, workdir: str, *, enabled: bool = True) -> MetricsWriter:
    """The run's writer as ``config.train`` asks (tensorboard, wandb)."""
    tc = config.train
    return MetricsWriter(workdir, enabled=enabled, tensorboard=tc.tensorboard, wandb=tc.wandb.to_dict(),
                         config=config)


class Progress:
    """A tqdm progress bar (steps, ETA, loss, tokens/s) on a terminal; on a stream that
    is not one (a log file), tqdm's same line once per update."""

    def __init__(self, total: int, start: int = 0, *, enabled: bool = True, stream=None):
        from tqdm.auto import tqdm
        self._tqdm = tqdm
        self.total, self.start = total, start
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.t0 = time.time()
        self._bar = tqdm(total=total, initial=start, unit="step", file=self.stream, dynamic_ncols=True,
                         smoothing=0.1) if self.tty else None

    @staticmethod
    def postfix(row: Mapping[str, Any]) -> str:
        parts = []
        loss = row.get("loss")
        if loss is not None:
            parts.append(f"loss={loss:.4f}" if isinstance(loss, (int, float)) else f"loss={loss}")
        if isinstance(row.get("tokens_per_s"), (int, float)):
            parts.append(f"tok/s={row['tokens_per_s']:.0f}")
        return ", ".join(parts)

    def update(self, step: int, row: Mapping[str, Any]) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.set_postfix_str(self.postfix(row), refresh=False)
            self._bar.update(step - self._bar.n)
            return
        line = self._tqdm.format_meter(step, self.total, time.time() - self.t0, unit="step", initial=self.start,
                                       postfix=self.postfix(row) or None)
        self.stream.write(line + "\n")
        self.stream.flush()

    def close(self):
        if self._bar is not None:
            self._bar.close()
