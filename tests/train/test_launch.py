"""`python -m launch.train` end to end on the tiny demo config: resume after kill -9
equals an uninterrupted run, SIGTERM leaves a checkpoint, config errors name the key,
and the exported Hugging Face folder loads in transformers with matching logits."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMOKE = ["--config=configs/demo.py:smoke", "--config.data.synthetic.tasks=8", "--config.train.steps=6",
         "--config.train.checkpoint_every=2", "--config.train.async_checkpoints=False"]


def launch(workdir, *extra, wait=True):
    cmd = [sys.executable, "-m", "launch.train", f"--workdir={workdir}", *SMOKE, *extra]
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    if not wait:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    return out


def losses(workdir):
    """step -> loss, the last logged value per step (a resumed run logs again)."""
    out = {}
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        for line in f:
            row = json.loads(line)
            if "loss" in row:
                out[row["step"]] = row["loss"]
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
def uninterrupted(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("full"))
    out = launch(workdir)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return workdir


def test_kill_9_then_rerun_matches_uninterrupted(uninterrupted, tmp_path):
    workdir = str(tmp_path / "killed")
    proc = launch(workdir, wait=False)
    wait_for_step(workdir, 3, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    steps_done = sorted(int(d) for d in os.listdir(os.path.join(workdir, "checkpoints")) if d.isdigit())
    assert steps_done and max(steps_done) < 6
    out = launch(workdir)  # the same command resumes
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    ref, resumed = losses(uninterrupted), losses(workdir)
    assert sorted(ref) == list(range(1, 7))
    for step in range(max(steps_done) + 1, 7):
        np.testing.assert_allclose(resumed[step], ref[step], rtol=1e-5, err_msg=f"step {step}")


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
