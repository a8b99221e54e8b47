"""`python -m launch.train` end to end on the tiny demo config: kill -9 during an
asynchronous save and at a random moment, then reruns, leave parameters bitwise equal to
an uninterrupted run's (each rerun says which step it resumed from); SIGTERM leaves a
checkpoint; config errors name the key; the exported Hugging Face folder loads in
transformers with matching logits."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from flax import nnx

import chaos

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Asynchronous checkpoints (the default) every 2 steps: a kill can cut a save short, and
# a resume may have to redo steps.
SMOKE = ["--config=configs/demo.py:smoke", "--config.data.synthetic.tasks=8", "--config.train.steps=6",
         "--config.train.checkpoint_every=2"]


def launch(workdir, *extra, wait=True, env=None):
    cmd = [sys.executable, "-m", "launch.train", f"--workdir={workdir}", *SMOKE, *extra]
    # every program into the persistent compilation cache, however fast it compiled
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
           **(env or {})}
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
    out = chaos.run_to_end(workdir, SMOKE + ["--config.train.profile_steps=(2,4)"], compile_cache)
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
    notes = chaos.chaos_run(workdir, SMOKE, compile_cache, chaos.SEED, kills=1, steps=6)
    assert not chaos.unfinished_saves(workdir), notes
    assert chaos.complete_steps(workdir)[-1] == 6, notes
    chaos.assert_bitwise_equal_exports(uninterrupted, workdir, notes)
    last = {r["step"]: r["loss"] for r in chaos.metric_rows(workdir)}  # a step logged again: the last row
    ref = {r["step"]: r["loss"] for r in chaos.metric_rows(uninterrupted)}
    assert 6 in last and all(last[s] == loss for s, loss in ref.items() if s in last), notes


# The demo recipe's model and data (480 synthetic tasks), 30 steps, a checkpoint every 5.
DEMO = ["--config=configs/demo.py", "--config.train.steps=30", "--config.train.checkpoint_every=5",
        "--config.train.log_every=1", "--config.train.eval_every=0", "--config.train.progress=False"]


@pytest.mark.slow
def test_demo_run_killed_at_ten_random_moments_ends_bitwise_exact(compile_cache, tmp_path):
    reference = str(tmp_path / "reference")
    chaos.run_to_end(reference, DEMO, compile_cache, timeout=3600)
    workdir = str(tmp_path / "killed")
    notes = chaos.chaos_run(workdir, DEMO, compile_cache, chaos.SEED, kills=10, steps=30, startup_s=40.0)
    print("\n".join(notes))
    chaos.assert_bitwise_equal_exports(reference, workdir, notes)


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


def test_a_finished_run_leaves_its_profile_trace_curves_and_compilation_cache(uninterrupted, compile_cache):
    from PIL import Image
    traces = [n for _, _, names in os.walk(os.path.join(uninterrupted, "profile")) for n in names]
    assert any(n.endswith(".xplane.pb") for n in traces), traces
    assert Image.open(os.path.join(uninterrupted, "curves.png")).size == (840, 300)
    assert os.listdir(compile_cache)   # JAX_COMPILATION_CACHE_DIR (chaos.env) is what "auto" uses when set
    with open(os.path.join(uninterrupted, "export", "preprocessor_config.json")) as f:
        pre = json.load(f)
    assert (pre["min_pixels"], pre["max_pixels"]) == (56 * 56, 112 * 112)      # configs/demo.py


def test_a_rerun_with_another_config_refuses_to_start_and_names_the_keys(uninterrupted, tmp_path):
    workdir = str(tmp_path / "rerun")   # a copy: the module's run is every test's, whatever this rerun does
    shutil.copytree(uninterrupted, workdir)
    before = open(os.path.join(workdir, "config.json")).read()
    out = subprocess.run([sys.executable, "-m", "launch.train", f"--workdir={workdir}", *SMOKE,
                          "--config.train.steps=8", "--config.optim.lr=0.01"], cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"},
                         capture_output=True, text=True, timeout=600)
    errors = [l for l in out.stderr.splitlines() if l.startswith("error:")]
    assert out.returncode == 2 and len(errors) == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert "train.steps: 6 -> 8" in errors[0] and "optim.lr: 0.003 -> 0.01" in errors[0]
    assert open(os.path.join(workdir, "config.json")).read() == before


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

    from guilibra_jax import models as M
    from guilibra_jax.train import fake_batch as F

    export = os.path.join(uninterrupted, "export")
    assert os.path.exists(os.path.join(export, "config.json"))
    assert os.path.exists(os.path.join(export, "tokenizer.json"))
    hf = transformers.AutoModelForImageTextToText.from_pretrained(export, torch_dtype=torch.float32).eval()
    model, config = M.load_hf(export)
    batch = F.fake_sft_batch(config, batch=1, seq_len=40, image_hw=(56, 84), seed=0)
    ours = np.asarray(nnx.jit(lambda m, *a: m(*a))(model, batch["input_ids"], batch["positions"],
                                                   batch["segment_ids"], batch["pixel_values"], batch["vision"]))
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


# ----------------------------------------------------------------------------- serving the export

def _export_prompt(workdir):
    """(agent on the export, our pipeline's prompt batch, the chat messages and image of
    a held-out record): what a server and our pipeline each make of one observation."""
    from guilibra_jax import actions as A
    from guilibra_jax.data import prompts as P
    from guilibra_jax.data import samples as S
    from guilibra_jax.envs.export import load_records
    from guilibra_jax.eval import agents as AG
    from guilibra_jax.eval.model_agent import make_checkpoint_agent

    export = os.path.join(workdir, "export")
    agent = make_checkpoint_agent(hf_path=export, max_new_tokens=24)   # run settings from the export
    data_dir = os.path.join(workdir, "synthetic_data")
    record = load_records(os.path.join(data_dir, "test.jsonl"))[0]
    obs = AG.observation_from_record(record, data_dir)
    batch = next(iter(agent.prompt_batches([obs], rows=1)))
    d = agent.config.data
    resized = A.resized_size_for(record.image_size, "qwen2_5_vl", min_pixels=d.min_pixels, max_pixels=d.max_pixels)
    system, user = S.prompt_turns(record, S.SampleSpec(d.method, "qwen2_5_vl", system_prompt=d.system_prompt), resized)
    before, after = user.split(P.IMAGE_PLACEHOLDER, 1)
    assert before == ""
    messages = [{"role": "system", "content": system},
                {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": after}]}]
    return export, agent, batch, messages, obs.screenshot


# one program for the tests below (same shapes): a new jitted function per call compiled it again each time
_prefill = nnx.jit(lambda m, *a, cache_size: m.prefill(*a, cache_size=cache_size), static_argnames="cache_size")


def _our_last_logits(agent, batch):
    from guilibra_jax.models.vision import device_vision_inputs
    model = nnx.merge(agent.graphdef, agent.params)
    seg = (np.asarray(batch["prompt_mask"]) != 0).astype(np.int32)
    logits, _ = _prefill(model, np.asarray(batch["prompt_ids"], np.int32), np.asarray(batch["positions"], np.int32),
                         seg, batch["pixel_values"], device_vision_inputs(batch["vision"]), cache_size=seg.shape[1])
    return np.asarray(logits)[0], np.asarray(batch["prompt_ids"])[0][seg[0] == 1]


def _hf_last_logits(export, ids, pixel_values, grid):
    import torch
    import transformers
    hf = transformers.AutoModelForImageTextToText.from_pretrained(export, dtype=torch.float32).eval()
    ids_t = torch.tensor(np.asarray(ids)[None], dtype=torch.long)
    with torch.no_grad():
        out = hf(input_ids=ids_t, attention_mask=torch.ones_like(ids_t),
                 mm_token_type_ids=(ids_t == hf.config.image_token_id).long(),
                 pixel_values=torch.tensor(np.asarray(pixel_values)), image_grid_thw=torch.tensor(np.asarray(grid)))
    return hf, out.logits[0, -1].numpy()


def test_export_image_processor_and_chat_template_give_our_prompt_and_logits(uninterrupted):
    """Without torchvision (module doc of train/export.py): the export's image processor
    and chat template (transformers' loaders) turn an image + chat into our pipeline's
    prompt ids and pixels exactly, and the model's logits agree."""
    from transformers import AutoImageProcessor, AutoTokenizer

    export, agent, batch, messages, image = _export_prompt(uninterrupted)
    ip = AutoImageProcessor.from_pretrained(export)
    tok = AutoTokenizer.from_pretrained(export)
    vis = ip(images=[image], return_tensors="np")
    ids = list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))
    k = ids.index(tok.convert_tokens_to_ids("<|image_pad|>"))
    n_pad = int(np.prod(vis["image_grid_thw"][0])) // ip.merge_size ** 2
    ids = ids[:k] + ids[k:k + 1] * n_pad + ids[k + 1:]     # what the processor does with the grid
    ours, our_ids = _our_last_logits(agent, batch)
    assert our_ids.tolist() == ids
    np.testing.assert_array_equal(vis["pixel_values"], np.asarray(batch["pixel_values"])[:len(vis["pixel_values"])])
    _, ref = _hf_last_logits(export, ids, vis["pixel_values"], vis["image_grid_thw"])
    assert np.abs(ours - ref).max() <= 1e-4 * max(np.abs(ref).max(), 1.0)


def test_autoprocessor_on_the_export_gives_our_prompt_and_logits(uninterrupted):
    """AutoProcessor (what vLLM and users load) on the export. Needs torchvision, which
    transformers' Qwen video processor imports; not in the test extra (5.3 GB of CUDA
    torch beside torch 2.13 CPU, no torchvision build imports beside the CPU torch): the test above covers the same files."""
    try:
        import torchvision  # noqa: F401
    except Exception as e:  # ImportError, or a CUDA build's RuntimeError beside CPU torch
        pytest.skip(f"AutoProcessor for Qwen-VL needs torchvision (its video processor); not importable: {e!r}")
    from transformers import AutoImageProcessor, AutoProcessor

    export, agent, batch, messages, image = _export_prompt(uninterrupted)
    ours, our_ids = _our_last_logits(agent, batch)
    proc = AutoProcessor.from_pretrained(export)
    text = proc.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    default = proc(text=[text], images=[image], return_tensors="np")
    assert default["input_ids"][0].tolist() == our_ids.tolist()     # the same frame: grid and image tokens
    # torchvision's antialiased bicubic differs from PIL's at sharp edges (data/images.py): same grid,
    # nearly the same pixels (seen: 54 of 70,560 values off by more than 0.1, at most 0.23)
    diff = np.abs(default["pixel_values"] - np.asarray(batch["pixel_values"])[:len(default["pixel_values"])])
    assert diff.mean() < 0.01 and np.mean(diff > 0.1) < 0.01
    proc.image_processor = AutoImageProcessor.from_pretrained(export, backend="pil")   # our pipeline's resize
    inputs = proc(text=[text], images=[image], return_tensors="np")
    assert inputs["input_ids"][0].tolist() == our_ids.tolist()
    np.testing.assert_array_equal(inputs["pixel_values"], np.asarray(batch["pixel_values"])[:len(inputs["pixel_values"])])
    _, ref = _hf_last_logits(export, inputs["input_ids"][0], inputs["pixel_values"], inputs["image_grid_thw"])
    assert np.abs(ours - ref).max() <= 1e-4 * max(np.abs(ref).max(), 1.0)


def test_transformers_generate_on_the_export_reproduces_our_greedy_response(uninterrupted):
    """``generate`` with the export's generation_config (greedy, Qwen's stop ids) gives
    our sampler's greedy tokens, token for token."""
    import torch
    from transformers import AutoImageProcessor, AutoTokenizer

    export, agent, batch, messages, image = _export_prompt(uninterrupted)
    ip, tok = AutoImageProcessor.from_pretrained(export), AutoTokenizer.from_pretrained(export)
    vis = ip(images=[image], return_tensors="np")
    import jax

    from guilibra_jax import generate as G
    from guilibra_jax.models.vision import device_vision_inputs
    _, our_ids = _our_last_logits(agent, batch)
    assert agent.sampling.temperature == 0.0
    out = G.generate(agent.graphdef, agent.params, batch["prompt_ids"], batch["prompt_mask"], batch["positions"],
                     batch["rope_deltas"], batch["pixel_values"], device_vision_inputs(batch["vision"]),
                     jax.random.key(0), agent.sampling)
    ours = np.asarray(out.tokens)[0, :int(out.lengths[0])].tolist()
    hf, _ = _hf_last_logits(export, our_ids, vis["pixel_values"], vis["image_grid_thw"])
    ids_t = torch.tensor(our_ids[None], dtype=torch.long)
    with torch.no_grad():
        gen = hf.generate(input_ids=ids_t, attention_mask=torch.ones_like(ids_t),
                          mm_token_type_ids=(ids_t == hf.config.image_token_id).long(),
                          pixel_values=torch.tensor(vis["pixel_values"]),
                          image_grid_thw=torch.tensor(vis["image_grid_thw"]), max_new_tokens=24)
    theirs = gen[0, len(our_ids):].tolist()
    stop = set(hf.generation_config.eos_token_id)
    theirs = theirs[:next((i + 1 for i, t in enumerate(theirs) if t in stop), len(theirs))]
    assert theirs == ours, (agent.decode(theirs), agent.decode(ours))


def test_convert_step_exports_that_checkpoint_and_a_missing_step_is_one_line(uninterrupted, tmp_path):
    from safetensors.numpy import load_file
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    steps = sorted(int(d) for d in os.listdir(os.path.join(uninterrupted, "checkpoints")) if d.isdigit())
    assert steps[-1] == 6 and len(steps) >= 2
    cmd = [sys.executable, "-m", "launch.convert", f"--workdir={uninterrupted}"]
    res = subprocess.run(cmd + [f"--step={steps[0]}", f"--out={tmp_path / 'early'}"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    early = load_file(os.path.join(tmp_path, "early", "model.safetensors"))
    final = load_file(os.path.join(uninterrupted, "export", "model.safetensors"))
    assert any(not np.array_equal(early[k], final[k]) for k in final)
    assert os.path.exists(os.path.join(tmp_path, "early", "preprocessor_config.json"))
    bad = subprocess.run(cmd + ["--step=5", f"--out={tmp_path / 'step5'}"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "--step=5" in bad.stderr and str(steps) in bad.stderr
