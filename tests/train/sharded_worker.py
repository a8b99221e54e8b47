"""Runs a few ASFT steps of a tiny model on a given mesh and prints the losses as JSON.

Used by test_sharding.py in fresh processes (fake CPU devices must be set before jax
starts): ``python tests/train/sharded_worker.py --devices=8 --mesh=2,4,1 --steps=3``;
with ``--num_processes=2 --process_id=i --port=P`` it joins a multi-process run.

``--data`` picks the batches (several, comma-separated, run in turn on each mesh):
  uniform  8 rows, one 56x56 image each (one process only)
  text     8 rows without images; each process feeds its rows
  mixed    2 micro-batches of 8 rows, defined as 2 parts of 4 rows: images of several
           sizes, empty rows, patches padded to a bucket of 64 (so processes and
           micro-batches differ in patch count), and one part with no sample at all
           (collate's dummy image). Two processes feed a part each; one process feeds
           the same global batch built from all images at once.
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
    ap.add_argument("--data", default="uniform", help="uniform, text, mixed; comma-separated: each in turn")
    ap.add_argument("--num_processes", type=int, default=1)
    ap.add_argument("--process_id", type=int, default=0)
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={args.devices}"
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
        for data in args.data.split(","):
            results.append(run_mesh(shape, data, args, cfg, graphdef, pstate))
    print(json.dumps(results))
    sys.stdout.flush()


def run_mesh(shape, data, args, cfg, graphdef, pstate):
    import math

    import jax
    from flax import nnx

    from guilibra_jax import sharding as S
    from guilibra_jax.train import optimizer, step_core
    from guilibra_jax.train.sft import step as sft_step
    from guilibra_jax.train.batching import put_batch, stack_micro_batches

    devices = jax.devices()[:math.prod(shape)]
    mesh = S.make_mesh(shape, devices=devices)
    param_sh = S.param_shardings(pstate, mesh, log=False)
    params = nnx.to_pure_dict(pstate)
    tx, sched = optimizer.make_optimizer(params, lr=1e-2, total_steps=10)
    opt_sh = S.opt_state_shardings(tx, params, param_sh, mesh)
    rep = S.replicated(mesh)
    state_sh = {"step": rep, "params": param_sh, "opt_state": opt_sh, "skipped": rep}
    state = jax.jit(lambda p: step_core.init_state(p, tx), out_shardings=state_sh)(
        jax.device_put(params, param_sh))
    step = jax.jit(sft_step.make_sft_step(graphdef, tx), in_shardings=(state_sh, None),
                   out_shardings=(state_sh, None), donate_argnums=0)
    losses = []
    n_proc, pid = jax.process_count(), jax.process_index()
    for i in range(args.steps):
        host = stack_micro_batches(make_micro_batches(data, cfg, i, n_proc, pid))
        state, metrics = step(state, put_batch(host, mesh, model_config=cfg))
        losses.append(float(metrics["loss"]))
    return {"mesh": shape, "data": data, "losses": losses, "devices": len(devices), "process": pid,
            "sharded_params": sum(1 for s in jax.tree.leaves(param_sh) if any(s.spec))}


def make_micro_batches(data, cfg, step, n_proc, pid):
    """This process's host micro-batches of one step."""
    from guilibra_jax.train import fake_batch as F

    if data == "mixed":
        if n_proc not in (1, 2):
            raise ValueError(f"--data=mixed is defined for 1 or 2 processes, got {n_proc}")
        parts = [0, 1] if n_proc == 1 else [pid]
        bucket = 64 if n_proc > 1 else 384  # one process: the 2 x 192 patches two processes join (one compile)
        return [collate([row for part in parts for row in mixed_rows(step, micro, part)], cfg, bucket=bucket)
                for micro in range(2)]
    if data not in ("uniform", "text"):
        raise ValueError(f"unknown --data={data!r}")
    full = F.fake_sft_batch(cfg, batch=8, seq_len=48, image_hw=(56, 56) if data == "uniform" else None, seed=step,
                            left_pad=3)
    if n_proc > 1:  # each process feeds its own rows
        if data != "text":
            raise ValueError("--data=uniform slices rows for one process only")
        rows = slice(pid * 8 // n_proc, (pid + 1) * 8 // n_proc)
        full = {k: (v[:, rows] if k == "positions" else v[rows]) for k, v in full.items()}
    return [full]


MIXED_SIZES = ((56, 56), (56, 84), (84, 112), (112, 112), (84, 56), None)  # None: an empty row


def mixed_rows(step, micro, part):
    """(image size or None, seed) of the 4 rows of ``part``; part 0 of step 1, micro 0 has no sample."""
    if (step, micro, part) == (1, 0, 0):
        return [(None, 0)] * 4
    return [(MIXED_SIZES[(7 * step + 3 * micro + 5 * part + row) % len(MIXED_SIZES)], 1000 * step + 100 * micro
             + 10 * part + row) for row in range(4)]


def collate(rows, cfg, seq_len=48, bucket=64):
    """A batch of ``rows`` as collate_sft shapes it: one image per sample in row order,
    patches padded to a multiple of ``bucket``, a dummy image when no row has one."""
    import numpy as np

    from guilibra_jax import models as M
    from guilibra_jax.models.vision import device_vision_inputs
    from guilibra_jax.train import fake_batch as F

    out, pixels, grids = [], [], []
    for hw, seed in rows:
        if hw is None:
            out.append({k: np.zeros((3, 1, seq_len) if k == "positions" else (1, seq_len), np.int32)
                        for k in ("input_ids", "positions", "segment_ids", "targets", "loss_segments")})
            continue
        row = F.fake_sft_batch(cfg, batch=1, seq_len=seq_len, image_hw=hw, seed=seed)
        pixels.append(row.pop("pixel_values"))
        row.pop("vision")
        grids.append((1, hw[0] // cfg.vision.patch_size, hw[1] // cfg.vision.patch_size))
        out.append(row)
    batch = {k: np.concatenate([r[k] for r in out], axis=1 if k == "positions" else 0) for k in out[0]}
    real = sum(len(p) for p in pixels)
    n = max(bucket, -(-real // bucket) * bucket)
    batch["pixel_values"] = np.zeros((n, cfg.vision.patch_dim), np.float32)
    if pixels:
        batch["pixel_values"][:real] = np.concatenate(pixels)
    m = cfg.vision.spatial_merge_size
    described = np.asarray(grids) if grids else np.array([[1, m, n // m]])
    batch["vision"] = device_vision_inputs(M.prepare_vision_inputs(described, cfg, num_patches=n))
    return batch

if __name__ == "__main__":
    main()
