r"""Record expert demonstrations of a world as training data.

    python -m launch.record_demos --world=miniwob --out=runs/miniwob_demos \
        [--tasks=click-button,enter-text] [--episodes=20] [--seed=0] [--split_fraction=0.2] [--scale=1]
    python -m launch.record_demos --world=synthetic --out=runs/world_demos --episodes=100

miniwob (``pip install -e '.[miniwob]'`` and Chromium): scripted DOM experts play each
task; writes ``train.jsonl`` / ``test.jsonl`` (native records with reasoning and target
boxes), GUI-Libra SFT JSON (``train_sft.json``, ``train_sft_noreason.json``, same for
test), screenshots and ``manifest.json`` with the expert's success rate per task
(:mod:`guilibra_jax.envs.miniwob.record`). synthetic: the bundled desktop + mobile world
(:func:`guilibra_jax.envs.export.export_dataset`, ``--episodes`` tasks per platform).
Prints the manifest's summary as JSON.
"""

from __future__ import annotations

import json
import logging

from absl import flags

from launch import cli, recipes

__doc__ += recipes.index_text()   # --help lists the recipes in configs/

_WORLD = flags.DEFINE_enum("world", "miniwob", ["miniwob", "synthetic"], "Which world plays the expert.")
_OUT = flags.DEFINE_string("out", None, "Output folder.")
_TASKS = flags.DEFINE_list("tasks", [], "miniwob: tasks to record (default: every task with an expert).")
_EPISODES = flags.DEFINE_integer("episodes", 20, "Episodes per task (synthetic: tasks per platform).")
_SEED = flags.DEFINE_integer("seed", 0, "Dataset seed: episode seeds and the train/test split derive from it.")
_SPLIT = flags.DEFINE_float("split_fraction", 0.2, "Share of episode seeds held out as the test split.")
_SCALE = flags.DEFINE_float("scale", 1.0, "miniwob: device pixels per CSS pixel of the screenshots.")
flags.mark_flags_as_required(["out"])


def main(argv):
    del argv
    logging.getLogger().setLevel(logging.INFO)
    from guilibra_jax.errors import UserError
    if _WORLD.value == "synthetic":
        from guilibra_jax.envs.export import export_dataset
        m = export_dataset(_OUT.value, n_tasks=_EPISODES.value, seed=_SEED.value, split_fraction=_SPLIT.value)
        print(json.dumps({k: m[k] for k in ("records", "tasks", "seconds")}))
        return
    from guilibra_jax.envs import miniwob as MW
    reason = MW.available()
    if reason:
        raise UserError(reason)
    unknown = sorted(set(_TASKS.value) - set(MW.TASKS))
    if unknown:
        raise UserError(f"--tasks: no expert for {unknown}; tasks with one: {', '.join(MW.TASKS)}")
    from guilibra_jax.envs.miniwob.record import record_demos
    m = record_demos(_OUT.value, tuple(_TASKS.value) or MW.TASKS, _EPISODES.value, _SEED.value, _SPLIT.value,
                     _SCALE.value)
    print(json.dumps({"records": m["records"], "expert_success_macro": m["expert_success_macro"],
                      "expert_success": {t: v["expert_success"] for t, v in m["per_task"].items()},
                      "seconds": m["seconds"]}))


if __name__ == "__main__":
    cli.run(main)
