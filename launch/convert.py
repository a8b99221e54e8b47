"""Export a training checkpoint to a Hugging Face folder (loads in transformers / vLLM).

    python -m launch.convert --workdir=runs/demo [--step=N] [--out=runs/demo/hf] [--weights=params|ema]

Reads only the parameters of the checkpoint (orbax partial restore: no optimizer state
in memory; with LoRA the adapters, merged into the run's base as its own export does) and writes the complete export of ``guilibra_jax.train.export``: weights,
tokenizer, chat template, and preprocessor / generation configs with the run's pixel
bounds and stop ids. The folder appears whole or not at all (``<out>.tmp-<pid>`` renamed
when complete); a half-written ``model.hf_path`` of the run is refused.
"""

import logging
import os

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


def convert(workdir: str, out: str | None = None, step: int | None = None, weights: str | None = None) -> str:
    """Export checkpoint ``step`` (None: the latest) of ``workdir`` to ``out``; returns ``out``.
    ``weights``: "params" or "ema" (None: "ema" when the run kept a parameter average)."""
    from flax import nnx

    from guilibra_jax import atomic
    from guilibra_jax.errors import UserError
    from guilibra_jax.train import config as run_config
    from guilibra_jax.train import data_source, model_factory

    nnx.use_eager_sharding(False)
    try:
        config = run_config.load_run_config(workdir)
    except FileNotFoundError as e:
        raise UserError(f"--workdir: {e}") from None
    atomic.check_complete(config.model.hf_path, "config key model.hf_path")   # whose files the export copies
    atomic.check_complete(config.tokenizer.path, "config key tokenizer.path")
    tokenizer = data_source.prepare_tokenizer(config, workdir)
    weights = weights or ("ema" if config.optim.ema_decay > 0 else "params")
    run = model_factory.RunWeights(config, tokenizer, workdir, weights)
    try:
        step, params = run.restore(step)
    except FileNotFoundError as e:
        raise UserError(f"--workdir={workdir} --step={step} --weights={weights}: {e}") from None
    out = out or os.path.join(workdir, f"export_step{step}")
    model_factory.export(run.graphdef, params, run.model_config, tokenizer, out, config=config)
    logging.info("exported step %d (%s) to %s", step, weights, out)
    return out


def main(argv):
    del argv
    logging.getLogger().setLevel(logging.INFO)
    print(convert(_WORKDIR.value, _OUT.value, _STEP.value, _WEIGHTS.value))


if __name__ == "__main__":
    cli.run(main)
