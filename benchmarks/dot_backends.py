"""The LM head's dots on XLA's CPU dot back ends and on torch, side by side: which back end
runs which shape well.

  python -m benchmarks.dot_backends                      # bench100m's head, 3 interleaved rounds
  python -m benchmarks.dot_backends --rounds=1 --positions=16 --vocab=4096 --out_dir=   # smoke

Shapes (--dtype, float32 by default; P head positions, D hidden, V vocabulary; benchmarks.op_profile found the two
gradient dots of the ASFT step's head far below its forward):
  head_forward    [P, D] x [V, D]^T -> [P, V]      logits
  head_grad_h     [P, V] x [V, D]   -> [P, D]      the gradient to the hidden states (contracts V)
  head_grad_w     [P, V]^T x [P, D] -> [V, D]      the gradient to the head weights
  decode_head     [R, D] x [V, D]^T -> [R, V]      a decode step's logits (R sampler rows)
  square          [N, N] x [N, N]                  the matmul peak's shape
Sides, each a fresh process per round (XLA reads XLA_FLAGS at start), in an order that rotates:
  xla_ynn    XLA's default (YNNPACK dots)
  xla_eigen  --xla_cpu_experimental_ynn_fusion_type= (YNN off: Eigen's dots)
  xla_onednn --xla_cpu_use_onednn=true --xla_cpu_experimental_onednn_fusion_type=dot, YNN off
             (oneDNN's dots; on AMD EPYC this jaxlib dies of SIGILL: a side that fails is
             recorded with its exit status and left out of the table)
  torch      torch.matmul (MKL / oneDNN) with all cores
--sides picks some of them (torch always runs: the ratios are to it).
Each side times every shape --repeats times after one warm call and reports the median; the JSON
holds each side's median over rounds in GFLOP/s and the ratios to torch.
Writes benchmarks/results/dot_backends[-bfloat16]-<machine>.json (see --out_dir).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ONEDNN_FLAGS = "--xla_cpu_use_onednn=true --xla_cpu_experimental_onednn_fusion_type=dot " \
               "--xla_cpu_experimental_ynn_fusion_type="
SIDES = {"xla_ynn": "", "xla_eigen": "--xla_cpu_experimental_ynn_fusion_type=", "xla_onednn": ONEDNN_FLAGS,
         "torch": None}


def shapes(p: int, d: int, v: int, rows: int, n: int) -> dict:
    """name -> (lhs shape, rhs shape, FLOPs) of each product computed as lhs @ rhs after the
    transposes named in the module docstring."""
    return {"head_forward": ((p, d), (v, d), 2 * p * d * v), "head_grad_h": ((p, v), (v, d), 2 * p * d * v),
            "head_grad_w": ((p, v), (p, d), 2 * p * d * v), "decode_head": ((rows, d), (v, d), 2 * rows * d * v),
            "square": ((n, n), (n, n), 2 * n ** 3)}


# each shape's product, the same expression on torch tensors and JAX arrays
PRODUCTS = {"head_forward": lambda a, b: a @ b.T, "head_grad_h": lambda a, b: a @ b,
            "head_grad_w": lambda a, b: a.T @ b, "decode_head": lambda a, b: a @ b.T, "square": lambda a, b: a @ b}


def run_side(side: str, args) -> dict:
    """In this process: each shape's median seconds over args.repeats calls after a warm one."""
    import numpy as np

    rng = np.random.default_rng(0)
    if side == "torch":   # CPU torch returns when the product is done
        import torch

        torch.set_num_threads(os.cpu_count())
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
        array, compile_, sync = (lambda x: torch.from_numpy(x).to(dtype)), (lambda f: f), (lambda x: x)
    else:
        import jax
        import jax.numpy as jnp

        dtype = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[args.dtype]
        array, compile_, sync = (lambda x: jnp.asarray(x, dtype)), jax.jit, jax.block_until_ready
    out = {}
    for name, (ls, rs, _) in shapes(args.positions, args.hidden, args.vocab, args.rows, args.square).items():
        a, b = (array(rng.standard_normal(s, dtype=np.float32)) for s in (ls, rs))
        f = compile_(PRODUCTS[name])
        sync(f(a, b))
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            sync(f(a, b))
            times.append(time.perf_counter() - t0)
        out[name] = float(np.median(times))
    return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--positions", type=int, default=192, help="P: head positions (the ASFT step's: 2 rows x 96)")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--vocab", type=int, default=151_936)
    p.add_argument("--rows", type=int, default=64, help="R: decode rows (the sampler benchmark's 8 x 8)")
    p.add_argument("--square", type=int, default=2048)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                   help="both operands and the product (bfloat16: AMX / AVX512-BF16 where the CPU has them)")
    p.add_argument("--sides", default=",".join(s for s in SIDES if s != "torch"),
                   help=f"comma-separated XLA sides of {[s for s in SIDES if s != 'torch']} (torch always runs)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--side", default="", help=argparse.SUPPRESS)   # a worker process: time one side, print JSON
    from benchmarks import _common as C
    C.add_result_args(p)
    return p.parse_args(argv)


def main(argv=None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.side:
        print(json.dumps(run_side(args.side, args)))
        return {}
    import numpy as np

    from benchmarks import _common as C

    start = C.run_start()
    chosen = [s for s in args.sides.split(",") if s]
    unknown = sorted(set(chosen) - set(SIDES) | ({"torch"} & set(chosen)))
    if unknown:
        raise SystemExit(f"--sides: unknown or not an XLA side: {unknown}; choose from {[s for s in SIDES if s != 'torch']}")
    names = [*chosen, "torch"]
    seconds = {s: [] for s in names}
    failed = {}
    for r in range(args.rounds):
        for side in names[r % len(names):] + names[:r % len(names)]:
            if side in failed:
                continue
            env = dict(os.environ)
            if SIDES[side] is not None:
                env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {SIDES[side]}".strip()
            cmd = [sys.executable, "-m", "benchmarks.dot_backends", f"--side={side}", *argv]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            if done.returncode:
                if side == "torch":
                    raise RuntimeError(f"side torch exited {done.returncode}: {done.stderr[-2000:]}")
                failed[side] = {"returncode": done.returncode, "stderr_tail": done.stderr[-400:]}
                print(f"[dot_backends] side {side} failed (exit {done.returncode}); left out", flush=True)
                continue
            seconds[side].append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(f"[dot_backends] round {r} done", flush=True)
    table = shapes(args.positions, args.hidden, args.vocab, args.rows, args.square)
    names = [s for s in names if s not in failed]
    gflops = {s: {n: round(table[n][2] / float(np.median([x[n] for x in seconds[s]])) / 1e9, 3) for n in table}
              for s in names}
    result = {"benchmark": "dot_backends", "dtype": args.dtype,
              "shapes": {n: {"lhs": list(ls), "rhs": list(rs), "flops": fl} for n, (ls, rs, fl) in table.items()},
              "sides": {s: f"XLA_FLAGS={SIDES[s]!r}" if SIDES[s] is not None else "torch.matmul" for s in names},
              "failed_sides": failed,
              "rounds": args.rounds, "repeats": args.repeats, "gflop_per_s": gflops,
              "over_torch": {s: {n: round(gflops[s][n] / gflops["torch"][n], 3) for n in table}
                             for s in names if s != "torch"},
              "seconds": {s: seconds[s] for s in names},
              "timing": "each side a fresh process per round, rounds in a rotating order; per shape the median of "
                        "--repeats calls after a warm one, then the median over rounds"}
    for s in names:
        print(f"[dot_backends] {s:10s} " + " ".join(f"{n} {gflops[s][n]:.0f}" for n in table), flush=True)
    name = "dot_backends" if args.dtype == "float32" else f"dot_backends-{args.dtype}"
    return C.report("dot_backends", name, result, args, start)


if __name__ == "__main__":
    main()
