"""Decode attention of G rows that share a prompt: the per-row KV cache the sampler keeps today
against a cascade (the prompt's keys and values once per prompt, a per-row cache for the response),
side by side. A measured lever for the RL sampler, not a code path of the library.

  python -m benchmarks.decode_attention                  # benchmarks.trainers' bench35m shapes, 160 and 1,024 prompt slots
  python -m benchmarks.decode_attention --rounds=1 --prompts=2 --group=2 --prompt_slots=8 --new_tokens=4 --out_dir=

Each --prompt_slots value (comma-separated) is a case of its own: the prompt's share of the
per-row cache, which the cascade keeps once per prompt, grows with it.

Both sides run --new_tokens - 1 decode steps of --layers layers in one jitted while loop, as
``generate._generate`` does: each layer projects the step's query, key and value from a small
state (so the steps depend on each other; the projections are a few percent of the work), writes
the key and value at the step's slot and attends.
  per_row   the sampler's layout (``generate.share_rows``): every row holds a copy of its prompt's
            keys [L, B, K, H, S] and values [L, B, K, S, H] with S = prompt + response slots, updated
            in place; attention is ``attention.cached_attention``
  cascade   the prompt's keys and values once per prompt [L, P, K, H, S_p] (never written while
            decoding) and a response cache [L, B, K, H, R]; attention is ``attention.cascade_attention``
            (what ``generate`` runs with copies > 1: each kv head's queries of a prompt's G rows are one
            matmul over the prompt's keys, each row's over its response keys, the softmax parts merged)
The two final states must agree (float32 rounding; ``max_abs_diff``). Reports each side's median
seconds per call over --rounds interleaved rounds and per_row / cascade.
Writes benchmarks/results/decode_attention-<machine>.json (see --out_dir).
"""
from __future__ import annotations

import argparse
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--group", type=int, default=8, help="rows per prompt")
    p.add_argument("--prompt_slots", default="160,1024",
                   help="the prompt's cache slots, comma-separated cases (benchmarks.trainers: 160)")
    p.add_argument("--new_tokens", type=int, default=32)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv_heads", type=int, default=2)
    p.add_argument("--head_dim", type=int, default=64)
    p.add_argument("--state", type=int, default=64, help="width of the state the projections read")
    p.add_argument("--rounds", type=int, default=7)
    from benchmarks import _common as C
    C.add_result_args(p)
    return p.parse_args(argv)


def build(a, prompt_slots: int):
    """{"per_row": f, "cascade": f}: jitted functions of no argument returning the final state [B, state]."""
    import jax
    import jax.numpy as jnp

    from guilibra_jax.models.attention import cached_attention, cascade_attention

    L, P, G, K, N, H, SP = a.layers, a.prompts, a.group, a.kv_heads, a.heads, a.head_dim, prompt_slots
    B, R, W = P * G, a.new_tokens - 1, a.state
    S = SP + R
    scale = H ** -0.5
    rnd = lambda i, shape: jax.random.normal(jax.random.fold_in(jax.random.key(0), i), shape, jnp.float32)  # noqa: E731
    pk, pv = rnd(1, (L, P, K, H, SP)), rnd(2, (L, P, K, SP, H))
    wq, wkv = rnd(3, (L, W, N * H)) * W ** -0.5, rnd(4, (L, W, 2 * K * H)) * W ** -0.5
    wo = rnd(5, (L, N * H, W)) * (N * H) ** -0.5
    x0 = rnd(6, (B, W))

    def project(x, l):    # from the RMS-normalised state, as a layer reads its input
        x = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)
        return (x @ wq[l]).reshape(B, N, H), (x @ wkv[l]).reshape(B, 2, K, H)

    def per_row():
        ck = jnp.zeros((L, B, K, H, S)).at[..., :SP].set(jnp.repeat(pk, G, axis=1))
        cv = jnp.zeros((L, B, K, S, H)).at[:, :, :, :SP].set(jnp.repeat(pv, G, axis=1))

        def body(i, carry):
            x, ck, cv = carry
            slot = SP + i
            mask = jnp.broadcast_to((jnp.arange(S) <= slot)[None, None, None], (B, 1, 1, S))
            for l in range(L):
                q, kv = project(x, l)
                ck = jax.lax.dynamic_update_slice(ck, kv[None, :, 0, :, :, None], (l, 0, 0, 0, slot))
                cv = jax.lax.dynamic_update_slice(cv, kv[None, :, 1, :, None, :], (l, 0, 0, slot, 0))
                o = cached_attention(q[:, None], ck[l], cv[l], mask, scale=scale)
                x = x + o.reshape(B, N * H) @ wo[l]
            return x, ck, cv

        return jax.lax.fori_loop(0, R, body, (x0, ck, cv))[0]

    def cascade():
        rk, rv = jnp.zeros((L, B, K, H, R)), jnp.zeros((L, B, K, R, H))
        pmask = jnp.ones((P, SP), bool)

        def body(i, carry):
            x, rk, rv = carry
            mask = jnp.broadcast_to((jnp.arange(R) <= i)[None, None, None], (B, 1, 1, R))
            for l in range(L):
                q, kv = project(x, l)
                rk = jax.lax.dynamic_update_slice(rk, kv[None, :, 0, :, :, None], (l, 0, 0, 0, i))
                rv = jax.lax.dynamic_update_slice(rv, kv[None, :, 1, :, None, :], (l, 0, 0, i, 0))
                o = cascade_attention(q[:, None], rk[l], rv[l], mask, pk[l], pv[l], pmask, scale=scale)
                x = x + o.reshape(B, N * H) @ wo[l]
            return x, rk, rv

        return jax.lax.fori_loop(0, R, body, (x0, rk, rv))[0]

    return {"per_row": jax.jit(per_row), "cascade": jax.jit(cascade)}


def main(argv=None) -> dict:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import numpy as np

    from benchmarks import _common as C

    start = C.run_start()
    if args.heads % args.kv_heads or args.new_tokens < 2:
        raise SystemExit("--heads must be a multiple of --kv_heads and --new_tokens at least 2")
    steps = args.new_tokens - 1
    cases = {}
    for sp in [int(x) for x in str(args.prompt_slots).split(",") if x]:
        fns = build(args, sp)
        out = {k: np.asarray(f()) for k, f in fns.items()}          # compile and warm
        diff = float(np.max(np.abs(out["per_row"] - out["cascade"])))
        scale = float(np.max(np.abs(out["per_row"])))
        if not diff <= 1e-4 * max(1.0, scale):
            raise SystemExit(f"prompt_slots={sp}: the two sides disagree: max |diff| {diff} (states up to {scale})")
        seconds = {k: [] for k in fns}
        order = list(fns)
        for r in range(args.rounds):
            for k in (order if r % 2 == 0 else order[::-1]):
                t = time.perf_counter()
                fns[k]().block_until_ready()
                seconds[k].append(time.perf_counter() - t)
        med = {k: float(np.median(v)) for k, v in seconds.items()}
        cases[str(sp)] = {"seconds": {k: round(v, 5) for k, v in med.items()},
                          "ms_per_step_per_layer": {k: round(1e3 * v / steps / args.layers, 4) for k, v in med.items()},
                          "seconds_each": {k: [round(x, 5) for x in v] for k, v in seconds.items()},
                          "per_row_over_cascade": round(med["per_row"] / med["cascade"], 3),
                          "max_abs_diff": diff, "state_max_abs": scale}
        print(f"[decode_attention] prompt_slots={sp}: per_row {med['per_row']:.4f} s, cascade {med['cascade']:.4f} s",
              flush=True)
    result = {"benchmark": "decode_attention",
              "shapes": {k: getattr(args, k) for k in ("prompts", "group", "new_tokens", "layers", "heads", "kv_heads",
                                                       "head_dim", "state")},
              "rows": args.prompts * args.group, "decode_steps": steps, "rounds": args.rounds,
              "timing": "median seconds per call (every decode step of every layer), sides alternating each round",
              "by_prompt_slots": cases}
    return C.report("decode_attention", "decode_attention", result, args, start)


if __name__ == "__main__":
    main()
