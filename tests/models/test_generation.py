"""KV-cache prefill + decode steps reproduce the full forward; scan and remat change nothing."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from guilibra_jax.models import QwenVL, get_rope_index, prepare_vision_inputs
from hf_fixtures import image_grid, make_batch, text_tokens


@pytest.mark.parametrize("family,scan", [("qwen2_5_vl", False), ("qwen3_vl", False), ("qwen3_vl", True)])
def test_prefill_and_decode_match_full_forward(loaded, family, scan):
  """With scan_layers the stacked cache is the scan's carry, written in place at each layer
  (Qwen3: deepstack inside the scanned stack)."""
  from guilibra_jax.models import load_hf
  _, model, config, path = loaded[family]
  if scan:
    model, _ = load_hf(path, scan_layers=True)
  n_new = 4
  rows = [text_tokens(2, 1) + [("img", image_grid(56, 84))] + text_tokens(3 + n_new, 2),
          text_tokens(1, 3) + [("img", image_grid(56, 56))] + text_tokens(1 + n_new, 4)]
  ids, mask, _, grid, pix = make_batch(rows)
  positions, _ = get_rope_index(ids, mask, grid, config)
  vision = prepare_vision_inputs(grid, config)
  full = np.asarray(nnx.jit(QwenVL.__call__)(model, jnp.asarray(ids, jnp.int32), jnp.asarray(positions),
                                             jnp.asarray(mask, jnp.int32), jnp.asarray(pix), vision))
  t = ids.shape[1] - n_new  # prompt = all but the last n_new tokens (left padded rows)
  prefill = nnx.jit(QwenVL.prefill, static_argnames="cache_size")
  logits, cache = prefill(model, jnp.asarray(ids[:, :t], jnp.int32), jnp.asarray(positions[:, :, :t]),
                          jnp.asarray(mask[:, :t], jnp.int32), jnp.asarray(pix), vision, cache_size=t + n_new + 3)
  tol = 1e-4 * np.abs(full).max()
  np.testing.assert_allclose(np.asarray(logits), full[:, t - 1], atol=tol, rtol=0)
  decode = nnx.jit(QwenVL.decode_step)
  for i in range(n_new):
    logits, cache = decode(model, jnp.asarray(ids[:, t + i], jnp.int32),
                                                jnp.asarray(positions[:, :, t + i]), cache)
    np.testing.assert_allclose(np.asarray(logits), full[:, t + i], atol=tol, rtol=0)
  assert int(cache["index"]) == t + n_new


def test_scan_layers_and_remat_match_loop(loaded):
  """Qwen3 (deepstack inside the scanned stack): logits and a layer's gradient agree."""
  family = "qwen3_vl"
  from guilibra_jax.models import load_hf
  _, model, config, path = loaded[family]
  scanned, _ = load_hf(path, scan_layers=True, remat="dots_saveable")
  rows = [text_tokens(3, 1) + [("img", image_grid(56, 84))] + text_tokens(4, 2)]
  ids, mask, _, grid, pix = make_batch(rows)
  positions, _ = get_rope_index(ids, mask, grid, config)
  vision = prepare_vision_inputs(grid, config)
  args = (jnp.asarray(ids, jnp.int32), jnp.asarray(positions), jnp.asarray(mask, jnp.int32), jnp.asarray(pix), vision)

  @nnx.jit
  def logits_and_grad(m, *a):
    return nnx.value_and_grad(lambda m: (m(*a) ** 2).mean())(m) + (m(*a),)

  _, g_loop, want = logits_and_grad(model, *args)
  _, g_scan, got = logits_and_grad(scanned, *args)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5 * np.abs(want).max(), rtol=0)
  a = g_loop["language_model"]["layers"][1]["mlp"]["up_proj"]["kernel"][...]
  b = g_scan["language_model"]["layers"]["mlp"]["up_proj"]["kernel"][...][1]
  np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5 * float(jnp.abs(a).max()), rtol=0)


# Deeper towers whose block runs have several blocks (the tiny ones have runs of one):
# Qwen2.5 windowed blocks 0-2 then full block 3; Qwen3 deepstack after block 1, then 2-3.
DEEP_VISION = {"qwen2_5_vl": dict(depth=4, fullatt_block_indexes=[3]),
               "qwen3_vl": dict(depth=4, deepstack_visual_indexes=[1])}


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_scanned_vision_blocks_match_transformers_and_the_loop(tmp_path, family):
  """scan_layers runs consecutive vision blocks in a lax.scan: image features and logits equal
  transformers' (float32 parity tolerance), and a vision block's gradient equals the loop's."""
  import torch
  from guilibra_jax.models import load_hf
  from hf_fixtures import build_hf
  hf = build_hf(family, vision=DEEP_VISION[family], seed=5)
  hf.save_pretrained(tmp_path)
  loop, config = load_hf(str(tmp_path))
  scanned, _ = load_hf(str(tmp_path), scan_layers=True, remat="full")
  rows = [text_tokens(3, 1) + [("img", image_grid(56, 84))] + text_tokens(4, 2)]
  ids, mask, mm, grid, pix = make_batch(rows)
  positions, _ = get_rope_index(ids, mask, grid, config)
  vision = prepare_vision_inputs(grid, config)
  args = (jnp.asarray(ids, jnp.int32), jnp.asarray(positions), jnp.asarray(mask, jnp.int32), jnp.asarray(pix), vision)
  with torch.no_grad():
    ref = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), pixel_values=torch.tensor(pix),
             image_grid_thw=torch.tensor(grid), mm_token_type_ids=torch.tensor(mm)).logits.numpy()

  @nnx.jit
  def logits_and_grad(m, *a):
    return nnx.value_and_grad(lambda m: (m(*a) ** 2).mean())(m) + (m(*a),)

  _, g_loop, want = logits_and_grad(loop, *args)
  _, g_scan, got = logits_and_grad(scanned, *args)
  np.testing.assert_allclose(np.asarray(got), ref, atol=1e-5 * np.abs(ref).max(), rtol=0)
  np.testing.assert_allclose(np.asarray(want), ref, atol=1e-5 * np.abs(ref).max(), rtol=0)
  for block in (0, 2):
    a = g_loop["visual"]["blocks"][block]["attn"]["qkv"]["kernel"][...]
    b = g_scan["visual"]["blocks"][block]["attn"]["qkv"]["kernel"][...]
    assert float(jnp.abs(a).max()) > 0
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5 * float(jnp.abs(a).max()), rtol=0)
