"""Smoke runs of the benchmarks on the tiny model, so that they cannot rot: each runs end to
end, writes its results JSON (machine, versions, commit, load) and checks what it claims to
(loss / gradient-norm parity with transformers, greedy token agreement, the GPU check's phases)."""
import glob
import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
torch = pytest.importorskip("torch", reason="the benchmarks compare against transformers + torch")
pytest.importorskip("transformers")


def _provenance(res):
    assert res["machine"]["cpu_cores"] >= 1 and res["machine"]["slug"] and isinstance(res["machine"]["cpu"], dict)
    assert res["versions"]["jax"] and res["versions"]["torch"]
    assert "commit" in res["git"] and isinstance(res["loaded"], bool) and "glibc_tunables" in res


def test_machine_info_tells_apart_cpus_of_one_model_name():
    """Two Intel VMs read the same model name: the file records family / model / stepping and
    the caches, as lscpu's sources state them."""
    from benchmarks import _common as C

    ident = C.machine_info()["cpu"]
    if os.path.exists("/proc/cpuinfo") and "x86" in os.uname().machine:
        first = open("/proc/cpuinfo").read().split("\n\n")[0]
        model = re.search(r"^model\s*:\s*(\d+)$", first, re.M).group(1)
        assert ident["model"] == model and ident["cpu_family"].isdigit()
    for d in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*"):
        level, kind, size = (open(os.path.join(d, n)).read().strip() for n in ("level", "type", "size"))
        if level == "3" and kind == "Unified":
            assert ident["caches"]["L3"] == size


@pytest.mark.slow   # minutes on 2 cores; the sampler smoke covers the harness, test_head_loss the step parity
def test_step_benchmark_interleaves_sides_with_parity_and_writes_results(tmp_path):
    from benchmarks import step

    res = step.main(["--model=tiny", "--seq=64", "--image=56", "--steps=1", "--steps_per_turn=2", "--mesh=1,1,1",
                     "--no-torch_compile", f"--out_dir={tmp_path}", "--loaded",
                     "--xla_variants", "eigen=--xla_cpu_experimental_ynn_fusion_type="])
    files = list(tmp_path.glob("step-tiny-float32-*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["sides"].keys() == {"jax", "jax:eigen", "torch_eager"}
    assert res["sides"]["jax:eigen"]["xla_flags"].endswith("--xla_cpu_experimental_ynn_fusion_type=")
    assert res["parity"]["jax:eigen"]["ok"] and "jax:eigen_vs_jax" in res["speedup"]
    _provenance(res)
    assert res["loaded"] is True
    assert res["parity"]["ok"], res["parity"]
    assert abs(res["batch"]["loss_fraction"] - 1 / 3) < 0.05
    # the JAX side computes the head at fewer positions than transformers (its full logits)
    assert res["batch"]["loss_positions"] <= res["batch"]["head_positions_jax"] < 64 * 2
    assert res["executed_flops_jax"] < res["executed_flops_torch"]
    for side in ("jax", "torch_eager"):
        s = res["sides"][side]
        # one round of two steps per side: the turn's first apart, the second timed (round 0 untimed)
        assert len(s["step_times_s"]) == 1 and len(s["turn_first_times_s"]) == 1 and len(s["losses"]) == 3
        assert s["tokens_per_s"] > 0
    assert res["sides"]["torch_eager"]["attn_implementation"] == "sdpa"
    assert res["sides"]["torch_eager"]["threads"] == os.cpu_count()
    assert res["sides"]["jax"]["host_prep_s"] > 0 and "jax_vs_torch_eager" in res["speedup"]


def test_step_benchmark_reads_xla_flag_sets_as_named_jax_sides():
    from benchmarks import step

    args = step.parse_args(["--no-torch", "--xla_variants",
                            "eigen=--xla_cpu_experimental_ynn_fusion_type=; ynn=--xla_cpu_experimental_ynn_fusion_type=dot,eltwise"])
    assert args.variants == {"jax:eigen": "--xla_cpu_experimental_ynn_fusion_type=",
                             "jax:ynn": "--xla_cpu_experimental_ynn_fusion_type=dot,eltwise"}
    assert step.parse_args([]).variants == {}
    for bad in ("noflags", "x=notaflag", "=--xla_a=1", "a=--xla_a=1;a=--xla_b=2"):
        with pytest.raises(SystemExit):
            step.parse_args(["--xla_variants", bad])


def test_sampler_benchmark_agrees_with_generate_and_writes_results(tmp_path):
    from benchmarks import sampler

    res = sampler.main(["--model=tiny", "--states=1", "--group=2", "--prompt_len=24", "--max_new_tokens=4",
                        "--iters=1", "--mesh=1,1,1", f"--out_dir={tmp_path}"])
    assert len(list(tmp_path.glob("sampler-tiny-float32-*.json"))) == 1
    _provenance(res)
    assert res["torch_eager_agreement"]["token_agreement"] == 1.0
    assert res["jax_tokens_per_s"] > 0 and res["torch_eager_tokens_per_s"] > 0
    assert res["jax_host_prep_s"] > 0 and res["torch_eager_host_prep_s"] > 0
    assert res["attn_implementation"] == {"torch_eager": "sdpa"}
    assert res["decode_flops"] > 0 and res["decode_bound"]
    assert res["jax_shared_identical_tokens"] and res["jax_shared_tokens_per_s"] > 0   # prefill once per prompt


def test_rl_step_benchmark_compares_shared_prompts_and_writes_results(tmp_path):
    from benchmarks import rl_step

    res = rl_step.main(["--steps=2", "--max_new_tokens=4", "--share_rounds=1", f"--out_dir={tmp_path}"])
    assert len(list(tmp_path.glob("rl_step-tiny-float32-*.json"))) == 1
    _provenance(res)
    assert res["steps"] == 2 and res["sample_s"] > 0 and res["update_s"] > 0
    p = res["shared_prompts"]
    assert p["identical_tokens"], p     # the same key gives the same responses, shared or not
    assert p["rounds"] == 1 and len(p["shared"]["step_s_each"]) == len(p["unshared"]["step_s_each"]) == 1
    assert p["rows_per_round"] == res["rows"] and p["shared"]["update_s"] > 0 and p["unshared"]["score_s"] > 0
    # the same rollouts and losses up to float noise, on rewards that vary within groups
    assert res["reward"] == "tokens" and p["identical_rewards"] and p["reward_group_std_mean"] > 0, p
    assert p["max_abs_difference"]["reward_mean"] == 0.0 and p["max_abs_difference"]["loss"] < 1e-4, p
    from guilibra_jax.train.rl import phases as PH
    assert PH.reward is not rl_step.token_reward      # the task reward is back for later tests


def _gpu_check(tmp_path, *flags):
    proc = subprocess.run(["bash", os.path.join(ROOT, "benchmarks", "gpu_check.sh"), "--tiny",
                           f"--out_dir={tmp_path}", "--steps=1", *flags],
                          capture_output=True, text=True, timeout=1800, env={**os.environ, "PYTHON": sys.executable})
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = list(tmp_path.glob("gpu_check-tiny-*.json"))
    assert len(files) == 1
    res = json.loads(files[0].read_text())
    _provenance(res)
    assert res["parity"]["ok"], res["parity"]
    assert res["asft_step"]["tokens_per_s"] > 0 and res["asft_step"]["model_flops"] > 0
    assert res["sampler"]["tokens_per_s"] > 0
    return res


@pytest.mark.slow   # minutes on 2 cores; a GPU check: the sampler smoke covers the harness
def test_gpu_check_runs_end_to_end_with_tiny(tmp_path):
    """benchmarks/gpu_check.sh as a user runs it, on the tiny model (CPU): parity, the ASFT step
    at a given depth and the sampler (the slow test below adds the layer fit)."""
    res = _gpu_check(tmp_path, "--layers=2")
    assert res["asft_step"]["fit"] == {"layers": 2} and res["asft_step"]["layers"] == 2


@pytest.mark.slow
def test_gpu_check_fits_the_layers_to_the_memory_limit(tmp_path):
    """The fit: compiled step bytes at 2 and 4 layers, extrapolated to a pretend limit (CPUs report none)."""
    res = _gpu_check(tmp_path, "--memory_limit_gb=0.05")
    fit = res["asft_step"]["fit"]
    assert fit["bytes_at_4_layers"] > fit["bytes_at_2_layers"] and 1 <= fit["layers"] <= 4
    assert fit["bytes_predicted"] <= 0.85 * fit["memory_limit_bytes"] or fit["layers"] == 1
    assert res["asft_step"]["layers"] == fit["layers"]


def test_nominal_peaks_match_device_kinds():
    from benchmarks._common import nominal_peak

    assert nominal_peak("NVIDIA H100 80GB HBM3") == 989e12
    assert nominal_peak("NVIDIA H100 PCIe") == 756e12
    assert nominal_peak("NVIDIA H200") == 989e12 and nominal_peak("NVIDIA A100-SXM4-80GB") == 312e12
    assert nominal_peak("cpu") is None


def test_interleaved_steps_rotate_the_order_and_mark_each_turns_first_step():
    from benchmarks._common import interleaved_steps

    calls, rounds = [], []
    step = lambda s: (calls.append(s), len(calls))[1]
    rows = interleaved_steps(step, ["a", "b", "c"], timed=2, per_turn=2, on_round=lambda r, rows: rounds.append(r))
    assert calls == ["a", "b", "c"] + ["b", "b", "c", "c", "a", "a"] + ["c", "c", "a", "a", "b", "b"]
    assert rounds == [0, 1, 2]
    assert rows["a"] == [(0, False, 1), (1, True, 8), (1, False, 9), (2, True, 12), (2, False, 13)]
    two = interleaved_steps(lambda s: s, ["x", "y"], timed=2, per_turn=1)   # two sides: reversed every other round
    assert [f for _, f, _ in two["x"]] == [False] * 3


@pytest.mark.slow   # ~10 s; the update's math: tests/train/test_sft_step.py, the interleaving: the test above
def test_optimizer_update_benchmark_ends_both_sides_on_the_same_parameters(tmp_path):
    from benchmarks import optimizer_update

    res = optimizer_update.main(["--model=tiny", "--rounds=1", "--per_turn=2", f"--out_dir={tmp_path}"])
    assert res["params_max_abs_diff"] < 1e-6 and res["params"] > 0
    for side in res["sides"].values():
        assert len(side["update_times_s"]) == 1 and side["turn_first_s"] > 0
    assert res["optax_select_over_step_core"] > 0
    _provenance(json.loads((tmp_path / "optimizer_update-tiny-" f"{res['machine']['slug']}.json").read_text()))


@pytest.mark.slow
def test_step_benchmark_with_torch_compile(tmp_path):
    """The torch.compile side (minutes of compilation on a CPU; the eager smoke test covers the rest)."""
    from benchmarks import step

    res = step.main(["--model=tiny", "--seq=64", "--image=56", "--steps=1", "--mesh=1,1,1", f"--out_dir={tmp_path}"])
    assert res["parity"]["torch_compile"]["ok"] and res["sides"]["torch_compile"]["torch_compile"]


def test_op_profile_counts_each_compiled_dot_and_puts_vocabulary_dots_in_the_head():
    """The HLO parser against XLA's own optimized text: every dot's FLOPs (2 x output x
    contracted) found on the op that runs it, the vocabulary-sized one as the head; and the
    summary of thunk events per step."""
    import jax
    import jax.numpy as jnp

    from benchmarks import op_profile as P

    def f(h, w, a, b):
        return jnp.tanh(h @ w.T).sum(), (a @ b).sum()

    args = (jnp.ones((8, 16)), jnp.ones((40_000, 16)), jnp.ones((24, 32)), jnp.ones((32, 48)))
    ops = P.hlo_ops(jax.jit(f).lower(*args).compile().as_text())
    dots = {name: op for name, op in ops.items() if op["flops"]}
    assert sorted(op["flops"] for op in dots.values()) == [2 * 24 * 48 * 32, 2 * 8 * 40_000 * 16]
    assert {P.category(n, op) for n, op in dots.items()} == {"dot", "head dot"}
    head = next(n for n, op in dots.items() if op["vocab"])
    events = [{"ph": "X", "name": head, "dur": 2e6}, {"ph": "X", "name": head, "dur": 4e6},
              {"ph": "X", "name": "not-an-op", "dur": 9e6}]
    out = P.summarize(events, ops, steps=2, top=5)
    assert out["categories"] == {"head dot": {"s_per_step": 3.0, "gflop_per_step": 0.01,
                                              "gflop_per_s": round(2 * 8 * 40_000 * 16 / 1e9 / 3.0, 1)}}
    assert out["top_ops"][0]["op"] == head and out["top_ops"][0]["runs_per_step"] == 1
    overlapping = [{"ph": "X", "name": head, "ts": 0, "dur": 4e6}, {"ph": "X", "name": head, "ts": 1e6, "dur": 1e6},
                   {"ph": "X", "name": head, "ts": 6e6, "dur": 2e6}]
    assert P.summarize(overlapping, ops, steps=2, top=1)["ops_busy_s_per_step"] == 3.0   # (4 + 2) s over 2 steps


def test_op_profile_keys_ops_by_module_and_splits_them_by_the_phase_that_started_last():
    from benchmarks import op_profile as P

    events = [{"ph": "X", "name": "generation", "ts": 0, "dur": 10},
              {"ph": "X", "name": "dot.1", "ts": 2, "dur": 3, "args": {"hlo_module": "jit__generate"}},
              {"ph": "X", "name": "update", "ts": 10, "dur": 5},
              {"ph": "X", "name": "dot.1", "ts": 11, "dur": 2, "args": {"hlo_module": "jit_traced"}},
              {"ph": "X", "name": "dot.2", "ts": 16, "dur": 1, "args": {"hlo_module": "jit_traced"}},  # spills over
              {"ph": "X", "name": "PjitFunction(f)", "ts": -5, "dur": 1}]                           # before any phase
    split = P.by_phase(P.keyed(events))
    assert [e["name"] for e in split["generation"]] == ["jit__generate/dot.1"]
    assert [e["name"] for e in split["update"]] == ["jit_traced/dot.1", "jit_traced/dot.2"]
    assert split["scoring"] == []


def test_op_profile_reads_every_dumped_module_and_names_a_module_dumped_twice_differently(tmp_path):
    """dumped_ops over XLA's own optimized text written as --xla_dump_to names it: ops keyed
    "<module>/<op>" with their FLOPs; a module name dumped twice with other text is ambiguous."""
    import jax
    import jax.numpy as jnp

    from benchmarks import op_profile as P

    def dump(i, fn, *args):
        text = jax.jit(fn).lower(*args).compile().as_text()
        name = re.search(r"^HloModule ([\w.\-]+)", text, re.M).group(1)
        (tmp_path / f"module_{i:04d}.{name}.cpu_after_optimizations.txt").write_text(text)
        (tmp_path / f"module_{i:04d}.{name}.cpu_after_optimizations-buffer-assignment.txt").write_text("x")
        return name

    def matmul(a, b):
        return a @ b

    name = dump(1, matmul, jnp.ones((8, 16)), jnp.ones((16, 4)))
    ops, ambiguous = P.dumped_ops(str(tmp_path))
    [key] = [k for k, op in ops.items() if op["flops"]]
    assert key.startswith(f"{name}/") and ops[key]["flops"] == 2 * 8 * 4 * 16 and ambiguous == []
    dump(2, matmul, jnp.ones((8, 32)), jnp.ones((32, 4)))      # the same name, other shapes
    assert P.dumped_ops(str(tmp_path))[1] == [name]


@pytest.mark.slow   # ~30 s; the dump reader and the phase split are covered by the two tests above
def test_op_profile_of_an_rl_step_joins_every_executable_with_its_trace(tmp_path):
    """--step=grpo end to end on the tiny model (its own process: the trace and dump flags must
    precede JAX): each phase's ops found in the dumped HLO, dots with FLOPs in generation and
    update, untraced and traced phase times."""
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "GUILIBRA_NO_HUGEPAGES")}
    env.update(XLA_FLAGS="", JAX_PLATFORMS="cpu")
    cmd = [sys.executable, "-m", "benchmarks.op_profile", "--step=grpo", "--size=tiny", "--prompts=2", "--group=2",
           "--max_new_tokens=4", "--steps=1", f"--out_dir={tmp_path}", "--loaded"]
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True, timeout=600)
    [path] = tmp_path.glob("op_profile-grpo-tiny-*.json")
    res = json.loads(path.read_text())
    assert res["step_s"]["untraced"] > 0
    # run as the launchers run training: with their malloc tunables (where glibc reads them)
    from guilibra_jax.train import distributed
    launcher_env = distributed.hugepage_environ(env, os.confstr("CS_GNU_LIBC_VERSION"))
    assert res["glibc_tunables"] == (launcher_env["GLIBC_TUNABLES"] if launcher_env else "")
    for phase in ("generation", "update"):
        ph = res["phases"][phase]
        assert ph["untraced_s"] > 0 and ph["traced_s"] > 0 and ph["ops_busy_s_per_step"] > 0
        assert ph["categories"]["dot"]["gflop_per_step"] > 0
        # the phase's executables were compiled once (small helpers like jit_stage may be
        # compiled for several shapes: their ops are listed as ambiguous)
        assert not {r["op"].split("/")[0] for r in ph["top_ops"]} & set(res["ambiguous_modules"])
    _provenance(res)


def test_dot_backends_times_each_shape_on_each_side_and_writes_results(tmp_path):
    from benchmarks import dot_backends

    small = ["--rounds=1", "--repeats=1", "--positions=8", "--hidden=32", "--vocab=512", "--rows=4", "--square=64",
             f"--out_dir={tmp_path}", "--loaded"]
    res = dot_backends.main([*small, "--sides=xla_ynn,xla_eigen"])
    assert len(list(tmp_path.glob("dot_backends-*.json"))) == 1
    assert set(res["gflop_per_s"]) == {"xla_ynn", "xla_eigen", "torch"}
    assert res["shapes"]["head_grad_h"] == {"lhs": [8, 512], "rhs": [512, 32], "flops": 2 * 8 * 512 * 32}
    assert all(v > 0 for side in res["gflop_per_s"].values() for v in side.values())
    assert set(res["over_torch"]) == {"xla_ynn", "xla_eigen"}
    _provenance(res)
    # bfloat16 on the oneDNN side: it runs, or (a CPU this jaxlib's oneDNN cannot run on) it is
    # recorded as failed with its exit status and left out of the table, never silently dropped
    res = dot_backends.main([*small, "--sides=xla_onednn", "--dtype=bfloat16"])
    assert res["dtype"] == "bfloat16" and len(list(tmp_path.glob("dot_backends-bfloat16-*.json"))) == 1
    assert set(res["gflop_per_s"]) | set(res["failed_sides"]) == {"xla_onednn", "torch"}
    assert all(isinstance(f["returncode"], int) and f["returncode"] != 0 for f in res["failed_sides"].values())
    with pytest.raises(SystemExit, match="unknown or not an XLA side"):
        dot_backends.main([*small, "--sides=xla_ynn,torch"])


def test_decode_attention_cascade_agrees_with_the_per_row_cache_and_writes_results(tmp_path):
    from benchmarks import decode_attention

    res = decode_attention.main(["--rounds=2", "--prompts=2", "--group=3", "--prompt_slots=5,9", "--new_tokens=4",
                                 "--layers=2", "--heads=4", "--kv_heads=2", "--head_dim=8", "--state=16",
                                 f"--out_dir={tmp_path}"])
    _provenance(json.loads((tmp_path / f"decode_attention-{res['machine']['slug']}.json").read_text()))
    assert sorted(res["by_prompt_slots"]) == ["5", "9"] and res["rows"] == 6
    for case in res["by_prompt_slots"].values():
        assert case["max_abs_diff"] <= 1e-4 * max(1.0, case["state_max_abs"]) and case["state_max_abs"] > 0
        assert len(case["seconds_each"]["cascade"]) == 2 and case["per_row_over_cascade"] > 0
