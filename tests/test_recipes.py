"""Every training recipe in configs/ validates, names the hardware it is sized for (in its
docstring and its ``hardware`` entry), has a mesh that fits that hardware, and plans
(compiles ahead of time) on that many fake devices: at tiny size in the default run (the
same planning code: mesh, shardings, update / sampler / scoring programs), at real size in
a slow test."""
import collections
import importlib
import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest

from guilibra_jax.train import config as run_config
from launch import recipes as R

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def train_recipes():
    """Every training recipe and argument (the default one too), smoke variants aside."""
    out = []
    for r in R.list_recipes():
        if r.kind != "train":
            continue
        args = [a for a in r.args if a != "smoke"]
        if r.default is None or r.default not in args:
            args.insert(0, "")
        out += [f"{r.path}:{a}" if a else r.path for a in args]
    return out


def load(spec):
    path, _, arg = spec.partition(":")
    module = importlib.import_module(path[:-3].replace("/", "."))
    return module, (module.get_config(arg) if arg else module.get_config())


@pytest.mark.parametrize("spec", train_recipes())
def test_recipe_validates_and_its_mesh_fits_its_hardware(spec):
    module, c = load(spec)
    run_config.validate(c, planning=True)
    hw = c.hardware
    assert hw.name and hw.name in (module.__doc__ or ""), f"{spec}: docstring must name its hardware {hw.name!r}"
    devices = hw.hosts * hw.devices_per_host
    fixed = math.prod(c.mesh[a] for a in ("data", "fsdp", "tensor") if c.mesh[a] != -1)
    assert devices % fixed == 0, f"{spec}: mesh {c.mesh.to_dict()} does not divide {devices} devices"
    assert c.data.batch_size % hw.hosts == 0


def _plan(specs, devices, tiny, tpu=False):
    cmd = [sys.executable, os.path.join(ROOT, "tests", "plan_worker.py"), f"--devices={devices}",
           f"--recipes={','.join(specs)}"] + (["--tiny"] if tiny else []) + (["--tpu"] if tpu else [])
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu", "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    assert out.returncode == 0, out.stderr[-4000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def tpu_recipes():
    """Recipes sized for a TPU slice (hardware.topology): planned with the TPU compiler."""
    return [spec for spec in train_recipes() if load(spec)[1].hardware.topology]


def _by_devices(tiny: bool):
    """{devices: recipes}; with ``tiny``, one recipe per method and mesh (at tiny size, sizes
    and switches give the same programs up to constants). TPU recipes aside."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from plan_worker import shrink
    groups, seen = collections.defaultdict(list), set()
    for spec in train_recipes():
        c = load(spec)[1]
        if c.hardware.topology:
            continue
        if tiny:   # one program set per method and set of sharded mesh axes (both families appear:
            # MOPD is Qwen3-VL); layouts that differ only in the axes' sizes plan the same programs
            key = json.dumps([c.method, sorted(a for a, n in c.mesh.to_dict().items() if n != 1)])
            if key in seen:
                continue
            seen.add(key)
        groups[c.hardware.hosts * c.hardware.devices_per_host].append(spec)
    return sorted(groups.items())


def _tiny_groups():
    """The single-device group (the demo recipes and QLoRA) is slow-marked: the default run
    compiles those programs anyway, in launches of the demo recipes (test_launch,
    test_rl_launch) and of QLoRA (test_lora_runs), and the planner on the 8- and 64-device
    groups here."""
    return [pytest.param(d, s, marks=pytest.mark.slow) if d == 1 else (d, s) for d, s in _by_devices(tiny=True)]


@pytest.mark.parametrize("devices,specs", _tiny_groups())
def test_every_recipe_plans_on_its_hardware_at_tiny_size(devices, specs):
    got = _plan(specs, devices, tiny=True)
    assert [g["recipe"] for g in got] == specs
    for g in got:
        rep = g["report"]
        assert rep["devices"] == devices and rep["peak_gib"] > 0
        progs = rep["programs"]
        method = load(g["recipe"])[1].method
        rl = load(g["recipe"])[1].rl
        reuse = rl.old_logprobs == "sampler" or rl.old_logprobs == "auto" and rl.top_p >= 1 and rl.top_k == 0
        want = {"asft_step"} if method == "sft" else {"update", "sampler"} | (set() if reuse else {"score_policy"})
        assert want <= set(progs), (g["recipe"], sorted(progs))
        assert all(p["temp"] > 0 for p in progs.values())
        assert rep["fits"] in (True, None)


@pytest.mark.slow
@pytest.mark.parametrize("devices,specs", _by_devices(tiny=False))
def test_every_recipe_fits_its_hardware_at_real_size(devices, specs, tmp_path):
    """Real sizes (minutes per recipe on a CPU); writes plan-*.json into tmp_path, or over the
    committed benchmarks/results/ when GUILIBRA_JAX_UPDATE_RESULTS=1 (tests write nothing into
    the checkout otherwise)."""
    update = os.environ.get("GUILIBRA_JAX_UPDATE_RESULTS", "") not in ("", "0")
    out_dir = os.path.join(ROOT, "benchmarks", "results") if update else str(tmp_path)
    for g in _plan(specs, devices, tiny=False):
        name = g["recipe"].replace("configs/", "").replace(".py", "").replace(":", "-")
        with open(os.path.join(out_dir, f"plan-{name}.json"), "w") as f:
            json.dump(g["report"], f, indent=1)
        assert g["report"]["fits"] is not False, (g["recipe"], g["report"].get("overflow"),
                                                  g["report"]["per_device_gib"])


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                    reason="libtpu is not installed (pip install -e .[tpu]): TPU recipes are not compiled")
def test_tpu_recipes_plan_on_their_slice_at_tiny_size():
    """Each TPU recipe's mesh and batch geometry compile for its slice (TPU compiler, tiny model);
    tests/train/test_tpu_plan.py checks the TPU path's figures in the default run."""
    specs = tpu_recipes()
    got = _plan(specs, 1, tiny=True, tpu=True)
    assert [g["recipe"] for g in got] == specs
    for g in got:
        rep = g["report"]
        assert rep["devices"] == rep["tpu"]["devices"] and rep["fits"] is True, (g["recipe"], rep["per_device_gib"])


def test_the_recipe_list_names_every_argument_a_recipe_declares():
    """launch.recipes reads ARGS from the source without importing (``ast.literal_eval``); an
    ARGS that is not a literal (e.g. built with ``*``) used to fall back silently to the RECIPES
    dict, dropping arguments from --help and from every test parametrised over the recipes."""
    for r in R.list_recipes():
        module = importlib.import_module(r.path[:-3].replace("/", "."))
        declared = set(getattr(module, "ARGS", ()))
        assert declared <= set(r.args), (r.path, sorted(declared - set(r.args)))
