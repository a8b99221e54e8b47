"""tie_word_embeddings is read as transformers 5 reads it, and save_hf writes both flags alike.

The case that used to differ: a config.json whose ``text_config`` says tied while the top
level says untied. transformers 5 unties Qwen3-VL there (only the top-level flag counts)
and ties Qwen2.5-VL (its config forwards a pre-v5 text_config flag); logits must match
transformers' own load of the same folder either way.
"""
import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from guilibra_jax.models import get_rope_index, load_hf, prepare_vision_inputs, save_hf
from guilibra_jax.models.config import tie_word_embeddings_of
from hf_fixtures import build_hf, image_grid, make_batch, text_tokens


def _logits_pair(path, config, model):
  from transformers import AutoModelForImageTextToText
  hf = AutoModelForImageTextToText.from_pretrained(path).eval()
  ids, mask, mm, grid, pix = make_batch([text_tokens(3, 1) + [("img", image_grid(56, 84))] + text_tokens(4, 2)])
  with torch.no_grad():
    ref = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), mm_token_type_ids=torch.tensor(mm),
             image_grid_thw=torch.tensor(grid), pixel_values=torch.tensor(pix)).logits.numpy()
  pos, _ = get_rope_index(ids, mask, grid, config)
  got = nnx.jit(lambda m, *a: m(*a))(model, jnp.asarray(ids, jnp.int32), jnp.asarray(pos),
                                     jnp.asarray(mask, jnp.int32), jnp.asarray(pix),
                                     prepare_vision_inputs(grid, config))
  return hf, np.asarray(got), ref


@pytest.mark.parametrize("family,head_on_disk,ties", [
    ("qwen3_vl", True, False),     # only the top-level flag counts: untied
    ("qwen2_5_vl", True, False),   # flag forwarded (tied), but a distinct lm_head on disk is kept
    ("qwen2_5_vl", False, True),   # flag forwarded and no lm_head on disk: tied to the embeddings
])
def test_text_config_tied_top_level_untied_loads_as_transformers_does(tmp_path, family, head_on_disk, ties):
  from safetensors.torch import load_file, save_file
  src = tmp_path / "src"
  build_hf(family, tie=False, seed=3).save_pretrained(src)     # separate lm_head.weight on disk
  cfg = json.loads((src / "config.json").read_text())
  cfg["tie_word_embeddings"] = False
  cfg["text_config"]["tie_word_embeddings"] = True
  (src / "config.json").write_text(json.dumps(cfg))
  if not head_on_disk:
    tensors = load_file(src / "model.safetensors")
    tensors.pop("lm_head.weight")
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})

  model, config = load_hf(src)
  hf, got, ref = _logits_pair(src, config, model)
  hf_tied = hf.lm_head.weight.data_ptr() == hf.get_input_embeddings().weight.data_ptr()
  assert hf_tied is ties                                        # transformers' own reading
  assert config.tie_word_embeddings is ties and (model.lm_head is None) is ties
  assert tie_word_embeddings_of(cfg, family) is (family == "qwen2_5_vl")
  scale = np.abs(ref).max()
  assert np.abs(got - ref).max() <= 1e-4 * scale, np.abs(got - ref).max() / scale


@pytest.mark.parametrize("tie", [False, True])
def test_save_hf_writes_both_flags_consistently(tmp_path, tie):
  hf = build_hf("qwen3_vl", tie=tie, seed=4)
  hf.save_pretrained(tmp_path / "src")
  model, config = load_hf(tmp_path / "src")
  save_hf(model, config, str(tmp_path / "out"))
  written = json.loads((tmp_path / "out" / "config.json").read_text())
  assert written["tie_word_embeddings"] is tie and written["text_config"]["tie_word_embeddings"] is tie
  again, config2 = load_hf(tmp_path / "out")
  assert config2.tie_word_embeddings is tie
  _, got, ref = _logits_pair(str(tmp_path / "out"), config2, again)
  assert np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max()
