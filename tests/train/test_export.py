"""The serving files of an export (train/export.py), read back by transformers' own
loaders: the image processor resizes to the run's pixels, generate stops on Qwen's
ids and decodes as our sampler does, files from model.hf_path are copied with the
pixel bounds overwritten, and per-platform budgets give the widest serving bounds."""
import json
import os

import numpy as np
import pytest
from PIL import Image

from guilibra_jax.data import images as I
from guilibra_jax.train import config as RC
from guilibra_jax.train import export as E

# Qwen2.5-VL-Instruct's released files (the keys that matter here)
QWEN_PREPROCESSOR = {"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "temporal_patch_size": 2,
                     "merge_size": 2, "image_mean": list(I.OPENAI_CLIP_MEAN), "image_std": list(I.OPENAI_CLIP_STD),
                     "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2_5_VLProcessor",
                     "marker": "kept"}
QWEN_GENERATION = {"bos_token_id": 151643, "pad_token_id": 151643, "do_sample": True,
                   "eos_token_id": [151645, 151643], "repetition_penalty": 1.05, "temperature": 0.1, "top_p": 0.001,
                   "top_k": 1, "transformers_version": "4.49.0"}


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    from guilibra_jax.data.demo_tokenizer import build_demo_tokenizer
    out = str(tmp_path_factory.mktemp("tok"))
    build_demo_tokenizer(["click the button at 12 34", "type hello world"] * 20, 300, out)
    return out


def _config(min_pixels=56 * 56, max_pixels=112 * 112, **data):
    c = RC.base_config()
    c.data.min_pixels, c.data.max_pixels = min_pixels, max_pixels
    for k, v in data.items():
        c.data[k] = v
    return c


def _source(tmp_path, tokenizer_dir):
    src = tmp_path / "qwen"
    src.mkdir()
    for f in os.listdir(tokenizer_dir):
        (src / f).write_bytes(open(os.path.join(tokenizer_dir, f), "rb").read())
    (src / "preprocessor_config.json").write_text(json.dumps(QWEN_PREPROCESSOR))
    (src / "generation_config.json").write_text(json.dumps(QWEN_GENERATION))
    return str(src)


def test_hf_path_files_are_copied_with_the_runs_pixels_and_stop_ids(tmp_path, tokenizer_dir):
    from transformers import AutoImageProcessor, AutoTokenizer, GenerationConfig

    src = _source(tmp_path, tokenizer_dir)
    config = _config()
    config.model.hf_path = src
    tok = AutoTokenizer.from_pretrained(src)
    out = str(tmp_path / "export")
    budgets = E.write_serving_files(out, config, tok, "qwen2_5_vl", source_dir=src)
    assert budgets == {"*": (56 * 56, 112 * 112)}
    with open(os.path.join(out, "preprocessor_config.json")) as f:
        pre = json.load(f)
    assert (pre["min_pixels"], pre["max_pixels"]) == (3136, 12544)
    assert pre["size"] == {"shortest_edge": 3136, "longest_edge": 12544} and pre["marker"] == "kept"
    assert open(os.path.join(out, "tokenizer.json"), "rb").read() == open(os.path.join(src, "tokenizer.json"),
                                                                          "rb").read()
    # what transformers reads back
    ip = AutoImageProcessor.from_pretrained(out)
    img = Image.fromarray(np.random.default_rng(0).integers(0, 255, (300, 500, 3), dtype=np.uint8))
    theirs = ip(images=[img], return_tensors="np")
    ours_pv, ours_grid = I.preprocess_image(img, I.processor_config("qwen2_5_vl", min_pixels=3136, max_pixels=12544))
    np.testing.assert_array_equal(theirs["image_grid_thw"][0], ours_grid)
    np.testing.assert_allclose(theirs["pixel_values"], ours_pv, atol=1e-6)
    gen = GenerationConfig.from_pretrained(out)
    im_end, eot = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")
    assert gen.eos_token_id == [im_end, eot] and gen.pad_token_id == tok.pad_token_id
    assert gen.do_sample is False and gen.repetition_penalty == 1.0   # our sampler: greedy, no penalty
    assert gen.max_new_tokens == config.train.eval_max_new_tokens
    assert RC.load_run_config(os.path.join(out, E.RUN_CONFIG_FILE)).data.max_pixels == 112 * 112


def test_rl_runs_export_their_rollout_sampling(tmp_path, tokenizer_dir):
    from transformers import AutoTokenizer, GenerationConfig
    config = _config()
    config.method = "grpo"
    config.rl.temperature, config.rl.top_p, config.rl.top_k, config.rl.max_new_tokens = 0.7, 0.9, 20, 64
    out = str(tmp_path / "export")
    E.write_serving_files(out, config, AutoTokenizer.from_pretrained(tokenizer_dir), "qwen2_5_vl")
    gen = GenerationConfig.from_pretrained(out)
    assert (gen.do_sample, gen.temperature, gen.top_p, gen.top_k, gen.max_new_tokens) == (True, 0.7, 0.9, 20, 64)


def test_without_a_source_the_family_defaults_are_written(tmp_path, tokenizer_dir):
    from transformers import AutoImageProcessor, AutoTokenizer
    out = str(tmp_path / "export")
    config = _config(min_pixels=0, max_pixels=200 * 200)
    E.write_serving_files(out, config, AutoTokenizer.from_pretrained(tokenizer_dir), "qwen3_vl")
    ip = AutoImageProcessor.from_pretrained(out)
    img = Image.fromarray(np.random.default_rng(1).integers(0, 255, (480, 640, 3), dtype=np.uint8))
    theirs = ip(images=[img], return_tensors="np")
    cfg = I.processor_config("qwen3_vl", max_pixels=200 * 200)
    assert cfg.min_pixels == 65536         # 0 = the family's default bound
    pv, grid = I.preprocess_image(img, cfg)
    np.testing.assert_array_equal(theirs["image_grid_thw"][0], grid)
    np.testing.assert_allclose(theirs["pixel_values"], pv, atol=1e-6)
    assert os.path.exists(os.path.join(out, "chat_template.jinja"))


def test_per_platform_budgets_are_served_with_the_widest_bounds(tmp_path, tokenizer_dir):
    """Each platform's resized image passes the served bounds unchanged, so a client
    that resizes per platform is served in each platform's own training frame."""
    from guilibra_jax import actions as A
    config = _config(pixels={"mobile": (28 * 28 * 4, 28 * 28 * 40), "desktop": dict(max_pixels=28 * 28 * 100)})
    budgets = E.pixel_budgets(config, "qwen2_5_vl")
    assert budgets == {"*": (3136, 12544), "mobile": (3136, 31360), "desktop": (3136, 78400)}
    lo, hi = E.serving_bounds(budgets)
    assert (lo, hi) == (3136, 78400)
    for platform, (p_lo, p_hi) in budgets.items():
        for size in ((1920, 1080), (1080, 2400), (333, 517)):
            w, h = A.resized_size_for(size, "qwen2_5_vl", min_pixels=p_lo, max_pixels=p_hi)
            assert A.resized_size_for((w, h), "qwen2_5_vl", min_pixels=lo, max_pixels=hi) == (w, h), (platform, size)
    from transformers import AutoTokenizer
    out = str(tmp_path / "export")
    E.write_serving_files(out, config, AutoTokenizer.from_pretrained(tokenizer_dir), "qwen2_5_vl")
    with open(os.path.join(out, "preprocessor_config.json")) as f:
        pre = json.load(f)
    assert (pre["min_pixels"], pre["max_pixels"]) == (lo, hi)


def test_bad_per_platform_budget_names_the_key():
    with pytest.raises(ValueError, match="data.pixels.mobile"):
        E.pixel_budgets(_config(pixels={"mobile": "big"}), "qwen2_5_vl")
