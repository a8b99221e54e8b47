"""Runs a few ASFT steps of a tiny model on a given mesh and prints the losses as JSON.

Used by test_sharding.py in fresh processes (fake CPU devices must be set before jax
starts): ``python tests/train/sharded_worker.py --devices=8 --mesh=2,4,1 --steps=3``;
with ``--num_processes=2 --process_id=i --port=P`` it joins a multi-process run.
"""

import argparse
import json
import os
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--mesh", default="1,1,1", help="data,fsdp,tensor[;data,fsdp,tensor...]: runs each in turn; "
                    "a mesh of fewer devices than available uses the first ones")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--images", type=int, default=1)
    ap.add_argument("--num_processes", type=int, default=1)
    ap.add_argument("--process_id", type=int, default=0)
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax
    if args.num_processes > 1:
        jax.distributed.initialize(coordinator_address=f"127.0.0.1:{args.port}", num_processes=args.num_processes,
                                   process_id=args.process_id)
    from flax import nnx

    from guilibra_jax import models as M
    from guilibra_jax.train import fake_batch as F

    nnx.use_eager_sharding(False)
    jax.config.update("jax_enable_x64", False)
    cfg = F.tiny_config(hidden=64)
    model = M.QwenVL(cfg, rngs=nnx.Rngs(0))
    graphdef, pstate, _ = nnx.split(model, nnx.Param, ...)
    results = []
    for mesh_arg in args.mesh.split(";"):
        shape = [int(x) for x in mesh_arg.split(",")]
        results.append(run_mesh(shape, args, cfg, graphdef, pstate))
    print(json.dumps(results))
    sys.stdout.flush()


def run_mesh(shape, args, cfg, graphdef, pstate):
    import math

    import jax
    from flax import nnx

    from guilibra_jax import sharding as S
    from guilibra_jax.train import fake_batch as F
    from guilibra_jax.train import optimizer, sft_step
    from guilibra_jax.train.loop import put_batch, stack_micro_batches

    devices = jax.devices()[:math.prod(shape)]
    mesh = S.make_mesh(shape, devices=devices)
    param_sh = S.param_shardings(pstate, mesh, log=False)
    params = nnx.to_pure_dict(pstate)
    tx, sched = optimizer.make_optimizer(params, lr=1e-2, total_steps=10)
    opt_sh = S.opt_state_shardings(tx, params, param_sh, mesh)
    rep = S.replicated(mesh)
    state_sh = {"step": rep, "params": param_sh, "opt_state": opt_sh, "skipped": rep}
    state = jax.jit(lambda p: sft_step.init_state(p, tx), out_shardings=state_sh)(
        jax.device_put(params, param_sh))
    step = jax.jit(sft_step.make_sft_step(graphdef, tx), in_shardings=(state_sh, None),
                   out_shardings=(state_sh, None), donate_argnums=0)
    losses = []
    n_proc, pid = jax.process_count(), jax.process_index()
    for i in range(args.steps):
        full = F.fake_sft_batch(cfg, batch=8, seq_len=48, image_hw=(56, 56) if args.images else None, seed=i,
                                left_pad=3)
        if n_proc > 1:  # each process feeds its own rows (text-only batches)
            rows = slice(pid * 8 // n_proc, (pid + 1) * 8 // n_proc)
            full = {k: (v[:, rows] if k == "positions" else v[rows]) for k, v in full.items()}
        state, metrics = step(state, put_batch(stack_micro_batches([full]), mesh))
        losses.append(float(metrics["loss"]))
    return {"mesh": shape, "losses": losses, "devices": len(devices), "process": pid,
            "sharded_params": sum(1 for s in jax.tree.leaves(param_sh) if any(s.spec))}


if __name__ == "__main__":
    main()
