"""Export a training checkpoint to a Hugging Face folder (loads in transformers / vLLM).

    python -m launch.convert --workdir=runs/demo [--step=N] --out=runs/demo/hf
"""

import logging
import os

from absl import app, flags

_WORKDIR = flags.DEFINE_string("workdir", None, "Run folder holding config.json and checkpoints/.")
_OUT = flags.DEFINE_string("out", None, "Output folder (default: WORKDIR/export_step<N>).")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest complete one).")
flags.mark_flags_as_required(["workdir"])


def main(argv):
    del argv
    import jax
    from flax import nnx

    from guilibra_jax.train import checkpoint as C
    from guilibra_jax.train import config as run_config
    from guilibra_jax.train import data_source, model_factory

    nnx.use_eager_sharding(False)
    workdir = _WORKDIR.value
    config = run_config.load_run_config(workdir)
    tokenizer = data_source.prepare_tokenizer(config, workdir)
    abstract = nnx.eval_shape(lambda: model_factory.build_model(config, tokenizer)[0])
    graphdef, pstate, _ = nnx.split(abstract, nnx.Param, ...)
    model_config = abstract.config
    step, params = C.restore_params(os.path.join(workdir, "checkpoints"), nnx.to_pure_dict(pstate), _STEP.value)
    out = _OUT.value or os.path.join(workdir, f"export_step{step}")
    model_factory.export(graphdef, jax.device_get(params), model_config, tokenizer, out)
    logging.info("exported step %d to %s", step, out)
    print(out)


if __name__ == "__main__":
    app.run(main)
