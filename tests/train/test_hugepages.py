"""The launchers re-execute themselves with glibc's huge-page tunable for malloc (see
distributed.HUGEPAGE_TUNABLE): same pid and command line, the user's own setting kept."""

import os
import subprocess
import sys

from guilibra_jax.train import distributed as D

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_environment_gains_the_tunable_only_where_glibc_reads_it():
  assert D.hugepage_environ({}, "glibc 2.36")["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
  assert D.hugepage_environ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, "glibc 2.35")["GLIBC_TUNABLES"] == \
      "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
  assert D.hugepage_environ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, "glibc 2.36") is None   # the user's
  assert D.hugepage_environ({"GUILIBRA_NO_HUGEPAGES": "1"}, "glibc 2.36") is None
  assert D.hugepage_environ({}, "glibc 2.31") is None          # older glibc: no such tunable
  assert D.hugepage_environ({}, "musl 1.2") is None
  assert D.hugepage_environ({}, "") is None


def test_a_launcher_reexecutes_once_with_the_same_pid_and_arguments(tmp_path):
  script = tmp_path / "probe.py"
  script.write_text(
      "import os, sys\n"
      "print('start', os.getpid(), os.environ.get('GLIBC_TUNABLES', ''), sys.argv[1:], flush=True)\n"
      "from guilibra_jax.train import distributed\n"
      "distributed.reexec_with_hugepages()\n"
      "print('after', os.getpid(), os.environ.get('GLIBC_TUNABLES', ''), sys.argv[1:], flush=True)\n")
  env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "GUILIBRA_NO_HUGEPAGES")}
  env["PYTHONPATH"] = ROOT
  out = subprocess.run([sys.executable, str(script), "--flag=a b"], env=env, capture_output=True, text=True,
                       timeout=60, check=True).stdout.split("\n")
  lines = [line for line in out if line]
  expected = D.hugepage_environ(env, os.confstr("CS_GNU_LIBC_VERSION"))
  if expected is None:      # not glibc >= 2.35: nothing to do, no re-exec
    assert [line.split()[0] for line in lines] == ["start", "after"]
    return
  pids = {line.split()[1] for line in lines}
  assert [line.split()[0] for line in lines] == ["start", "start", "after"]   # one re-exec, then on
  assert len(pids) == 1                                                        # the same process
  assert lines[-1].endswith("glibc.malloc.hugetlb=1 ['--flag=a b']")


def test_the_demo_run_benchmark_runs_a_side_and_writes_its_file(tmp_path):
  """benchmarks.demo_run end to end on the smoke recipe (one side, one round): it cannot rot."""
  import json
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  subprocess.run([sys.executable, "-m", "benchmarks.demo_run", "--config=configs/demo.py:smoke", "--steps=2",
                  "--rounds=1", "--sides=no_hugepages", f"--out_dir={tmp_path}", "--loaded"], cwd=ROOT, env=env,
                 check=True, capture_output=True, text=True, timeout=300)
  (path,) = tmp_path.glob("demo_run-*.json")
  res = json.loads(path.read_text())
  (run,) = res["runs"]
  assert run["side"] == "no_hugepages" and run["wall_s"] > 0 and run["minor_faults"] > 0
  assert res["git"]["commit"] and res["loaded"] is True


def test_the_demo_run_benchmark_records_the_final_held_out_accuracy(tmp_path):
  """A full demo_run row carries the run's last logged held-out step accuracy (a faster run
  must be seen to learn as much)."""
  import json
  from benchmarks.demo_run import final_eval
  path = tmp_path / "metrics.jsonl"
  rows = [{"step": 600, "eval/step_acc": 0.5, "eval/desktop/step_acc": 0.4}, {"step": 1199, "loss": 0.1},
          {"step": 1200, "eval/step_acc": 0.8, "eval/desktop/step_acc": 0.75, "eval/mobile/step_acc": 0.85}]
  path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
  assert final_eval(str(path)) == {"eval/step_acc": 0.8, "eval/desktop/step_acc": 0.75, "eval/mobile/step_acc": 0.85}
  path.write_text(json.dumps({"step": 1, "loss": 1.0}) + "\n")
  assert final_eval(str(path)) == {}
