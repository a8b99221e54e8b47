"""Curate: ``python -m launch.curate --config=configs/curate.py[:arg] --workdir=DIR``.

GUI-Libra's data filters with our own sampler (see :mod:`guilibra_jax.curate`):
re-prediction consistency, box verification, reasoning augmentation and RL rebalancing.
Writes ``DIR/curated/`` (native JSONL and the input's format), ``DIR/curation_report.md``
/ ``.json`` and ``DIR/match_frequency.png``. Re-running the same command continues a
killed run without sampling finished records again. Several hosts: start the same
command on every host (as launch.train; the workdir on shared storage).
"""

from guilibra_jax.train import distributed

distributed.apply_gpu_xla_flags()  # before jax initialises its backends
distributed.apply_tpu_xla_flags()  # on a Cloud TPU VM only

import json  # noqa: E402
import logging  # noqa: E402

from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from launch import cli, recipes  # noqa: E402

__doc__ += recipes.help_text("curate")

_CONFIG = config_flags.DEFINE_config_file("config", None, "Curation recipe: configs/curate.py[:arg].",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Curation folder (stage logs, curated data, report).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    del argv
    logging.getLogger().setLevel(logging.INFO)
    for noisy in ("absl", "orbax", "jax", "grain"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    config = _CONFIG.value
    from guilibra_jax.curate.run import run_curation, validate
    validate(config)
    d = config.distributed
    distributed.initialize(d.coordinator_address, d.num_processes, d.process_id, d.local_device_ids)
    report = run_curation(config, _WORKDIR.value)
    short = {name: {k: st[k] for k in ("in", "out", "removed_by_reason") if k in st}
             for name, st in report["stages"].items()}
    print(json.dumps({"stages": short, "outputs": report.get("outputs"),
                      "filter_vs_injected": report.get("filter_vs_injected")}, indent=1))


if __name__ == "__main__":
    cli.run(main)
