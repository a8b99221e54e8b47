"""Where an RL step's time goes: a short GRPO job (guilibra_jax.train.run.train, in process,
on a temp workdir) on the bundled synthetic world, split into sampling / scoring / update.

Each metrics row of a stage-2 run carries sample_s (prompt batch, generate, decode, rewards,
advantages), score_s (old-policy and reference / teacher log-probs), update_s (ppo_epochs x
minibatches optimizer updates) and step_s. The first step compiles everything and is reported
apart (first_step_s); the means and fractions are over the later steps. rollout_tokens_per_s =
mean response length x rows / sample_s (random policies rarely stop, so rows mostly run to
max_new_tokens). setup_s = wall time outside the steps: synthetic data export, tokenizer, model init,
the final checkpoint.

Sizes (model.tiny.*; the vocabulary is the synthetic world's tokenizer, data.synthetic.tokenizer_vocab):
  tiny       the recipe's own (text 128 x 2 layers, vision 64 x 2)
  medium     text 256 x 4 layers, vision 128 x 2
  bench35m   benchmarks/_common.py's bench100m shapes (text 512 x 8, vision 384 x 4) with the
             synthetic 1k vocabulary instead of Qwen's 152k: 35.3M parameters (files before
             this name called it bench100m).

Rewards (--reward): ``tokens`` (default) replaces the task reward with (first response token
id mod 3) / 2 of a valid row (0, 0.5 or 1; success at 1), a function of the sampled tokens that
varies within a group for any policy, so that group statistics, advantages and the update
carry signal and "identical rewards" between the sides is a check that can fail; ``task``
keeps the recipe's GUI-Libra reward (a random policy's text never parses: every reward equal).
The JSON records the rewards' within-group spread (``reward_group_std_mean``, > 0 for tokens).

Shared prompts (``shared_prompts`` in the JSON; --share_rounds, 0 = off): after the run, whole
GRPO steps (the phases' rollout, reward, advantages, score, update) with each prompt computed once
for its group's rows (rl.share_prefill=True: the sampler's prefill shared by the G rows, scoring
and updates in the shared-prompt layout: the vision tower and the prompt's layers once per prompt
and call, the LM head at response positions only) and without (every row its own prompt), the two
sides interleaved round by round (which goes first alternates) on the same prompt batches and
keys, both starting each round from the same state, the first (compiling) round untimed.
It reports both sides' phase times, the speedups, whether they sampled identical tokens, and the
largest per-round difference of reward, loss, gradient norm and KL between the sides.

  python -m benchmarks.rl_step                                   # tiny, 2 prompts x G=4, 4 steps
  python -m benchmarks.rl_step --size=medium --prompts=4 --group=8 --max_new_tokens=64 --steps=4
  python -m benchmarks.rl_step --size=bench35m --prompts=8 --group=8 --share_rounds=4
  python -m benchmarks.rl_step --set rl.minibatches=1 --set model.dtype=bfloat16

Writes benchmarks/results/rl_step-<size>-<dtype>-<machine>.json (see --out_dir) and prints it.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib.util
import json
import logging
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from guilibra_jax.train import distributed  # noqa: E402

distributed.apply_gpu_xla_flags()  # before jax initialises its backends, as launch/train.py

import jax  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import _common as C  # noqa: E402

SIZES = {
    "tiny": {},
    "medium": dict(hidden=256, intermediate=768, layers=4, heads=4, kv_heads=2, vision_depth=2, vision_hidden=128,
                   vision_intermediate=256, vision_heads=4),
    "bench35m": dict(hidden=512, intermediate=1536, layers=8, heads=8, kv_heads=2, vision_depth=4,
                      vision_hidden=384, vision_intermediate=1024, vision_heads=6),
}
PARTS = ("sample_s", "score_s", "update_s")
REWARDS = ("tokens", "task")


def token_reward(s, ro):
    """(first response token id mod 3) / 2 for a valid row, 0 otherwise; success at 1: the
    phases' ``reward(setup, rollout) -> Scored`` with a reward that varies within a group for
    any policy (also used by tests/train/varied_reward_train.py)."""
    from guilibra_jax.train.rl import rollout as RO
    r = np.where(ro.valid, (np.asarray(ro.tokens)[:, 0] % 3) / 2.0, 0.0).astype(np.float32)
    return RO.Scored(r, (r >= 1.0) & np.asarray(ro.valid, bool), {})


def group_std_mean(reward: np.ndarray, group: int) -> float:
    """The mean over groups of the rewards' standard deviation within a group."""
    return float(np.asarray(reward, np.float64).reshape(-1, group).std(axis=1).mean())


def load_config(spec: str):
    """``path.py[:arg]`` -> the module's get_config(arg)."""
    path, _, arg = spec.partition(":")
    module_spec = importlib.util.spec_from_file_location("rl_step_recipe", path)
    if module_spec is None:
        raise SystemExit(f"--config={spec!r}: {path!r} is not a Python file")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.get_config(arg or None)


def override(config, assignment: str) -> None:
    """Apply ``a.b.c=value`` (value a Python literal, else a string) to the ConfigDict."""
    key, sep, raw = assignment.partition("=")
    if not sep:
        raise SystemExit(f"--set {assignment!r}: expected key=value")
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        value = raw
    *parents, last = key.split(".")
    node = config
    for part in parents:
        node = node[part]
    node[last] = value


def build_config(args):
    config = load_config(args.config)
    config.model.tiny.update(SIZES[args.size])
    config.data.batch_size = args.prompts
    config.rl.group_size = args.group
    config.rl.max_new_tokens = args.max_new_tokens
    config.model.dtype = args.dtype
    config.train.update(steps=args.steps, log_every=1, eval_every=0, export=False, progress=False,
                        tensorboard=False, checkpoint_every=args.steps)
    for assignment in args.set:
        override(config, assignment)
    return config


def summarize(rows: list[dict], config) -> dict:
    """Means over the steps after the first (compiling) one, and each part's fraction of step_s."""
    steady = rows[1:] or rows
    mean = lambda k: float(np.mean([r[k] for r in steady]))
    out = {"first_step_s": round(rows[0]["step_s"], 3), "steps_timed": len(steady), "step_s": round(mean("step_s"), 4),
           "step_s_each": [round(r["step_s"], 3) for r in steady]}  # a slow one: a recompile, or a busy machine
    for k in PARTS:
        out[k] = round(mean(k), 4)
    for k in PARTS:
        out[k.replace("_s", "_fraction")] = round(mean(k) / mean("step_s"), 3)
    n_rows = config.data.batch_size * config.rl.group_size
    tokens = [r.get("response_length", 0.0) * n_rows for r in steady]
    out["rollout_tokens_per_s"] = round(float(np.mean([t / r["sample_s"] for t, r in zip(tokens, steady)])), 1)
    out["response_length"] = round(float(np.mean([r.get("response_length", 0.0) for r in steady])), 2)
    out["truncated_fraction"] = round(float(np.mean([r.get("truncated_fraction", 0.0) for r in steady])), 3)
    for k in ("reward_mean", "reward_group_std"):       # the run's own rewards (metrics rows)
        vals = [r[k] for r in steady if k in r]
        out[k] = round(float(np.mean(vals)), 4) if vals else None
    return out


def compare_sharing(config, workdir: str, rounds: int) -> dict:
    """GRPO steps (rollout + reward + advantages, scoring, update: the stage-2 phases, as
    the RL trainer runs them) with each prompt computed once per group (rl.share_prefill=True: the
    sampler's prefill, and the scoring and update passes in the shared-prompt layout) and
    without (every row its own prompt everywhere), the two sides interleaved round by round
    (which goes first alternates) on the same prompt batches and sampling keys, each side
    updating its own copy of one initial state; round 0 (compiling) untimed."""
    from guilibra_jax.data.pipeline import make_rl_loader
    from guilibra_jax.train.rl import advantages as ADV
    from guilibra_jax.train import data_source
    from guilibra_jax.train.rl import phases as PH
    from guilibra_jax.train.rl import setup as RS
    from guilibra_jax.train.rl.trainer import Prompts
    from guilibra_jax.train import multihost as MH

    mesh = MH.run_mesh(config)
    tokenizer = data_source.prepare_tokenizer(config, workdir)
    shared, state, _ = RS.setup(config, mesh, tokenizer)
    plain_config = config.copy_and_resolve_references()
    plain_config.rl.share_prefill = False
    sides = {"shared": shared, "unshared": dataclasses.replace(shared, config=plain_config)}
    states = {"shared": state, "unshared": jax.tree.map(lambda x: x.copy(), state)}
    loader = make_rl_loader(data_source.data_config(config, data_source.train_files(config, workdir)), tokenizer,
                            shared.model_config, shard_index=jax.process_index(), shard_count=jax.process_count())
    prompts = Prompts(loader)
    times = {name: {k: [] for k in PARTS} for name in sides}
    seen = {name: [] for name in sides}
    same, same_rewards, rows = True, True, 0
    rl = config.rl

    def one_step(name, batch, key):
        s = sides[name]
        t0 = time.perf_counter()
        ro = PH.rollout(s, states[name]["params"], batch, key)
        sc = PH.reward(s, ro)
        adv = ADV.compute(sc.reward, sc.success & ro.valid, rl.group_size, config.method, rl)
        adv["advantages"] = np.where(ro.valid, adv["advantages"], 0.0).astype(np.float32)
        t1 = time.perf_counter()
        scores = PH.score(s, states[name]["params"], ro)
        t2 = time.perf_counter()
        states[name], metrics, _ = PH.update(s, states[name], ro, adv, scores)
        t3 = time.perf_counter()
        return ro, sc, metrics, (t1 - t0, t2 - t1, t3 - t2)

    try:
        for r in range(rounds + 1):     # round 0 compiles both sides
            batch, key = next(prompts), jax.random.PRNGKey(1000 + r)
            # both sides start the round from one state: the same rollouts, and the layouts'
            # float noise does not compound (at a KL near 0 it steers the update)
            states["unshared"] = jax.tree.map(lambda x: x.copy(), states["shared"])
            order = list(sides) if r % 2 == 0 else list(sides)[::-1]
            out = {}
            for name in order:
                out[name] = one_step(name, batch, key)
                if r:
                    for k, t in zip(PARTS, out[name][3]):
                        times[name][k].append(t)
                ro, sc, metrics, _ = out[name]
                seen[name].append({"reward_mean": float(sc.reward[ro.valid].mean()), "loss": float(metrics["loss"]),
                                   "grad_norm": float(metrics["grad_norm"]), "kl": float(metrics["kl"]),
                                   "reward_group_std": group_std_mean(sc.reward, rl.group_size)})
            a, b = out["shared"][0], out["unshared"][0]
            same &= bool(np.array_equal(a.tokens, b.tokens) and np.array_equal(a.lengths, b.lengths))
            same_rewards &= bool(np.array_equal(out["shared"][1].reward, out["unshared"][1].reward))
            rows = a.rows
    finally:
        prompts.close()
    res = {"rounds": rounds, "rows_per_round": rows, "group": rl.group_size, "minibatches": rl.minibatches,
           "identical_tokens": same, "identical_rewards": same_rewards,
           "reward_group_std_mean": round(float(np.mean([x["reward_group_std"] for x in seen["shared"]])), 4)}
    for name in sides:
        step = [sum(x) for x in zip(*(times[name][k] for k in PARTS))]
        res[name] = {"step_s": round(float(np.mean(step)), 4), "step_s_each": [round(t, 3) for t in step],
                     **{k: round(float(np.mean(times[name][k])), 4) for k in PARTS}}
    res["speedup"] = {k: round(res["unshared"][k] / res["shared"][k], 3) for k in ("step_s",) + PARTS}
    res["step_time_change"] = round(res["shared"]["step_s"] / res["unshared"]["step_s"] - 1, 3)
    res["max_abs_difference"] = {k: float(max(abs(x[k] - y[k]) for x, y in zip(seen["shared"], seen["unshared"])))
                                 for k in seen["shared"][0]}
    res["per_round"] = seen
    return res


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/grpo_demo.py:smoke", help="recipe file[:arg]")
    ap.add_argument("--size", default="tiny", choices=sorted(SIZES), help="model.tiny.* preset")
    ap.add_argument("--prompts", type=int, default=2, help="data.batch_size: prompts per step")
    ap.add_argument("--group", type=int, default=4, help="rl.group_size: G rollouts per prompt")
    ap.add_argument("--max_new_tokens", type=int, default=32)
    ap.add_argument("--steps", type=int, default=4, help="train.steps, the first (compiling) one included")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="model.dtype (compute)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="any other config override")
    ap.add_argument("--workdir", default="", help="a new folder to keep the run in (default: a temp folder, removed)")
    ap.add_argument("--reward", default="tokens", choices=REWARDS,
                    help="tokens: a reward of the sampled tokens that varies within groups; task: the recipe's")
    ap.add_argument("--share_rounds", type=int, default=3,
                    help="timed steps per side, prompts shared by their group vs not (0 = skip the comparison)")
    C.add_result_args(ap)
    args = ap.parse_args(argv)
    if args.share_rounds < 0:
        raise SystemExit(f"--share_rounds={args.share_rounds}: expected >= 0")
    if args.steps < 2:
        raise SystemExit("--steps must be >= 2: the first step compiles and is not averaged")
    if args.workdir and os.path.exists(os.path.join(args.workdir, "metrics.jsonl")):
        raise SystemExit(f"--workdir={args.workdir!r} holds a run already (the run would resume it); use a new folder")

    logging.basicConfig(level=logging.WARNING)

    from guilibra_jax.train.rl import phases as PH
    task_reward = PH.reward
    if args.reward == "tokens":
        PH.reward = token_reward            # the trainer and compare_sharing both call PH.reward
    try:
        return _run(args, start=C.run_start())
    finally:
        PH.reward = task_reward             # main() may run inside a test process


def _run(args, start: dict) -> dict:
    from guilibra_jax.models import param_count
    from guilibra_jax.train import config as run_config
    from guilibra_jax.train import data_source, model_factory
    from guilibra_jax.train.run import train

    config = build_config(args)
    run_config.validate(config)
    sharing = None
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.workdir or tmp
        t0 = time.perf_counter()
        train(config, workdir)
        wall_s = time.perf_counter() - t0
        with open(os.path.join(workdir, "metrics.jsonl")) as f:
            rows = [r for r in map(json.loads, filter(str.strip, f)) if "step_s" in r]
        tokenizer = data_source.prepare_tokenizer(config, workdir)
        params = param_count(model_factory.tiny_model_config(config.model.tiny, tokenizer)) \
            if not config.model.hf_path and config.model.name == "tiny" else None
        if args.share_rounds:
            sharing = compare_sharing(config, workdir, args.share_rounds)
    row = {"benchmark": "rl_step", "config": args.config, "size": args.size, "params": params, "reward": args.reward,
           "method": config.method, "backend": jax.default_backend(), "devices": jax.device_count(),
           "prompts": config.data.batch_size, "group": config.rl.group_size, "rows": config.data.batch_size *
           config.rl.group_size, "max_new_tokens": config.rl.max_new_tokens, "minibatches": config.rl.minibatches,
           "ppo_epochs": config.rl.ppo_epochs, "dtype": config.model.dtype, "steps": len(rows),
           "wall_s": round(wall_s, 2), "setup_s": round(wall_s - sum(r["step_s"] for r in rows), 2)}
    row.update(summarize(rows, config))
    row["shared_prompts"] = sharing
    return C.report("rl_step", f"rl_step-{args.size}-{args.dtype}", row, args, start)


if __name__ == "__main__":
    from benchmarks._common import launcher_malloc
    launcher_malloc()
    main()
