r"""Write a vision probe: one-step screens whose answer only the screenshot holds.

    python -m launch.vision_probe --kind=color --box=small --out=runs/probe_color_small
    python -m launch.train --config=configs/miniwob.py --workdir=runs/probe_color_small_w \
        --config.data.train_files='("runs/probe_color_small/train.jsonl",)' \
        --config.data.eval_files='("runs/probe_color_small/test.jsonl",)' \
        --config.train.steps=600 --config.train.eval_every=300 --config.train.eval_samples=200

Compare the run's ``eval/step_acc`` with ``eval/constant_baseline_step_acc`` (the best
constant answer). Kinds and what each tells: :mod:`guilibra_jax.envs.probes`; measured
runs: docs/miniwob.md ("Can the tiny model read the screen?").
"""

from __future__ import annotations

import json

from absl import flags

from guilibra_jax.envs.probes import BOXES, KINDS, write_probe
from launch import cli, recipes

__doc__ += recipes.index_text()   # --help lists the recipes in configs/

_KIND = flags.DEFINE_enum("kind", "color", list(KINDS), "What the probe asks.")
_BOX = flags.DEFINE_enum("box", "small", sorted(BOXES), "Box size (small: about a MiniWoB++ button).")
_OUT = flags.DEFINE_string("out", None, "Output folder (train.jsonl, test.jsonl, images/).")
_TRAIN = flags.DEFINE_integer("train", 2000, "Training screens.", lower_bound=1)
_TEST = flags.DEFINE_integer("test", 200, "Held-out screens.", lower_bound=1)
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the screens.")
flags.mark_flags_as_required(["out"])


def main(argv):
    del argv
    counts = write_probe(_OUT.value, _KIND.value, _BOX.value, _TRAIN.value, _TEST.value, _SEED.value)
    print(json.dumps({"out": _OUT.value, "kind": _KIND.value, "box": _BOX.value, **counts}))


if __name__ == "__main__":
    cli.run(main)
