r"""Will a recipe fit? ``python -m launch.plan --config=configs/X.py[:arg] --devices=N
[--hosts=H] [--device_memory_gib=80] [--out=plan.json]``

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


def _early_devices(argv) -> None:
    """Fake CPU devices must be set before jax starts."""
    n = next((a.split("=", 1)[1] for a in argv if a.startswith("--devices=")), None)
    if n:
        flags = os.environ.get("XLA_FLAGS", "")
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={int(n)}".strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


_early_devices(sys.argv)

import json  # noqa: E402
import logging  # noqa: E402
import tempfile  # noqa: E402

from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from launch import cli  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Recipe file: configs/X.py[:arg].", lock_config=True)
_DEVICES = flags.DEFINE_integer("devices", None, "Devices of the run (all hosts together).")
_HOSTS = flags.DEFINE_integer("hosts", 1, "Processes (hosts) of the run.")
_MEMORY = flags.DEFINE_float("device_memory_gib", 80.0, "Memory of one device (H100 80GB: 80).")
_OUT = flags.DEFINE_string("out", "", "Also write the report as JSON here.")
_WORKDIR = flags.DEFINE_string("workdir", "", "Where a demo recipe builds its tokenizer (default: a temp dir).")
flags.mark_flags_as_required(["config", "devices"])


def main(argv):
    del argv
    logging.getLogger().setLevel(logging.WARNING)
    from guilibra_jax.train import config as run_config

    config = _CONFIG.value
    run_config.validate(config, planning=True)
    report = plan_config(config, _DEVICES.value, _HOSTS.value, _MEMORY.value, _WORKDIR.value)
    print(format_report(report))
    if _OUT.value:
        with open(_OUT.value, "w") as f:
            json.dump(report, f, indent=1)
    if report["fits"] is False:
        sys.exit(1)


def plan_config(config, devices: int, hosts: int = 1, device_memory_gib: float = 80.0, workdir: str = "") -> dict:
    """The memory plan of ``config`` on ``devices`` devices over ``hosts`` processes."""
    import jax

    from guilibra_jax import sharding as S
    from guilibra_jax.errors import ConfigError
    from guilibra_jax.train import plan as PLAN

    if jax.device_count() != devices:
        raise ConfigError(f"--devices={devices} but this process has {jax.device_count()} devices: XLA_FLAGS was set "
                          f"before launch.plan started; unset it")
    if devices % hosts:
        raise ConfigError(f"--hosts={hosts} does not divide --devices={devices}")
    if config.data.batch_size % hosts:
        raise ConfigError(f"config key data.batch_size = {config.data.batch_size} is invalid: expected a multiple of "
                          f"--hosts={hosts}")
    try:
        mesh = S.make_mesh(dict(config.mesh))
    except ValueError as e:
        raise ConfigError(f"config key mesh = {dict(config.mesh)} is invalid for {devices} devices: {e}") from None
    tokenizer = _tokenizer(config, workdir)
    if config.method == "sft":
        return _plan_sft(config, mesh, tokenizer, device_memory_gib, hosts)
    from guilibra_jax.train import rl_loop
    s, state, state_sh = rl_loop.setup(config, mesh, tokenizer, materialize=False)
    return PLAN.plan_stage2(s, state, state_sh, device_memory_gib, processes=hosts)


def _tokenizer(config, workdir: str):
    """The run's tokenizer when it has one without downloads; None for named sizes."""
    from guilibra_jax.train import data_source
    if config.model.hf_path or config.tokenizer.path or config.model.name == "tiny":
        return data_source.prepare_tokenizer(config, workdir or tempfile.mkdtemp(prefix="plan-"))
    return None


def _plan_sft(config, mesh, tokenizer, device_memory_gib, hosts):
    import jax

    from guilibra_jax.train import model_factory
    from guilibra_jax.train import plan as PLAN
    from guilibra_jax.train.loop import optimizer_from_config, sharded_state
    from guilibra_jax.train.sft_step import make_sft_step

    mc = model_factory.model_config_of(config, tokenizer)
    graphdef, params, param_sh = model_factory.abstract_model(mc, mesh, **model_factory.model_kwargs(config))
    tx, schedule = optimizer_from_config(config, params, config.train.steps)
    state, state_sh = sharded_state(params, tx, param_sh, mesh, materialize=False)
    step = make_sft_step(graphdef, tx, alpha_action=config.loss.alpha_action,
                         alpha_grounding=config.loss.alpha_grounding, normalize=config.loss.normalize,
                         schedule=schedule)
    jit_step = jax.jit(step, in_shardings=(state_sh, None), out_shardings=(state_sh, None), donate_argnums=0)
    return PLAN.plan_sft(config, mesh, graphdef, state, state_sh, jit_step, mc, device_memory_gib, hosts)


def format_report(report: dict) -> str:
    lines = [f"mesh {report['mesh']} ({report['devices']} devices), per device (GiB):"]
    for k, v in report["per_device_gib"].items():
        lines.append(f"  {k:<44} {v:10.3f}")
    for name, st in report["programs"].items():
        extra = {k: round(v / 2**30, 3) for k, v in st.items() if k.endswith("_estimate")}
        if extra:
            lines.append(f"  ({name}: {', '.join(f'{k[:-9]} ~{v} GiB' for k, v in extra.items())} of its temporaries)")
    usable = report["usable_gib"]
    lines.append(f"  {'peak (' + str(report['peak_program']) + ')':<44} {report['peak_gib']:10.3f}"
                 + (f"  of {usable:.2f} usable" if usable else ""))
    if report["fits"] is None:
        lines.append("fits: unknown (no device memory given)")
    elif report["fits"]:
        lines.append("fits: yes")
    else:
        lines.append(f"fits: NO: {report['overflow']} overflows; {report['suggestion']}")
    return "\n".join(lines)


if __name__ == "__main__":
    cli.run(main)
