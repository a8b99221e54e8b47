"""`python -m launch.train` end to end on the tiny demo config: kill -9 during an
asynchronous save and at a random moment, then reruns, leave parameters bitwise equal to
an uninterrupted run's (each rerun says which step it resumed from); SIGTERM leaves a
checkpoint; config errors name the key; the exported Hugging Face folder loads in
transformers with matching logits."""
import json
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import chaos

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Asynchronous checkpoints (the default) every 2 steps: a kill can cut a save short, and
# a resume may have to redo steps.
SMOKE = ["--config=configs/demo.py:smoke", "--config.data.synthetic.tasks=8", "--config.train.steps=6",
         "--config.train.checkpoint_every=2"]
SEED = int(os.environ.get("GUILIBRA_CHAOS_SEED", time.time_ns() % 2**31))


def launch(workdir, *extra, wait=True):
    cmd = [sys.executable, "-m", "launch.train", f"--workdir={workdir}", *SMOKE, *extra]
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    if not wait:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    return out


def wait_for_step(workdir, step, proc, timeout=600):
    path = os.path.join(workdir, "metrics.jsonl")
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise AssertionError(f"run ended early: {proc.stdout.read()[-3000:]}")
        if os.path.exists(path) and any(json.loads(l)["step"] >= step for l in open(path) if l.strip()):
            return
        time.sleep(0.2)
    raise TimeoutError(f"step {step} never logged")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, compile_cache):
    workdir = str(tmp_path_factory.mktemp("full"))
    out = chaos.run_to_end(workdir, SMOKE, compile_cache)
    assert chaos.resumed_from(out) == 0  # a fresh workdir says it starts from step 0
    return workdir


def test_kill_9_during_an_async_save_and_at_a_random_moment_then_reruns_are_bitwise_exact(
        uninterrupted, compile_cache, tmp_path):
    workdir = str(tmp_path / "killed")
    cut = chaos.kill_during_save(workdir, SMOKE, compile_cache, min_step=4)
    assert chaos.unfinished_saves(workdir), "the kill did not land inside an asynchronous save"
    assert max(chaos.complete_steps(workdir), default=0) < cut
    # The next launch resumes from the newest complete checkpoint before the cut save
    # (removing the unfinished one); it is killed again at a random moment.
    notes = chaos.chaos_run(workdir, SMOKE, compile_cache, random.Random(SEED), kills=1, steps=6)
    assert not chaos.unfinished_saves(workdir)
    assert chaos.complete_steps(workdir)[-1] == 6
    chaos.assert_bitwise_equal_exports(uninterrupted, workdir)
    last = {r["step"]: r["loss"] for r in chaos.metric_rows(workdir)}  # a step logged again: the last row
    ref = {r["step"]: r["loss"] for r in chaos.metric_rows(uninterrupted)}
    assert 6 in last and all(last[s] == loss for s, loss in ref.items() if s in last), (SEED, notes)


# The demo recipe's model and data (480 synthetic tasks), 30 steps, a checkpoint every 5.
DEMO = ["--config=configs/demo.py", "--config.train.steps=30", "--config.train.checkpoint_every=5",
        "--config.train.log_every=1", "--config.train.eval_every=0", "--config.train.progress=False"]


@pytest.mark.slow
def test_demo_run_killed_at_ten_random_moments_ends_bitwise_exact(compile_cache, tmp_path):
    reference = str(tmp_path / "reference")
    chaos.run_to_end(reference, DEMO, compile_cache, timeout=3600)
    workdir = str(tmp_path / "killed")
    notes = chaos.chaos_run(workdir, DEMO, compile_cache, random.Random(SEED), kills=10, steps=30, startup_s=40.0)
    print("\n".join([f"seed {SEED}", *notes]))
    chaos.assert_bitwise_equal_exports(reference, workdir)


def test_sigterm_saves_a_checkpoint_and_exits_cleanly(tmp_path):
    workdir = str(tmp_path / "term")
    proc = launch(workdir, "--config.train.steps=1000", "--config.train.checkpoint_every=1000", wait=False)
    wait_for_step(workdir, 2, proc)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output[-3000:]
    saved = [int(d) for d in os.listdir(os.path.join(workdir, "checkpoints")) if d.isdigit()]
    assert saved and 2 <= max(saved) < 1000  # saved at the step it stopped, not at a scheduled one
    assert not os.path.exists(os.path.join(workdir, "export"))  # an unfinished run is not exported


def test_a_rerun_with_another_config_refuses_to_start_and_names_the_keys(uninterrupted):
    before = open(os.path.join(uninterrupted, "config.json")).read()
    out = subprocess.run([sys.executable, "-m", "launch.train", f"--workdir={uninterrupted}", *SMOKE,
                          "--config.train.steps=8", "--config.optim.lr=0.01"], cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"},
                         capture_output=True, text=True, timeout=600)
    errors = [l for l in out.stderr.splitlines() if l.startswith("error:")]
    assert out.returncode == 2 and len(errors) == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert "train.steps: 6 -> 8" in errors[0] and "optim.lr: 0.003 -> 0.01" in errors[0]
    assert open(os.path.join(uninterrupted, "config.json")).read() == before


def test_unknown_config_key_is_named(tmp_path):
    out = launch(str(tmp_path / "bad"), "--config.train.stepz=3")
    assert out.returncode != 0 and "stepz" in out.stderr


def test_bad_config_value_is_named_before_work_starts(tmp_path):
    out = launch(str(tmp_path / "bad"), "--config.loss.normalize=batch")
    assert out.returncode != 0 and "loss.normalize" in out.stderr
    assert not os.path.exists(str(tmp_path / "bad" / "synthetic_data"))


def test_export_loads_in_transformers_with_matching_logits(uninterrupted):
    import torch
    import transformers
    from flax import nnx

    from guilibra_jax import models as M
    from guilibra_jax.train import fake_batch as F

    export = os.path.join(uninterrupted, "export")
    assert os.path.exists(os.path.join(export, "config.json"))
    assert os.path.exists(os.path.join(export, "tokenizer.json"))
    hf = transformers.AutoModelForImageTextToText.from_pretrained(export, torch_dtype=torch.float32).eval()
    model, config = M.load_hf(export)
    batch = F.fake_sft_batch(config, batch=1, seq_len=40, image_hw=(56, 84), seed=0)
    ours = np.asarray(model(batch["input_ids"], batch["positions"], batch["segment_ids"], batch["pixel_values"],
                            batch["vision"]))
    ids = torch.tensor(batch["input_ids"], dtype=torch.long)
    mm = (ids == config.image_token_id).long()
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=torch.ones_like(ids), mm_token_type_ids=mm,
                 pixel_values=torch.tensor(batch["pixel_values"]),
                 image_grid_thw=torch.tensor([[1, 4, 6]])).logits.numpy()
    scale = np.abs(ref).max()
    assert np.abs(ours - ref).max() <= 1e-4 * max(scale, 1.0)


def test_convert_of_the_last_checkpoint_equals_the_end_of_run_export(uninterrupted, tmp_path):
    from safetensors.numpy import load_file
    out = str(tmp_path / "hf")
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    res = subprocess.run([sys.executable, "-m", "launch.convert", f"--workdir={uninterrupted}", f"--out={out}"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    a = load_file(os.path.join(out, "model.safetensors"))
    b = load_file(os.path.join(uninterrupted, "export", "model.safetensors"))
    assert sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
