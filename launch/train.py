"""Train: ``python -m launch.train --config=configs/X.py[:arg] --workdir=DIR [--config.a.b=v]``.

``method`` in the config picks the trainer: sft (ASFT), grpo or mopd (stage 2).
Re-running the same command resumes from the latest complete checkpoint in DIR.
"""

from guilibra_jax.train import distributed

distributed.apply_gpu_xla_flags()  # before jax initialises its backends

import logging  # noqa: E402

from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from launch import cli  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Recipe file: configs/X.py[:arg].", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run folder (metrics, checkpoints, export).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    del argv
    logging.getLogger().setLevel(logging.INFO)
    for noisy in ("absl", "orbax", "jax", "grain"):  # library chatter: warnings only
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from guilibra_jax.train import config as run_config

    config = _CONFIG.value
    run_config.validate(config)  # before jax, flax and the models are imported: a bad key fails in a second
    d = config.distributed
    distributed.initialize(d.coordinator_address, d.num_processes, d.process_id, d.local_device_ids)
    import jax

    run_config.validate(config, jax.device_count(), jax.process_count())  # the mesh against the devices
    from guilibra_jax.train import loop, rl_loop

    run = loop.train if config.method == "sft" else rl_loop.train_rl
    row = run(config, _WORKDIR.value)
    logging.info("final: %s", row)


if __name__ == "__main__":
    cli.run(main)
