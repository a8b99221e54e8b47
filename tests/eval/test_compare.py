"""Paired comparison of two online evaluations: episodes matched by id (not by order), the
difference and its interval against hand values, and episode sets that differ refused by
name, through the function and the launcher."""
import json
import os
import random
import subprocess
import sys

import pytest

from guilibra_jax.errors import UserError
from guilibra_jax.eval.compare import compare_online

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _online(outcomes):
    """An online_<agent>.json object as launch.eval writes it for MiniWoB++."""
    return {"episodes": [{"task_id": f"{t}-{s}", "task": t, "seed": s, "success": bool(ok), "steps": 2}
                         for (t, s), ok in outcomes.items()]}


def _pair(seed=0):
    rng = random.Random(seed)
    a = {(t, s): rng.random() < 0.3 for t in ("click-test", "enter-text") for s in range(20)}
    b = {k: (not v) if rng.random() < 0.25 else v for k, v in a.items()}
    return a, b


def test_difference_pairs_episodes_by_id_and_matches_hand_values():
    a, b = _pair()
    ob = _online(b)
    random.Random(1).shuffle(ob["episodes"])               # another order: pairing is by episode id
    got = compare_online(_online(a), ob)
    want = sum(b.values()) / 40 - sum(a.values()) / 40
    assert got["pairs"] == 40 and got["difference"] == pytest.approx(want)
    assert got["a"] == pytest.approx(sum(a.values()) / 40) and got["b"] == pytest.approx(sum(b.values()) / 40)
    lo, hi = got["interval95"]
    assert lo <= want <= hi and lo < hi
    task = got["by_group"]["enter-text"]
    assert task["pairs"] == 20
    assert task["difference"] == pytest.approx(sum(b[k] - a[k] for k in a if k[0] == "enter-text") / 20)
    # b identical to a but one episode turned into a success: the difference is exactly 1/40 and
    # every resample's difference is 0 or positive
    c = dict(a)
    k = next(k for k, v in a.items() if not v)
    c[k] = True
    same = compare_online(_online(a), _online(c))
    assert same["difference"] == pytest.approx(1 / 40) and same["interval95"][0] >= 0


def test_synthetic_episodes_pair_by_platform_and_task_id():
    eps = [{"task_id": "t1", "platform": p, "seed": 3, "success": ok} for p, ok in (("desktop", 1), ("mobile", 0))]
    got = compare_online({"episodes": eps}, {"episodes": [dict(e, success=1) for e in eps]})
    assert got["pairs"] == 2 and got["difference"] == 0.5
    assert got["by_group"]["mobile"]["difference"] == 1.0 and got["by_group"]["desktop"]["difference"] == 0.0


def test_episode_sets_that_differ_or_repeat_are_refused_by_name():
    a, b = _pair()
    del b[("enter-text", 7)]
    with pytest.raises(UserError, match=r"b lacks 1 of a's 40 episodes \(enter-text-7\)"):
        compare_online(_online(a), _online(b))
    with pytest.raises(UserError, match="appears twice"):
        o = _online(a)
        compare_online(o, {"episodes": o["episodes"] + o["episodes"][:1]})
    with pytest.raises(UserError, match="no 'episodes' list"):
        compare_online({"overall": {}}, _online(a))


def test_launcher_reads_files_or_a_folder_and_writes_the_comparison(tmp_path):
    a, b = _pair()
    (tmp_path / "sft").mkdir()
    (tmp_path / "sft" / "online_checkpoint.json").write_text(json.dumps(_online(a)))
    (tmp_path / "rl.json").write_text(json.dumps(_online(b)))
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    run = lambda *args: subprocess.run([sys.executable, "-m", "launch.compare", *args], cwd=ROOT, env=env,
                                       capture_output=True, text=True, timeout=120)
    out = run(f"--a={tmp_path}/sft", f"--b={tmp_path}/rl.json", f"--out={tmp_path}/cmp.json")
    assert out.returncode == 0, out.stderr
    got = json.loads((tmp_path / "cmp.json").read_text())
    assert got == json.loads(out.stdout) and got["pairs"] == 40
    assert got["difference"] == pytest.approx(compare_online(_online(a), _online(b))["difference"])
    (tmp_path / "sft" / "online_random.json").write_text(json.dumps(_online(a)))
    out = run(f"--a={tmp_path}/sft", f"--b={tmp_path}/rl.json")
    assert out.returncode == 2 and "exactly one online_<agent>.json" in out.stderr
