"""Outputs appear whole or not at all (guilibra_jax/atomic.py): a process killed with -9
while it writes an export, a merge or converted data (native JSONL, GUI-Libra SFT JSON
with its images, GUI-Libra RL parquet) leaves the older complete output untouched, or
none, and every reader refuses the half-written folder with one line naming it; an
ordinary transformers folder (no marker) still loads.

One child process (atomic_worker.py) writes each output completely, then writes each
again over it and into a fresh folder, each write blocked after its first file; the
test waits until all ten are blocked and kills it with -9, so the kill lands mid-write
every time, whatever the machine's speed."""
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from guilibra_jax import atomic
from guilibra_jax.errors import UserError

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [os.path.join(ROOT, "tests", "models"), os.path.join(ROOT, "tests", "data"), HERE]

import atomic_worker  # noqa: E402

WRITERS = sorted(atomic_worker.OUTPUT)


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """(root, child pid, digests of the complete outputs, the spec) after the kill."""
    from data_fixtures import make_native_dataset
    from hf_fixtures import build_hf

    from guilibra_jax.data.demo_tokenizer import build_demo_tokenizer
    from launch import convert_data

    root = str(tmp_path_factory.mktemp("atomic"))
    spec = {"root": root, "a": os.path.join(root, "in", "a"), "b": os.path.join(root, "in", "b"),
            "tokenizer": os.path.join(root, "in", "tok")}
    build_hf("qwen2_5_vl", seed=1).save_pretrained(spec["a"])
    build_hf("qwen2_5_vl", seed=2).save_pretrained(spec["b"])
    build_demo_tokenizer(["click the button at 12 34", "type hello world"] * 20, 300, spec["tokenizer"])
    spec["jsonl"] = make_native_dataset(os.path.join(root, "in", "data"), 6)
    spec["parquet"] = os.path.join(root, "in", "data.parquet")
    convert_data.convert([spec["jsonl"]], "native", spec["parquet"], "guilibra_rl")
    for name in WRITERS:
        for target in ("old", "fresh"):
            os.makedirs(os.path.join(root, name, target))
    with open(os.path.join(root, "spec.json"), "w") as f:
        json.dump(spec, f)
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    log = open(os.path.join(root, "worker.log"), "w+")
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "atomic_worker.py"), os.path.join(root, "spec.json")],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=log, text=True)
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    seen, digests = [], None
    try:
        while sum(line.startswith("BLOCKED") for line in seen) < 2 * len(WRITERS):
            try:
                line = lines.get(timeout=600)
            except queue.Empty:   # a write that neither blocked nor finished: its stack in the log
                proc.send_signal(signal.SIGUSR1)
                time.sleep(2)
                line = ""
            if not line or line.startswith("FINISHED"):
                log.seek(0)
                raise AssertionError(f"the writers did not all block: {seen + [line]}\n{log.read()[-8000:]}")
            seen.append(line)
            if line.startswith("COMPLETE "):
                digests = json.loads(line[len("COMPLETE "):])
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        log.close()
    return root, proc.pid, digests, spec


@pytest.mark.parametrize("writer", WRITERS)
def test_kill_9_mid_write_leaves_the_old_complete_output_or_none(killed, writer):
    root, pid, digests, _ = killed
    old, fresh = os.path.join(root, writer, "old"), os.path.join(root, writer, "fresh")
    assert digests[writer] and atomic_worker.digest(old) == digests[writer]   # untouched, every byte
    # the kill landed inside both writes: their temporary outputs are there, and nothing else
    assert any(f".tmp-{pid}" in n for n in os.listdir(old)), os.listdir(old)
    assert os.listdir(fresh) and all(f".tmp-{pid}" in n for n in os.listdir(fresh)), os.listdir(fresh)


def _leftover(folder, pid):
    return next(os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(f".tmp-{pid}"))


@pytest.mark.parametrize("writer", ["export", "merge"])
def test_every_model_reader_refuses_a_half_written_folder_naming_it(killed, writer):
    from guilibra_jax.eval.model_agent import make_checkpoint_agent
    from guilibra_jax.train import config as RC
    from guilibra_jax.train import hub
    from guilibra_jax.train import merge as MG
    from guilibra_jax.train import model_factory as MF

    root, pid, _, spec = killed
    fresh = os.path.join(root, writer, "fresh", "model")
    tmp = _leftover(os.path.dirname(fresh), pid)
    assert os.path.exists(os.path.join(tmp, "config.json")) and os.path.exists(os.path.join(tmp, "model.safetensors"))
    cases = {
        "load_frozen": lambda p: MF.load_frozen(p, dtype="float32", param_dtype="float32"),
        "model.hf_path": lambda p: MF.model_config_of(_with_hf_path(RC.base_config(), p), None),
        "launch.train paths": lambda p: hub.resolve_model_path(p, "model.hf_path"),
        "launch.merge": lambda p: MG.merge_folders("average", [p, spec["a"]], os.path.join(root, "never")),
        "launch.eval": lambda p: make_checkpoint_agent(hf_path=p),
    }
    for name, read in cases.items():
        for path, words in ((tmp, "is an incomplete output"), (fresh, f"does not exist; {tmp} next to it is an "
                                                                      f"incomplete one")):
            with pytest.raises(UserError) as e:
                read(path)
            msg = str(e.value)
            assert words in msg and path in msg and "\n" not in msg, (name, msg)
    assert not os.path.exists(os.path.join(root, "never"))
    old = os.path.join(root, writer, "old", "model")   # the complete one next to the leftover: fine
    atomic.check_complete(old)
    assert MF.model_config_of(_with_hf_path(RC.base_config(), old), None).text.vocab_size == 300


def _with_hf_path(config, path):
    config.model.hf_path = path
    return config


def test_launch_convert_and_merge_refuse_it_on_one_line(killed, tmp_path):
    from guilibra_jax.train import config as RC
    from guilibra_jax.train import run_history

    root, pid, _, spec = killed
    tmp = _leftover(os.path.join(root, "export", "fresh"), pid)
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    merge = subprocess.run([sys.executable, "-m", "launch.merge", "--method=average", f"--inputs={spec['a']},{tmp}",
                            f"--out={tmp_path / 'merged'}"], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=300)
    workdir = str(tmp_path / "run")   # a run that started from the half-written folder
    config = RC.base_config()
    config.model.hf_path = tmp
    os.makedirs(os.path.join(workdir, "checkpoints", "1"))
    run_history.record_config(config, workdir)
    convert = subprocess.run([sys.executable, "-m", "launch.convert", f"--workdir={workdir}"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=300)
    for out in (merge, convert):
        errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
        assert out.returncode == 2 and len(errors) == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
        assert tmp in errors[0] and "incomplete output" in errors[0], errors
    assert not os.path.exists(tmp_path / "merged")


def test_converted_data_leftovers_are_never_read(killed):
    from guilibra_jax.data import readers as R
    root, pid, _, _ = killed
    for writer, ext in (("native", ".jsonl"), ("guilibra_sft", ".json"), ("guilibra_rl", ".parquet")):
        old = os.path.join(root, writer, "old")
        assert R.expand_paths([old], (ext,)) == [os.path.join(old, atomic_worker.OUTPUT[writer])]
        with pytest.raises(Exception, match="no .* files"):   # only the temporary file is there
            R.expand_paths([os.path.join(root, writer, "fresh")], (ext,))
    sft = os.path.join(root, "guilibra_sft", "old", "out.json")
    src = R.open_source([sft], "guilibra_sft")
    assert len(src) == 6 and all(os.path.exists(os.path.join(os.path.dirname(sft), json.load(open(sft))[i]["image"]))
                                 for i in range(6))


def test_the_next_write_replaces_the_leftover_and_a_transformers_folder_needs_no_marker(killed, tmp_path):
    from guilibra_jax.train import model_factory as MF
    root, pid, _, spec = killed
    atomic.check_complete(spec["a"])   # save_pretrained: no marker, no sentinel: loads as ever
    graphdef, params, model_config = MF.load_frozen(spec["a"], dtype="float32", param_dtype="float32")
    folder = str(tmp_path / "w")
    shutil.copytree(os.path.join(root, "export", "fresh"), folder)   # the killed writer's leftover
    out = os.path.join(folder, "model")
    MF.export(graphdef, params, model_config, None, out)
    assert os.listdir(folder) == ["model"]   # the dead writer's temporary folder was removed
    assert os.path.exists(os.path.join(out, atomic.COMPLETE)) and not os.path.exists(os.path.join(out,
                                                                                                   atomic.INCOMPLETE))
    atomic.check_complete(out)
    MF.load_frozen(out, dtype="float32", param_dtype="float32")


def test_a_partial_copy_of_a_complete_folder_is_refused(killed, tmp_path):
    root, _, _, _ = killed
    copy = str(tmp_path / "copy")
    shutil.copytree(os.path.join(root, "merge", "old", "model"), copy)
    with open(os.path.join(copy, "model.safetensors"), "r+b") as f:
        f.truncate(100)
    with pytest.raises(UserError, match=r"copy is incomplete: model.safetensors has 100 bytes, not \d+"):
        atomic.check_complete(copy, "")
    os.remove(os.path.join(copy, "model.safetensors"))
    with pytest.raises(UserError, match="model.safetensors is missing"):
        atomic.check_complete(copy)


def test_an_output_path_that_is_not_a_model_folder_is_never_replaced(killed, tmp_path):
    from guilibra_jax.train import model_factory as MF
    _, _, _, spec = killed
    workdir = tmp_path / "run"
    (workdir / "checkpoints").mkdir(parents=True)
    (workdir / "config.json").write_text("{}")
    graphdef, params, model_config = MF.load_frozen(spec["a"], dtype="float32", param_dtype="float32")
    with pytest.raises(UserError, match="is not a model folder .*checkpoints/.*refusing to replace it"):
        MF.export(graphdef, params, model_config, None, str(workdir))
    assert sorted(os.listdir(workdir)) == ["checkpoints", "config.json"]
