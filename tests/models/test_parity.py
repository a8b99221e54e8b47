"""Logits, image features and deepstack features equal transformers (torch CPU).

float32: max |jax - torch| <= 1e-5 * max |torch logit| over real (non-padding) tokens.
Observed on the tiny models (2-core CPU, logits of magnitude ~0.6): 1.5e-7 .. 3e-7 absolute
for every case and both families, i.e. ~5e-7 relative (float32 summation-order noise), so
1e-5 leaves a 20x margin and still catches any real difference (a wrong rope section,
a missing bias or norm offset moves logits by 1e-3 .. 1e-1).

bfloat16 (what every recipe computes in): both implementations round differently (where
each casts, sums, upcasts for softmax and norms), so they are not compared with each
other directly but with the float32 reference: ours-bf16 must be no further from it than
transformers-bf16 is, up to a margin derived next to the test (BF16_*).
"""
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from guilibra_jax.models import get_rope_index, prepare_vision_inputs
from hf_fixtures import image_grid, make_batch, text_tokens

REL_TOL = 1e-5
T_BUCKET, P_BUCKET = 32, 64  # every image case is padded to these: one compile per family


@nnx.jit
def forward(model, ids, positions, segment_ids, pixel_values, vision):
  return model(ids, positions, segment_ids, pixel_values, vision)

CASES = {
    "text_only": [text_tokens(11, 1)],
    "one_image": [text_tokens(4, 1) + [("img", image_grid(56, 84))] + text_tokens(5, 2)],
    "two_images_non_square": [text_tokens(3, 1) + [("img", image_grid(56, 84))] + text_tokens(2, 2)
                              + [("img", image_grid(84, 56))] + text_tokens(4, 3)],
    "batch_left_padding": [text_tokens(2, 4) + [("img", image_grid(56, 84))] + text_tokens(6, 5),
                           text_tokens(3, 6) + [("img", image_grid(56, 56))] + text_tokens(1, 7)],
    "text_batch_left_padding": [text_tokens(9, 8), text_tokens(4, 9)],
    # several images in a row, a text-only row and a one-image row in one batch
    "mixed_rows": [text_tokens(3, 10) + [("img", image_grid(56, 84))] + text_tokens(2, 11)
                   + [("img", image_grid(84, 56))] + text_tokens(3, 12),
                   text_tokens(12, 13),
                   text_tokens(2, 14) + [("img", image_grid(56, 56))] + text_tokens(5, 15)],
}


def _torch_logits(hf, ids, mask, mm, grid, pix, positions):
  kw = dict(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
  if grid is not None:
    kw.update(pixel_values=torch.tensor(pix), image_grid_thw=torch.tensor(grid), mm_token_type_ids=torch.tensor(mm))
  else:
    kw.update(position_ids=torch.tensor(positions, dtype=torch.long))  # text: positions skip left padding
  with torch.no_grad():
    return hf(**kw).logits.numpy()


def _jax_logits(model, config, ids, mask, grid, pix, positions):
  pixels, vision = None, None
  if grid is not None:
    # Pad the patch sequence to a bucket: padding patches must change nothing.
    pixels = jnp.asarray(np.pad(pix, ((0, P_BUCKET - pix.shape[0]), (0, 0))))
    vision = prepare_vision_inputs(grid, config, num_patches=P_BUCKET)
  return np.asarray(forward(model, jnp.asarray(ids, jnp.int32), jnp.asarray(positions), jnp.asarray(mask, jnp.int32),
                            pixels, vision)).astype(np.float32)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_logits_match_transformers(loaded, family, case):
  hf, model, config, _ = loaded[family]
  ids, mask, mm, grid, pix = make_batch(CASES[case], pad_to=T_BUCKET)
  positions, _ = get_rope_index(ids, mask, grid, config)
  ref = _torch_logits(hf, ids, mask, mm, grid, pix, positions)
  got = _jax_logits(model, config, ids, mask, grid, pix, positions)
  real = mask.astype(bool)
  err = np.abs(got - ref)[real].max()
  assert err <= REL_TOL * np.abs(ref[real]).max(), (family, case, err)


@pytest.fixture(scope="module")
def bf16(hf_dirs):
  """family -> (transformers model in bfloat16, our model loaded with bfloat16 compute and weights)."""
  import copy

  from guilibra_jax.models import load_hf
  out = {}
  for family, (hf, path) in hf_dirs.items():
    ours, _ = load_hf(path, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
    out[family] = (copy.deepcopy(hf).to(torch.bfloat16).eval(), ours)
  return out


# Bounds of the bf16 test. Both sides round the same float32 weights to bf16, then each
# rounds intermediate results at its own points, so their errors against float32 are of
# one size (here ~1.5% of the logit scale at most, ~0.2% on average) but not equal.
# Measured on these models, ours / transformers: max error 0.75-1.15, mean error
# 0.92-1.02 over every case and both families (2-core CPU). Bounds: max <= 1.3x theirs
# + 1/4 bf16 ulp of the logit scale, mean <= 1.2x theirs. What this catches, measured:
# bf16 weights made by truncating float32 (a converter bug) raise the mean ratio to
# 1.34-1.46; a NaN, an overflow or an un-cast weight fails outright. What it cannot see
# on models this small: rounding choices whose effect drowns in bf16 noise (RMSNorm
# statistics or rope angles in bf16 moved the ratios by < 0.2 here).
BF16_MAX_FACTOR, BF16_MAX_ULPS, BF16_MEAN_FACTOR = 1.3, 0.25 * 2.0**-8, 1.2


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_bf16_logits_are_as_close_to_float32_as_transformers_bf16(loaded, bf16, family, case):
  hf32, _, config, _ = loaded[family]
  hf16, ours16 = bf16[family]
  ids, mask, mm, grid, pix = make_batch(CASES[case], pad_to=T_BUCKET)
  positions, _ = get_rope_index(ids, mask, grid, config)
  ref = _torch_logits(hf32, ids, mask, mm, grid, pix, positions)
  with torch.no_grad():
    kw = dict(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
    if grid is not None:
      kw.update(pixel_values=torch.tensor(pix).to(torch.bfloat16), image_grid_thw=torch.tensor(grid),
                mm_token_type_ids=torch.tensor(mm))
    else:
      kw.update(position_ids=torch.tensor(positions, dtype=torch.long))
    theirs = hf16(**kw).logits.float().numpy()
  ours = _jax_logits(ours16, config, ids, mask, grid, pix, positions)
  real = mask.astype(bool)
  scale = np.abs(ref[real]).max()
  err_ours, err_theirs = np.abs(ours - ref)[real].max(), np.abs(theirs - ref)[real].max()
  mean_ours, mean_theirs = np.abs(ours - ref)[real].mean(), np.abs(theirs - ref)[real].mean()
  assert min(err_ours, err_theirs) > 1e-4 * scale  # both really computed in bf16 (float32: ~5e-7)
  assert err_ours <= BF16_MAX_FACTOR * err_theirs + BF16_MAX_ULPS * scale, (family, case, err_ours, err_theirs)
  assert mean_ours <= BF16_MEAN_FACTOR * mean_theirs, (family, case, mean_ours, mean_theirs)


_image_features = nnx.jit(lambda m, pixels, vision: m.image_features(pixels, vision))


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_image_features_match_transformers(loaded, family):
  hf, model, config, _ = loaded[family]
  grid = np.array([image_grid(56, 84), image_grid(84, 112)])
  pix = np.random.default_rng(3).standard_normal((int(grid.prod(-1).sum()), 3 * 2 * 14 * 14)).astype(np.float32)
  with torch.no_grad():
    out = hf.model.get_image_features(torch.tensor(pix), torch.tensor(grid), return_dict=True)
  ref = torch.cat(out.pooler_output).numpy()
  merged, deepstack = _image_features(model, jnp.asarray(pix), prepare_vision_inputs(grid, config))
  np.testing.assert_allclose(np.asarray(merged), ref, atol=REL_TOL * np.abs(ref).max(), rtol=0)
  if family == "qwen3_vl":
    assert len(deepstack) == len(out.deepstack_features) == 2
    for got, want in zip(deepstack, out.deepstack_features):
      want = torch.cat(want).numpy()
      np.testing.assert_allclose(np.asarray(got), want, atol=REL_TOL * np.abs(want).max(), rtol=0)


def test_vision_tower_isolates_images_and_padding(loaded):
  """An image's features do not depend on the other images or on padding patches."""
  _, model, config, _ = loaded["qwen2_5_vl"]
  g1, g2 = image_grid(56, 84), image_grid(84, 112)
  rng = np.random.default_rng(0)
  p1 = rng.standard_normal((int(np.prod(g1)), 1176)).astype(np.float32)
  p2 = rng.standard_normal((int(np.prod(g2)), 1176)).astype(np.float32)
  alone, _ = _image_features(model, jnp.asarray(p1), prepare_vision_inputs([g1], config))
  both_pix = np.concatenate([p1, p2, 100 * rng.standard_normal((16, 1176)).astype(np.float32)])
  both, _ = _image_features(model, jnp.asarray(both_pix), prepare_vision_inputs([g1, g2], config,
                                                                                num_patches=both_pix.shape[0]))
  np.testing.assert_allclose(np.asarray(both)[: alone.shape[0]], np.asarray(alone), atol=1e-5, rtol=0)
