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
  hf, model, config, shared = loaded[family]
  src = str(tmp_path / "src")   # the session's folder is every test's: this test adds a file to a copy
  shutil.copytree(shared, src)
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


def test_a_missing_shard_is_named_with_its_index_and_a_tensor(tmp_path):
  hf = build_hf("qwen2_5_vl", seed=2)
  hf.save_pretrained(tmp_path / "src")
  model, config = load_hf(tmp_path / "src")
  save_hf(model, config, str(tmp_path / "sharded"), max_shard_bytes=60_000)
  index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
  shard = sorted(set(index["weight_map"].values()))[1]
  first = sorted(k for k, v in index["weight_map"].items() if v == shard)[0]
  os.remove(tmp_path / "sharded" / shard)
  with pytest.raises(CheckpointError, match=rf"shard .*{shard} is missing: .*index\.json maps \d+ tensors to it "
                                            rf"\(first: '{first}'\)"):
    load_hf(tmp_path / "sharded")


def test_an_unknown_architecture_names_config_json(loaded, tmp_path):
  _, _, _, src = loaded["qwen2_5_vl"]
  dst = tmp_path / "llama"
  shutil.copytree(src, dst)
  cfg = json.loads((dst / "config.json").read_text())
  cfg.update(model_type="llama", architectures=["LlamaForCausalLM"])
  (dst / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(CheckpointError, match=r"config\.json: model_type 'llama' "
                                            r"\(architectures \['LlamaForCausalLM'\]\) is not supported"):
    load_hf(dst)
  (dst / "config.json").write_text("{not json")
  with pytest.raises(CheckpointError, match=r"config\.json is not valid JSON"):
    load_hf(dst)


def test_a_tokenizer_of_another_model_names_the_token_file_and_tensor(loaded, tmp_path):
  from guilibra_jax.data.demo_tokenizer import build_demo_tokenizer
  _, _, config, src = loaded["qwen2_5_vl"]
  dst = tmp_path / "mixed"
  shutil.copytree(src, dst)
  # A tokenizer whose vision tokens sit at other ids than config.json's (the demo BPE
  # puts Qwen's special tokens at 0..19; the model says <|image_pad|> = 290).
  build_demo_tokenizer(["click the button", "type hello"], 300, str(dst))
  with pytest.raises(CheckpointError, match=r"tokenizer\.json: token <\|image_pad\|> has id \d+ but config\.json "
                                            r"image_token_id is 290"):
    load_hf(dst)
  # Vision ids right but more tokens than embedding rows.
  tok = json.loads((dst / "tokenizer.json").read_text())
  for t in tok["added_tokens"]:
    t["id"] = {"<|image_pad|>": 290, "<|video_pad|>": 291, "<|vision_start|>": 292, "<|vision_end|>": 293}.get(
        t["content"], t["id"])
  tok["added_tokens"].append({**tok["added_tokens"][0], "id": config.text.vocab_size + 5, "content": "<extra>"})
  (dst / "tokenizer.json").write_text(json.dumps(tok))
  with pytest.raises(CheckpointError, match=rf"tokenizer\.json holds token ids up to {config.text.vocab_size + 5} "
                                            r"but tensor 'model\.embed_tokens\.weight' has 300 rows"):
    load_hf(dst)
