"""get_rope_index equals transformers' model.model.get_rope_index."""
import numpy as np
import pytest
import torch

from guilibra_jax.models import get_rope_index
from hf_fixtures import image_grid, make_batch, text_tokens

CASES = {
    "text_only_left_pad": [text_tokens(7, 1), text_tokens(4, 2)],
    "one_image": [text_tokens(3, 1) + [("img", image_grid(56, 84))] + text_tokens(5, 2)],
    "two_images_one_row": [text_tokens(2, 1) + [("img", image_grid(56, 84))] + text_tokens(3, 2)
                           + [("img", image_grid(112, 56))] + text_tokens(2, 3)],
    "batch_left_pad": [text_tokens(3, 1) + [("img", image_grid(84, 56))] + text_tokens(9, 2),
                       text_tokens(2, 3) + [("img", image_grid(56, 56))] + text_tokens(1, 4)
                       + [("img", image_grid(56, 112))]],
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_rope_index_matches_transformers(loaded, family, case):
  hf, _, config, _ = loaded[family]
  ids, mask, mm, grid, _ = make_batch(CASES[case], pad_to=None)
  pos, deltas = get_rope_index(ids, mask, grid, config)
  ref_pos, ref_deltas = hf.model.get_rope_index(
      torch.tensor(ids), mm_token_type_ids=torch.tensor(mm),
      image_grid_thw=None if grid is None else torch.tensor(grid), attention_mask=torch.tensor(mask))
  assert pos.dtype == np.int32 and pos.shape == (3,) + ids.shape
  np.testing.assert_array_equal(pos, ref_pos.numpy())
  np.testing.assert_array_equal(deltas, ref_deltas.numpy()[:, 0])


def test_rope_index_rejects_grid_count_mismatch(loaded):
  _, _, config, _ = loaded["qwen2_5_vl"]
  ids, mask, _, grid, _ = make_batch([[1, ("img", image_grid(56, 56)), 2]])
  with pytest.raises(ValueError, match="image_grid_thw"):
    get_rope_index(ids, mask, np.concatenate([grid, grid]), config)
