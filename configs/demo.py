"""The quick-start demo: a tiny Qwen2.5-VL-shaped model learns GUI-Libra ASFT on the
bundled synthetic desktop + mobile world, on CPU, in minutes.

Hardware: 1 x CPU (2 cores are enough: about 3 minutes).
"""

from guilibra_jax.train.config import base_config


def get_config(arg=None):
    c = base_config()
    c.data.synthetic.enabled = True
    c.data.synthetic.tasks = 480
    # GUI-Libra's own system turn is ~300 tokens of action descriptions; a tiny model
    # trained from scratch for minutes drowns in it (held-out greedy step accuracy 0.0 with
    # it, measured). The short turn keeps the platform and the action names.
    c.data.system_prompt = "GUI agent on a {platform}. Actions: {actions}."
    c.data.max_length = 256
    c.data.patch_bucket = 512
    c.data.batch_size = 8
    c.data.max_pixels = 112 * 112
    c.data.min_pixels = 56 * 56
    c.model.dtype = "float32"
    c.optim.lr = 3e-3
    c.optim.warmup_steps = 20
    c.optim.weight_decay = 0.0
    c.train.steps = 1200
    c.train.log_every = 10
    c.train.checkpoint_every = 300
    c.train.eval_every = 1200
    c.train.eval_samples = 128
    if arg == "smoke":  # a few steps, for tests
        c.data.synthetic.tasks = 12
        c.train.steps = 4
        c.train.log_every = 1
        c.train.checkpoint_every = 2
        c.train.eval_every = 0
        c.train.progress = False
        c.train.memory_plan = False
    return c
