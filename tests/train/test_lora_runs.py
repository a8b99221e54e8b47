"""LoRA through the real runs (``model.lora.rank > 0``, ``launch.train``'s harness), ASFT and GRPO:

- checkpoints hold only the adapters and their optimizer state, never the base;
- the base stays frozen: the merged export equals base + alpha/r * A @ B of the exported
  PEFT adapter, exactly, and every kernel LoRA does not adapt equals the base;
- PEFT (``peft.PeftModel.from_pretrained``) puts the exported adapter on the transformers
  base model and its logits equal transformers' on the merged export;
- a run resumed from its step-2 checkpoint ends bitwise equal to the uninterrupted run;
- GRPO with LoRA: the same checkpoint and export layout, the reference is the base (the
  first update's KL is 0), and the merged export is the base plus the exported adapter;
- configuration errors name the key.
"""
import os
import shutil

import jax
import numpy as np
import pytest
from flax import nnx

from guilibra_jax.errors import ConfigError
from tests.chance_reward import chance_reward

RANK, ALPHA = 4, 8.0


def _config(recipe="demo"):
    import importlib
    c = importlib.import_module(f"configs.{recipe}").get_config("smoke")
    c.model.lora.rank = RANK
    c.model.lora.alpha = ALPHA
    c.optim.lr = 1e-2                 # adapters start with B = 0: move them visibly in 4 steps
    c.optim.warmup_steps = 0
    c.train.tensorboard = False
    c.train.curves = False
    return c


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from guilibra_jax.train.run import train
    workdir = str(tmp_path_factory.mktemp("lora") / "run")
    train(_config(), workdir)
    return workdir


def _params(folder):
    from guilibra_jax.models import load_hf
    model, config = load_hf(folder)
    return nnx.to_pure_dict(nnx.state(model, nnx.Param)), config


def _flat(tree):
    from guilibra_jax.param_paths import param_paths
    return dict(zip(jax.tree.leaves(param_paths(tree)), jax.tree.leaves(tree)))


def _base(workdir, tmp_path):
    """The run's random-init base, rebuilt from its config and exported as an HF folder."""
    from guilibra_jax.train import data_source, model_factory
    c = _config()
    tok = data_source.prepare_tokenizer(c, str(tmp_path / "tok"))
    model, mc = model_factory.build_model(c, tok)
    graphdef, state = nnx.split(model, nnx.Param)
    params = nnx.to_pure_dict(state)
    folder = str(tmp_path / "base")
    model_factory.export(graphdef, jax.device_get(params), mc, tok, folder)
    return params, folder


@pytest.fixture(scope="module")
def grpo_dir(tmp_path_factory):
    from guilibra_jax import rewards
    from guilibra_jax.train.run import train
    workdir = str(tmp_path_factory.mktemp("lora_grpo") / "run")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rewards, "guilibra_reward", chance_reward)
        train(_config("grpo_demo"), workdir)
    return workdir


@pytest.fixture(params=["sft", "grpo"])
def any_run(request, run_dir, grpo_dir):
    return {"sft": run_dir, "grpo": grpo_dir}[request.param]


def test_checkpoints_hold_only_the_adapters(any_run):
    from guilibra_jax.train.checkpoint import Checkpointer
    run_dir = any_run
    ckpt = Checkpointer(os.path.join(run_dir, "checkpoints"))
    step = max(int(d) for d in os.listdir(os.path.join(run_dir, "checkpoints")) if d.isdigit())
    tree = ckpt._manager.item_metadata(step)["state"]
    paths = set(_flat(dict(tree["params"])))
    ckpt.close()
    assert paths and all(p.endswith(("/lora_a", "/lora_b")) for p in paths), sorted(paths)[:4]
    assert any("self_attn/q_proj/kernel" in p for p in paths) and any("mlp/down_proj/kernel" in p for p in paths)
    assert not any("embed_tokens" in p or "visual" in p for p in paths)


def test_merged_export_is_the_frozen_base_plus_the_exported_adapter(any_run, tmp_path):
    from guilibra_jax import lora as L
    from guilibra_jax.lora_export import load_peft_adapter
    run_dir = any_run
    exported, mc = _params(os.path.join(run_dir, "export"))
    base, _ = _base(run_dir, tmp_path)
    adapters, spec = load_peft_adapter(os.path.join(run_dir, "adapter"), base, mc)
    assert (spec.rank, spec.scale) == (RANK, ALPHA / RANK)
    assert any(np.abs(np.asarray(a["lora_b"])).max() > 0 for a in adapters.values())   # the adapters trained
    merged, got, base_f = _flat(L.merge(base, adapters, spec)), _flat(exported), _flat(base)
    assert set(merged) == set(got)
    for path, want in merged.items():
        np.testing.assert_allclose(np.asarray(got[path]), np.asarray(want), rtol=0, atol=1e-6, err_msg=path)
        if path not in adapters:      # not adapted: the base, bit for bit
            np.testing.assert_array_equal(np.asarray(got[path]), np.asarray(base_f[path]), err_msg=path)
    changed = [p for p in adapters if np.abs(np.asarray(got[p]) - np.asarray(base_f[p])).max() > 1e-5]
    assert changed, "no adapted kernel moved"


def test_convert_of_the_last_checkpoint_is_the_export(run_dir, tmp_path):
    """launch.convert reads the adapters and merges them into the run's base (read again)
    exactly as the run's own export did (a GRPO run's: tests/train/test_param_ema.py)."""
    from safetensors.numpy import load_file
    from guilibra_jax.train.model_factory import export_checkpoint as convert
    want = load_file(os.path.join(run_dir, "export", "model.safetensors"))
    got = load_file(os.path.join(convert(run_dir, str(tmp_path / "converted")), "model.safetensors"))
    assert set(got) == set(want)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_the_checkpoint_agent_on_the_workdir_holds_the_export(run_dir):
    import guilibra_jax.eval.model_agent  # noqa: F401  (registers "checkpoint")
    from guilibra_jax.eval.agents import make_agent
    exported, _ = _params(os.path.join(run_dir, "export"))
    got, want = _flat(make_agent("checkpoint", workdir=run_dir).params), _flat(exported)
    assert set(got) == set(want)
    for k in want:
        np.testing.assert_allclose(np.asarray(got[k]), np.asarray(want[k]), rtol=0, atol=1e-6, err_msg=k)


def test_scoring_a_lora_workdir_names_its_export(run_dir):
    from guilibra_jax.train import model_factory as MF
    with pytest.raises(ConfigError, match="LoRA run: its checkpoints hold adapters only"):
        MF.load_frozen(run_dir)


def test_peft_puts_the_adapter_on_the_transformers_base_with_the_merged_logits(run_dir, tmp_path):
    peft = pytest.importorskip("peft")
    import torch
    import transformers
    from guilibra_jax import models as M
    from guilibra_jax.train import fake_batch as F
    _, base_folder = _base(run_dir, tmp_path)
    load = lambda p: transformers.AutoModelForImageTextToText.from_pretrained(p, dtype=torch.float32).eval()
    with_adapter = peft.PeftModel.from_pretrained(load(base_folder), os.path.join(run_dir, "adapter")).eval()
    merged, plain = load(os.path.join(run_dir, "export")), load(base_folder)
    _, config = M.load_hf(base_folder)
    batch = F.fake_sft_batch(config, batch=1, seq_len=40, image_hw=(56, 84), seed=0)
    ids = torch.tensor(batch["input_ids"], dtype=torch.long)
    kw = dict(input_ids=ids, attention_mask=torch.ones_like(ids), mm_token_type_ids=(ids == config.image_token_id).long(),
              pixel_values=torch.tensor(batch["pixel_values"]), image_grid_thw=torch.tensor([[1, 4, 6]]))
    with torch.no_grad():
        a, m, b = (x(**kw).logits.numpy() for x in (with_adapter, merged, plain))
    scale = np.abs(m).max()
    assert np.abs(a - m).max() <= 1e-5 * scale
    assert np.abs(b - m).max() > 1e-3 * scale       # the adapter changes the model


def test_a_run_resumed_from_its_step_2_checkpoint_ends_bitwise_equal(run_dir, tmp_path):
    from safetensors.numpy import load_file
    from guilibra_jax.train.run import train
    resumed = str(tmp_path / "resumed")
    shutil.copytree(run_dir, resumed)
    for gone in ("checkpoints/4", "export", "adapter"):
        shutil.rmtree(os.path.join(resumed, gone))
    train(_config(), resumed)
    for folder, name in (("export", "model.safetensors"), ("adapter", "adapter_model.safetensors")):
        want, got = load_file(os.path.join(run_dir, folder, name)), load_file(os.path.join(resumed, folder, name))
        assert set(want) == set(got)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=f"{folder}/{k}")


@pytest.mark.parametrize("key,value,shown", [
    ("model.lora.targets", ("^no/such/path$",), "model.lora.targets"),
    ("model.lora.rank", 100000, "model.lora.rank"),
    ("model.lora.dropout", 0.1, "model.lora.dropout"),
    ("optim.freeze", ("embed",), "optim.freeze"),
    ("model.quantize", "fp8", "model.quantize"),
])
@pytest.mark.parametrize("validated", [True, False], ids=["launch", "train"])
def test_bad_lora_settings_are_one_line_errors_naming_the_key(tmp_path, key, value, shown, validated):
    """launch.train's validation, and a direct train() call (checked where the model is built)."""
    from guilibra_jax.train import config as run_config
    from guilibra_jax.train.run import train
    c = _config()
    *groups, name = key.split(".")
    node = c
    for g in groups:
        node = node[g]
    node[name] = value
    with pytest.raises(ConfigError, match=shown.replace(".", r"\.")) as e:
        if validated:
            run_config.validate(c)
        train(c, str(tmp_path / "bad"))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("validated", [True, False], ids=["launch", "train"])
def test_quantize_without_lora_is_a_one_line_error(tmp_path, validated):
    from guilibra_jax.train import config as run_config
    from guilibra_jax.train.run import train
    c = _config()
    c.model.lora.rank = 0
    c.model.quantize = "nf4"
    with pytest.raises(ConfigError, match=r"model\.quantize.*model\.lora\.rank") as e:
        if validated:
            run_config.validate(c)
        train(c, str(tmp_path / "bad"))
    assert "\n" not in str(e.value)


def test_grpo_with_lora_scores_its_reference_on_the_base_itself(tmp_path):
    """The default reference is the frozen base, not a second copy of the weights; with
    rl.reference set, a separate model (selectable)."""
    from guilibra_jax.train import data_source
    from guilibra_jax.train import multihost as MH
    from guilibra_jax.train.rl.setup import setup
    c = _config("grpo_demo")
    tok = data_source.prepare_tokenizer(c, str(tmp_path))
    s, state, _ = setup(c, MH.run_mesh(c), tok)
    assert s.frozen["reference"].params is s.lora.base
    for _ in range(3):      # sampling and scoring merge once per step: one compiled merge, not one per step
        s.policy(state["params"])
    assert s.lora._merge._cache_size() == 1
    assert all(p.endswith(("/lora_a", "/lora_b")) for p in _flat(state["params"]))


def test_qlora_trains_adapters_on_the_quantized_base_and_exports_their_merge(tmp_path, kind="nf4"):
    """model.quantize (nf4 here; int8 takes the same path, its codes are tests/test_quantize.py's):
    checkpoints still hold only adapters; the merged export is the dequantized base plus the
    exported adapter (what the run trained on), which differs from the plain base by at most
    the quantization error; the training loss falls."""
    import json
    from guilibra_jax import lora as L
    from guilibra_jax import quantize as Q
    from guilibra_jax.lora_export import load_peft_adapter
    from guilibra_jax.train.run import train
    c = _config()
    c.model.quantize = kind
    workdir = str(tmp_path / "run")
    train(c, workdir)
    test_checkpoints_hold_only_the_adapters(workdir)
    exported, mc = _params(os.path.join(workdir, "export"))
    base, _ = _base(workdir, tmp_path)
    adapters, spec = load_peft_adapter(os.path.join(workdir, "adapter"), base, mc)
    quantized = L.quantize_base(base, L.adapted_paths(base, spec), kind)
    merged, got, base_f = _flat(L.merge(quantized, adapters, spec)), _flat(exported), _flat(base)
    for path, want in merged.items():
        np.testing.assert_allclose(np.asarray(got[path]), np.asarray(want), rtol=0, atol=1e-6, err_msg=path)
    plain = _flat(L.dequantize_base(quantized))
    for path in adapters:     # the quantized kernels moved from the base by the quantization error only
        w = np.asarray(base_f[path])
        assert 0 < np.abs(np.asarray(plain[path]) - w).max() <= Q.MAX_ERROR[kind] * np.abs(w).max() + 1e-6
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl")) if '"loss"' in line]
    assert rows[-1]["loss"] < rows[0]["loss"]
    test_convert_of_the_last_checkpoint_is_the_export(workdir, tmp_path)   # the quantized base, merged again


def test_grpo_with_qlora_scores_its_reference_on_the_dequantized_base(tmp_path):
    """GRPO's default reference under QLoRA is the quantized base, dequantized at each scoring
    (no second resident copy): with fresh adapters the policy is that same model, so the
    first update's KL is 0."""
    import json
    from guilibra_jax import quantize as Q
    from guilibra_jax.train.run import train
    c = _config("grpo_demo")
    c.model.quantize = "nf4"
    c.train.steps = 1
    c.rl.minibatches = 1              # one update per step: its KL is measured before any change
    workdir = str(tmp_path / "run")
    train(c, workdir)
    first = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl")) if '"kl"' in line][0]
    assert first["kl"] == pytest.approx(0.0, abs=1e-6) and np.isfinite(first["loss"])
    from guilibra_jax.train import data_source
    from guilibra_jax.train import multihost as MH
    from guilibra_jax.train.rl.setup import setup
    s, state, _ = setup(c, MH.run_mesh(c), data_source.prepare_tokenizer(c, str(tmp_path / "tok")))
    ref = s.frozen["reference"]
    assert ref.params is s.lora.base and any(Q.is_quantized(x) for x in jax.tree.leaves(ref.params, is_leaf=Q.is_quantized))
    plain = ref.plain_params()
    merged = s.policy(state["params"])
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), plain, merged)


def test_resuming_on_another_base_is_a_one_line_error_naming_the_key(run_dir, tmp_path):
    """The checkpoints hold only adapters: a resumed run whose base differs from the recorded
    one refuses to start, even where the config check lets the change through
    (train.allow_config_change; or the same model.hf_path whose files were replaced). Here
    another random init stands for another base."""
    from guilibra_jax.train.lora_state import BASE_RECORD
    from guilibra_jax.train.run import train
    assert os.path.exists(os.path.join(run_dir, BASE_RECORD))
    resumed = str(tmp_path / "resumed")
    shutil.copytree(run_dir, resumed)
    shutil.rmtree(os.path.join(resumed, "export"))
    c = _config()
    c.model.seed = 7                   # another base
    c.train.allow_config_change = True
    with pytest.raises(ConfigError, match=r"model\.hf_path.*differs from the one the adapters") as e:
        train(c, resumed)
    assert "\n" not in str(e.value)
    c = _config()
    c.model.quantize = "int8"          # the same base, quantized: not what the adapters saw either
    c.train.allow_config_change = True
    with pytest.raises(ConfigError, match=r"model\.quantize"):
        train(c, resumed)
