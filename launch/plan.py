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


def _early_devices(argv) -> None:
    """Fake CPU devices must be set before jax starts: --devices, else the recipe's hardware."""
    n = next((a.split("=", 1)[1] for a in argv if a.startswith("--devices=")), None)
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

from launch import cli  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Recipe file: configs/X.py[:arg].", lock_config=True)
_DEVICES = flags.DEFINE_integer("devices", None, "Devices of the run, all hosts together (default: the recipe's "
                                "hardware.hosts * hardware.devices_per_host).")
_HOSTS = flags.DEFINE_integer("hosts", None, "Processes (hosts) of the run (default: the recipe's hardware.hosts).")
_MEMORY = flags.DEFINE_float("device_memory_gib", None, "Memory of one device, e.g. 80 for an H100 80GB "
                             "(default: the recipe's hardware.device_memory_gib; 0 = unknown).")
_OUT = flags.DEFINE_string("out", "", "Also write the report as JSON here.")
_WORKDIR = flags.DEFINE_string("workdir", "", "Where a demo recipe builds its tokenizer (default: a temp dir).")
flags.mark_flags_as_required(["config"])


def main(argv):
    del argv
    logging.getLogger().setLevel(logging.WARNING)
    from guilibra_jax.train import config as run_config
    from guilibra_jax.train import plan as PLAN

    config = _CONFIG.value
    run_config.validate(config, planning=True)
    hw = config.hardware
    devices = _DEVICES.value or hw.hosts * hw.devices_per_host
    hosts = _HOSTS.value or hw.hosts
    memory = _MEMORY.value if _MEMORY.value is not None else (hw.device_memory_gib or None)
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
