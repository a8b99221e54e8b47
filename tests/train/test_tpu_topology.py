"""TPU slice names, the chip table and the roofline (no libtpu needed), and launch.plan's
one-line errors for an unknown slice or a missing TPU compiler."""
import os
import subprocess
import sys

import pytest

from guilibra_jax.errors import UserError
from guilibra_jax.train import tpu_topology as TT

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("name,want", [("v5p:4x4x4", ("v5p", (4, 4, 4))), ("v5e:2x2", ("v5e", (2, 2))),
                                       ("v4:2x2x1", ("v4", (2, 2, 1))), ("v6e:16x16", ("v6e", (16, 16)))])
def test_slice_names_parse(name, want):
    assert TT.parse_topology(name) == want


@pytest.mark.parametrize("name", ["v5p-128", "v7:2x2", "v5e", "v5e:2", ""])
def test_unknown_slice_names_raise_a_user_error_naming_the_generations(name):
    with pytest.raises(UserError, match=r"v4.*v5e.*v5p.*v6e"):
        TT.parse_topology(name)


def test_missing_libtpu_names_the_extra(monkeypatch):
    monkeypatch.setattr(TT, "libtpu_available", lambda: False)
    with pytest.raises(UserError, match=r"pip install -e \.\[tpu\]"):
        TT.topology("v5e:2x2")


def test_roofline_is_the_slower_of_compute_and_memory():
    chip = TT.CHIPS["v5e"]
    topo = TT.Topology("v5e:2x2", "v5e", 4, [object()] * 4, 1, chip)
    r = TT.roofline(chip.peak_bf16_flops, chip.hbm_bytes_per_s / 2, topo)
    assert r == {"compute_s": 1.0, "memory_s": 0.5, "time_s": 1.0, "bound": "compute"}
    # v4 slices list one device per TensorCore: each gets half a chip
    v4 = TT.Topology("v4:2x2x1", "v4", 4, [object()] * 8, 1, TT.CHIPS["v4"])
    assert v4.device_memory_gib == 16.0 and v4.device_peak_flops == 137.5e12


def test_model_flops_are_6n_plus_attention():
    assert TT.model_flops_per_token(10, 2, 4, 8) == 60 + 3 * 2 * 2 * 2 * 4 * 8 / 2
    assert TT.model_flops_per_token(10, 2, 4, 8, train=False) == 20 + 2 * 2 * 2 * 4 * 8 / 2


def test_launch_plan_rejects_an_unknown_slice_in_one_line():
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-m", "launch.plan", "--config=configs/demo.py:smoke", "--platform=tpu",
                          "--topology=v9:2x2"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "v9:2x2" in out.stderr and "Traceback" not in out.stderr


def test_a_program_the_tpu_compiler_refuses_is_planned_as_not_fitting():
    """The TPU compiler checks HBM itself and raises; the plan keeps its figure (message as
    libtpu 0.0.42 words it) and says the program does not fit."""
    from guilibra_jax.train import plan as PLAN

    class Lowered:
        def compile(self):
            raise RuntimeError("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
                               "temporaries (333.12G) exceeds available HBM (95.74G).")

    st = PLAN.compiled_stats(PLAN.compile_program(Lowered()))
    assert st["temp"] == int(333.12 * 2 ** 30) and st["argument"] == 0 and "333.12G" in st["refused_by_compiler"]

    class Broken:
        def compile(self):
            raise RuntimeError("INTERNAL: something else")

    with pytest.raises(RuntimeError, match="something else"):
        PLAN.compile_program(Broken())
