"""The demo's ASFT step planned on N fake devices (fsdp N; 8 rows of 1,024 tokens, full
remat); prints the plan's JSON report.  python activation_sharding_worker.py N"""
import os
import sys
import tempfile

N = int(sys.argv[1])
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={N}"
os.environ["JAX_PLATFORMS"] = "cpu"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import json  # noqa: E402

from configs import demo  # noqa: E402
from guilibra_jax.train import recipe_plan as PLAN  # noqa: E402

c = demo.get_config("smoke")
c.data.max_length, c.data.seq_buckets = 1024, (1024,)
c.data.batch_size, c.train.grad_accum = 8, 1
c.model.remat = "full"
c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, N, 1
with tempfile.TemporaryDirectory(prefix="activation-sharding-") as work:      # (mkdtemp left one per run)
    print(json.dumps(PLAN.plan_config(c, N, 1, 80.0, workdir=work)))
