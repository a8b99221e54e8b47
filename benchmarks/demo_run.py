"""The quick-start run (``make demo``: ``launch.train --config=configs/demo.py``) as a user runs it,
each side its own process, sides interleaved round by round: wall, user and system CPU
seconds, minor page faults and peak RSS of the whole run (from ``wait4``), and the train
steps' own rate (``metrics.jsonl``'s timestamps are not kept, so the rate is steps over the
wall time after the first logged row).

    python -m benchmarks.demo_run [--steps 300] [--rounds 2] [--sides default,no_hugepages]

Sides: ``default`` (the launcher as shipped) and ``no_hugepages`` (``GUILIBRA_NO_HUGEPAGES=1``:
malloc in 4 KiB pages, see ``guilibra_jax.train.distributed.HUGEPAGE_TUNABLE``). ``--steps 1200 --full``
(evaluation and export on) is the full ``make demo``; each run then also records its final
held-out step accuracy. Writes ``benchmarks/results/demo_run[-full]-<machine>.json`` with the
machine, versions and commit.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

from benchmarks._common import add_result_args, report, run_start

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIDES = {"default": {}, "no_hugepages": {"GUILIBRA_NO_HUGEPAGES": "1"}}


def run_side(side: str, steps: int, full: bool, workdir: str, config: str = "configs/demo.py") -> dict:
    """One ``launch.train`` of the demo in a fresh ``workdir`` (no compilation cache carried over)."""
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "GUILIBRA_NO_HUGEPAGES")}
    env.update(SIDES[side])
    cmd = [sys.executable, "-m", "launch.train", f"--config={config}", f"--workdir={workdir}",
           f"--config.train.steps={steps}"]
    if not full:
        cmd += ["--config.train.eval_every=0", "--config.train.export=False", f"--config.train.checkpoint_every={steps}"]
    t0 = time.time()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.time() - t0
    err = proc.stderr.read()
    proc.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"[demo_run] {side}: launch.train failed:\n{err[-3000:]}")
    row = {"side": side, "wall_s": round(wall, 2), "user_s": round(usage.ru_utime, 2),
           "sys_s": round(usage.ru_stime, 2), "minor_faults": usage.ru_minflt,
           "peak_rss_mib": round(usage.ru_maxrss / 1024, 1)}
    if full:      # the run's own held-out result, so a faster run is seen to learn as much
        row.update(final_eval(os.path.join(workdir, "metrics.jsonl")))
    return row


def final_eval(metrics_path: str) -> dict:
    """The last logged held-out step accuracy (overall and per platform) of a run."""
    from guilibra_jax.train.curves import read_metrics
    rows = [r for r in read_metrics(metrics_path) if "eval/step_acc" in r]
    if not rows:
        return {}
    keys = ("eval/step_acc", "eval/desktop/step_acc", "eval/mobile/step_acc", "eval/constant_baseline_step_acc")
    return {k: rows[-1][k] for k in keys if k in rows[-1]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--sides", default="default,no_hugepages")
    p.add_argument("--full", action="store_true", help="evaluation and export on, as make demo")
    p.add_argument("--config", default="configs/demo.py", help="the recipe (tests: configs/demo.py:smoke)")
    add_result_args(p)
    args = p.parse_args()
    sides = args.sides.split(",")
    unknown = [s for s in sides if s not in SIDES]
    if unknown:
        raise SystemExit(f"--sides: {unknown[0]!r} is not a side; expected some of {sorted(SIDES)}")
    start = run_start()
    runs = []
    for r in range(args.rounds):
        for side in sides:
            workdir = tempfile.mkdtemp(prefix=f"demo_run_{side}_")
            try:
                row = {"round": r, **run_side(side, args.steps, args.full, workdir, args.config)}
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
            print(row, flush=True)
            runs.append(row)
    summary = {}
    for side in sides:
        rows = [x for x in runs if x["side"] == side]
        summary[side] = {k: round(sum(x[k] for x in rows) / len(rows), 2)
                         for k in ("wall_s", "user_s", "sys_s", "minor_faults", "peak_rss_mib")}
    if len(sides) == 2:
        a, b = sides
        summary[f"wall_ratio_{b}_over_{a}"] = round(summary[b]["wall_s"] / summary[a]["wall_s"], 3)
    report("demo_run", "demo_run-full" if args.full else "demo_run", {"config": args.config, "steps": args.steps, "full": args.full, "rounds": args.rounds, "runs": runs,
                                    "summary": summary}, args, start)


if __name__ == "__main__":
    main()
