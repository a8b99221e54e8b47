"""One live run per workdir: ``<workdir>/run.lock``.

    with run_lock(workdir):     # train/run.py, around the whole run
        ...

A run takes the lock before it writes anything into the workdir and removes it when it
ends (normally, on an error, or after a SIGTERM checkpoint). A second run on a workdir
whose run is alive (a scheduler retry while the first job still runs, two terminals)
stops at once with a one-line :class:`WorkdirBusy` naming the live process: host, pid
and when it started.

The lock file is JSON: the holder's host, pid, start time, boot id, pid namespace and
process start (``guilibra_jax.process_id``), a random token and its command line. It
appears whole: written to ``run.lock.<pid>.tmp`` and hard-linked to ``run.lock``, which
fails if a lock exists (``O_EXCL`` creation where the file system has no hard links).

Is the holder alive?

* On this machine (same host name, boot id and pid namespace) its pid is checked: a pid
  that does not run, a zombie, or a pid reused by another process (another start time)
  is a dead holder (``kill -9``, an out-of-memory kill). The heartbeat is not needed.
* From another machine (a workdir on a shared file system) the pid cannot be checked:
  the holder refreshes the lock file's modification time every
  ``GUILIBRA_LOCK_HEARTBEAT_S`` seconds (default 30) from a daemon thread, and a lock
  whose heartbeat is older than ``GUILIBRA_LOCK_STALE_S`` seconds (default 300) is a
  dead holder's (a lost node). Until then the second run is refused, and the message
  says when the lock will count as stale. The clocks of the hosts are assumed to agree
  to well within that timeout.

A dead holder's lock is taken over with a warning naming it: moved to
``run.lock.stale-<pid>`` (one rename, so of two processes taking over at once only one
succeeds), checked to be the lock judged dead, and removed. If the holder loses its lock
while it runs (its heartbeat stalled past the timeout and another run took over), the
heartbeat thread logs an error once; the run goes on (its checkpoints are whole steps).

Multi-process runs hold one lock per run: process 0 takes it; the others do not, and
learn through a collective whether process 0 got it (if not, every process stops with
a user error).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import sys
import threading
import time
import uuid

from guilibra_jax import process_id as P
from guilibra_jax.errors import UserError

log = logging.getLogger(__name__)

LOCK_FILE = "run.lock"
HEARTBEAT_ENV, STALE_ENV = "GUILIBRA_LOCK_HEARTBEAT_S", "GUILIBRA_LOCK_STALE_S"
DEFAULT_HEARTBEAT_S, DEFAULT_STALE_S = 30.0, 300.0


class WorkdirBusy(UserError):
    """The workdir's run is alive."""


def _env_seconds(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name, "") or default)
    except ValueError:
        raise UserError(f"{name}={os.environ[name]!r}: expected a number of seconds") from None
    return value if value > 0 else default


def stale_after_s() -> float:
    return _env_seconds(STALE_ENV, DEFAULT_STALE_S)


def heartbeat_s() -> float:
    return _env_seconds(HEARTBEAT_ENV, DEFAULT_HEARTBEAT_S)


def read_lock(path: str) -> tuple[dict | None, float | None]:
    """(holder, modification time) of the lock file ``path``; (None, None) when there is
    none; ({}, mtime) when it cannot be parsed."""
    try:
        mtime = os.stat(path).st_mtime
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return None, None
    try:
        holder = json.loads(text)
    except ValueError:
        return {}, mtime
    return (holder if isinstance(holder, dict) else {}), mtime


def holder_is_alive(holder: dict, mtime: float, now: float | None = None) -> tuple[bool, str]:
    """(alive, why) for the holder of a lock last refreshed at ``mtime`` (module docstring)."""
    running = P.is_running(holder) if holder else None
    if running is not None:
        pid = holder.get("pid")
        return running, (f"pid {pid} runs on this host" if running else f"pid {pid} no longer runs on this host")
    age, stale = (now or time.time()) - mtime, stale_after_s()
    where = "its pid cannot be checked from here" if holder else "the lock file is unreadable"
    if age > stale:
        return False, f"{where} and its heartbeat is {age:.0f} s old (stale after {STALE_ENV}={stale:.0f} s)"
    return True, (f"{where}; its heartbeat is {age:.0f} s old, so it counts as alive until the heartbeat is "
                  f"{stale:.0f} s old ({STALE_ENV})")


class WorkdirLock:
    """The lock of ``workdir`` (module docstring). ``acquire`` / ``release``, or ``with``."""

    def __init__(self, workdir: str):
        self.workdir = workdir
        self.path = os.path.join(workdir, LOCK_FILE)
        self.me = {**P.this_process(), "token": uuid.uuid4().hex, "command": " ".join(sys.argv)[:300]}
        self.held = False
        self.took_over: dict | None = None   # the dead holder whose lock this one replaced
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- acquire / release

    def acquire(self, tries: int = 5) -> "WorkdirLock":
        os.makedirs(self.workdir, exist_ok=True)
        for _ in range(tries):
            if self._create():
                self.held = True
                self._start_heartbeat()
                return self
            holder, mtime = read_lock(self.path)
            if holder is None:   # released in between: try again
                continue
            if not holder and time.time() - mtime < 2.0:   # another process is writing it (no hard links)
                time.sleep(0.2)
                continue
            alive, why = holder_is_alive(holder, mtime)
            if alive:
                raise WorkdirBusy(f"workdir {self.workdir} is in use by a live run ({P.describe(holder)}; {why}): "
                                  f"wait for it to end or stop it; if that process is gone, delete {self.path}")
            log.warning("workdir %s: taking over the lock of a run that is gone (%s; %s)", self.workdir,
                        P.describe(holder) if holder else "unreadable lock file", why)
            if self._remove_stale(holder):
                self.took_over = holder
        raise WorkdirBusy(f"workdir {self.workdir}: could not take {self.path} in {tries} tries (other processes "
                          f"keep taking it)")

    def _create(self) -> bool:
        """Create the lock file whole; False if one exists."""
        tmp = f"{self.path}.{self.me['pid']}.{self.me['token'][:8]}.tmp"
        with open(tmp, "w") as f:
            json.dump(self.me, f)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, self.path)
            return True
        except FileExistsError:
            return False
        except OSError as e:   # no hard links here: exclusive creation (written just after)
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
                raise
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "w") as f:
                json.dump(self.me, f)
            return True
        finally:
            os.remove(tmp)

    def _remove_stale(self, holder: dict) -> bool:
        """Move the lock judged dead aside and delete it; False (nothing removed) when the
        file changed since it was judged (another process took over first)."""
        aside = f"{self.path}.stale-{self.me['pid']}"
        try:
            os.replace(self.path, aside)
        except FileNotFoundError:
            return False
        moved, _ = read_lock(aside)
        if (moved or {}).get("token") != (holder or {}).get("token"):   # a fresh lock: put it back
            with contextlib.suppress(FileExistsError):
                os.link(aside, self.path)
            os.remove(aside)
            return False
        os.remove(aside)
        return True

    def holds(self) -> bool:
        """Whether the lock file still carries this lock's token."""
        holder, _ = read_lock(self.path)
        return bool(holder) and holder.get("token") == self.me["token"]

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self.held and self.holds():
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.path)
        self.held = False

    def __enter__(self) -> "WorkdirLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    # -- heartbeat

    def _start_heartbeat(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, args=(heartbeat_s(),), name="workdir-lock-heartbeat",
                                        daemon=True)
        self._thread.start()

    def _beat(self, every: float) -> None:
        while not self._stop.wait(every):
            try:
                if not self.holds():
                    holder, _ = read_lock(self.path)
                    log.error("workdir %s: this run lost its lock %s to %s (its heartbeat was older than %s s?); two "
                              "runs may now write this workdir", self.workdir, self.path,
                              P.describe(holder) if holder else "nobody", stale_after_s())
                    return
                os.utime(self.path)
            except OSError as e:   # a file-system hiccup: try again at the next beat
                log.warning("workdir %s: lock heartbeat failed: %s", self.workdir, e)


@contextlib.contextmanager
def run_lock(workdir: str):
    """Hold ``workdir``'s lock around a run of one or several processes (module
    docstring): process 0 takes it; with several processes every one learns whether it
    got it. Yields the lock (None on processes other than 0)."""
    import jax
    lock, error = None, None
    if jax.process_index() == 0:
        try:
            lock = WorkdirLock(workdir).acquire()
        except UserError as e:
            error = e
    if jax.process_count() > 1:
        from guilibra_jax.train import multihost as MH
        got = MH.gather_counts(0 if error is not None else 1)   # a collective: every process calls it
        if error is None and not got[0]:
            raise WorkdirBusy(f"workdir {workdir}: process 0 could not take its lock {os.path.join(workdir, LOCK_FILE)} "
                              f"(see process 0's error)")
    if error is not None:
        raise error
    try:
        yield lock
    finally:
        if lock is not None:
            lock.release()
