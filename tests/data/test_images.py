"""Preprocessing equals transformers' Qwen2-VL image processor (PIL backend, what
transformers uses for Qwen2.5-VL and Qwen3-VL without torchvision)."""
import numpy as np
import pytest
from PIL import Image

from guilibra_jax.data import images as I

SIZES = [(1080, 2400), (1920, 1080), (333, 517), (64, 40), (28, 700)]


def _reference(cfg):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    return Qwen2VLImageProcessorPil(patch_size=cfg.patch_size, temporal_patch_size=cfg.temporal_patch_size,
                                    merge_size=cfg.merge_size, image_mean=list(cfg.image_mean),
                                    image_std=list(cfg.image_std),
                                    size={"shortest_edge": cfg.min_pixels, "longest_edge": cfg.max_pixels})


@pytest.mark.parametrize("family,max_pixels", [("qwen2_5_vl", None), ("qwen3_vl", 1280 * 32 * 32),
                                               ("qwen3_vl", 256 * 32 * 32)])
def test_pixel_values_equal_transformers(family, max_pixels):
    cfg = I.processor_config(family, max_pixels=max_pixels)
    ref = _reference(cfg)
    rng = np.random.default_rng(0)
    for w, h in SIZES:
        img = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        want = ref(images=[img], return_tensors="np")
        pv, grid = I.preprocess_image(img, cfg)
        assert pv.dtype == np.float32 and pv.shape == want["pixel_values"].shape, (w, h)
        np.testing.assert_allclose(pv, want["pixel_values"], rtol=0, atol=1e-6)
        np.testing.assert_array_equal(grid, want["image_grid_thw"][0])
        assert I.num_image_tokens((w, h), cfg) == ref.get_number_of_image_patches(h, w) // cfg.merge_size ** 2


def test_family_defaults_match_releases():
    q25, q3 = I.processor_config("qwen2_5_vl"), I.processor_config("qwen3_vl")
    assert (q25.patch_size, q25.merge_size, q25.min_pixels, q25.max_pixels) == (14, 2, 3136, 1003520)
    assert (q3.patch_size, q3.merge_size, q3.image_mean, q3.image_std) == (16, 2, (0.5,) * 3, (0.5,) * 3)
    assert q25.patch_dim == 1176 and q3.patch_dim == 1536


def test_load_image_falls_back_to_sibling_extension(tmp_path):
    Image.new("RGB", (10, 8), (1, 2, 3)).save(tmp_path / "shot.jpg")
    assert I.load_image(str(tmp_path / "shot.png")).size == (10, 8)
    with pytest.raises(I.ImageLoadError):
        I.load_image(str(tmp_path / "absent.png"))
    (tmp_path / "broken.png").write_bytes(b"not an image")
    with pytest.raises(I.ImageLoadError):
        I.load_image(str(tmp_path / "broken.png"))


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_patches_to_image_inverts_preprocess_image_exactly(family):
    """The screenshot rebuilt from pixel patches (what a served scorer is sent) is the resized
    image itself: preprocessing it again gives the same patches and grid, bit for bit."""
    cfg = I.processor_config(family, min_pixels=4 * 32 * 32, max_pixels=64 * 32 * 32)
    img = np.random.default_rng(0).integers(0, 256, (150, 230, 3), dtype=np.uint8)
    pv, grid = I.preprocess_image(img, cfg)
    back = I.patches_to_image(pv, grid, cfg)
    assert back.shape == (grid[1] * cfg.patch_size, grid[2] * cfg.patch_size, 3) and back.dtype == np.uint8
    pv2, grid2 = I.preprocess_image(back, cfg)
    assert np.array_equal(grid, grid2) and np.array_equal(pv, pv2)
