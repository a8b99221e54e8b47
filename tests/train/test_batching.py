"""Joining processes' images into the global patch sequence (batching.join_patches)
gives exactly what prepare_vision_inputs makes for all images of the global batch; the
single-process put_batch places host arrays unchanged."""
import jax
import numpy as np
import pytest

from guilibra_jax import models as M
from guilibra_jax import sharding as S
from guilibra_jax.data.collate import round_up
from guilibra_jax.models.vision import device_vision_inputs
from guilibra_jax.train import fake_batch as F
from guilibra_jax.train.batching import gather_images, join_patches, pad_patches, put_batch, stack_micro_batches


def local_part(grids, cfg, bucket, rng):
    """What one process's collate makes: its images' patches padded to a bucket, and how
    many of them its image tokens consume (collate's dummy image when it has none)."""
    mu, m = cfg.vision.merge_unit, cfg.vision.spatial_merge_size
    real = int(sum(np.prod(g) for g in grids))
    p = round_up(real, bucket)
    pixels = np.zeros((p, cfg.vision.patch_dim), np.float32)
    pixels[:real] = rng.standard_normal((real, cfg.vision.patch_dim))
    described = np.asarray(grids) if grids else np.array([[1, m, p // m]])
    vision = device_vision_inputs(M.prepare_vision_inputs(described, cfg, num_patches=p))
    assert real % mu == 0
    return pixels, vision, real


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_joined_parts_equal_prepare_vision_inputs_of_all_images(family):
    cfg = F.tiny_config(family)
    rng = np.random.default_rng(0)
    grids = [[(1, 4, 6), (1, 6, 4)], [], [(1, 8, 8)], [(2, 4, 4), (1, 2, 2)]]  # part 1: no sample (dummy image)
    parts = [local_part(g, cfg, bucket=32, rng=rng) for g in grids]
    n = len(parts) * max(p.shape[0] for p, _, _ in parts)
    pixels, vision = join_patches(parts, n, cfg.vision.merge_unit)

    all_grids = np.asarray([g for part in grids for g in part])
    expected = device_vision_inputs(M.prepare_vision_inputs(all_grids, cfg, num_patches=n))
    assert vision.keys() == expected.keys()
    for k in expected:
        assert vision[k].dtype == expected[k].dtype, k
        np.testing.assert_array_equal(vision[k], expected[k], err_msg=k)
    real = np.concatenate([p[:r] for p, _, r in parts])
    np.testing.assert_array_equal(pixels[:len(real)], real)
    assert not pixels[len(real):].any()


def test_join_rejects_index_beyond_consumed_patches():
    cfg = F.tiny_config("qwen2_5_vl")
    pixels, vision, real = local_part([(1, 4, 6), (1, 8, 8)], cfg, bucket=32, rng=np.random.default_rng(0))
    consumed = 24 + 12  # the first image and 3 of the 16 merged tokens of the second: part of an image
    with pytest.raises(ValueError, match="slot_lengths"):
        join_patches([(pixels, vision, consumed)], 2 * pixels.shape[0], cfg.vision.merge_unit)


def test_single_process_put_batch_keeps_host_arrays():
    cfg = F.tiny_config()
    host = stack_micro_batches([F.fake_sft_batch(cfg, batch=2, seq_len=48, image_hw=(56, 56), seed=s)
                                for s in range(2)])
    mesh = S.make_mesh([1, 1, 1], devices=jax.devices()[:1])
    placed = put_batch(host, mesh)
    assert jax.tree.structure(placed) == jax.tree.structure(host)
    for a, b in zip(jax.tree.leaves(placed), jax.tree.leaves(host)):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a), b)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_micro_batches_of_different_patch_buckets_stack_with_inert_padding(family):
    cfg = F.tiny_config(family)
    rng = np.random.default_rng(1)
    grids = [[(1, 4, 6)], [(1, 8, 8), (1, 4, 4)]]
    micro = []
    for g in grids:
        pixels, vision, _ = local_part(g, cfg, bucket=32, rng=rng)
        micro.append({"input_ids": np.zeros((2, 8), np.int32), "pixel_values": pixels, "vision": vision})
    assert micro[0]["pixel_values"].shape[0] < micro[1]["pixel_values"].shape[0]
    stacked = stack_micro_batches(micro)
    n = micro[1]["pixel_values"].shape[0]
    assert stacked["pixel_values"].shape == (2, n, cfg.vision.patch_dim)
    slots, slot_len = micro[1]["vision"]["patch_index"].shape  # the larger layout of the two
    expected = device_vision_inputs(M.prepare_vision_inputs(np.asarray(grids[0]), cfg, num_patches=n,
                                                            num_slots=slots, slot_len=slot_len))
    for k in expected:
        np.testing.assert_array_equal(stacked["vision"][k][0], expected[k], err_msg=k)
        np.testing.assert_array_equal(stacked["vision"][k][1], micro[1]["vision"][k], err_msg=k)
    p0 = micro[0]["pixel_values"]
    np.testing.assert_array_equal(stacked["pixel_values"][0, :len(p0)], p0)
    assert not stacked["pixel_values"][0, len(p0):].any()


def test_micro_batches_of_different_lengths_are_rejected_by_name():
    a = {"input_ids": np.zeros((2, 8), np.int32)}
    b = {"input_ids": np.zeros((2, 16), np.int32)}
    with pytest.raises(ValueError, match="input_ids"):
        stack_micro_batches([a, b])


@pytest.mark.parametrize("micro_axis", [True, False])
def test_gather_images_of_one_process_returns_its_own_images(micro_axis):
    cfg = F.tiny_config()
    batch = F.fake_sft_batch(cfg, batch=2, seq_len=48, image_hw=(56, 84))
    batch["pixel_values"], batch["vision"] = pad_patches(batch["pixel_values"], batch["vision"], 64)
    host = stack_micro_batches([batch, batch]) if micro_axis else batch
    mesh = S.make_mesh([1, 1, 1], devices=jax.devices()[:1])
    out = gather_images(host, mesh, cfg, micro_axis=micro_axis)
    np.testing.assert_array_equal(out["pixel_values"], host["pixel_values"])
    for k, v in host["vision"].items():
        np.testing.assert_array_equal(out["vision"][k], v, err_msg=k)
