"""Evaluate: ``python -m launch.eval --config=configs/eval_demo.py[:smoke] --workdir=DIR``.

Runs offline step metrics and online episodes in the synthetic world for every agent in
``config.agents`` and writes ``report.json`` / ``report.png`` into DIR (see
:mod:`guilibra_jax.eval.run`). Agents: expert, random, convention, checkpoint (a
training run or an export), endpoint (a model served by vLLM / SGLang / an API).
"""

from guilibra_jax.train import distributed

if __name__ == "__main__":
    distributed.reexec_with_hugepages()   # malloc in huge pages (glibc tunable, read at start-up)

import json
import logging

from absl import flags
from ml_collections import config_flags

from launch import cli, recipes

__doc__ += recipes.help_text("eval")

_CONFIG = config_flags.DEFINE_config_file("config", None, "Eval recipe: configs/X.py[:arg].",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Output folder (report, trajectories, data).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    del argv
    logging.getLogger().setLevel(logging.INFO)
    from guilibra_jax.eval.run import run_eval
    out = run_eval(_CONFIG.value, _WORKDIR.value)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    cli.run(main)
