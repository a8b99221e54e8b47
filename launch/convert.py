"""Export a training checkpoint to a Hugging Face folder (loads in transformers / vLLM).

    python -m launch.convert --workdir=runs/demo [--step=N] [--out=runs/demo/hf] [--weights=params|ema]

Reads only the parameters of the checkpoint (orbax partial restore: no optimizer state
in memory; with LoRA the adapters, merged into the run's base as its own export does) and writes the complete export of ``guilibra_jax.train.export``: weights,
tokenizer, chat template, and preprocessor / generation configs with the run's pixel
bounds and stop ids. The folder appears whole or not at all (``<out>.tmp-<pid>`` renamed
when complete); a half-written ``model.hf_path`` of the run is refused. The work is
``guilibra_jax.train.model_factory.export_checkpoint``.
"""

import logging

from absl import flags

from launch import cli, recipes

__doc__ += recipes.index_text()   # --help lists the recipes in configs/

_WORKDIR = flags.DEFINE_string("workdir", None, "Run folder holding config.json and checkpoints/.")
_OUT = flags.DEFINE_string("out", None, "Output folder (default: WORKDIR/export_step<N>).")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest complete one).")
_WEIGHTS = flags.DEFINE_enum("weights", None, ["params", "ema"],
                             "Which weights: the trained parameters, or their moving average (optim.ema_decay). "
                             "Default: what the run's own export writes (ema when optim.ema_decay > 0).")
flags.mark_flags_as_required(["workdir"])


def main(argv):
    del argv
    logging.getLogger().setLevel(logging.INFO)
    from flax import nnx

    from guilibra_jax.train import model_factory
    nnx.use_eager_sharding(False)
    print(model_factory.export_checkpoint(_WORKDIR.value, _OUT.value, _STEP.value, _WEIGHTS.value))


if __name__ == "__main__":
    cli.run(main)
