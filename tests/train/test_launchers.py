"""Launchers that explain themselves: --help lists the recipes (and what it lists is what
get_config accepts), --config.print_only / --dry_run print the validated config and
exit, user errors are one line with exit status 2, and model.hf_path takes Hub ids."""
import importlib
import json
import os
import subprocess
import sys

import pytest

from guilibra_jax.errors import UserError
from launch import recipes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(module, *args, env=None):
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu", "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def test_every_listed_recipe_argument_is_accepted_by_its_get_config():
    listed = recipes.list_recipes()
    assert {r.path for r in listed} == {f"configs/{f}" for f in os.listdir(os.path.join(ROOT, "configs"))
                                        if f.endswith(".py") and not f.startswith("_")}
    for r in listed:
        module = importlib.import_module(r.path[:-3].replace("/", "."))
        for arg in r.args or (None,):
            assert module.get_config(arg) is not None, (r.path, arg)
        assert r.summary and "\n" not in r.summary and len(r.summary) <= 120
    kinds = {r.path: r.kind for r in listed}
    assert kinds["configs/eval_demo.py"] == "eval" and kinds["configs/guilibra_sft.py"] == "train"


def test_train_help_lists_the_recipes_with_arguments_and_one_line():
    out = _run("launch.train", "--help")           # absl exits with status 1 after --help
    assert out.returncode in (0, 1) and "Traceback" not in out.stderr, out.stderr[-2000:]
    text = out.stdout + out.stderr
    for r in recipes.list_recipes(kind="train"):
        assert r.path in text and r.summary in text
    assert "qwen2_5_vl_3b|qwen2_5_vl_7b|qwen3_vl_4b|qwen3_vl_8b" in text
    assert "configs/eval_demo.py" not in text and "--config.print_only=True" in text and "--dry_run" in text


def test_print_only_prints_the_validated_config_and_exits(tmp_path):
    workdir = tmp_path / "never"
    out = _run("launch.train", "--config=configs/demo.py:smoke", f"--workdir={workdir}",
               "--config.print_only=True", "--config.train.steps=7")
    assert out.returncode == 0, out.stderr[-2000:]
    config, end = json.JSONDecoder().raw_decode(out.stdout)
    assert config["train"]["steps"] == 7 and config["data"]["synthetic"]["enabled"] is True
    plan = out.stdout[end:]          # then the memory plan on this machine's devices
    assert "asft_step" in plan and "peak (asft_step)" in plan and "fits:" in plan, plan
    assert not workdir.exists()
    out = _run("launch.train", "--config=configs/demo.py:smoke", "--dry_run", "--config.loss.normalize=batch")
    assert out.returncode == 2 and "loss.normalize" in out.stderr and "Traceback" not in out.stderr


def test_hub_ids_are_told_from_paths(tmp_path):
    from guilibra_jax.train.hub import is_hub_id
    assert is_hub_id("Qwen/Qwen2.5-VL-3B-Instruct") and is_hub_id("org-1/model_x.v2")
    (tmp_path / "runs" / "demo").mkdir(parents=True)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert not is_hub_id("runs/demo")           # an existing relative folder is a path
    finally:
        os.chdir(cwd)
    for path in ("/models/qwen", "./runs/x", "~/models/x", "runs/demo/export", "model", "", "a/b.json"):
        assert not is_hub_id(path), path


def test_offline_hub_id_is_a_user_error_naming_hf_hub_offline(tmp_path, monkeypatch):
    from guilibra_jax.train.hub import resolve_model_path
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError, match=r"model.hf_path = 'someorg/not-cached-model'.*HF_HUB_OFFLINE=1"):
        resolve_model_path("someorg/not-cached-model", "model.hf_path", cache_dir=str(tmp_path))
    out = _run("launch.train", "--config=configs/demo.py:smoke", "--dry_run",
               "--config.model.hf_path=someorg/not-cached-model")
    assert out.returncode == 2 and "HF_HUB_OFFLINE" in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_a_cached_hub_snapshot_resolves_offline(tmp_path, monkeypatch):
    """The Hub cache layout (refs/main -> snapshots/<commit>): offline, a cached id
    resolves to its snapshot folder."""
    from guilibra_jax.train.hub import resolve_model_path
    repo = tmp_path / "models--someorg--cached-model"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0123456789abcdef0123456789abcdef01234567")
    snap = repo / "snapshots" / "0123456789abcdef0123456789abcdef01234567"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_model_path("someorg/cached-model", "model.hf_path", cache_dir=str(tmp_path)) == str(snap)
    assert resolve_model_path(str(snap), "model.hf_path") == str(snap)       # a folder passes unchanged


def test_convert_data_and_eval_user_errors_are_one_line(tmp_path):
    out = _run("launch.convert_data", f"--input={tmp_path}/missing.jsonl", "--format=native",
               f"--output={tmp_path}/out.jsonl")
    assert out.returncode == 2 and out.stderr.startswith("error: --input=") and "Traceback" not in out.stderr
    out = _run("launch.eval", "--config=configs/eval_demo.py:smoke", f"--workdir={tmp_path}/eval",
               "--config.agents=('endpoint',)")
    assert out.returncode == 2 and "agent_kwargs.endpoint.url" in out.stderr and "Traceback" not in out.stderr
    out = _run("launch.convert_data", f"--input={tmp_path}/missing.jsonl", "--format=native",
               f"--output={tmp_path}/out.jsonl", "--verbose")
    assert out.returncode != 0 and "Traceback" in out.stderr
