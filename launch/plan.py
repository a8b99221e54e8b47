r"""Will a recipe fit? ``python -m launch.plan --config=configs/X.py[:arg] [--devices=N]
[--hosts=H] [--device_memory_gib=80] [--out=plan.json]`` (defaults: the recipe's ``hardware``)

On this machine's CPU, with N fake devices, builds the recipe's mesh, lowers and compiles
ahead of time, at the recipe's real shapes and from abstract arrays (nothing allocated),
the ASFT step, or for stage 2 the update step, the sampler (prefill + decode) and each
model's scoring pass, and prints per device what stays resident (parameters, optimizer
state, frozen models) and each program's temporaries (XLA's memory analysis), the peak,
and whether it fits ``device_memory_gib`` (with 10% kept for the runtime). Exit status 1
when it does not fit, naming the component that overflows and what to change.
``--hosts`` is the number of processes the run will have (image batches are joined
across them). See ``guilibra_jax/train/plan.py`` for what the figures mean.

    python -m launch.plan --config=configs/mopd.py:8x8 --devices=64 --hosts=8

``--platform=tpu --topology=v5p:4x4x4`` (v4, v5e, v5p, v6e slices; the default for a recipe
whose ``hardware.topology`` names one) compiles the same programs with the real TPU
compiler for that slice's devices, on this CPU-only machine (needs libtpu:
``pip install -e .[tpu]``): per-device memory from the TPU compiler, FLOPs and HBM bytes
from its cost analysis, and a roofline lower bound of the step time and the MFU it allows
(``plan.tpu_estimate``). Devices and hosts come from the slice.

    python -m launch.plan --config=configs/guilibra_sft.py:qwen2_5_vl_7b_v5p
    python -m launch.plan --config=configs/guilibra_sft.py:qwen2_5_vl_7b --platform=tpu --topology=v5p:2x2x2
"""

import os
import sys


def _recipe_hardware(argv):
    """The recipe's ``hardware`` (read before jax starts: configs import no jax)."""
    spec = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)
    if not spec:
        return None
    import importlib.util
    path, _, arg = spec.partition(":")
    try:
        module_spec = importlib.util.spec_from_file_location("_plan_recipe", path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        config = module.get_config(arg) if arg else module.get_config()
        return config.hardware
    except Exception:  # noqa: BLE001  (absl reports a bad --config properly later)
        return None


def _flag(argv, name):
    return next((a.split("=", 1)[1] for a in argv if a.startswith(f"--{name}=")), None)


def _tpu_requested(argv) -> bool:
    """--platform=tpu, --topology=..., or (no --platform) a recipe naming a TPU topology."""
    platform = _flag(argv, "platform")
    if platform is not None:
        return platform == "tpu"
    if _flag(argv, "topology"):
        return True
    hw = _recipe_hardware(argv) if "--help" not in argv else None
    return bool(hw is not None and hw.topology)


def _early_devices(argv) -> None:
    """Fake CPU devices must be set before jax starts: --devices, else the recipe's hardware
    (none for a TPU slice: its devices come from the topology)."""
    n = _flag(argv, "devices")
    if _tpu_requested(argv):
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
        from guilibra_jax.train import distributed
        distributed.apply_tpu_xla_flags(force=True)   # compiled as the trainer compiles on the slice
        return
    if n is None and "--help" not in argv:
        hw = _recipe_hardware(argv)
        n = hw.hosts * hw.devices_per_host if hw is not None else None
    if n:
        flags = os.environ.get("XLA_FLAGS", "")
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={int(n)}".strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


_early_devices(sys.argv)

import json  # noqa: E402
import logging  # noqa: E402

from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from launch import cli, recipes  # noqa: E402

__doc__ += recipes.help_text("plan")   # --help lists the recipes in configs/

_CONFIG = config_flags.DEFINE_config_file("config", None, "Recipe file: configs/X.py[:arg].", lock_config=True)
_DEVICES = flags.DEFINE_integer("devices", None, "Devices of the run, all hosts together (default: the recipe's "
                                "hardware.hosts * hardware.devices_per_host).")
_HOSTS = flags.DEFINE_integer("hosts", None, "Processes (hosts) of the run (default: the recipe's hardware.hosts).")
_MEMORY = flags.DEFINE_float("device_memory_gib", None, "Memory of one device, e.g. 80 for an H100 80GB "
                             "(default: the recipe's hardware.device_memory_gib; 0 = unknown).")
_OUT = flags.DEFINE_string("out", "", "Also write the report as JSON here.")
_PLATFORM = flags.DEFINE_enum("platform", None, ["cpu", "tpu"], "Compile for fake CPU devices (GPU-like) or with the "
                              "TPU compiler for --topology (default: tpu when the recipe's hardware.topology is set).")
_TOPOLOGY = flags.DEFINE_string("topology", None, "TPU slice for --platform=tpu, e.g. v5e:2x2, v5p:4x4x4, v6e:4x4 "
                                "(default: the recipe's hardware.topology).")
_WORKDIR = flags.DEFINE_string("workdir", "", "Where a demo recipe builds its tokenizer (default: a temp dir).")
flags.mark_flags_as_required(["config"])


def main(argv):
    del argv
    logging.getLogger().setLevel(logging.WARNING)
    from guilibra_jax.train import config as run_config
    from guilibra_jax.train import recipe_plan as PLAN

    config = _CONFIG.value
    run_config.validate(config, planning=True)
    hw = config.hardware
    devices = _DEVICES.value or hw.hosts * hw.devices_per_host
    hosts = _HOSTS.value or hw.hosts
    memory = _MEMORY.value if _MEMORY.value is not None else (hw.device_memory_gib or None)
    platform = _PLATFORM.value or ("tpu" if (_TOPOLOGY.value or hw.topology) else "cpu")
    if platform == "tpu":
        from guilibra_jax.errors import UserError
        from guilibra_jax.train import tpu_topology as TT
        name = _TOPOLOGY.value or hw.topology
        if not name:
            raise UserError("--platform=tpu needs --topology (e.g. --topology=v5p:2x2x2): the recipe's "
                            "hardware.topology is empty")
        topo = TT.topology(name)
        if _DEVICES.value and _DEVICES.value != len(topo.devices):
            raise UserError(f"--devices={_DEVICES.value} but {name} has {len(topo.devices)} devices; drop --devices")
        hosts = _HOSTS.value or topo.hosts
        memory = _MEMORY.value or topo.device_memory_gib
        print(f"planning for TPU {name}: {len(topo.devices)} devices ({topo.chip.kind}) on {hosts} host(s), "
              f"{memory:.1f} GiB each (recipe hardware: {hw.name})")
        report = PLAN.plan_config(config, len(topo.devices), hosts, memory, _WORKDIR.value, topology=topo)
    else:
        print(f"planning for {devices} devices on {hosts} host(s) (recipe hardware: {hw.name})")
        report = PLAN.plan_config(config, devices, hosts, memory, _WORKDIR.value)
    print(PLAN.format_report(report))
    if _OUT.value:
        with open(_OUT.value, "w") as f:
            json.dump(report, f, indent=1)
    if report["fits"] is False:
        sys.exit(1)


if __name__ == "__main__":
    cli.run(main)
