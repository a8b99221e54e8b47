"""Helpers of the eval tests: a tiny training workdir as launch.train leaves it, and the
eval_demo docstring's command lines parsed by launch.eval's flags."""
import json
import os
import shlex
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from configs import demo, eval_demo
from guilibra_jax.envs.export import load_records
from guilibra_jax.train import checkpoint as C
from guilibra_jax.train import data_source as DS
from guilibra_jax.train import model_factory as MF

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BATCH = 4
N_NEW = 8
STEP_SEEDS = {1: 1, 2: 2, 3: 0}     # checkpoint step -> random_params seed; the latest is the "run" params


def random_params(abstract_params, seed=0):
    """Random weights drawn on the host (no per-shape compiles), larger than the default
    init: at that init the tiny tied model repeats its last input token, so responses
    would not depend on the prompt (see tests/test_generate.py)."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda x: jnp.asarray(
        0.15 * rng.standard_normal(x.shape) if len(x.shape) > 1 else 1 + 0.1 * rng.standard_normal(x.shape),
        x.dtype), abstract_params)


def build_run(root: str) -> types.SimpleNamespace:
    """A training workdir (config.json, the demo tokenizer built by the trainer's own code,
    orbax checkpoints at the steps of STEP_SEEDS) and the HF export of its latest step."""
    workdir = os.path.join(root, "workdir")
    config = demo.get_config("smoke")
    config.data.synthetic.tasks = 4
    config.data.synthetic.tokenizer_vocab = 512
    config.data.batch_size = BATCH
    config.data.max_length = 1024        # every held-out prompt fits (the smoke tokenizer is wordy)
    config.model.tiny.update(dict(hidden=64, intermediate=128, vision_hidden=32, vision_intermediate=64,
                                  vision_heads=2))
    DS.ensure_synthetic_data(config, workdir)
    tokenizer = DS.prepare_tokenizer(config, workdir)
    C.write_json(os.path.join(workdir, "config.json"), config.to_dict())
    abstract = nnx.eval_shape(lambda: MF.build_model(config, tokenizer)[0])
    graphdef, pstate, _ = nnx.split(abstract, nnx.Param, ...)
    model_config = abstract.config
    step_params = {step: jax.device_put(random_params(nnx.to_pure_dict(pstate), seed), jax.devices()[0])
                   for step, seed in STEP_SEEDS.items()}                              # as restored
    ckpt = C.Checkpointer(os.path.join(workdir, "checkpoints"), max_to_keep=len(STEP_SEEDS), async_save=False)
    for step, params in sorted(step_params.items()):
        ckpt.save(step, {"step": jnp.asarray(step), "params": params}, {"note": "test"}, force=True)
    ckpt.close()
    params = step_params[max(step_params)]
    hf = MF.export(graphdef, params, model_config, tokenizer, os.path.join(root, "hf"))
    test_path = os.path.join(DS.synthetic_dir(workdir), "test.jsonl")
    return types.SimpleNamespace(workdir=workdir, hf=hf, config=config, tokenizer=tokenizer,
                                 model_config=model_config, graphdef=graphdef, params=params,
                                 step_params=step_params, test_path=test_path, records=load_records(test_path),
                                 base=os.path.dirname(test_path))


def doc_commands() -> list[list[str]]:
    """The flags of configs/eval_demo.py's documented launch.eval lines with a checkpoint."""
    doc = eval_demo.__doc__.replace("\\\n", " ")
    return [shlex.split(line.strip())[3:] for line in doc.splitlines()
            if "launch.eval" in line and "checkpoint" in line]


def parse_eval_flags(args: list[str]) -> tuple[list[str], dict]:
    """(agents, agent_kwargs.checkpoint) as launch.eval's flags parse ``args``."""
    code = ("import sys, json; from absl import flags; import launch.eval as E; flags.FLAGS(sys.argv); "
            "c = E._CONFIG.value; print(json.dumps([list(c.agents), c.agent_kwargs.checkpoint.to_dict()]))")
    out = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    agents, kw = json.loads(out.stdout.strip().splitlines()[-1])
    return agents, kw
