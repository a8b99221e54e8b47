"""LoRA adapters <-> a Hugging Face PEFT adapter folder (``adapter_config.json`` +
``adapter_model.safetensors``) that ``peft.PeftModel.from_pretrained`` loads onto the
transformers Qwen2.5-VL / Qwen3-VL model.

PEFT names a module's tensors ``base_model.model.<module>.lora_A.weight`` [r, in] and
``.lora_B.weight`` [out, r], where <module> is the transformers 5 module path of the
Linear, which is our canonical HF name without ``.weight`` (models/checkpoint.py:
``model.language_model.layers.3.self_attn.q_proj``, ``model.visual.blocks.0.attn.qkv``,
``lm_head``). A layer of stacked (``scan_layers``) adapters is one module per layer.
``target_modules`` lists the adapted modules by full name, so PEFT adapts exactly them.
"""
from __future__ import annotations

import json
import os
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import safe_open
from safetensors.flax import save_file

from guilibra_jax import atomic
from guilibra_jax.lora import LoraSpec, kernel_in_out, kernel_layout
from guilibra_jax.models.checkpoint import CheckpointError, hf_entries
from guilibra_jax.models.config import ModelConfig
from guilibra_jax.param_paths import param_paths

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PREFIX = "base_model.model."
_KEY = re.compile(r"^base_model\.model\.(.+)\.lora_([AB])\.weight$")


def peft_modules(paths, model_config: ModelConfig) -> list[tuple[str, str, int | None]]:
  """(HF module name, our parameter path, layer of a stacked kernel or None) of each
  Linear kernel among ``paths`` ('/'-joined), one per layer for stacked kernels."""
  nested: dict = {}
  for path in paths:
    node = nested
    *mods, leaf = path.split("/")
    for m in mods:
      node = node.setdefault(m, {})
    node[leaf] = 0
  out = []
  for name, spath, layer, _ in hf_entries(nnx.State(nested), model_config):
    out.append((name[: -len(".weight")], "/".join(str(p) for p in spath), layer))
  return out


def adapter_config(spec: LoraSpec, modules: list[str], base_path: str | None) -> dict:
  """The adapter_config.json of PEFT's LoraConfig for ``modules`` (HF module names)."""
  return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_path, "revision": None,
          "r": spec.rank, "lora_alpha": spec.alpha, "lora_dropout": spec.dropout, "target_modules": sorted(modules),
          "bias": "none", "fan_in_fan_out": False, "init_lora_weights": True, "use_rslora": False, "use_dora": False,
          "modules_to_save": None, "rank_pattern": {}, "alpha_pattern": {}, "layers_to_transform": None,
          "layers_pattern": None, "inference_mode": True}


def save_peft_adapter(adapters: dict, spec: LoraSpec, model_config: ModelConfig, base_path: str | None,
                      out_dir: str, dtype=None) -> None:
  """Write ``adapters`` (lora.init_adapters' layout) as a PEFT adapter folder ``out_dir``
  for the base model at ``base_path`` (recorded as base_model_name_or_path), atomically
  (guilibra_jax.atomic). Tensors keep the adapters' dtype unless ``dtype`` is given.
  Host arrays: a multi-host caller gathers the adapters first."""
  tensors, modules = {}, []
  for module, path, layer in peft_modules(adapters, model_config):
    a, b = (jnp.asarray(adapters[path][k]) for k in ("lora_a", "lora_b"))
    if layer is not None:
      a, b = a[layer], b[layer]
    # jnp transposes, not numpy views: see checkpoint.hf_state_dict
    tensors[f"{PREFIX}{module}.lora_A.weight"] = a.T.astype(a.dtype if dtype is None else dtype)   # [r, in]
    tensors[f"{PREFIX}{module}.lora_B.weight"] = b.T.astype(b.dtype if dtype is None else dtype)   # [out, r]
    modules.append(module)
  with atomic.writing_folder(out_dir, "out_dir") as tmp:
    save_file(tensors, os.path.join(tmp, WEIGHTS_FILE), metadata={"format": "pt"})
    with open(os.path.join(tmp, CONFIG_FILE), "w") as f:
      json.dump(adapter_config(spec, modules, None if base_path is None else os.fspath(base_path)), f, indent=2)


def _read_config(path: str) -> dict:
  cfg_path = os.path.join(path, CONFIG_FILE)
  if not os.path.exists(cfg_path):
    raise CheckpointError(f"{path}: no {CONFIG_FILE} (not a PEFT adapter folder)")
  try:
    with open(cfg_path) as f:
      cfg = json.load(f)
  except ValueError as e:
    raise CheckpointError(f"{cfg_path} is not valid JSON: {e}") from None
  plain = {"peft_type": "LORA", "bias": "none", "use_dora": False, "use_rslora": False, "fan_in_fan_out": False,
           "lora_bias": False, "rank_pattern": {}, "alpha_pattern": {}, "modules_to_save": None}
  for key, want in plain.items():
    got = cfg.get(key, want)
    if (got or None) != (want or None):     # None, False, {} and [] all mean "off"
      raise CheckpointError(f"{cfg_path}: {key} is {got!r}; only plain LoRA loads here ({key} {want!r})")
  return cfg


def _same_model(a: str, b: str) -> bool:
  if os.path.exists(a) and os.path.exists(b):
    return os.path.realpath(a) == os.path.realpath(b)
  return os.path.normpath(a) == os.path.normpath(b)


def _read_tensors(w_path: str, modules, family: str) -> dict[str, dict[str, np.ndarray]]:
  """HF module name -> {"A": lora_A.weight, "B": lora_B.weight} of the file; CheckpointError
  for a tensor that is not one of ``modules``' lora_A / lora_B."""
  if not os.path.exists(w_path):
    raise CheckpointError(f"{os.path.dirname(w_path)}: no {WEIGHTS_FILE}")
  found: dict[str, dict[str, np.ndarray]] = {}
  with safe_open(w_path, framework="numpy") as f:
    for key in sorted(f.keys()):
      m = _KEY.match(key)
      if not m or m.group(1) not in modules:
        raise CheckpointError(f"tensor {key!r} in {w_path} is not the lora_A / lora_B weight of a Linear of this "
                              f"{family} model (names look like {PREFIX}{min(modules)}.lora_A.weight)")
      found.setdefault(m.group(1), {})[m.group(2)] = f.get_tensor(key)
  return found


def load_peft_adapter(path: str, params: Any, model_config: ModelConfig, *, base_path: str | None = None,
                      dtype=jnp.float32) -> tuple[dict, LoraSpec]:
  """(adapters, spec) of the PEFT adapter folder ``path`` for our model's ``params``.

  CheckpointError naming the file when: the folder is incomplete, not plain LoRA (DoRA,
  rsLoRA, bias, per-module ranks, modules_to_save), made for another base model
  (``base_path`` given and the adapter's base_model_name_or_path another folder), or a
  tensor names no Linear of our model, lacks its A / B partner, or has another shape.
  A stacked kernel whose file adapts only some layers gets zero adapters on the others
  (the same model). The spec's targets are the adapted paths, anchored; its dropout is 0
  whatever lora_dropout the file gives (dropout changes training only)."""
  path = os.fspath(path)
  atomic.check_complete(path, "adapter")
  cfg = _read_config(path)
  cfg_path = os.path.join(path, CONFIG_FILE)
  found_base = cfg.get("base_model_name_or_path")
  if base_path is not None and found_base and not _same_model(os.fspath(base_path), found_base):
    raise CheckpointError(f"{cfg_path}: the adapter was made for base model {found_base!r}, not {base_path!r}")
  try:
    spec = LoraSpec(int(cfg["r"]), float(cfg["lora_alpha"]), 0.0, (".",))
  except (KeyError, TypeError, ValueError) as e:
    raise CheckpointError(f"{cfg_path}: r / lora_alpha missing or invalid: {e}") from None
  leaves = dict(zip(jax.tree.leaves(param_paths(params)), jax.tree.leaves(params)))
  ours = {m: (p, layer) for m, p, layer in peft_modules([p for p in leaves if kernel_layout(p)], model_config)}
  w_path = os.path.join(path, WEIGHTS_FILE)
  adapters: dict[str, dict[str, jax.Array]] = {}
  for module, ab in sorted(_read_tensors(w_path, ours, model_config.family).items()):
    p, layer = ours[module]
    fan_in, fan_out = kernel_in_out(p, leaves[p].shape)
    for part, want in (("A", (spec.rank, fan_in)), ("B", (fan_out, spec.rank))):
      key = f"{PREFIX}{module}.lora_{part}.weight"
      if part not in ab:
        raise CheckpointError(f"tensor {key!r} is missing in {w_path} (its lora_{'B' if part == 'A' else 'A'} is "
                              f"there)")
      if tuple(ab[part].shape) != want:
        raise CheckpointError(f"tensor {key!r} in {w_path} has shape {tuple(ab[part].shape)}, expected {want} "
                              f"(r {spec.rank}, {p} of our model)")
    a, b = ab["A"].T.astype(dtype), ab["B"].T.astype(dtype)
    if layer is not None:
      n = leaves[p].shape[0]
      entry = adapters.setdefault(p, {"lora_a": np.zeros((n, fan_in, spec.rank), dtype),
                                      "lora_b": np.zeros((n, spec.rank, fan_out), dtype)})
      entry["lora_a"][layer], entry["lora_b"][layer] = a, b
    else:
      adapters[p] = {"lora_a": a, "lora_b": b}
  if not adapters:
    raise CheckpointError(f"{w_path} holds no LoRA tensors")
  adapters = jax.tree.map(jnp.asarray, adapters)
  targets = tuple("^" + re.escape(p) + "$" for p in sorted(adapters))
  return adapters, LoraSpec(spec.rank, spec.alpha, 0.0, targets)
