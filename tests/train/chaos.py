"""Kill -9 a ``python -m launch.train`` run at chosen or random moments, rerun it, and
check what the reruns say and leave behind.

The helpers read only what a user sees: the log lines ("resumed from step N",
"starting from step 0"), the checkpoint folders orbax leaves (complete ``<step>/`` and
unfinished ``<step>.orbax-checkpoint-tmp-*``), ``metrics.jsonl`` and the exported
safetensors. Every launch of a test shares one persistent XLA compilation cache, so
that a rerun does not pay the compile again (cached executables are the same code).

Random kill moments come from ``SEED``: ``GUILIBRA_CHAOS_SEED`` when set, else drawn once
per session from the clock. :func:`chaos_run` prints it first (pytest shows a failing
test's output) and names it in its failure messages; rerun a failure with
``GUILIBRA_CHAOS_SEED=<seed>`` for the same moments (the moments are steps and fractions
of a step's time, so the timing itself still varies with the machine).
"""
from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import signal
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UNFINISHED = ".orbax-checkpoint-tmp"
RESUMED = re.compile(r"resumed from step (\d+)")
FRESH = "starting from step 0"
SEED = int(os.environ.get("GUILIBRA_CHAOS_SEED") or time.time_ns() % 2**31)


TRAIN = "launch.train"                        # the module a launch runs (``module=``)
VARIED_REWARD = "tests.train.varied_reward_train"   # launch.train with rewards that vary in a group


def seed_note(seed: int) -> str:
    return f"chaos seed {seed} (rerun with GUILIBRA_CHAOS_SEED={seed})"


def env(cache_dir: str) -> dict:
    return {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu", "JAX_COMPILATION_CACHE_DIR": cache_dir,
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@dataclasses.dataclass
class Launch:
    proc: subprocess.Popen
    log_path: str
    metrics_lines_before: int

    def output(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


def launch(workdir: str, args: list[str], cache_dir: str, tag: str = "run", module: str = TRAIN) -> Launch:
    os.makedirs(workdir, exist_ok=True)
    log_path = os.path.join(os.path.dirname(os.path.abspath(workdir)),
                            f"{os.path.basename(workdir)}.{tag}.{time.time_ns()}.log")
    cmd = [sys.executable, "-m", module, f"--workdir={workdir}", *args]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env(cache_dir), stdout=log, stderr=subprocess.STDOUT)
    return Launch(proc, log_path, len(metric_rows(workdir)))


def run_to_end(workdir: str, args: list[str], cache_dir: str, timeout: float = 900, module: str = TRAIN) -> str:
    run = launch(workdir, args, cache_dir, "end", module)
    try:
        run.proc.wait(timeout=timeout)
    finally:
        run.kill()
    out = run.output()
    assert run.proc.returncode == 0, out[-4000:]
    return out


def metric_rows(workdir: str) -> list[dict]:
    """The rows of metrics.jsonl (a line cut short by a kill is skipped)."""
    path = os.path.join(workdir, "metrics.jsonl")
    rows = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    pass
    return rows


def complete_steps(workdir: str) -> list[int]:
    d = os.path.join(workdir, "checkpoints")
    return sorted(int(n) for n in os.listdir(d) if n.isdigit()) if os.path.isdir(d) else []


def unfinished_saves(workdir: str) -> list[str]:
    d = os.path.join(workdir, "checkpoints")
    return sorted(n for n in os.listdir(d) if UNFINISHED in n) if os.path.isdir(d) else []


def resumed_from(output: str) -> int | None:
    """The step a launch said it resumed from (0: a fresh start); None if it never said."""
    m = RESUMED.findall(output)
    if m:
        return int(m[-1])
    return 0 if FRESH in output else None


def wait_until(cond, run: Launch, timeout: float = 900, poll: float = 0.02) -> bool:
    """Poll ``cond()`` until true (True) or the run ends (False)."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        if cond():
            return True
        if run.proc.poll() is not None:
            return cond()
        time.sleep(poll)
    raise TimeoutError(f"condition not met in {timeout} s; log tail: {run.output()[-3000:]}")


def new_steps(run: Launch, workdir: str) -> list[int]:
    return [r["step"] for r in metric_rows(workdir)[run.metrics_lines_before:] if "loss" in r]


def stop(proc: subprocess.Popen, timeout: float = 5.0) -> None:
    """SIGSTOP, and wait until the kernel reports the process stopped."""
    proc.send_signal(signal.SIGSTOP)
    t0 = time.time()
    while time.time() - t0 < timeout:
        try:
            with open(f"/proc/{proc.pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("T", "t"):
                    return
        except (OSError, IndexError):
            return
        time.sleep(0.001)


def kill_during_save(workdir: str, args: list[str], cache_dir: str, min_step: int, tries: int = 3,
                     module: str = TRAIN) -> int:
    """Launch and kill -9 while orbax writes an asynchronous checkpoint of a step >=
    ``min_step``: when its unfinished folder appears, the process is stopped (SIGSTOP),
    and killed only if that folder is still unfinished then, else let go on to the next
    save. Returns the step whose save was cut; the unfinished folder is left behind."""
    for _ in range(tries):
        run = launch(workdir, args, cache_dir, "save-kill", module)
        seen: set[str] = set(unfinished_saves(workdir))

        def fresh_save():
            return [n for n in unfinished_saves(workdir) if n not in seen and int(n.split(".")[0]) >= min_step]

        try:
            while wait_until(lambda: bool(fresh_save()), run, poll=0.005):
                names = fresh_save()
                stop(run.proc)
                still = [n for n in names if n in unfinished_saves(workdir)]
                if still:
                    run.kill()
                    return int(still[0].split(".")[0])
                seen.update(names)
                run.proc.send_signal(signal.SIGCONT)
        finally:
            run.kill()
    raise AssertionError(f"no asynchronous save caught in flight in {tries} launches")


def kill_at_random_moment(workdir: str, args: list[str], cache_dir: str, rng: random.Random, steps: int,
                          startup_s: float = 20.0, module: str = TRAIN) -> tuple[Launch, str]:
    """Launch and kill -9 at a random moment: during start-up (one time in five: a
    uniform time in [0, startup_s]) or after a random step not logged yet is logged,
    plus a random fraction of a step's time (compute, an asynchronous save, the export
    at the end). Returns the launch and where it was killed (for failure messages)."""
    run = launch(workdir, args, cache_dir, "random-kill", module)
    done = max([r["step"] for r in metric_rows(workdir)], default=0)
    # One kill in five during start-up; else after a step this launch has still to run.
    target = 0 if rng.random() < 0.2 or done >= steps else rng.randint(done + 1, steps)
    if target == 0:
        delay = rng.uniform(0, startup_s)
        time.sleep(delay)
        where = f"{delay:.1f} s after launch"
    else:
        t0 = time.time()
        reached = wait_until(lambda: any(s >= target for s in new_steps(run, workdir)), run, poll=0.01)
        per_step = (time.time() - t0) / max(1, len(new_steps(run, workdir)))
        delay = rng.uniform(0, min(per_step, 5.0))
        time.sleep(delay)
        where = f"{delay:.2f} s after step {target} was logged" if reached else "after the run ended"
    run.kill()
    return run, where


def check_resume(output: str, expected: int, context: str) -> None:
    """A launch's log names the step it resumed from, and it is ``expected`` (the newest
    complete checkpoint when it started)."""
    got = resumed_from(output)
    assert got is not None, f"{context}: the log never says where it resumed from:\n{output[-3000:]}"
    assert got == expected, f"{context}: resumed from step {got}, expected {expected} (newest complete checkpoint)"


def export_tensors(workdir: str) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file
    return load_file(os.path.join(workdir, "export", "model.safetensors"))


def assert_bitwise_equal_exports(reference: str, workdir: str, notes: list[str] = ()) -> None:
    """``notes``: what the failure message adds (the chaos seed and the kills)."""
    a, b = export_tensors(reference), export_tensors(workdir)
    assert sorted(a) == sorted(b), "; ".join(notes)
    differ = [k for k in a if not np.array_equal(a[k], b[k])]
    worst = {k: float(np.abs(a[k].astype(np.float64) - b[k]).max()) for k in differ[:5]}
    assert not differ, (f"{len(differ)} of {len(a)} exported tensors differ from the uninterrupted run: {worst}; "
                        + "; ".join(notes))


def chaos_run(workdir: str, args: list[str], cache_dir: str, seed: int, kills: int, steps: int,
              startup_s: float = 20.0, module: str = TRAIN) -> list[str]:
    """Kill -9 the run ``kills`` times at random moments drawn from ``seed``, each time
    rerunning the same command; then run it to the end. Every launch that gets as far as
    opening its checkpoints must say it resumed from the newest complete checkpoint
    present when it started. Returns the seed's note and where each kill landed (for
    the caller's failure messages)."""
    rng = random.Random(seed)
    notes = [seed_note(seed)]
    print(notes[0], flush=True)   # in the report of any failure, whatever raised
    for k in range(kills):
        expected = max(complete_steps(workdir), default=0)
        run, where = kill_at_random_moment(workdir, args, cache_dir, rng, steps, startup_s, module)
        got = resumed_from(run.output())
        notes.append(f"kill {k + 1}: {where} (resumed from {got}, newest complete {expected})")
        if got is not None:
            assert got == expected, "; ".join(notes)
    expected = max(complete_steps(workdir), default=0)
    out = run_to_end(workdir, args, cache_dir, module=module)
    check_resume(out, expected, "; ".join(notes) + "; final rerun")
    return notes
