"""The workdir lock (train/workdir_lock.py) with real processes: a live holder makes a
second run stop at once with one line naming its host, pid and start; a holder killed
with -9 (reaped or still a zombie) leaves a lock the next run takes over with a warning;
a lock from another host is judged by its heartbeat; only process 0 takes the lock."""
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from guilibra_jax.errors import UserError
from guilibra_jax.train import workdir_lock as WL

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOLDER = ("import sys, time\n"
          "from guilibra_jax.train.workdir_lock import WorkdirLock\n"
          "WorkdirLock(sys.argv[1]).acquire()\n"
          "print('locked', flush=True)\n"
          "time.sleep(600)\n")


def _env():
    return {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}


@pytest.fixture
def holder(tmp_path):
    """A child process holding the lock of ``tmp_path / 'run'`` (killed at the end)."""
    workdir = str(tmp_path / "run")
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, workdir], cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.strip() == "locked", proc.stderr.read()
    yield workdir, proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def test_a_live_holder_stops_a_second_acquire_at_once_naming_host_pid_and_start(holder, monkeypatch):
    workdir, proc = holder
    monkeypatch.setattr(WL.time, "sleep", lambda s: pytest.fail(f"waited {s} s for a live holder"))
    with pytest.raises(WL.WorkdirBusy) as e:
        WL.WorkdirLock(workdir).acquire()
    msg = str(e.value)
    assert "\n" not in msg and isinstance(e.value, UserError)
    assert f"pid {proc.pid}" in msg and f"host {socket.gethostname()}" in msg and "started 20" in msg, msg
    assert proc.poll() is None   # nothing done to the holder


@pytest.mark.parametrize("reaped", [True, False], ids=["reaped", "zombie"])
def test_a_lock_left_by_kill_9_is_taken_over_with_a_warning(holder, caplog, reaped):
    workdir, proc = holder
    proc.send_signal(signal.SIGKILL)
    if reaped:
        proc.wait()
    else:   # killed but not yet waited for: a zombie whose pid still exists
        while True:
            with open(f"/proc/{proc.pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.01)
    with caplog.at_level(logging.WARNING):
        lock = WL.WorkdirLock(workdir).acquire()
    try:
        assert lock.took_over["pid"] == proc.pid
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any("taking over" in w and f"pid {proc.pid}" in w and "no longer runs" in w for w in warned), warned
        assert json.load(open(os.path.join(workdir, WL.LOCK_FILE)))["pid"] == os.getpid()
    finally:
        lock.release()
    assert not os.path.exists(os.path.join(workdir, WL.LOCK_FILE))


def _foreign_lock(workdir, age_s):
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, WL.LOCK_FILE)
    with open(path, "w") as f:
        json.dump({"host": "another-node", "pid": 4242, "started": time.time() - age_s - 60, "boot_id": "x",
                   "pid_ns": "", "proc_start": 1, "token": "t"}, f)
    os.utime(path, (time.time() - age_s, time.time() - age_s))
    return path


def test_another_hosts_lock_is_alive_while_its_heartbeat_is_fresh_and_taken_over_when_stale(tmp_path, caplog,
                                                                                            monkeypatch):
    monkeypatch.setenv(WL.STALE_ENV, "300")
    workdir = str(tmp_path / "run")
    _foreign_lock(workdir, age_s=10)
    with pytest.raises(WL.WorkdirBusy, match=r"host another-node, pid 4242.*heartbeat is 1\d s old.*300 s"):
        WL.WorkdirLock(workdir).acquire()
    _foreign_lock(workdir, age_s=400)   # a lost node: no heartbeat for longer than the timeout
    with caplog.at_level(logging.WARNING):
        lock = WL.WorkdirLock(workdir).acquire()
    lock.release()
    assert lock.took_over["host"] == "another-node"
    assert any("another-node" in r.getMessage() and "40" in r.getMessage() for r in caplog.records)


def test_the_holder_refreshes_its_heartbeat_and_reports_a_lost_lock(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv(WL.HEARTBEAT_ENV, "0.05")
    workdir = str(tmp_path / "run")
    lock = WL.WorkdirLock(workdir).acquire()
    path = os.path.join(workdir, WL.LOCK_FILE)
    try:
        old = time.time() - 1000
        os.utime(path, (old, old))
        deadline = time.time() + 30
        while os.stat(path).st_mtime < old + 500 and time.time() < deadline:
            time.sleep(0.02)
        assert os.stat(path).st_mtime > old + 500   # touched again by the heartbeat thread
        with caplog.at_level(logging.ERROR):
            _foreign_lock(workdir, age_s=0)   # someone else's lock now
            while not any("lost its lock" in r.getMessage() for r in caplog.records) and time.time() < deadline:
                time.sleep(0.02)
        assert any("lost its lock" in r.getMessage() and "another-node" in r.getMessage() for r in caplog.records)
    finally:
        lock.release()
    assert os.path.exists(path)   # another's lock is never removed by release


def test_only_process_0_takes_the_lock(tmp_path, monkeypatch):
    import jax
    workdir = str(tmp_path / "run")
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    with WL.run_lock(workdir) as lock:
        assert lock is None and not os.path.exists(os.path.join(workdir, WL.LOCK_FILE))
    monkeypatch.setattr(jax, "process_index", lambda: 0)
    with WL.run_lock(workdir) as lock:
        assert lock.holds()
    assert not os.path.exists(os.path.join(workdir, WL.LOCK_FILE))


MULTI = ("import os, sys\n"
         "from guilibra_jax.train import distributed\n"
         "distributed.initialize()\n"
         "import jax\n"
         "from jax.experimental import multihost_utils\n"
         "from guilibra_jax.train import workdir_lock as WL\n"
         "try:\n"
         "    with WL.run_lock(sys.argv[1]) as lock:\n"
         "        held = os.path.exists(os.path.join(sys.argv[1], WL.LOCK_FILE))\n"
         "        multihost_utils.sync_global_devices('checked')   # process 0 holds it while both look\n"
         "        print('HELD', jax.process_index(), lock is not None, held, flush=True)\n"
         "except WL.WorkdirBusy as e:\n"
         "    print('BUSY', jax.process_index(), e, flush=True)\n")


def _two_processes(workdir):
    """What each of the 2 processes of one run says about the lock (process order)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, "-c", MULTI, workdir], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env={**_env(), "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}", "JAX_NUM_PROCESSES": "2",
                                   "JAX_PROCESS_ID": str(i)}) for i in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    lines = [[line for line in out.splitlines() if line.startswith(("HELD", "BUSY"))] for out, _ in outs]
    assert all(len(x) == 1 for x in lines), [err[-3000:] for _, err in outs]
    return [x[0] for x in lines]


def test_a_two_process_run_holds_one_lock_taken_by_process_0(tmp_path):
    workdir = str(tmp_path / "run")
    assert _two_processes(workdir) == ["HELD 0 True True", "HELD 1 False True"]
    assert not os.path.exists(os.path.join(workdir, WL.LOCK_FILE))


def test_a_two_process_run_on_a_live_runs_workdir_stops_on_every_process(holder):
    workdir, proc = holder
    p0, p1 = _two_processes(workdir)
    assert p0.startswith("BUSY 0") and f"pid {proc.pid}" in p0, p0
    assert p1.startswith("BUSY 1") and "process 0 could not take its lock" in p1, p1


def _smoke_config():
    import importlib.util
    spec = importlib.util.spec_from_file_location("demo_recipe", os.path.join(ROOT, "configs", "demo.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.get_config("smoke")


def test_train_on_a_locked_workdir_stops_before_writing_anything(holder):
    from guilibra_jax.train.run import train
    workdir, proc = holder
    before = sorted(os.listdir(workdir))
    with pytest.raises(WL.WorkdirBusy, match=f"pid {proc.pid}"):
        train(_smoke_config(), workdir)
    assert sorted(os.listdir(workdir)) == before == [WL.LOCK_FILE]


def test_launch_train_on_a_locked_workdir_exits_2_with_one_line(holder):
    workdir, proc = holder
    out = subprocess.run([sys.executable, "-m", "launch.train", "--config=configs/demo.py:smoke",
                          f"--workdir={workdir}"], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert out.returncode == 2 and len(errors) == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert f"pid {proc.pid}" in errors[0] and "in use by a live run" in errors[0]
    assert sorted(os.listdir(workdir)) == [WL.LOCK_FILE]
