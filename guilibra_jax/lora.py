"""LoRA adapters on the model's Linear kernels, as pure functions on parameter trees.

An adapted kernel W of HF shape [out, in] (ours: [*in_dims, *out_dims], see
models/layers.py) gets A [in, r] and B [r, out] (in / out: the products of its input /
output dims, flattened as in the HF checkpoint) and reads, at the forward,

    W' = W + (alpha / r) * (A @ B).reshape(W.shape)        # merge()

which is PEFT's ``y = W x + (alpha / r) * B(A(x))`` with PEFT's lora_A.weight = A^T [r, in]
and lora_B.weight = B^T [out, r]. Text layers stacked by ``scan_layers`` ([L, *in, *out])
get stacked adapters A [L, in, r], B [L, r, out].

Parameters are the trainers' pure dict (``nnx.to_pure_dict(nnx.state(model, nnx.Param))``)
and targets are regexes ``re.search``-ed over its '/'-joined paths, as ``optim.freeze``
("language_model/layers/0/self_attn/q_proj/kernel"). Adapters are a flat dict
``{param path: {"lora_a": A, "lora_b": B}}``: a pytree for optax and checkpoints.

Adaptable: every Linear kernel (text q/k/v/o and gate/up/down, the vision tower's qkv /
proj / MLPs, the patch mergers, an untied lm_head); not the patch embedding (a Conv3d in
HF), embeddings, norms or biases.

QLoRA (``model.quantize``): the adapted kernels of the frozen base are stored blockwise
quantized (:mod:`guilibra_jax.quantize`, int8 or nf4; :func:`quantize_base`) and ``merge``
dequantizes each one before adding its A @ B.

Dropout: none. Merging at the forward applies one W' to every token, so it cannot drop
PEFT's per-token LoRA input (``B(A(dropout(x)))``); ``dropout > 0`` is a ConfigError.
"""
from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import jax
import jax.numpy as jnp

from guilibra_jax import choices as CH
from guilibra_jax import quantize as Q
from guilibra_jax.errors import ConfigError
from guilibra_jax.models.checkpoint import kernel_in_dims
from guilibra_jax.param_paths import param_paths, unmatched_patterns

TEXT_TARGETS = CH.LORA_TEXT_TARGETS   # the decoder's attention and MLP projections


@dataclasses.dataclass(frozen=True)
class LoraSpec:
  """rank r, alpha (scale alpha / r), dropout (must be 0, see the module docstring) and
  targets (regexes over parameter paths; config key model.lora.targets)."""
  rank: int
  alpha: float
  dropout: float = 0.0
  targets: tuple[str, ...] = TEXT_TARGETS

  def __post_init__(self):
    if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
      raise ConfigError(f"config key model.lora.rank: {self.rank!r} is not a rank; expected an integer >= 1")
    if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or not (
        math.isfinite(self.alpha) and self.alpha > 0):
      raise ConfigError(f"config key model.lora.alpha: {self.alpha!r}; expected a finite number > 0")
    if self.dropout != 0:
      raise ConfigError(f"config key model.lora.dropout: {self.dropout!r} is not supported: adapters are merged "
                        f"into the weights at the forward (W + alpha/r * A @ B), which cannot drop the LoRA input "
                        f"per token as PEFT's lora_dropout does; set 0.0")
    if isinstance(self.targets, str) or not self.targets:
      raise ConfigError(f"config key model.lora.targets: {self.targets!r}; expected a non-empty tuple of regexes")
    object.__setattr__(self, "targets", tuple(self.targets))
    for pattern in self.targets:
      try:
        re.compile(pattern)
      except (re.error, TypeError) as e:
        raise ConfigError(f"config key model.lora.targets: {pattern!r} is not a regex: {e}") from None

  @property
  def scale(self) -> float:
    return self.alpha / self.rank


def kernel_layout(path: str) -> tuple[bool, int] | None:
  """(stacked over layers, number of input dims) of the Linear kernel at ``path``, or None
  for a parameter LoRA cannot adapt (the conv patch embedding, embeddings, norms, biases)."""
  parts = tuple(path.split("/"))
  if parts[-1] != "kernel" or parts[:3] == ("visual", "patch_embed", "proj"):
    return None
  stacked = parts[:2] == ("language_model", "layers") and not parts[2].isdigit()
  return stacked, kernel_in_dims(parts)


def kernel_in_out(path: str, shape: tuple) -> tuple[int, int]:
  """(in, out) of the HF Linear that the kernel of ``shape`` at ``path`` is."""
  stacked, n_in = kernel_layout(path)
  dims = tuple(shape[1:]) if stacked else tuple(shape)
  return math.prod(dims[:n_in]), math.prod(dims[n_in:])


def _flat_paths(params: Any) -> dict[str, Any]:
  """'/'-joined path -> leaf."""
  return dict(zip(jax.tree.leaves(param_paths(params)), jax.tree.leaves(params)))


def adapted_paths(params: Any, spec: LoraSpec) -> list[str]:
  """The sorted paths of the kernels ``spec`` adapts in ``params``. ConfigError naming
  model.lora.targets for a pattern that matches no path or a parameter that is not a
  Linear kernel, and model.lora.rank for a rank above min(in, out) of a matched layer."""
  leaves = _flat_paths(params)
  unmatched = unmatched_patterns(params, spec.targets)
  if unmatched:
    example = ", ".join(list(leaves)[:3])
    raise ConfigError(f"config key model.lora.targets: pattern {unmatched[0]!r} matches no parameter path (paths "
                      f"look like {example}; re.search over '/'-joined paths)")
  out = []
  for path, leaf in leaves.items():
    pattern = next((p for p in spec.targets if re.search(p, path)), None)
    if pattern is None:
      continue
    if kernel_layout(path) is None:
      raise ConfigError(f"config key model.lora.targets: pattern {pattern!r} matches {path} of shape "
                        f"{tuple(leaf.shape)}, which is not a Linear kernel (LoRA adapts Linear kernels only, "
                        f"not embeddings, norms, biases or the patch embedding); anchor the pattern, e.g. "
                        f"'.../kernel$'")
    fan_in, fan_out = kernel_in_out(path, leaf.shape)
    if spec.rank > min(fan_in, fan_out):
      raise ConfigError(f"config key model.lora.rank: {spec.rank} exceeds min(in, out) = {min(fan_in, fan_out)} "
                        f"of {path} (in {fan_in}, out {fan_out})")
    out.append(path)
  return sorted(out)


def init_adapters(params: Any, spec: LoraSpec, rng: jax.Array, dtype=jnp.float32
                  ) -> dict[str, dict[str, jax.Array]]:
  """Fresh adapters for the kernels ``spec`` adapts: A as PEFT's default
  (``kaiming_uniform_(a=sqrt(5))`` of lora_A.weight [r, in], i.e. U(-1/sqrt(in), 1/sqrt(in))),
  B zeros, so that merge() returns ``params`` exactly. ``params`` may be abstract
  (ShapeDtypeStructs): only shapes are read."""
  leaves = _flat_paths(params)
  paths = adapted_paths(params, spec)
  out = {}
  for path, key in zip(paths, jax.random.split(rng, len(paths))):
    shape = tuple(leaves[path].shape)
    fan_in, fan_out = kernel_in_out(path, shape)
    lead = shape[:1] if kernel_layout(path)[0] else ()
    bound = 1.0 / math.sqrt(fan_in)
    out[path] = {"lora_a": jax.random.uniform(key, lead + (fan_in, spec.rank), dtype, -bound, bound),
                 "lora_b": jnp.zeros(lead + (spec.rank, fan_out), dtype)}
  return out


def delta(kernel_shape: tuple, a: jax.Array, b: jax.Array) -> jax.Array:
  """A @ B ([L,] in, out) in the kernel's own shape."""
  return jnp.matmul(a, b, precision=jax.lax.Precision.HIGHEST).reshape(kernel_shape)


def merge(params: Any, adapters: dict[str, dict[str, jax.Array]], spec: LoraSpec) -> Any:
  """``params`` with W + (alpha / r) * A @ B in place of each adapted kernel (computed in the
  wider of the two dtypes, returned in W's; a quantized W is dequantized first). Jit-able,
  differentiable in ``adapters``."""
  paths = param_paths(params)
  missing = sorted(set(adapters) - set(jax.tree.leaves(paths)))
  if missing:
    raise ValueError(f"adapters for {missing[0]} ({len(missing)} in all) have no parameter in params")

  def one(w, path):
    if Q.is_quantized(w):
      w = Q.dequantize(w)
    if path not in adapters:
      return w
    a, b = adapters[path]["lora_a"], adapters[path]["lora_b"]
    wide = jnp.promote_types(w.dtype, jnp.result_type(a, b))
    return (w.astype(wide) + spec.scale * delta(w.shape, a, b).astype(wide)).astype(w.dtype)

  return jax.tree.map(one, params, paths, is_leaf=Q.is_quantized)


def quantize_base(params: Any, paths: list[str], kind: str) -> Any:
  """``params`` with each kernel at ``paths`` as a :class:`quantize.QuantizedKernel` of
  ``kind`` (jit-able; abstract ``params`` give abstract codes and scales)."""
  keep = set(paths)

  def one(w, path):
    if path not in keep:
      return w
    if isinstance(w, jax.ShapeDtypeStruct):
      return Q.abstract_quantized(w, kind, path)
    return Q.quantize(w, kind, path)

  return jax.tree.map(one, params, param_paths(params))


def dequantize_base(params: Any) -> Any:
  """``params`` with every quantized kernel back in its dtype (the base without adapters)."""
  return jax.tree.map(lambda w: Q.dequantize(w) if Q.is_quantized(w) else w, params, is_leaf=Q.is_quantized)
