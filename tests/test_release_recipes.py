"""The four release recipes validate and hold the releases' settings; every new switch's
bad value is a ConfigError naming the key."""
import pytest

from configs import guilibra_grpo, guilibra_sft, mopd, mopd_teacher_sft
from guilibra_jax.errors import ConfigError
from guilibra_jax.train.config import base_config, validate


def _valid(c, tmp_path):
    data = tmp_path / "data.jsonl"
    data.touch()
    c.data.train_files = (str(data),)
    if c.method == "mopd":
        for label in c.rl.teachers:
            c.rl.teachers[label] = str(tmp_path)
    validate(c)
    return c


@pytest.mark.parametrize("name", sorted(guilibra_sft.RECIPES))
def test_guilibra_sft_release_and_paper(name, tmp_path):
    c = _valid(guilibra_sft.get_config(name), tmp_path)
    assert (c.optim.lr, c.optim.schedule, c.optim.weight_decay, c.data.mix) == (1e-5, "cosine", 0.0, "both")
    assert c.data.batch_size * c.train.grad_accum == 256 and (c.data.min_pixels, c.data.max_pixels) == (3136, 5720064)
    if name.startswith("qwen2_5"):   # use_action_weight=True, action_weight=2
        assert (c.loss.weighting, c.loss.normalize, c.loss.alpha_action, c.loss.alpha_grounding) == (
            "release", "token", 2.0, 4.0)
    else:                            # Qwen3: use_action_weight=False
        assert (c.loss.normalize, c.loss.alpha_action, c.loss.alpha_grounding) == ("token", 1.0, 1.0)
    p = _valid(guilibra_sft.get_config(name + ":paper"), tmp_path)
    assert (p.loss.weighting, p.loss.normalize, p.loss.alpha_action, p.loss.alpha_grounding) == (
        "paper", "sample", 2.0, 4.0)


def test_guilibra_grpo_release(tmp_path):
    c = _valid(guilibra_grpo.get_config("qwen3_vl_8b"), tmp_path)
    assert c.data.batch_size * c.rl.group_size == 2048 and c.data.batch_size * c.rl.group_size // c.rl.minibatches == 1024
    assert (c.rl.dual_clip, c.rl.std_unbiased, c.optim.weight_decay, c.data.max_length) == (3.0, True, 1e-2, 8092)
    assert (c.data.min_pixels, c.data.max_pixels) == (262144, 2508800)
    assert (c.rl.reward.format_rule, c.rl.reward.value_rule, c.rl.kl_beta, c.rl.top_p) == ("release", "release",
                                                                                          0.001, 0.98)
    p = _valid(guilibra_grpo.get_config("qwen3_vl_8b:paper"), tmp_path)
    assert (p.rl.dual_clip, p.rl.std_unbiased, p.rl.reward.format_rule) == (0.0, False, "paper")


@pytest.mark.parametrize("platform", ["desktop", "mobile"])
def test_mopd_teacher_sft_release(platform, tmp_path):
    c = _valid(mopd_teacher_sft.get_config(platform), tmp_path)
    assert (c.optim.lr, c.data.batch_size * c.train.grad_accum, c.optim.schedule, c.optim.weight_decay) == (
        1e-6, 32, "cosine", 0.01)
    assert dict(c.data.pixels) == {"desktop": (3136, 13107200), "mobile": (40768, 548800)}


@pytest.mark.parametrize("layout", mopd.ARGS)
def test_mopd_release(layout, tmp_path):
    c = _valid(mopd.get_config(layout), tmp_path)
    assert (c.rl.reward.mopd_rule, c.rl.reward.check_tool_name, c.rl.dual_clip, c.rl.normalize_std) == (
        "release", False, 10.0, False)
    assert c.rl.mopd.kl_mask == "off"                                      # mask off, as run_mopd.sh
    assert c.rl.group_filter.enabled and c.rl.group_filter.max_rounds == 0  # filter_groups, no round limit
    rollouts = 256 if layout == "served" else 1024   # served: 32 groups per update, so one host's update fits
    assert (c.data.batch_size, c.rl.update_groups * c.rl.group_size) == (384, rollouts) and c.data.max_length == 8192
    if layout == "served":
        assert c.train.grad_accum * c.mesh.fsdp == rollouts    # one row per FSDP group per micro-batch
        assert all("://" in t for t in mopd.get_config(layout).rl.teachers.values())   # URLs (_valid swaps them)
    elif layout == "8x8":   # per FSDP group one group's 8 responses (their prompt computed once)
        assert c.train.grad_accum * c.mesh.fsdp * c.rl.group_size == 1024 and c.rl.score_rows == 128
    else:                 # one row per FSDP group per update micro-batch
        assert c.train.grad_accum * c.mesh.fsdp == 1024


def test_mopd_on_one_host_is_refused_naming_what_fits():
    with pytest.raises(ValueError, match=r"does not fit one host.*:4x8"):
        mopd.get_config("1x8")


@pytest.mark.parametrize("key,value,method", [
    ("rl.dual_clip", 0.5, "grpo"), ("rl.reward.format_rule", "x", "grpo"), ("rl.reward.mopd_rule", "paper", "grpo"),
    ("loss.weighting", "both", "sft"), ("data.open_think", "yes", "sft"), ("data.pixels.mobile", (5, 1), "sft"),
    ("data.rebalance.step_keep", (1.5,), "sft"), ("data.rebalance.max_share.mobile", 1.0, "sft"),
    ("data.rebalance.key", "app", "sft"), ("rl.mopd.kl_mask", "on", "mopd"), ("rl.group_filter.max_rounds", -1, "grpo"),
])
def test_bad_values_name_the_key(key, value, method):
    c = base_config()
    c.method = method
    c.data.synthetic.enabled = True
    if method == "mopd":
        c.rl.teachers = {"*": "random:1"}
    *path, last = key.split(".")
    node = c
    for k in path:
        node = node[k]
    node[last] = value
    named = {"data.pixels.mobile": "data.pixels", "data.rebalance.max_share.mobile": "data.rebalance.max_share"}
    with pytest.raises(ConfigError, match=named.get(key, key).replace(".", r"\.") + " = "):
        validate(c)
