"""Where the JAX ASFT step's time goes, op by op: a profiler trace of the compiled step
(benchmarks.step's JAX side, same model and batch) joined with its optimized HLO.

  python -m benchmarks.op_profile                    # bench100m, fp32, 2 x 256 tokens, 3 traced steps
  python -m benchmarks.op_profile --model=tiny --steps=1 --out_dir=   # smoke run, nothing written
  python -m benchmarks.op_profile --xla_flags="--xla_cpu_prefer_vector_width=512"

Each executed HLO op's wall time per step (the trace's thunk events; on CPU XLA emits them with
--xla_cpu_enable_xprof_traceme, which this module adds to XLA_FLAGS before JAX starts) is put
in one category:
  head dot       a dot with the vocabulary as a dimension (the LM head, its two gradients)
  dot            every other dot (YNN / Eigen fusions holding a dot); their FLOPs are counted
                 from the HLO shapes, so each gets a FLOP rate
  copy           copies and transposes (layout changes XLA inserted)
  elementwise    every other op (loop fusions, reductions, scatters, the optimizer update)
  control        while / conditional / call wrappers (their bodies' ops are counted too, so
                 this is overhead on top)
The JSON lists the categories (s per step, GFLOP per step, GFLOP/s), the top ops with their
shape and source op name, the traced step time and the measured matmul peak. Ops run
concurrently on the CPU thread pool are each timed from start to end, so the categories can
add up to more than the step; ops_busy_s_per_step is the time some op was running (the union
of their intervals), the rest of the step is dispatch and waiting.
An op's traced time is not what removing it saves: tracing adds a cost per op, and an op that
runs beside the critical path on another core costs little wall time (a layer slice of the KV
cache took 0.28 s of a 1.29 s traced generation, and removing it left the untraced time as it was,
docs/benchmarks.md). Confirm a change with untraced, alternated timings.
--step=grpo | distill: one whole RL step of benchmarks.trainers' ours side instead (same recipe, model
folder and prompt batches; --size / --prompts / --group / --max_new_tokens as there), every
executable it runs (XLA's optimized HLO dumped to a temporary folder, ops keyed by module) and
the ops split by phase (generation, scoring, update: the step's trace annotations; an op goes to
the phase that started last before it). Untraced phase times (medians of --steps steps, before
tracing) are reported beside the traced ones: their difference is the trace's own cost, or the
batches' (each step plays the next prompt batch, and a batch of long prompts runs a larger bucket).
  python -m benchmarks.op_profile --step=distill --size=bench35m --prompts=4 --group=8 --steps=2
Writes benchmarks/results/op_profile-<model>-<dtype>-<machine>.json, or
op_profile-<step>-<size>-<machine>.json (see --out_dir).
"""
from __future__ import annotations

import argparse
import bisect
import collections
import glob
import gzip
import json
import os
import re
import shutil
import sys
import tempfile

TRACE_FLAG = "--xla_cpu_enable_xprof_traceme=true"
VOCAB_MIN = 32_768   # a dot dimension this large is the vocabulary
RL_STEPS = ("grpo", "distill")
PHASES = ("generation", "scoring", "update")   # benchmarks.trainers.ours_step's trace annotations


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="bench100m")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--image", type=int, default=224)
    p.add_argument("--steps", type=int, default=3, help="traced steps (after 2 untraced)")
    p.add_argument("--top", type=int, default=40, help="ops listed")
    p.add_argument("--xla_flags", default="", help="appended to XLA_FLAGS (and recorded)")
    p.add_argument("--step", default="asft", choices=("asft",) + RL_STEPS,
                   help="asft: benchmarks.step's JAX step | grpo / distill: benchmarks.trainers' ours side")
    p.add_argument("--size", default="bench35m", help="--step=grpo|distill: model.tiny.* preset (rl_step.SIZES)")
    p.add_argument("--prompts", type=int, default=4, help="--step=grpo|distill: prompts per step")
    p.add_argument("--group", type=int, default=8, help="--step=grpo|distill: responses per prompt")
    p.add_argument("--max_new_tokens", type=int, default=32, help="--step=grpo|distill: response length limit")
    from benchmarks import _common as C
    C.add_result_args(p)
    return p.parse_args(argv)


def hlo_ops(text: str) -> dict:
    """op name -> {shape, opcode, op_name (metadata), flops, vocab} for every instruction of the
    optimized HLO text outside fused computations (what runs as one op): a fusion's FLOPs are
    its computation's dots (2 x output elements x contracted size); vocab: one of them has a
    vocabulary-sized dimension."""
    comp_flops, comp_vocab, dot_flops, ops = collections.Counter(), {}, {}, {}
    comp, shapes = None, {}
    for ln in text.splitlines():
        if ln and not ln.startswith(" ") and "{" in ln:
            m = re.search(r"%([\w.\-]+)", ln)
            comp, shapes = (m.group(1) if m else None), {}
            continue
        m = re.match(r"^\s*(?:ROOT\s+)?%([\w.\-]+) = (\w+\[[\d,]*\]\S*|\([^=]*?\)) ([\w\-]+)\(", ln)
        if not m:
            continue
        name, shape, opcode = m.groups()
        dims = re.match(r"\w+\[([\d,]*)\]", shape)
        dims = [int(x) for x in dims.group(1).split(",") if x] if dims else []
        shapes[name] = dims
        if opcode == "dot":
            lhs = re.search(r"dot\(%([\w.\-]+),", ln).group(1)
            contracted = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", ln).group(1)
            k = 1
            for x in contracted.split(","):
                if x:
                    k *= shapes[lhs][int(x)]
            out = 1
            for x in dims:
                out *= x
            dot_flops[name] = (2 * out * k, max(dims + shapes[lhs]) >= VOCAB_MIN)
            comp_flops[comp] += dot_flops[name][0]
            comp_vocab[comp] = comp_vocab.get(comp, False) or dot_flops[name][1]
        called = re.search(r"calls=%([\w.\-]+)", ln)
        opn = re.search(r'op_name="([^"]*)"', ln)
        ops[name] = (shape, opcode, opn.group(1) if opn else "", called.group(1) if called else None, comp)
    fused = {called for _, opcode, _, called, _ in ops.values() if opcode == "fusion"}
    table = {}
    for name, (shape, opcode, opn, called, comp) in ops.items():
        if comp in fused:     # inside a fusion: it runs as part of the fusion op
            continue
        if opcode == "dot":   # an unfused dot
            flops, vocab = dot_flops[name]
        elif opcode == "fusion":
            flops, vocab = comp_flops.get(called, 0), comp_vocab.get(called, False)
        else:                 # while / conditional / call: their bodies' ops are timed themselves
            flops, vocab = 0, False
        table[name] = {"shape": shape, "opcode": opcode, "op_name": opn, "flops": flops, "vocab": vocab}
    return table


def dumped_ops(folder: str) -> tuple[dict, list[str]]:
    """Every module XLA dumped to ``folder`` (--xla_dump_to, after optimizations) as one table
    keyed "<module>/<op>" (what ``keyed`` makes of a thunk event), and the module names dumped
    more than once with different text (their ops take the first dump's shapes and FLOPs)."""
    table, seen, ambiguous = {}, {}, []
    for path in sorted(glob.glob(os.path.join(folder, "*after_optimizations.txt"))):
        with open(path) as f:
            text = f.read()
        m = re.search(r"^HloModule ([\w.\-]+)", text, re.M)
        if not m:
            continue
        module = m.group(1)
        if module in seen:
            if seen[module] != hash(text) and module not in ambiguous:
                ambiguous.append(module)
            continue
        seen[module] = hash(text)
        table.update({f"{module}/{name}": op for name, op in hlo_ops(text).items()})
    return table, ambiguous


def keyed(events: list[dict]) -> list[dict]:
    """Thunk events renamed "<module>/<op>" (their hlo_module argument): ops of several
    executables share names."""
    out = []
    for e in events:
        module = (e.get("args") or {}).get("hlo_module")
        out.append({**e, "name": f"{module}/{e['name']}"} if module else e)
    return out


def by_phase(events: list[dict], phases=PHASES) -> dict[str, list[dict]]:
    """The events split by the phase annotation that started last before each (events before
    the first annotation are dropped)."""
    marks = sorted((e["ts"], e["name"]) for e in events if e.get("ph") == "X" and e.get("name") in phases)
    starts = [ts for ts, _ in marks]
    out = {p: [] for p in phases}
    for e in events:
        if e.get("ph") != "X" or e.get("name") in phases:
            continue
        i = bisect.bisect_right(starts, e.get("ts", 0)) - 1
        if i >= 0:
            out[marks[i][1]].append(e)
    return out


def category(name: str, op: dict) -> str:
    if op["opcode"] in ("while", "conditional", "call"):
        return "control"
    if op["flops"]:
        return "head dot" if op["vocab"] else "dot"
    if op["opcode"] in ("copy", "transpose") or name.startswith(("copy", "transpose")):
        return "copy"
    return "elementwise"


def trace_events(folder: str) -> list[dict]:
    [path] = glob.glob(os.path.join(folder, "plugins", "profile", "*", "*.trace.json.gz"))
    with gzip.open(path) as f:
        d = json.load(f)
    return d["traceEvents"] if isinstance(d, dict) else d


def summarize(events: list[dict], ops: dict, steps: int, top: int) -> dict:
    per_op, calls = collections.Counter(), collections.Counter()
    for e in events:
        if e.get("ph") == "X" and e.get("name") in ops:
            per_op[e["name"]] += e.get("dur", 0) / 1e6 / steps
            calls[e["name"]] += 1
    cats = collections.defaultdict(lambda: {"s_per_step": 0.0, "gflop_per_step": 0.0})
    rows = []
    for name, s in per_op.items():
        op = ops[name]
        flops = (op["flops"] or 0) * calls[name] / steps
        kind = category(name, op)
        c = cats[kind]
        c["s_per_step"] += s
        c["gflop_per_step"] += flops / 1e9
        rows.append({"op": name, "category": kind, "s_per_step": round(s, 4),
                     "gflop_per_step": round(flops / 1e9, 2),
                     "gflop_per_s": round(flops / 1e9 / s, 1) if flops and s else None,
                     "runs_per_step": calls[name] / steps, "shape": op["shape"][:60], "op_name": op["op_name"][-120:]})
    spans = sorted((e.get("ts", 0), e.get("ts", 0) + e.get("dur", 0)) for e in events if e.get("ph") == "X" and e.get("name") in ops)
    busy, end = 0.0, None   # the union of the ops' intervals: time some op was running
    for a, b in spans:
        busy += max(0.0, b - max(a, end)) if end is not None else b - a
        end = b if end is None else max(end, b)
    for c in cats.values():
        c["gflop_per_s"] = round(c["gflop_per_step"] / c["s_per_step"], 1) if c["s_per_step"] else None
        c["s_per_step"], c["gflop_per_step"] = round(c["s_per_step"], 4), round(c["gflop_per_step"], 2)
    rows.sort(key=lambda r: -r["s_per_step"])
    return {"ops_busy_s_per_step": round(busy / 1e6 / steps, 4), "categories": dict(sorted(cats.items(), key=lambda kv: -kv[1]["s_per_step"])), "top_ops": rows[:top]}


def rl_profile(args, dump: str) -> dict:
    """--step=grpo|distill: benchmarks.trainers' ours side stepped in this process, 2 warm-up
    steps, --steps untraced, --steps traced; the phases' ops from the trace."""
    import jax
    import numpy as np

    from benchmarks import trainers as T
    from guilibra_jax.train import config as run_config
    from guilibra_jax.train import data_source
    from guilibra_jax.train import multihost as MH
    from guilibra_jax.train.rl import setup as RS

    ap = argparse.ArgumentParser()
    T.add_step_args(ap)
    targs = ap.parse_args([f"--size={args.size}", f"--prompts={args.prompts}", f"--group={args.group}",
                           f"--max_new_tokens={args.max_new_tokens}", f"--steps={2 * args.steps + 1}"])
    targs.pair = args.step
    with tempfile.TemporaryDirectory() as tmp:
        workdir, model_dir = os.path.join(tmp, "run"), os.path.join(tmp, "model")
        params = T.make_model_folder(targs, workdir, model_dir)
        targs.teacher_dir = ""
        if args.step == "distill":
            targs.teacher_dir = os.path.join(tmp, "teacher")
            T.make_model_folder(targs, workdir, targs.teacher_dir, seed=targs.seed + 1)
        batches = T.draw_batches(targs, workdir, model_dir, 2 * args.steps + 2)
        config = T.build_config(targs, model_dir, targs.teacher_dir)
        run_config.validate(config)
        s, state, _ = RS.setup(config, MH.run_mesh(config), data_source.prepare_tokenizer(config, workdir))
        step = lambda r: T.ours_step(s, state, batches[r], jax.random.PRNGKey(1000 + r))
        for r in range(2):
            state, _ = step(r)
        untraced = []
        for r in range(2, 2 + args.steps):
            state, out = step(r)
            untraced.append(out)
        with tempfile.TemporaryDirectory() as d:
            with jax.profiler.trace(d):
                traced = []
                for r in range(2 + args.steps, 2 + 2 * args.steps):
                    state, out = step(r)
                    traced.append(out)
            events = keyed(trace_events(d))
        ops, ambiguous = dumped_ops(dump)
    med = lambda rows, k: round(float(np.median([x[k] for x in rows])), 4)
    split = by_phase(events)
    phases = {}
    for p in PHASES:
        phases[p] = {"untraced_s": med(untraced, f"{p}_s"), "traced_s": med(traced, f"{p}_s"),
                     **summarize(split[p], ops, args.steps, args.top)}
    return {"step": args.step, "size": args.size, "params": params, "prompts": args.prompts, "group": args.group,
            "rows": args.prompts * args.group, "max_new_tokens": args.max_new_tokens, "dtype": "float32",
            "traced_steps": args.steps, "untraced_steps": args.steps,
            "step_s": {"untraced": med(untraced, "step_s"), "traced": med(traced, "step_s")},
            "ambiguous_modules": ambiguous, "phases": phases}


def main(argv=None) -> dict:
    args = parse_args(argv)
    flags = [os.environ.get("XLA_FLAGS", ""), TRACE_FLAG, args.xla_flags]
    dump = tempfile.mkdtemp(prefix="op_profile_hlo_") if args.step in RL_STEPS else None
    if dump:
        flags.append(f"--xla_dump_to={dump} --xla_dump_hlo_as_text")
    os.environ["XLA_FLAGS"] = " ".join(x for x in flags if x)
    if dump:
        try:
            return rl_main(args, dump)
        finally:
            shutil.rmtree(dump, ignore_errors=True)
    import jax
    import numpy as np

    from benchmarks import _common as C
    from benchmarks import step as B

    start = C.run_start()
    sargs = B.parse_args([f"--model={args.model}", f"--batch={args.batch}", f"--seq={args.seq}",
                          f"--image={args.image}", "--no-torch", "--no-torch_compile"])
    config = C.bench_config(args.model)
    side = B.JaxSide(sargs, config, B.host_batch(config, sargs), None)
    ops = hlo_ops(side.compiled.as_text())
    for _ in range(2):
        side.step()
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            times = [side.step()[0] for _ in range(args.steps)]
        events = trace_events(d)
    result = {"benchmark": "op_profile", "model": args.model, "dtype": sargs.dtype,
              "batch": {"rows": args.batch, "seq": args.seq, "image": args.image}, "traced_steps": args.steps,
              "step_s": round(float(np.median(times)), 4), "xla_flags": os.environ["XLA_FLAGS"],
              "measured_peak_flops": C.measure_matmul_peak(),
              "timing": "op wall time per step from the profiler's thunk events (concurrent ops overlap)",
              **summarize(events, ops, args.steps, args.top)}
    for name, c in result["categories"].items():
        print(f"[op_profile] {name:12s} {c['s_per_step']:7.3f} s/step {c['gflop_per_step']:8.1f} GFLOP "
              f"{c['gflop_per_s'] or 0:7.1f} GFLOP/s", flush=True)
    return C.report("op_profile", f"op_profile-{args.model}-{sargs.dtype}", result, args, start)


def rl_main(args, dump: str) -> dict:
    from benchmarks import _common as C

    start = C.run_start()
    result = {"benchmark": "op_profile", **rl_profile(args, dump), "xla_flags": os.environ["XLA_FLAGS"],
              "measured_peak_flops": C.measure_matmul_peak(),
              "timing": "per phase: op wall time per step from the profiler's thunk events (concurrent ops overlap); "
                        "untraced_s / traced_s: the phase's median wall time without / with the profiler"}
    for p, ph in result["phases"].items():
        print(f"[op_profile] {p}: untraced {ph['untraced_s']:.3f} s, traced {ph['traced_s']:.3f} s, "
              f"ops busy {ph['ops_busy_s_per_step']:.3f} s", flush=True)
        for name, c in ph["categories"].items():
            print(f"[op_profile]   {name:12s} {c['s_per_step']:7.3f} s/step {c['gflop_per_step']:8.1f} GFLOP "
                  f"{c['gflop_per_s'] or 0:7.1f} GFLOP/s", flush=True)
    return C.report("op_profile", f"op_profile-{args.step}-{args.size}", result, args, start)


if __name__ == "__main__":
    from benchmarks._common import launcher_malloc
    launcher_malloc()
    sys.exit(0 if main() else 1)
