"""LoRA adapters (guilibra_jax.lora) and their PEFT export (guilibra_jax.lora_export).

Fresh adapters leave the model exactly as it was; merge is W + alpha/r * A @ B against
numpy and its gradient the analytic one; ``peft.PeftModel.from_pretrained`` loads our export
onto the transformers model, whose logits then equal ours with the merged weights; the
export reads back exactly; bad specs and bad files are one-line errors naming the key or
the file. Tiny random models of both families (tests/models/hf_fixtures.py)."""
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

from guilibra_jax.errors import ConfigError
from guilibra_jax.lora import LoraSpec, adapted_paths, init_adapters, merge
from guilibra_jax.lora_export import load_peft_adapter, save_peft_adapter
from guilibra_jax.models import CheckpointError, get_rope_index, load_hf, prepare_vision_inputs
from guilibra_jax.param_paths import param_paths
from tests.float_tolerance import assert_f32_close

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "models"))
from hf_fixtures import build_hf, image_grid, make_batch, text_tokens  # noqa: E402

# Every Linear kernel: text attention and MLP, vision blocks, patch mergers, lm_head.
ALL_LINEAR = (r"^(?!visual/patch_embed/).*/kernel$",)
ROWS = [text_tokens(4, 1) + [("img", image_grid(56, 84))] + text_tokens(5, 2), text_tokens(9, 3)]
T_PAD, P_PAD = 32, 64
REL_TOL = 1e-5   # as tests/models/test_parity.py: float32 ours vs transformers


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
  """family -> saved tiny HF checkpoint folder."""
  out = {}
  for family in ("qwen2_5_vl", "qwen3_vl"):
    path = str(tmp_path_factory.mktemp(family))
    build_hf(family).save_pretrained(path)
    out[family] = path
  return out


@pytest.fixture(scope="module")
def models(folders):
  """(family, scan_layers) -> (jax model, ModelConfig, pure-dict params)."""
  cache = {}

  def get(family, scan):
    if (family, scan) not in cache:
      model, config = load_hf(folders[family], scan_layers=scan)
      cache[family, scan] = model, config, nnx.to_pure_dict(nnx.state(model, nnx.Param))
    return cache[family, scan]
  return get


def _with_params(model, params):
  graphdef, state, rest = nnx.split(model, nnx.Param, ...)
  state = jax.tree.map(lambda x: x, state)
  nnx.replace_by_pure_dict(state, params)
  return nnx.merge(graphdef, state, rest)


@nnx.jit
def _forward(model, ids, positions, segment_ids, pixel_values, vision):
  return model(ids, positions, segment_ids, pixel_values, vision)


def _inputs(config):
  ids, mask, mm, grid, pix = make_batch(ROWS, pad_to=T_PAD)
  positions, _ = get_rope_index(ids, mask, grid, config)
  return ids, mask, mm, grid, pix, positions


def _jax_logits(model, config):
  ids, mask, _, grid, pix, positions = _inputs(config)
  pixels = jnp.asarray(np.pad(pix, ((0, P_PAD - pix.shape[0]), (0, 0))))
  vision = prepare_vision_inputs(grid, config, num_patches=P_PAD)
  return np.asarray(_forward(model, jnp.asarray(ids, jnp.int32), jnp.asarray(positions), jnp.asarray(mask, jnp.int32),
                             pixels, vision)), mask.astype(bool)


def _torch_logits(hf, config):
  import torch
  ids, mask, mm, grid, pix, _ = _inputs(config)
  with torch.no_grad():
    return hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), pixel_values=torch.tensor(pix),
              image_grid_thw=torch.tensor(grid), mm_token_type_ids=torch.tensor(mm)).logits.numpy()


def _random_adapters(params, spec, seed=0):
  """Adapters with A as initialised and B random (non-zero): the model changes by ~its weights' size."""
  adapters = init_adapters(params, spec, jax.random.key(seed))
  keys = jax.random.split(jax.random.key(seed + 1), len(adapters))
  return {p: {"lora_a": ab["lora_a"], "lora_b": 0.05 * jax.random.normal(k, ab["lora_b"].shape)}
          for k, (p, ab) in zip(keys, sorted(adapters.items()))}


def _flat(tree):
  return dict(zip(jax.tree.leaves(param_paths(tree)), jax.tree.leaves(tree)))


# ----------------------------------------------------------------------------- merge

@pytest.mark.parametrize("family,scan", [("qwen2_5_vl", False), ("qwen3_vl", True)])
def test_fresh_adapters_give_the_base_model_exactly(models, family, scan):
  model, config, params = models(family, scan)
  spec = LoraSpec(4, 8.0, 0.0, ALL_LINEAR)
  adapters = init_adapters(params, spec, jax.random.key(0))
  assert adapters and all(float(jnp.abs(ab["lora_a"]).max()) > 0 for ab in adapters.values())
  merged = merge(params, adapters, spec)
  flat = _flat(merged)
  for path, w in _flat(params).items():
    np.testing.assert_array_equal(np.asarray(flat[path]), np.asarray(w), err_msg=path)
  base, real = _jax_logits(model, config)
  got, _ = _jax_logits(_with_params(model, merged), config)
  np.testing.assert_array_equal(got[real], base[real])


def test_init_follows_peft_kaiming_uniform(models):
  _, _, params = models("qwen2_5_vl", True)
  adapters = init_adapters(params, LoraSpec(8, 16.0, 0.0, ALL_LINEAR), jax.random.key(0))
  a = np.asarray(adapters["language_model/layers/mlp/down_proj/kernel"]["lora_a"])   # [L, in=96, r]
  assert a.shape == (2, 96, 8)
  bound = 1 / np.sqrt(96)        # kaiming_uniform_(a=sqrt(5)): gain sqrt(1/3) * sqrt(3 / fan_in)
  assert np.abs(a).max() <= bound and np.abs(a).max() > 0.95 * bound
  assert abs(a.std() - bound / np.sqrt(3)) < 0.1 * bound / np.sqrt(3)
  assert not np.array_equal(a[0], a[1])      # layers drawn independently


def test_merge_is_base_plus_scaled_product(models):
  _, _, params = models("qwen3_vl", True)
  spec = LoraSpec(4, 12.0, 0.0, ALL_LINEAR)
  adapters = _random_adapters(params, spec)
  merged = _flat(merge(params, adapters, spec))
  for path, w in _flat(params).items():
    w = np.asarray(w)
    if path not in adapters:
      np.testing.assert_array_equal(np.asarray(merged[path]), w, err_msg=path)
      continue
    a, b = (np.asarray(adapters[path][k], np.float64) for k in ("lora_a", "lora_b"))
    ref = w + 3.0 * np.matmul(a, b).reshape(w.shape)
    assert_f32_close(merged[path], ref, n_terms=4, err_msg=path)
  assert {"language_model/layers/self_attn/o_proj/kernel", "visual/blocks/0/attn/qkv/kernel",
          "visual/deepstack_merger_list/1/linear_fc2/kernel", "lm_head/kernel"} <= set(adapters)


def test_grad_of_merge_is_the_analytic_form():
  """dL/dA = s dL/dW B^T and dL/dB = s A^T dL/dW, for a stacked o_proj-shaped kernel
  [L, N, H, D] (two input dims) and a vision qkv [D, 3, N, H] (three output dims)."""
  rng = np.random.default_rng(0)
  params = {"language_model": {"layers": {"self_attn": {"o_proj": {"kernel": rng.normal(size=(2, 3, 4, 5))}}}},
            "visual": {"blocks": {0: {"attn": {"qkv": {"kernel": rng.normal(size=(6, 3, 2, 2))}}}}}}
  params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)
  spec = LoraSpec(2, 3.0, 0.0, ("o_proj", "qkv"))
  adapters = _random_adapters(params, spec)
  weights = {p: jnp.asarray(rng.normal(size=w.shape), jnp.float32) for p, w in _flat(params).items()}

  def loss(ad):
    return sum(jnp.sum(weights[p] * jnp.tanh(w)) for p, w in _flat(merge(params, ad, spec)).items())

  grads = jax.jit(jax.grad(loss))(adapters)
  merged = _flat(merge(params, adapters, spec))
  s = spec.alpha / spec.rank
  for path, (n_lead, fan_in) in {"language_model/layers/self_attn/o_proj/kernel": (1, 12),
                                 "visual/blocks/0/attn/qkv/kernel": (0, 6)}.items():
    g_w = np.asarray(weights[path] * (1 - jnp.tanh(merged[path]) ** 2), np.float64)   # dL/dW'
    g_w = g_w.reshape(g_w.shape[:n_lead] + (fan_in, -1))
    a, b = (np.asarray(adapters[path][k], np.float64) for k in ("lora_a", "lora_b"))
    np.testing.assert_allclose(grads[path]["lora_a"], s * g_w @ np.swapaxes(b, -1, -2), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grads[path]["lora_b"], s * np.swapaxes(a, -1, -2) @ g_w, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- PEFT

@pytest.mark.parametrize("family,scan", [("qwen2_5_vl", False), ("qwen3_vl", True)])
def test_peft_loads_our_adapter_with_our_logits(models, folders, tmp_path, family, scan):
  peft = pytest.importorskip("peft")
  model, config, params = models(family, scan)
  spec = LoraSpec(4, 8.0, 0.0, ALL_LINEAR)
  adapters = _random_adapters(params, spec)
  out = str(tmp_path / "adapter")
  save_peft_adapter(adapters, spec, config, folders[family], out)
  ours, real = _jax_logits(_with_params(model, merge(params, adapters, spec)), config)
  base, _ = _jax_logits(model, config)

  hf = peft.PeftModel.from_pretrained(build_hf(family), out).eval()
  n_lora = sum(1 for name, _ in hf.named_modules() if name.endswith(".lora_A.default"))
  with open(os.path.join(out, "adapter_config.json")) as f:
    n_targets = len(json.load(f)["target_modules"])
  assert n_lora == n_targets
  assert n_targets > len(adapters) if scan else n_targets == len(adapters)   # stacked: one module per layer
  ref = _torch_logits(hf, config)
  scale = np.abs(ref[real]).max()
  assert np.abs(ours - ref)[real].max() <= REL_TOL * scale
  assert np.abs(base - ref)[real].max() > 100 * REL_TOL * scale     # the adapters do change the model


@pytest.mark.parametrize("family,scan", [("qwen2_5_vl", True), ("qwen3_vl", False)])
def test_export_reads_back_exactly(models, folders, tmp_path, family, scan):
  _, config, params = models(family, scan)
  spec = LoraSpec(4, 8.0, 0.0, (r"self_attn/[qv]_proj/kernel", "attn/qkv/kernel", "mlp/down_proj/kernel$"))
  adapters = _random_adapters(params, spec)
  out = str(tmp_path / "adapter")
  save_peft_adapter(adapters, spec, config, folders[family], out)
  got, got_spec = load_peft_adapter(out, params, config, base_path=folders[family])
  assert sorted(got) == sorted(adapters)
  for path, ab in adapters.items():
    for k in ("lora_a", "lora_b"):
      np.testing.assert_array_equal(np.asarray(got[path][k]), np.asarray(ab[k]), err_msg=f"{path} {k}")
  assert (got_spec.rank, got_spec.alpha) == (spec.rank, spec.alpha)
  assert adapted_paths(params, got_spec) == adapted_paths(params, spec)
  save_peft_adapter(adapters, spec, config, folders[family], out, dtype=jnp.bfloat16)   # replaces the folder
  got, _ = load_peft_adapter(out, params, config)
  for path, ab in adapters.items():
    for k in ("lora_a", "lora_b"):
      np.testing.assert_array_equal(got[path][k], ab[k].astype(jnp.bfloat16).astype(jnp.float32))


# ----------------------------------------------------------------------------- errors

@pytest.mark.parametrize("kwargs,key,shown", [
    (dict(targets=("no_such_module",)), "model.lora.targets", "'no_such_module' matches no parameter path"),
    (dict(targets=("embed_tokens",)), "model.lora.targets", "embed_tokens/embedding"),
    (dict(targets=("input_layernorm",)), "model.lora.targets", "input_layernorm/scale"),
    (dict(targets=("q_proj",)), "model.lora.targets", "q_proj/bias"),
    (dict(targets=("patch_embed",)), "model.lora.targets", "patch_embed/proj/kernel"),
    (dict(rank=0), "model.lora.rank", "0"),
    (dict(rank=33, targets=("visual/blocks/0/attn/qkv/kernel",)), "model.lora.rank", "min(in, out) = 32"),
    (dict(dropout=0.1), "model.lora.dropout", "per token"),
    (dict(alpha=float("nan")), "model.lora.alpha", "nan"),
])
def test_bad_spec_is_a_config_error_naming_the_key(models, kwargs, key, shown):
  _, _, params = models("qwen2_5_vl", False)
  with pytest.raises(ConfigError) as e:
    spec = LoraSpec(**{"rank": 4, "alpha": 8.0, "dropout": 0.0, "targets": ALL_LINEAR, **kwargs})
    init_adapters(params, spec, jax.random.key(0))
  assert key in str(e.value) and shown in str(e.value) and "\n" not in str(e.value)


def test_load_refuses_another_base_or_shape_naming_the_file(models, folders, tmp_path):
  _, config, params = models("qwen2_5_vl", False)
  spec = LoraSpec(2, 4.0, 0.0, ("self_attn/q_proj/kernel",))
  out = str(tmp_path / "adapter")
  save_peft_adapter(init_adapters(params, spec, jax.random.key(0)), spec, config, folders["qwen2_5_vl"], out)
  with pytest.raises(CheckpointError, match="adapter_config.json: the adapter was made for base model"):
    load_peft_adapter(out, params, config, base_path=folders["qwen3_vl"])
  _, config3, params3 = models("qwen3_vl", False)
  save_peft_adapter(init_adapters(params3, LoraSpec(2, 4.0, 0.0, ("linear_fc1/kernel",)), jax.random.key(0)),
                    spec, config3, None, str(tmp_path / "qwen3"))
  with pytest.raises(CheckpointError, match=r"adapter_model.safetensors is not the lora_A / lora_B weight"):
    load_peft_adapter(str(tmp_path / "qwen3"), params, config)
  with open(os.path.join(out, "adapter_config.json")) as f:
    dora = {**json.load(f), "use_dora": True}
  os.makedirs(tmp_path / "dora")
  with open(tmp_path / "dora" / "adapter_config.json", "w") as f:
    json.dump(dora, f)
  with pytest.raises(CheckpointError, match=r"dora/adapter_config.json: use_dora is True; only plain LoRA"):
    load_peft_adapter(str(tmp_path / "dora"), params, config)
  weights = os.path.join(out, "adapter_model.safetensors")
  tensors = load_file(weights)
  key = "base_model.model.model.language_model.layers.1.self_attn.q_proj.lora_A.weight"
  tensors[key] = np.zeros((2, 65), np.float32)
  save_file(tensors, weights, metadata={"format": "pt"})
  os.remove(os.path.join(out, "guilibra_complete.json"))     # hand-edited: no longer our complete output
  with pytest.raises(CheckpointError, match=rf"{key}' in .*adapter_model.safetensors has shape \(2, 65\), "
                                            r"expected \(2, 64\)"):
    load_peft_adapter(out, params, config)
