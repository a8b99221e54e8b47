"""The guarded AdamW update of every trainer, alone, side by side with the same update
written the usual optax way: which formulation XLA runs faster.

    python -m benchmarks.optimizer_update                    # bench100m's parameters, 4 rounds
    python -m benchmarks.optimizer_update --model=tiny --rounds=1 --out_dir=   # smoke

Both sides update the model's parameters with the recipe optimizer (``optimizer.make_optimizer``:
AdamW, weight decay, global-norm clip 1.0) on donated state, from one micro-batch whose gradient
is the batch itself (the backward is one elementwise op, so a step is the update):
  step_core       the trainers' step, ``step_core.make_step`` (its micro-batch scan included):
                  a ``lax.cond`` guard, the gradients divided inside it, the clip given the
                  norm the step computed (``optimizer.clip_by_global_norm``)
  optax_select    the update as optax's examples write it, and as make_step wrote it until the
                  commit that added this benchmark (no scan): the divided gradients, optax's own
                  ``clip_by_global_norm`` (a second norm inside), new or old state chosen by
                  ``jnp.where`` on every leaf
The sides alternate round by round in one process, --per_turn back-to-back updates per turn (the
first of each turn reported apart); they must end on the same parameters (max abs difference
recorded). Writes benchmarks/results/optimizer_update-<model>-<machine>.json.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from benchmarks import _common as C


def optax_select_step(micro_terms, tx):
    """make_step's update as written before (``tx`` with optax's own clip): what a user
    writing it with optax gets."""
    import jax
    import jax.numpy as jnp
    import optax

    grad_fn = jax.value_and_grad(micro_terms, has_aux=True)

    def step(state, batch):
        params = state["params"]
        (num, (den, _)), g = grad_fn(params, jax.tree.map(lambda x: x[0], batch))   # one micro-batch
        safe_den = jnp.maximum(den, 1e-9)
        loss = num / safe_den
        grads = jax.tree.map(lambda x: x / safe_den, g)
        grad_norm = optax.tree.norm(grads)
        ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        updates, new_opt = tx.update(grads, state["opt_state"], params)
        new_params = optax.apply_updates(params, updates)
        keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, old)
        return {"step": state["step"] + 1, "params": keep(new_params, params),
                "opt_state": keep(new_opt, state["opt_state"]), "skipped": state["skipped"]}, grad_norm

    return step


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="bench100m", help="tiny | bench35m | bench100m: its parameters")
    p.add_argument("--rounds", type=int, default=4, help="timed rounds after one untimed update per side")
    p.add_argument("--per_turn", type=int, default=3, help="back-to-back updates per side per round")
    C.add_result_args(p)
    args = p.parse_args(argv)

    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from guilibra_jax.models import QwenVL
    from guilibra_jax.train import optimizer, step_core

    start = C.run_start()
    nnx.use_eager_sharding(False)
    config = C.bench_config(args.model)
    params = nnx.to_pure_dict(nnx.state(QwenVL(config, rngs=nnx.Rngs(0)), nnx.Param))
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
    recipe = lambda clip: optimizer.make_optimizer(params, lr=1e-5, total_steps=1000, schedule="constant",
                                                   weight_decay=0.01, clip_norm=clip)[0]
    txs = {"step_core": recipe(1.0), "optax_select": optax.chain(optax.clip_by_global_norm(1.0), recipe(None))}
    # the gradient of sum(p * b) is b: the step is the update (a cheap elementwise "backward")
    micro_terms = lambda p, b: (sum(jnp.vdot(x, y) for x, y in zip(jax.tree.leaves(p), jax.tree.leaves(b))),
                                (jnp.float32(300.0), {}))
    batch = jax.tree.map(lambda x: (x * 0.5)[None], params)    # one micro-batch
    core = step_core.make_step(micro_terms, txs["step_core"], {})
    fns = {"step_core": jax.jit(lambda s, b: (lambda out: (out[0], out[1]["grad_norm"]))(core(s, b)),
                                donate_argnums=0),
           "optax_select": jax.jit(optax_select_step(micro_terms, txs["optax_select"]), donate_argnums=0)}
    states = {name: step_core.init_state(jax.tree.map(jnp.copy, params), txs[name]) for name in fns}

    def update(name):
        t0 = time.perf_counter()
        states[name], norm = fns[name](states[name], batch)
        jax.block_until_ready((states[name], norm))
        return time.perf_counter() - t0

    rows = C.interleaved_steps(update, list(fns), args.rounds, args.per_turn)
    diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in
               zip(jax.tree.leaves(states["step_core"]["params"]), jax.tree.leaves(states["optax_select"]["params"])))
    sides = {}
    for name, rs in rows.items():
        timed = [x.out for x in rs if x.round and not x.turn_first]
        firsts = [x.out for x in rs if x.turn_first]
        sides[name] = {"update_s": round(float(np.median(timed)), 4), "update_times_s": [round(t, 4) for t in timed],
                       "first_s": round(rs[0].out, 3),
                       **({"turn_first_s": round(float(np.median(firsts)), 4)} if firsts else {})}
    ratio = round(sides["optax_select"]["update_s"] / sides["step_core"]["update_s"], 3)
    bytes_min = 7 * 4 * n_params      # read grad, param, mu, nu; write param, mu, nu (float32)
    result = {"benchmark": "optimizer_update", "model": args.model, "params": n_params,
              "optimizer": "make_optimizer: AdamW lr 1e-5 (constant), weight decay 0.01, clip 1.0",
              "rounds": args.rounds, "per_turn": args.per_turn, "sides": sides,
              "optax_select_over_step_core": ratio, "params_max_abs_diff": diff,
              "min_traffic_bytes": bytes_min, "measured_memory_bandwidth_bytes_per_s": C.measure_memory_bandwidth(),
              "timing": "interleaved rounds in one process, donated state; each update to its finished outputs"}
    print(f"[optimizer_update] {args.model} ({n_params / 1e6:.1f}M params): step_core "
          f"{sides['step_core']['update_s'] * 1e3:.1f} ms, optax_select {sides['optax_select']['update_s'] * 1e3:.1f} "
          f"ms: {ratio}x; params differ by {diff:.2e}", flush=True)
    return C.report("optimizer_update", f"optimizer_update-{args.model}", result, args, start)


if __name__ == "__main__":
    C.launcher_malloc()
    main()
