"""Config validation: every key of the base config has a type-and-range rule; recipes
pass; each of a table of bad configs, given on the command line, stops
``python -m launch.train`` with exit status 2 (1 for values the flag parser itself
rejects) and one line naming the full key, before anything heavy is imported and before
the workdir is touched; regex options that match no parameter name the key and pattern.
"""
import concurrent.futures
import math
import os
import subprocess
import sys
import time

import pytest

from guilibra_jax.errors import ConfigError
from guilibra_jax.train import config as C
from guilibra_jax.train import config_checks as K

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SFT = "--config=configs/demo.py:smoke"
GRPO = "--config=configs/grpo_demo.py:smoke"
MOPD = [GRPO, "--config.method=mopd", "--config.data.method=mopd"]

# (command-line arguments, the key the message must name, exit status)
BAD = [
    ([SFT, "--config.method=dpo"], "method", 2),
    ([SFT, "--config.model.dtype=float64"], "model.dtype", 2),
    ([SFT, "--config.model.param_dtype=int8"], "model.param_dtype", 2),
    ([SFT, "--config.model.remat=some"], "model.remat", 2),
    ([SFT, "--config.model.seed=-1"], "model.seed", 2),
    ([SFT, "--config.model.hf_path=/nonexistent/model"], "model.hf_path", 2),
    ([SFT, "--config.model.tiny.family=llama"], "model.tiny.family", 2),
    ([SFT, "--config.model.tiny.hidden=0"], "model.tiny.hidden", 2),
    ([SFT, "--config.model.tiny.heads=3"], "model.tiny.heads", 2),
    ([SFT, "--config.model.tiny.kv_heads=3"], "model.tiny.kv_heads", 2),
    ([SFT, "--config.model.tiny.mrope_section=(4,4)"], "model.tiny.mrope_section", 2),
    ([SFT, "--config.model.tiny.mrope_section=(4,4,4)"], "model.tiny.mrope_section", 2),
    ([SFT, "--config.tokenizer.path=/nonexistent/tokenizer"], "tokenizer.path", 2),
    ([SFT, "--config.data.format=csv"], "data.format", 2),
    ([SFT, "--config.data.method=dpo"], "data.method", 2),
    ([SFT, "--config.data.mix=half"], "data.mix", 2),
    ([SFT, "--config.data.mix=1.5"], "data.mix", 2),
    ([SFT, "--config.data.max_length=0"], "data.max_length", 2),
    ([SFT, "--config.data.seq_buckets=(128,512)"], "data.seq_buckets", 2),
    ([SFT, "--config.data.seq_buckets=(0,256)"], "data.seq_buckets", 2),
    ([SFT, "--config.data.patch_bucket=30"], "data.patch_bucket", 2),
    ([SFT, "--config.data.min_pixels=20000"], "data.min_pixels", 2),
    ([SFT, "--config.data.max_pixels=-5"], "data.max_pixels", 2),
    ([SFT, "--config.data.batch_size=0"], "data.batch_size", 2),
    ([SFT, "--config.data.workers=-1"], "data.workers", 2),
    ([SFT, "--config.data.max_bad_fraction=1.5"], "data.max_bad_fraction", 2),
    ([SFT, "--config.data.system_prompt=Agent on {platform} for {user}"], "data.system_prompt", 2),
    ([SFT, "--config.data.synthetic.enabled=False"], "data.train_files", 2),
    ([SFT, "--config.data.synthetic.enabled=False", "--config.data.train_files=('/nope/*.jsonl',)"],
     "data.train_files", 2),
    ([SFT, "--config.data.eval_files=('/nope/test.jsonl',)", "--config.data.synthetic.enabled=False",
      f"--config.data.train_files=('{ROOT}/README.md',)"], "data.eval_files", 2),
    ([SFT, "--config.data.synthetic.platforms=('tv',)"], "data.synthetic.platforms", 2),
    ([SFT, "--config.data.synthetic.tasks=0"], "data.synthetic.tasks", 2),
    ([SFT, "--config.data.synthetic.test_fraction=1.0"], "data.synthetic.test_fraction", 2),
    ([SFT, "--config.data.synthetic.tokenizer_vocab=100"], "data.synthetic.tokenizer_vocab", 2),
    ([SFT, "--config.loss.alpha_action=-1.0"], "loss.alpha_action", 2),
    ([SFT, "--config.loss.normalize=batch"], "loss.normalize", 2),
    ([SFT, "--config.optim.lr=0.0"], "optim.lr", 2),
    ([SFT, "--config.optim.warmup_steps=-1"], "optim.warmup_steps", 2),
    ([SFT, "--config.optim.schedule=step"], "optim.schedule", 2),
    ([SFT, "--config.optim.end_lr_fraction=2.0"], "optim.end_lr_fraction", 2),
    ([SFT, "--config.optim.weight_decay=-0.1"], "optim.weight_decay", 2),
    ([SFT, "--config.optim.b1=1.0"], "optim.b1", 2),
    ([SFT, "--config.optim.b2=-0.5"], "optim.b2", 2),
    ([SFT, "--config.optim.eps=0.0"], "optim.eps", 2),
    ([SFT, "--config.optim.clip_norm=-1.0"], "optim.clip_norm", 2),
    ([SFT, "--config.optim.freeze=('[unclosed',)"], "optim.freeze", 2),
    ([SFT, "--config.optim.lr_multipliers={'visual': -1.0}"], "optim.lr_multipliers", 2),
    ([SFT, "--config.train.steps=0"], "train.steps", 2),
    ([SFT, "--config.train.grad_accum=0"], "train.grad_accum", 2),
    ([SFT, "--config.train.log_every=0"], "train.log_every", 2),
    ([SFT, "--config.train.checkpoint_every=-2"], "train.checkpoint_every", 2),
    ([SFT, "--config.train.keep_checkpoints=0"], "train.keep_checkpoints", 2),
    ([SFT, "--config.train.eval_every=-1"], "train.eval_every", 2),
    ([SFT, "--config.train.eval_samples=0"], "train.eval_samples", 2),
    ([SFT, "--config.mesh.data=0"], "mesh.data", 2),
    ([SFT, "--config.mesh.fsdp=-2"], "mesh.fsdp", 2),
    ([SFT, "--config.mesh.data=-1", "--config.mesh.fsdp=-1"], "mesh", 2),
    ([SFT, "--config.mesh.tensor=2"], "mesh", 2),  # 2 x 1 x 1 on one CPU device: needs the device count
    ([SFT, "--config.data.batch_size=3", "--config.mesh.fsdp=2"], "data.batch_size", 2),
    ([SFT, "--config.distributed.coordinator_address=localhost"], "distributed.coordinator_address", 2),
    ([SFT, "--config.distributed.local_device_ids=a,b"], "distributed.local_device_ids", 2),
    ([SFT, "--config.distributed.num_processes=2", "--config.distributed.coordinator_address=h:1",
      "--config.distributed.process_id=5"], "distributed.process_id", 2),
    ([GRPO, "--config.rl.group_size=1"], "rl.group_size", 2),
    ([GRPO, "--config.rl.temperature=0.0"], "rl.temperature", 2),
    ([GRPO, "--config.rl.top_p=0.0"], "rl.top_p", 2),
    ([GRPO, "--config.rl.top_k=-1"], "rl.top_k", 2),
    ([GRPO, "--config.rl.minibatches=3"], "rl.minibatches", 2),
    ([GRPO, "--config.rl.clip_low=1.0"], "rl.clip_low", 2),
    ([GRPO, "--config.rl.kl_kind=k4"], "rl.kl_kind", 2),
    ([GRPO, "--config.rl.kl_beta=-0.1"], "rl.kl_beta", 2),
    ([GRPO, "--config.rl.kl_clamp=-1.0"], "rl.kl_clamp", 2),
    ([GRPO, "--config.rl.aggregation=sum"], "rl.aggregation", 2),
    ([GRPO, "--config.rl.sngs.signal=reward"], "rl.sngs.signal", 2),
    ([GRPO, "--config.rl.sngs.lambda0=2.0"], "rl.sngs.lambda0", 2),
    ([GRPO, "--config.rl.reward.value_rule=strict"], "rl.reward.value_rule", 2),
    ([GRPO, "--config.rl.reward.w_fmt=1.5"], "rl.reward.w_fmt", 2),
    ([GRPO, "--config.rl.reference=/nonexistent/ref"], "rl.reference", 2),
    ([GRPO, "--config.rl.mopd.kl_mask_tau=2.0"], "rl.mopd.kl_mask_tau", 2),
    ([GRPO, "--config.rl.score_chunk=-1"], "rl.score_chunk", 2),
    ([GRPO, "--config.rl.group_filter.greedy_wrong=true"], "rl.group_filter.greedy_wrong", 2),  # filter off
    ([GRPO, "--config.data.method=mopd"], "data.method", 2),
    ([*MOPD], "rl.teachers", 2),
    ([*MOPD, "--config.rl.teachers={'desktop': '.'}"], "rl.teachers", 2),  # the data also holds mobile
    ([*MOPD, "--config.rl.teachers={'desktop': '/nonexistent/t'}"], "rl.teachers.desktop", 2),
    ([SFT, "--config.train.steps=abc"], "--config.train.steps", 1),   # the flag parser: not an int
    ([SFT, "--config.train.stepz=3"], "train.stepz", 2),              # unknown key (locked config)
]


def _launch(args, workdir):
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    t0 = time.time()
    out = subprocess.run([sys.executable, "-m", "launch.train", f"--workdir={workdir}", *args], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    return out, time.time() - t0


def test_bad_configs_exit_with_one_line_naming_the_key_before_anything_heavy(tmp_path):
    assert len(BAD) >= 40
    workdirs = [str(tmp_path / f"run{i}") for i in range(len(BAD))]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(_launch, [args for args, _, _ in BAD], workdirs))
    failures = []
    for (args, key, status), (out, _), workdir in zip(BAD, results, workdirs):
        text = out.stderr + out.stdout
        lines = [l for l in out.stderr.splitlines() if l.startswith(("error:", "FATAL"))]
        ok = (out.returncode == status and len(lines) == 1 and key in lines[0] and "Traceback" not in text
              and not os.path.exists(workdir))
        if ok and status == 2:
            ok = lines[0].startswith(f"error: config key {key} ") or f"config key {key} " in lines[0]
        if not ok:
            failures.append(f"{args[1:]} -> exit {out.returncode}, expected {status} naming {key}: {text[-600:]}")
    assert not failures, "\n".join(failures)
    # Start-up of a failing launch (measured under whatever load the machine has): the
    # import-light path fails before jax is imported, except the mesh-vs-devices check.
    times = sorted(t for (_, key, _), (_, t) in zip(BAD, results) if key != "mesh")
    print(f"failing launch wall time: median {times[len(times) // 2]:.2f} s, max {times[-1]:.2f} s")


def test_every_base_config_key_has_a_rule_and_every_rule_a_key():
    keys = [k for k, _ in C._walk(C.base_config())]
    assert sorted(set(keys) - set(C.RULES)) == []
    assert sorted(set(C.RULES) - set(keys)) == []
    assert list(C.RULES) == list(C.KEYS)   # the rules are the table's
    for key, k in C.KEYS.items():
        assert isinstance(k.rule, K.Check) and k.rule.expected, key
        k.rule(key, k.default)   # every default passes its own rule
        value = C.base_config()
        for part in key.split("."):
            value = value[part]
        assert (value.to_dict() if hasattr(value, "to_dict") else value) == k.default, key


def test_base_config_is_fresh_each_call():
    a, b = C.base_config(), C.base_config()
    a.data.pixels["mobile"] = (1, 2)
    a.rl.teachers["desktop"] = "random:0"
    a.train.tensorboard = False        # 'auto' or a bool: a FieldReference of field type object
    assert b.data.pixels.to_dict() == {} and b.rl.teachers.to_dict() == {} and b.train.tensorboard == "auto"
    assert C.base_config().to_dict() == b.to_dict()


def test_recipes_pass_validation():
    import importlib
    checked = 0
    for name, args in [("demo", [None, "smoke"]), ("grpo_demo", ["smoke"]), ("guilibra_sft", ["qwen3_vl_8b"]),
                       ("guilibra_grpo", ["qwen2_5_vl_7b"]), ("mopd", [None]), ("mopd_teacher_sft", ["desktop"]),
                       ("mopd_demo", ["smoke"])]:
        module = importlib.import_module(f"configs.{name}")
        for arg in args:
            c = module.get_config(arg) if arg else module.get_config()
            if not c.data.synthetic.enabled:
                c.data.train_files = (os.path.join(ROOT, "README.md"),)  # the recipes leave data to the user
            c.model.hf_path = ""
            for label in list(c.rl.teachers):
                c.rl.teachers[label] = ROOT
            C.validate(c)
            fewest = abs(math.prod([c.mesh.data, c.mesh.fsdp, c.mesh.tensor]))  # an axis of -1 gets 1 device
            C.validate(c, fewest, 1)
            checked += 1
    assert checked == 8


def test_reward_keys_the_method_does_not_read_are_named_and_recipes_set_none():
    """A GRPO recipe switched to method=mopd keeps its GUI-Libra reward keys: each is named
    (with the warning logged); MOPD's rule under GRPO likewise; defaults name nothing."""
    import importlib
    c = importlib.import_module("configs.grpo_demo").get_config("smoke")
    assert C.inert_reward_keys(c) == []
    c.rl.reward.mopd_rule = "release"
    assert C.inert_reward_keys(c) == ["rl.reward.mopd_rule"]
    c.rl.reward.mopd_rule = "strict"
    c.method, c.data.method, c.rl.reward.grounding_sigma = "mopd", "mopd", 0.1
    assert C.inert_reward_keys(c) == ["rl.reward.value_rule", "rl.reward.grounding_sigma"]   # value_rule: the recipe's
    for name, arg in [("mopd", None), ("mopd_demo", "smoke"), ("guilibra_grpo", "qwen2_5_vl_7b")]:
        module = importlib.import_module(f"configs.{name}")
        assert C.inert_reward_keys(module.get_config(arg) if arg else module.get_config()) == [], name


def test_constants_mirrored_from_heavy_modules_agree():
    from guilibra_jax.data.demo_tokenizer import QWEN_SPECIAL_TOKENS
    assert C.DEMO_MIN_VOCAB == len(QWEN_SPECIAL_TOKENS) + 256


def test_enumerations_are_defined_once_in_choices():
    """The modules that act on a config value use the very tuples the rules check against."""
    from guilibra_jax import choices as CH
    from guilibra_jax import losses, rewards
    from guilibra_jax.data import prompts, readers, tokenize
    from guilibra_jax.envs import adapter
    from guilibra_jax.models import config as model_config
    from guilibra_jax.models import model
    from guilibra_jax.train import metrics
    from guilibra_jax.train.model_factory import DTYPES
    from guilibra_jax.train.rl import advantages

    same = [(losses.NORMALIZATIONS, CH.NORMALIZATIONS), (losses.WEIGHTINGS, CH.WEIGHTINGS),
            (losses.KL_KINDS, CH.KL_KINDS), (losses.AGGREGATIONS, CH.AGGREGATIONS),
            (losses.MOPD_ESTIMATORS, CH.MOPD_ESTIMATORS), (model_config.FAMILIES, CH.FAMILIES),
            (readers.FORMATS, CH.DATA_FORMATS), (tokenize.WEIGHTINGS, CH.WEIGHTINGS),
            (advantages.KL_MASKS, CH.KL_MASKS), (rewards.FORMAT_RULES, CH.REWARD_RULES),
            (rewards.MOPD_RULES, CH.MOPD_REWARD_RULES), (adapter.PLATFORMS, CH.PLATFORMS),
            (metrics.WANDB_MODES, CH.WANDB_MODES), (prompts.METHODS, CH.TARGET_FORMATS),
            (prompts.OPEN_THINK_SETTINGS, CH.OPEN_THINK)]
    assert all(a is b for a, b in same), [b for a, b in same if a is not b]
    assert tuple(model.REMAT_POLICIES) == CH.REMATS and tuple(DTYPES) == CH.DTYPE_NAMES
    for key, choices in [("method", CH.METHODS), ("model.remat", CH.REMATS), ("rl.kl_kind", CH.KL_KINDS),
                         ("rl.mopd.estimator", CH.MOPD_ESTIMATORS), ("data.format", CH.DATA_FORMATS)]:
        assert C.RULES[key].expected == "one of " + ", ".join(map(repr, choices)), key


def test_regex_options_that_match_no_parameter_name_the_key_and_pattern():
    import jax
    from flax import nnx

    from guilibra_jax import models as M
    from guilibra_jax.train import fake_batch
    from guilibra_jax.train.state import optimizer_from_config

    model = nnx.eval_shape(lambda: M.QwenVL(fake_batch.tiny_config(), rngs=nnx.Rngs(0)))
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    c = C.base_config()
    c.optim.freeze = ("visual",)
    c.optim.lr_multipliers = {"lm_head|embed": 0.5}
    optimizer_from_config(c, params, 10)  # both match: no error
    c.optim.freeze = ("visual", "vision_tower/")
    with pytest.raises(ConfigError, match=r"optim\.freeze pattern 'vision_tower/' matches no parameter"):
        optimizer_from_config(c, params, 10)
    c.optim.freeze = ()
    c.optim.lr_multipliers = {"decoder/": 0.1}
    with pytest.raises(ConfigError, match=r"optim\.lr_multipliers pattern 'decoder/' matches no parameter"):
        optimizer_from_config(c, params, 10)
    assert jax.tree.leaves(params)


def test_unknown_model_name_is_a_config_error():
    from guilibra_jax.train import model_factory
    c = C.base_config()
    c.model.name = "qwen9_vl_1t"
    with pytest.raises(ConfigError, match=r"config key model\.name = 'qwen9_vl_1t'"):
        model_factory.build_model(c, tokenizer=None)


def test_a_bad_config_fails_before_jax_flax_or_the_models_are_imported(tmp_path):
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "launch.train", f"--workdir={tmp_path}/w", SFT,
                          "--config.optim.b2=1.5"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "config key optim.b2 = 1.5" in out.stderr
    imported = {line.split("|")[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    assert "guilibra_jax.train.config" in imported
    assert not {m for m in imported if m.split(".")[0] in ("jax", "flax", "orbax", "transformers", "torch", "grain")
                or m.startswith("guilibra_jax.models")}
