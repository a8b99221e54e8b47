"""Who wrote a lock or a half-written output, and whether that process still runs.

A process is named by its host, pid and start time, plus, on Linux, the kernel's boot
id, its pid namespace and its start in clock ticks since boot (``/proc/<pid>/stat``).
Only a process on *this* machine can be checked: same host name, boot id and pid
namespace (two containers sharing a host name, or a node rebooted under the same name,
are other machines). There, a pid that does not run, runs as a zombie, or runs with
another start time (the pid was reused) is a dead process. Elsewhere :func:`is_running`
answers None: the caller decides (the workdir lock goes by its heartbeat).
"""

from __future__ import annotations

import os
import socket
import time


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def boot_id() -> str:
    return _read("/proc/sys/kernel/random/boot_id")


def pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first), or None."""
    text = _read(f"/proc/{pid}/stat")
    return text.rsplit(")", 1)[1].split() if ")" in text else None


def process_start(pid: int) -> int | None:
    """Start of ``pid`` in clock ticks since boot (Linux), or None."""
    fields = _stat(pid)
    try:
        return int(fields[19]) if fields else None
    except (IndexError, ValueError):
        return None


def this_process() -> dict:
    """This process's identity (JSON-able)."""
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "started": time.time(), "boot_id": boot_id(),
            "pid_ns": pid_namespace(), "proc_start": process_start(pid)}


def on_this_machine(info: dict) -> bool:
    """Whether the process ``info`` (:func:`this_process` of it) ran on this machine, where
    its pid means something."""
    me = this_process()
    if info.get("host") != me["host"]:
        return False
    return all(not info.get(k) or not me[k] or info[k] == me[k] for k in ("boot_id", "pid_ns"))


def is_running(info: dict) -> bool | None:
    """True / False for a process of this machine, None for one elsewhere (module docstring)."""
    if not on_this_machine(info):
        return None
    pid = int(info.get("pid") or 0)
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # another user's process: it exists
        pass
    fields = _stat(pid)
    if fields and fields[0] in ("Z", "X"):   # killed, not yet reaped by its parent
        return False
    start = process_start(pid)
    if info.get("proc_start") and start is not None and start != info["proc_start"]:
        return False   # the pid now belongs to another process
    return True


def describe(info: dict) -> str:
    """``host h, pid 123, started 2025-01-02 03:04:05 UTC``."""
    started = info.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)) if started else "at an unknown time"
    return f"host {info.get('host', '?')}, pid {info.get('pid', '?')}, started {when}"
