"""Joining processes' images into the global patch sequence (batching.join_patches)
gives exactly what prepare_vision_inputs makes for all images of the global batch; the
single-process put_batch places host arrays unchanged except the pixels, which it lays out
by vision slot (sharded like the slots) without changing the model's output."""
import jax
import numpy as np
import pytest

from guilibra_jax import models as M
from guilibra_jax import sharding as S
from guilibra_jax.data.collate import round_up
from guilibra_jax.models.vision import device_vision_inputs
from guilibra_jax.train import fake_batch as F
from guilibra_jax.train.batching import (gather_images, join_patches, pad_patches, put_batch, slot_pixels,
                                        stack_micro_batches)


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


def test_single_process_put_batch_keeps_host_arrays_and_lays_pixels_out_by_slot():
    cfg = F.tiny_config()
    host = stack_micro_batches([F.fake_sft_batch(cfg, batch=2, seq_len=48, image_hw=(56, 56), seed=s)
                                for s in range(2)])
    mesh = S.make_mesh([1, 1, 1], devices=jax.devices()[:1])
    placed = put_batch(host, mesh)
    assert jax.tree.structure(placed) == jax.tree.structure(host)
    pixels, index = host["pixel_values"], host["vision"]["patch_index"]
    want = {**host, "pixel_values": slot_pixels(pixels, index)}
    for a, b in zip(jax.tree.leaves(placed), jax.tree.leaves(want)):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a), b)
    # slot s, position j holds pixel row patch_index[s, j]; padding positions are zero
    got = np.asarray(placed["pixel_values"])
    for m in range(len(pixels)):
        for (s, j), row in np.ndenumerate(index[m]):
            np.testing.assert_array_equal(got[m, s, j], pixels[m, row] if row >= 0 else 0)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_model_output_is_the_same_from_pixel_rows_and_from_slot_layout(family):
    import jax.numpy as jnp
    from flax import nnx
    cfg = F.tiny_config(family)
    hw = (56, 84) if family == "qwen2_5_vl" else (64, 96)   # whole merged units of each patch size
    b = F.fake_sft_batch(cfg, batch=2, seq_len=48, image_hw=hw, seed=3)
    model = M.QwenVL(cfg, rngs=nnx.Rngs(0))
    args = [jnp.asarray(b[k]) for k in ("input_ids", "positions", "segment_ids")]
    forward = nnx.jit(lambda m, pixels, vision: m(*args, pixels, vision))
    rows = forward(model, jnp.asarray(b["pixel_values"]), b["vision"])
    slots = forward(model, jnp.asarray(slot_pixels(b["pixel_values"], b["vision"]["patch_index"])), b["vision"])
    np.testing.assert_array_equal(np.asarray(rows), np.asarray(slots))


SHARDED_PIXELS = r"""
import os
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
import jax
from guilibra_jax import sharding as S
from guilibra_jax.train import fake_batch as F
from guilibra_jax.train.batching import put_batch
host = F.fake_sft_batch(F.tiny_config(), batch=4, seq_len=48, image_hw=(56, 56), seed=0)
placed = put_batch(host, S.make_mesh([1, 4, 1], devices=jax.devices()[:4]), micro_axis=False)
px = placed["pixel_values"]
print(px.shape, sorted({sh.data.shape for sh in px.addressable_shards}))
"""


def test_slot_layout_pixels_are_sharded_over_the_batch_devices():
    """4 fake devices (a subprocess): each holds a quarter of the slots' pixels."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", SHARDED_PIXELS], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    shape, shards = out.stdout.strip().split(" [")
    s, l, d = eval(shape)
    assert s % 4 == 0 and eval("[" + shards) == [(s // 4, l, d)]
