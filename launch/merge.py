"""Merge models of one architecture into a Hugging Face folder (weight averaging, task arithmetic, TIES).

    python -m launch.merge --method=average --inputs=runs/a,runs/b --out=runs/avg [--weights=0.7,0.3]
    python -m launch.merge --method=task_arithmetic --inputs=runs/a,runs/b --base=runs/base --out=runs/ta \\
        [--scale=2]
    python -m launch.merge --method=ties --inputs=runs/a,runs/b --base=runs/base --out=runs/ties \\
        [--ties_density=0.2]

Inputs are Hugging Face folders or training workdirs (a finished run's ``export/``, else
its latest checkpoint). The output loads in transformers and in our loader, with the
first input's tokenizer and serving files; see :mod:`guilibra_jax.train.merge`.
"""

import logging

from absl import flags

from launch import cli, recipes

__doc__ += recipes.index_text()   # --help lists the recipes in configs/

_METHOD = flags.DEFINE_enum("method", None, ["average", "task_arithmetic", "ties"], "Merge method.")
_INPUTS = flags.DEFINE_list("inputs", None, "Models to merge: HF folders or training workdirs, comma-separated.")
_OUT = flags.DEFINE_string("out", None, "Output Hugging Face folder.")
_WEIGHTS = flags.DEFINE_list("weights", None, "One weight per input (average: normalised; default equal).")
_BASE = flags.DEFINE_string("base", "", "task_arithmetic, TIES: the model the inputs were fine-tuned from.")
_SCALE = flags.DEFINE_float("scale", 1.0, "task_arithmetic: base + scale x the inputs' weighted mean task vector.")
_DENSITY = flags.DEFINE_float("ties_density", 0.2, "TIES: fraction of each task vector's entries kept per tensor.")
flags.mark_flags_as_required(["method", "inputs", "out"])


def main(argv):
    del argv
    logging.getLogger().setLevel(logging.INFO)
    from guilibra_jax.errors import UserError
    from guilibra_jax.train.merge import merge_folders
    weights = None
    if _WEIGHTS.value:
        try:
            weights = [float(w) for w in _WEIGHTS.value]
        except ValueError:
            raise UserError(f"--weights={','.join(_WEIGHTS.value)!r}: expected comma-separated numbers") from None
    print(merge_folders(_METHOD.value, _INPUTS.value, _OUT.value, weights=weights, base=_BASE.value,
                        density=_DENSITY.value, scale=_SCALE.value))


if __name__ == "__main__":
    cli.run(main)
