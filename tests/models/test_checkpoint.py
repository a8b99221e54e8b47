"""HF -> load_hf -> save_hf -> transformers reload; errors name the tensor and the file."""
import json
import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from safetensors.torch import load_file, save_file

from guilibra_jax.models import CheckpointError, get_rope_index, load_hf, prepare_vision_inputs, save_hf
from hf_fixtures import build_hf, image_grid, make_batch, text_tokens


def _inputs(config):
  ids, mask, mm, grid, pix = make_batch([text_tokens(3, 1) + [("img", image_grid(56, 84))] + text_tokens(4, 2)])
  return ids, mask, mm, grid, pix


def _torch_logits(model, ids, mask, mm, grid, pix):
  with torch.no_grad():
    return model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), mm_token_type_ids=torch.tensor(mm),
                 image_grid_thw=torch.tensor(grid), pixel_values=torch.tensor(pix)).logits.numpy()


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_round_trip_reloads_in_transformers_with_identical_logits(loaded, tmp_path, family):
  from transformers import AutoModelForImageTextToText
  hf, model, config, src = loaded[family]
  with open(os.path.join(src, "tokenizer_config.json"), "w") as f:
    json.dump({"model_max_length": 128}, f)
  out = tmp_path / "export"
  save_hf(model, config, str(out), tokenizer_dir=src)
  assert (out / "tokenizer_config.json").exists()
  reloaded = AutoModelForImageTextToText.from_pretrained(out).eval()
  assert type(reloaded) is type(hf)
  args = _inputs(config)
  np.testing.assert_array_equal(_torch_logits(reloaded, *args), _torch_logits(hf, *args))
  # Same tensor names as the family's own save_pretrained.
  assert sorted(load_file(out / "model.safetensors")) == sorted(load_file(os.path.join(src, "model.safetensors")))


def test_sharded_bf16_export_and_tied_embeddings(tmp_path):
  from transformers import AutoModelForImageTextToText
  hf = build_hf("qwen3_vl", tie=True, seed=1)
  hf.save_pretrained(tmp_path / "src")
  model, config = load_hf(tmp_path / "src")
  assert config.tie_word_embeddings and model.lm_head is None
  save_hf(model, config, str(tmp_path / "out"), max_shard_bytes=100_000)
  index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
  assert len(set(index["weight_map"].values())) > 1 and "lm_head.weight" not in index["weight_map"]
  again, _ = load_hf(tmp_path / "out")
  ids, mask, _, grid, pix = _inputs(config)
  pos, _ = get_rope_index(ids, mask, grid, config)
  args = (jnp.asarray(ids, jnp.int32), jnp.asarray(pos), jnp.asarray(mask, jnp.int32), jnp.asarray(pix),
          prepare_vision_inputs(grid, config))
  fwd = nnx.jit(lambda m, *a: m(*a))
  np.testing.assert_array_equal(np.asarray(fwd(again, *args)), np.asarray(fwd(model, *args)))
  reloaded = AutoModelForImageTextToText.from_pretrained(tmp_path / "out").eval()
  np.testing.assert_array_equal(_torch_logits(reloaded, *_inputs(config)), _torch_logits(hf, *_inputs(config)))
  save_hf(model, config, str(tmp_path / "bf16"), dtype=jnp.bfloat16)
  assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"
  assert load_file(tmp_path / "bf16" / "model.safetensors")["model.visual.pos_embed.weight"].dtype == torch.bfloat16


def _edited_copy(src, dst, edit):
  shutil.copytree(src, dst)
  tensors = load_file(os.path.join(dst, "model.safetensors"))
  edit(tensors)
  save_file(tensors, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
  return dst


def test_missing_unexpected_and_misshaped_tensors_are_named(loaded, tmp_path):
  _, _, _, src = loaded["qwen2_5_vl"]
  name = "model.layers.1.self_attn.k_proj.bias"
  path = _edited_copy(src, tmp_path / "missing", lambda t: t.pop(name))
  with pytest.raises(CheckpointError, match=r"missing tensor 'model\.layers\.1\.self_attn\.k_proj\.bias'"):
    load_hf(path)
  path = _edited_copy(src, tmp_path / "unexpected", lambda t: t.update({"visual.extra.weight": torch.zeros(2)}))
  with pytest.raises(CheckpointError, match=r"unexpected tensor 'visual\.extra\.weight' in .*model\.safetensors"):
    load_hf(path)
  path = _edited_copy(src, tmp_path / "shape",
                      lambda t: t.update({"visual.blocks.0.attn.qkv.weight": torch.zeros(96, 31)}))
  with pytest.raises(CheckpointError, match=r"'visual\.blocks\.0\.attn\.qkv\.weight' in .*model\.safetensors has "
                                            r"shape \(96, 31\), expected \(96, 32\)"):
    load_hf(path)


def test_save_hf_of_host_numpy_params_equals_device_params(tmp_path):
  """Regression: params fetched with jax.device_get (numpy) once exported transposed kernels
  as strided views, which safetensors wrote in memory order (scrambled weights)."""
  import jax
  import numpy as np
  from flax import nnx
  from safetensors.numpy import load_file

  from guilibra_jax import models as M
  from guilibra_jax.train import fake_batch as F
  nnx.use_eager_sharding(False)
  cfg = F.tiny_config()
  model = M.QwenVL(cfg, rngs=nnx.Rngs(0))
  graphdef, pstate, _ = nnx.split(model, nnx.Param, ...)
  host = nnx.merge(graphdef, jax.device_get(nnx.to_pure_dict(pstate)))
  M.save_hf(model, cfg, str(tmp_path / "dev"))
  M.save_hf(host, cfg, str(tmp_path / "host"))
  a = load_file(str(tmp_path / "dev" / "model.safetensors"))
  b = load_file(str(tmp_path / "host" / "model.safetensors"))
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)
