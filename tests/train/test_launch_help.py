"""Every launcher's ``--help`` (and ``-h``) exits with status 0 and names the recipes in
configs/: those it runs (train and plan: the training recipes, eval, curate, study:
theirs), or all of them by launcher for those that take no recipe. Launchers run in
parallel, one process each."""
import concurrent.futures
import glob
import os
import subprocess
import sys

import pytest

from launch import recipes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# launcher -> the recipe kind it runs (None: it takes no recipe and lists every one)
LAUNCHERS = {"train": "train", "plan": "train", "eval": "eval", "curate": "curate", "study": "study",
             "convert": None, "convert_data": None, "merge": None, "record_demos": None, "compare": None,
             "copy_variants": None, "vision_probe": None}


def _help(name: str, flag: str = "--help") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", f"launch.{name}", flag], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def helps():
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        return dict(zip(LAUNCHERS, pool.map(_help, LAUNCHERS)))


def test_every_launcher_is_covered():
    found = {os.path.basename(p)[:-3] for p in glob.glob(os.path.join(ROOT, "launch", "*.py"))}
    assert found - {"__init__", "cli", "recipes"} == set(LAUNCHERS)


@pytest.mark.parametrize("name", sorted(LAUNCHERS))
def test_help_exits_0_and_names_the_recipes(name, helps):
    out = helps[name]
    assert out.returncode == 0, f"launch.{name} --help: exit status {out.returncode}\n{out.stderr[-2000:]}"
    assert "Traceback" not in out.stderr and "flags:" in out.stdout, out.stderr[-2000:]
    kind = LAUNCHERS[name]
    listed = recipes.list_recipes(kind=kind)
    assert listed
    missing = [r.path for r in listed if r.path not in out.stdout]
    assert not missing, f"launch.{name} --help does not name {missing}"
    if kind is not None:
        others = [r.path for r in recipes.list_recipes() if r.kind != kind and r.path in out.stdout.split("flags:")[0]]
        assert not others, f"launch.{name} --help lists recipes it does not run: {others}"


def test_short_help_flag_exits_0():
    out = _help("merge", "-h")
    assert out.returncode == 0 and "configs/demo.py" in out.stdout, out.stderr[-2000:]


def test_train_help_lists_every_config_key_with_its_default(helps):
    from guilibra_jax.train import config as C
    out = helps["train"].stdout
    missing = [key for key, k in C.KEYS.items() if f"  {key} = {k.default!r}: " not in out]
    assert not missing, f"launch.train --help does not list {missing}"
