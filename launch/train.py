"""Train: ``python -m launch.train --config=configs/X.py[:arg] --workdir=DIR [--config.a.b=v]``.

``method`` in the config picks the trainer: sft (ASFT), grpo or mopd (stage 2).
Re-running the same command resumes from the latest complete checkpoint in DIR.
``model.hf_path`` (and teachers, references) may be a Hugging Face Hub id.
"""

from guilibra_jax.train import distributed

if __name__ == "__main__":
    distributed.reexec_with_hugepages()   # malloc in huge pages (glibc tunable, read at start-up)
distributed.apply_gpu_xla_flags()  # before jax initialises its backends
distributed.apply_tpu_xla_flags()  # on a Cloud TPU VM only

import json  # noqa: E402
import logging  # noqa: E402

from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from guilibra_jax.train import config as run_config  # noqa: E402  (light: no jax)
from launch import cli, recipes  # noqa: E402

__doc__ += recipes.help_text() + run_config.key_list_text()   # --help lists the recipes and every config key

_CONFIG = config_flags.DEFINE_config_file("config", None, "Recipe file: configs/X.py[:arg].", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run folder (metrics, checkpoints, export).")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Same as --config.print_only=True: print the resolved, validated "
                             "config (and the memory plan) and exit.")
flags.mark_flags_as_required(["config"])


def plan_summary(config) -> str | None:
    """Hook for the memory plan (issue #11) that --dry_run prints after the config:
    ``guilibra_jax.train.recipe_plan.dry_run_summary(config) -> str``. (``launch.plan`` is itself a
    launcher with its own flags, so it is not imported here; the planner's library function is.)"""
    from guilibra_jax.train import recipe_plan   # imports jax: after the config was validated
    return recipe_plan.dry_run_summary(config)


def print_resolved(config) -> None:
    """What --config.print_only / --dry_run prints: the config as the run would use it."""
    print(json.dumps(config.to_dict(), indent=2, sort_keys=True, default=str))
    summary = plan_summary(config)
    if summary:
        print(summary)


def main(argv):
    del argv
    logging.getLogger().setLevel(logging.INFO)
    for noisy in ("absl", "orbax", "jax", "grain"):  # library chatter: warnings only
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from guilibra_jax.errors import UserError
    from guilibra_jax.train import hub

    config = _CONFIG.value
    hub.resolve_run_paths(config)
    run_config.validate(config)  # before jax, flax and the models are imported: a bad key fails in a second
    if config.print_only or _DRY_RUN.value:
        print_resolved(config)
        return
    if not _WORKDIR.value:
        raise UserError("--workdir is required (the run folder: metrics, checkpoints, export)")
    d = config.distributed
    distributed.initialize(d.coordinator_address, d.num_processes, d.process_id, d.local_device_ids)
    import jax

    run_config.validate(config, jax.device_count(), jax.process_count())  # the mesh against the devices
    from guilibra_jax.train import compilation_cache
    from guilibra_jax.train.run import train

    compilation_cache.enable(config.train.compilation_cache_dir, _WORKDIR.value)
    row = train(config, _WORKDIR.value)
    logging.info("final: %s", row)


if __name__ == "__main__":
    cli.run(main)
