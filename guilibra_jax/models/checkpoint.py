"""Hugging Face safetensors checkpoints <-> QwenVL (never pickle).

Internally every parameter has a canonical HF name in transformers 5's module layout
(`model.language_model.*`, `model.visual.*`, `lm_head.weight`). Files may use the older
Qwen2.5-VL layout (`model.layers.*`, `visual.*`); `load_hf` accepts both, `save_hf` writes
the layout the family's released checkpoints use.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
from typing import Iterator

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import safe_open
from safetensors.flax import save_file

from guilibra_jax.errors import UserError
from guilibra_jax.models.config import FAMILIES, ModelConfig
from guilibra_jax.models.model import QwenVL

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json",
                   "added_tokens.json", "chat_template.json", "chat_template.jinja", "preprocessor_config.json",
                   "video_preprocessor_config.json", "processor_config.json", "generation_config.json")


class CheckpointError(UserError):
  """A checkpoint folder we cannot use: a missing shard, a tensor missing, unexpected or
  mis-shaped, an unsupported architecture, a tokenizer of another model. The message
  names the file (and the tensor or token)."""


# ----------------------------------------------------------------------------- names
def canonical_name(name: str) -> str:
  """File tensor name -> canonical (transformers 5 module) name."""
  if name.startswith("visual."):
    return "model." + name
  for sub in ("layers.", "embed_tokens.", "norm."):
    if name.startswith("model." + sub):
      return "model.language_model." + name[len("model."):]
  return name


def file_name(canonical: str, family: str) -> str:
  """Canonical name -> the name the family's released checkpoints use."""
  if family == "qwen2_5_vl":
    if canonical.startswith("model.visual."):
      return canonical[len("model."):]
    if canonical.startswith("model.language_model."):
      return "model." + canonical[len("model.language_model."):]
  return canonical


def kernel_in_dims(path: tuple) -> int:
  mod, parent = path[-2], path[-3] if len(path) >= 3 else None
  return 2 if mod == "o_proj" or (mod == "proj" and parent == "attn") else 1


def hf_entries(state, config: ModelConfig) -> Iterator[tuple[str, tuple, int | None, str]]:
  """(canonical HF name, state path, layer index for stacked params or None, kind) per HF tensor."""
  for path, _ in nnx.to_flat_state(state):
    path = tuple(path)
    leaf = path[-1]
    if path[0] == "visual" and path[1:3] == ("patch_embed", "proj") and leaf == "kernel":
      kind = "conv"
    elif leaf == "kernel":
      kind = f"linear{kernel_in_dims(path)}"
    elif leaf == "embedding":
      kind = "embed"
    else:
      kind = "flat"  # bias, norm scale / bias: flattened in HF
    mods = [str(p) for p in path[:-1]]
    suffix = "bias" if leaf == "bias" else "weight"
    prefix = "model." + ".".join(mods)
    if mods[0] == "lm_head":
      yield "lm_head.weight", path, None, kind
    elif mods[0] == "language_model" and mods[1] == "layers" and not mods[2].isdigit():  # scanned layers
      for i in range(config.text.num_layers):
        name = "model.language_model.layers.%d.%s.%s" % (i, ".".join(mods[2:]), suffix)
        yield name, path, i, kind
    else:
      yield f"{prefix}.{suffix}", path, None, kind


def _to_hf(value: np.ndarray | jax.Array, kind: str, config: ModelConfig):
  if kind == "conv":  # [C*t*p*p, D] -> [D, C, t, p, p]
    v = config.vision
    return value.T.reshape(v.hidden_size, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size)
  if kind.startswith("linear"):
    n_in = int(kind[-1])
    shape = value.shape
    return value.reshape(math.prod(shape[:n_in]), math.prod(shape[n_in:])).T
  return value.reshape(-1) if kind == "flat" else value


def _from_hf(tensor, kind: str, target_shape: tuple):
  if kind == "conv":
    return tensor.reshape(tensor.shape[0], -1).T.reshape(target_shape)
  if kind.startswith("linear"):
    if tensor.ndim != 2:
      raise ValueError(f"expected a 2-D weight, found shape {tuple(tensor.shape)}")
    return tensor.T.reshape(target_shape)
  return tensor.reshape(target_shape)


def _hf_shape_of(shape: tuple, kind: str, config: ModelConfig) -> tuple:
  if kind == "conv":
    v = config.vision
    return (v.hidden_size, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size)
  if kind.startswith("linear"):
    n_in = int(kind[-1])
    return (math.prod(shape[n_in:]), math.prod(shape[:n_in]))
  return shape if kind == "embed" else (math.prod(shape),)


# ----------------------------------------------------------------------------- load
def _tensor_files(path: str) -> dict[str, str]:
  """tensor name (as in the files) -> file path."""
  index = os.path.join(path, "model.safetensors.index.json")
  if os.path.exists(index):
    try:
      with open(index) as f:
        weight_map = json.load(f)["weight_map"]
    except (ValueError, KeyError) as e:
      raise CheckpointError(f"{index} is not a safetensors index (a JSON object with a 'weight_map'): {e}") from None
    files = {k: os.path.join(path, v) for k, v in weight_map.items()}
    for shard in sorted(set(files.values())):
      if not os.path.exists(shard):
        names = sorted(k for k, v in files.items() if v == shard)
        raise CheckpointError(f"shard {shard} is missing: {index} maps {len(names)} tensors to it (first: "
                              f"{names[0]!r}); copy the whole checkpoint folder")
    return files
  single = os.path.join(path, "model.safetensors")
  if not os.path.exists(single):
    raise CheckpointError(f"{path}: no model.safetensors or model.safetensors.index.json")
  with safe_open(single, framework="flax") as f:
    return {k: single for k in f.keys()}


_EMBED = "model.language_model.embed_tokens.weight"


def _untie_if_distinct_head(config: ModelConfig, files: dict, by_canonical: dict) -> ModelConfig:
  """As transformers' ``from_pretrained``: a config that says tied while the files hold an
  ``lm_head.weight`` different from the input embeddings loads untied (both kept)."""
  if not config.tie_word_embeddings or "lm_head.weight" not in by_canonical or _EMBED not in by_canonical:
    return config
  head, embed = by_canonical["lm_head.weight"], by_canonical[_EMBED]
  with safe_open(files[head], framework="flax") as f:
    a = f.get_tensor(head)
  with safe_open(files[embed], framework="flax") as f:
    b = f.get_tensor(embed)
  if a.shape == b.shape and bool(jnp.array_equal(a, b)):
    return config
  return dataclasses.replace(config, tie_word_embeddings=False)


def read_config(path: str) -> ModelConfig:
  """The ModelConfig of a checkpoint folder; CheckpointError naming config.json when it
  is absent, unreadable, or describes an architecture we do not implement."""
  cfg_path = os.path.join(path, "config.json")
  if not os.path.exists(cfg_path):
    raise CheckpointError(f"{path}: no config.json (not a Hugging Face checkpoint folder)")
  try:
    with open(cfg_path) as f:
      cfg = json.load(f)
  except ValueError as e:
    raise CheckpointError(f"{cfg_path} is not valid JSON: {e}") from None
  if cfg.get("model_type") not in FAMILIES:
    raise CheckpointError(f"{cfg_path}: model_type {cfg.get('model_type')!r} (architectures "
                          f"{cfg.get('architectures')}) is not supported; expected one of {FAMILIES} "
                          f"(Qwen2_5_VLForConditionalGeneration, Qwen3VLForConditionalGeneration)")
  try:
    return ModelConfig.from_hf(cfg)
  except KeyError as e:
    raise CheckpointError(f"{cfg_path} lacks the key {e.args[0]!r} that a {cfg['model_type']} config needs") from None
  except ValueError as e:
    raise CheckpointError(f"{cfg_path}: {e}") from None


SPECIAL_TOKENS = {"<|image_pad|>": "image_token_id", "<|video_pad|>": "video_token_id",
                  "<|vision_start|>": "vision_start_token_id", "<|vision_end|>": "vision_end_token_id"}


def check_tokenizer_files(path: str, config: ModelConfig) -> None:
  """If ``path`` holds a tokenizer.json, check that it belongs to the model: Qwen's
  vision tokens have the ids config.json gives them, and every token id has a row in
  the embedding. CheckpointError naming the file, the token or the tensor otherwise."""
  tok_path = os.path.join(path, "tokenizer.json")
  if not os.path.exists(tok_path):
    return
  try:
    with open(tok_path) as f:
      tok = json.load(f)
  except ValueError as e:
    raise CheckpointError(f"{tok_path} is not valid JSON: {e}") from None
  ids = {t["content"]: int(t["id"]) for t in tok.get("added_tokens") or []}
  vocab = (tok.get("model") or {}).get("vocab") or {}
  for token, key in SPECIAL_TOKENS.items():
    found = ids.get(token, vocab.get(token) if isinstance(vocab, dict) else None)
    if found is not None and found != getattr(config, key):
      raise CheckpointError(f"{tok_path}: token {token} has id {found} but config.json {key} is "
                            f"{getattr(config, key)}: the tokenizer belongs to another model")
  n_ids = 1 + max([*ids.values(), *(vocab.values() if isinstance(vocab, dict) else [len(vocab) - 1]), -1])
  if n_ids > config.text.vocab_size:
    raise CheckpointError(f"{tok_path} holds token ids up to {n_ids - 1} but tensor "
                          f"{file_name('model.language_model.embed_tokens.weight', config.family)!r} has "
                          f"{config.text.vocab_size} rows (config.json vocab_size): the tokenizer belongs to "
                          f"another model")


def load_hf(path: str, dtype=jnp.float32, param_dtype=jnp.float32, mesh=None, **model_kwargs
            ) -> tuple[QwenVL, ModelConfig]:
  """Load a local HF checkpoint folder (config.json + single or sharded safetensors).

  model_kwargs go to QwenVL (remat, scan_layers). Tensors are read and converted on the
  host one parameter at a time; with ``mesh`` each parameter goes straight to its sharding
  (``sharding.param_shardings``), so no device ever holds the whole model (every process
  of a multi-host run reads the files and keeps its own shards). Raises CheckpointError
  naming the tensor and file on a missing, unexpected or mis-shaped tensor.
  """
  path = os.fspath(path)
  config = read_config(path)
  check_tokenizer_files(path, config)
  files = _tensor_files(path)
  by_canonical = {canonical_name(k): k for k in files}
  config = _untie_if_distinct_head(config, files, by_canonical)
  abstract = nnx.eval_shape(lambda: QwenVL(config, dtype=dtype, param_dtype=param_dtype, **model_kwargs))
  gdef, state = nnx.split(abstract)
  entries = list(hf_entries(state, config))
  expected = {e[0] for e in entries}
  unexpected = sorted(k for k in by_canonical if k not in expected and not (
      k == "lm_head.weight" and config.tie_word_embeddings))
  if unexpected:
    k = by_canonical[unexpected[0]]
    raise CheckpointError(f"unexpected tensor {k!r} in {files[k]} ({len(unexpected)} unexpected in all: "
                          f"{[by_canonical[u] for u in unexpected[:5]]})")
  missing = sorted(expected - set(by_canonical))
  if missing:
    raise CheckpointError(f"missing tensor {file_name(missing[0], config.family)!r} in {path} "
                          f"({len(missing)} missing in all: {missing[:5]})")

  handles: dict[str, object] = {}
  stacked: dict[tuple, list] = {}
  flat = dict((tuple(p), v) for p, v in nnx.to_flat_state(state))
  place = _placer(state, mesh)
  values: dict[tuple, jax.Array] = {}
  try:
    for name, spath, layer, kind in entries:
      key = by_canonical[name]
      fpath = files[key]
      if fpath not in handles:
        handles[fpath] = safe_open(fpath, framework="numpy").__enter__()
      tensor = handles[fpath].get_tensor(key)
      target = flat[spath]
      tshape = tuple(target.shape[1:]) if layer is not None else tuple(target.shape)
      want = _hf_shape_of(tshape, kind, config)
      if tuple(tensor.shape) != want:
        raise CheckpointError(f"tensor {key!r} in {fpath} has shape {tuple(tensor.shape)}, expected {want}")
      arr = np.ascontiguousarray(_from_hf(tensor, kind, tshape)).astype(param_dtype)
      if layer is None:
        values[spath] = place(spath, arr)
      else:
        layers = stacked.setdefault(spath, [None] * config.text.num_layers)
        layers[layer] = arr
        if all(x is not None for x in layers):  # the last layer of a stacked parameter
          values[spath] = place(spath, np.stack(layers))
          del stacked[spath]
  finally:
    for h in handles.values():
      h.__exit__(None, None, None)
  for spath, var in flat.items():
    var.set_value(values[spath])
  model = nnx.merge(gdef, nnx.from_flat_state(flat))
  return model, config


def _placer(state, mesh):
  """(state path, host array) -> device array: on the default device, or in the
  parameter's sharding on ``mesh``."""
  if mesh is None:
    return lambda spath, arr: jnp.asarray(arr)
  from guilibra_jax import sharding as S
  flat_sh = dict(_flat_items(S.param_shardings(state, mesh, log=False)))
  return lambda spath, arr: S.put_host(arr, flat_sh[spath])


def _flat_items(tree, prefix=()):
  """(path tuple, leaf) of a nested dict."""
  for k, v in tree.items():
    if isinstance(v, dict):
      yield from _flat_items(v, prefix + (k,))
    else:
      yield prefix + (k,), v


# ----------------------------------------------------------------------------- save
def hf_state_dict(model: QwenVL, dtype=None) -> dict[str, jax.Array]:
  """Canonical HF name -> array in HF layout."""
  config = model.config
  state = nnx.state(model, nnx.Param)
  flat = dict((tuple(p), v) for p, v in nnx.to_flat_state(state))
  out = {}
  for name, spath, layer, kind in hf_entries(state, config):
    # jnp, not numpy: a numpy transpose is a strided view that safetensors.flax writes in
    # memory order, which silently scrambles the weights (seen with device_get'd params).
    value = jnp.asarray(flat[spath].get_value())
    if layer is not None:
      value = value[layer]
    value = _to_hf(value, kind, config)
    out[name] = value.astype(dtype) if dtype is not None else value
  return out


def save_hf(model: QwenVL, config: ModelConfig | None, path: str, *, dtype=None, max_shard_bytes: int = 5 * 2**30,
            tokenizer_dir: str | None = None) -> None:
  """Write config.json + safetensors (sharded with an index when above max_shard_bytes).

  tokenizer_dir: copy tokenizer / processor / generation files found there.
  """
  config = config or model.config
  os.makedirs(path, exist_ok=True)
  hf = config.to_hf()
  tensors = {file_name(k, config.family): v for k, v in hf_state_dict(model, dtype).items()}
  some = next(iter(tensors.values()))
  hf["dtype"] = {jnp.dtype(jnp.bfloat16): "bfloat16", jnp.dtype(jnp.float16): "float16"}.get(
      jnp.dtype(some.dtype), "float32")
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(hf, f, indent=2)
  for old in os.listdir(path):
    if old.startswith("model") and (old.endswith(".safetensors") or old.endswith(".safetensors.index.json")):
      os.remove(os.path.join(path, old))
  shards, cur, size = [], {}, 0
  for k in sorted(tensors):
    n = tensors[k].size * jnp.dtype(tensors[k].dtype).itemsize
    if cur and size + n > max_shard_bytes:
      shards.append(cur)
      cur, size = {}, 0
    cur[k] = tensors[k]
    size += n
  shards.append(cur)
  if len(shards) == 1:
    save_file(shards[0], os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
  else:
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
      fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
      save_file(shard, os.path.join(path, fname), metadata={"format": "pt"})
      for k, v in shard.items():
        weight_map[k] = fname
        total += v.size * jnp.dtype(v.dtype).itemsize
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
      json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
  if tokenizer_dir:
    for fname in TOKENIZER_FILES:
      src = os.path.join(tokenizer_dir, fname)
      if os.path.exists(src):
        shutil.copy(src, os.path.join(path, fname))
