"""What a long run's log shows about its health: how many programs this process has
lowered and compiled so far, and its host memory.

Every logged row gets ``sys/lowerings`` (programs traced and lowered to XLA since the
process started: a jit cache miss, whether or not the persistent compilation cache then
serves the binary), ``sys/compiles`` (XLA backend compiles) and ``sys/host_rss_mib``
(resident set size now). After warm-up (the first step, the first eval, the first
checkpoint, each shape bucket once) ``sys/lowerings`` must stop growing; a run whose
count keeps rising recompiles (a shape or a static argument that changes per step), and
a rising RSS is a host leak. ``tests/train/test_soak.py`` checks both.

The counts come from JAX's monitoring events (``jax.monitoring``), registered once per
process.
"""

from __future__ import annotations

import os
import resource
import threading

from jax import monitoring

# The event names of jax._src.dispatch (stable since jax 0.4.x).
LOWERING_EVENT = "/jax/core/compile/jaxpr_to_mlir_module_duration"
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"

_counts = {LOWERING_EVENT: 0, BACKEND_COMPILE_EVENT: 0}
_lock = threading.Lock()
_registered = False


def _listener(event: str, duration_secs: float, **kwargs) -> None:
    if event in _counts:
        with _lock:
            _counts[event] += 1


def watch() -> None:
    """Start counting lowerings and compiles in this process (idempotent)."""
    global _registered
    with _lock:
        if _registered:
            return
        monitoring.register_event_duration_secs_listener(_listener)
        _registered = True


def host_rss_mib() -> float:
    """This process's resident set size now, in MiB (Linux: /proc/self/statm; elsewhere
    the peak, from getrusage)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / 2**20 if os.uname().sysname == "Darwin" else peak / 1024


def row() -> dict:
    """The health columns of a metrics row (module docstring)."""
    with _lock:
        lowerings, compiles = _counts[LOWERING_EVENT], _counts[BACKEND_COMPILE_EVENT]
    return {"sys/lowerings": lowerings, "sys/compiles": compiles, "sys/host_rss_mib": round(host_rss_mib(), 1)}
