"""LoRA in a run (``model.lora.rank > 0``): the adapters are the train state's
``params`` (so the optimizer, checkpoints and resume hold only them), the base weights
are a frozen argument of the jitted step (never checkpointed: a resumed run reads them
again from ``model.hf_path``, or re-creates the seeded random init), and the model's
parameters for evaluation and export are ``lora.merge(base, adapters)``.

    frozen = FrozenBase.build(config, params, param_sh, mesh)   # None when LoRA is off
    state = sharded_state(frozen.adapters, tx, frozen.adapter_sh, mesh)
    step(state, batch, frozen.base)                          # the trainer's jitted step
    frozen.merged(state["params"])                           # evaluation, export
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from guilibra_jax import lora as L
from guilibra_jax import quantize as Q
from guilibra_jax import sharding as S
from guilibra_jax.errors import ConfigError
from guilibra_jax.train.checkpoint import write_json

log = logging.getLogger(__name__)

ADAPTER_DIR = "adapter"     # <workdir>/adapter: the PEFT adapter the run exports next to export/


def lora_spec(config) -> L.LoraSpec | None:
    """The run's :class:`lora.LoraSpec`, or None when ``model.lora.rank`` is 0 (full fine-tuning)."""
    lo = config.model.lora
    if not lo.rank:
        return None
    return L.LoraSpec(int(lo.rank), float(lo.alpha), float(lo.dropout), tuple(lo.targets))


@dataclasses.dataclass
class FrozenBase:
    """The frozen base weights of a LoRA run on the mesh (with ``model.quantize`` its adapted
    kernels as :class:`quantize.QuantizedKernel`), the spec, fresh adapters (replicated:
    r x (in + out) per adapted kernel) with their shardings, and ``param_sh``: the shardings
    of the model's plain parameters (what :meth:`merged` returns)."""

    spec: L.LoraSpec
    base: Any
    base_sh: Any
    adapters: Any
    adapter_sh: Any
    param_sh: Any
    quantize: str = ""

    @classmethod
    def build(cls, config, params, param_sh, mesh, *, materialize: bool = True) -> "FrozenBase | None":
        """None without LoRA; ConfigError naming model.lora.* for targets that match no
        parameter or no Linear kernel, or a rank above a layer's min(in, out).
        ``materialize=False``: abstract base and adapters (ShapeDtypeStructs with their
        shardings) for ahead-of-time plans; ``params`` may then be abstract."""
        spec, kind = lora_spec(config), config.model.quantize
        if kind and kind not in Q.KINDS:
            raise ConfigError(f"config key model.quantize = {kind!r} is invalid: expected one of {('',) + Q.KINDS}")
        if kind and spec is None:
            raise ConfigError(f"config key model.quantize = {kind!r} needs model.lora.rank > 0: a quantized base "
                              f"is frozen, only adapters can train on it")
        if spec is None:
            return None
        init = lambda: L.init_adapters(params, spec, jax.random.key(int(config.model.seed) + 1),
                                       dtype=jax.tree.leaves(params)[0].dtype)
        paths = L.adapted_paths(params, spec) if kind else []
        shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
        q_abstract = L.quantize_base(shapes, paths, kind) if kind else shapes
        base_sh = param_sh if not kind else jax.tree.map(
            lambda q, sh: Q.shardings_like(q, sh) if Q.is_quantized(q) else sh, q_abstract, param_sh,
            is_leaf=Q.is_quantized)
        with_sh = lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh)
        if not materialize:
            abstract = jax.eval_shape(init)
            adapter_sh = jax.tree.map(lambda _: S.replicated(mesh), abstract)
            return cls(spec, jax.tree.map(with_sh, q_abstract, base_sh), base_sh,
                       jax.tree.map(with_sh, abstract, adapter_sh), adapter_sh, param_sh, kind)
        adapters = init()
        adapter_sh = jax.tree.map(lambda _: S.replicated(mesh), adapters)
        base = jax.device_put(params, param_sh)
        if kind:
            base = jax.jit(lambda p: L.quantize_base(p, paths, kind), out_shardings=base_sh)(base)
            log.info("QLoRA: %d adapted kernels stored as %s (%.1f MiB of %s)", len(paths), kind,
                     S.tree_nbytes(base) / 2**20, "frozen base")
        return cls(spec, base, base_sh, jax.device_put(adapters, adapter_sh), adapter_sh, param_sh, kind)

    @functools.cached_property
    def _merge(self):
        """The jitted merge, built once: a new jit per call would retrace it every step."""
        return jax.jit(lambda b, a: L.merge(b, a, self.spec), out_shardings=self.param_sh)

    def merged(self, adapters) -> Any:
        """base + (alpha / r) A @ B (dequantized first under QLoRA), in the plain parameters'
        shardings."""
        return self._merge(self.base, adapters)

    @functools.cached_property
    def _dequantize(self):
        return jax.jit(L.dequantize_base, out_shardings=self.param_sh)

    def plain(self, base=None) -> Any:
        """The base without adapters as plain parameters (under QLoRA a dequantized copy;
        else the base itself): GRPO's default reference with LoRA."""
        base = self.base if base is None else base
        return self._dequantize(base) if self.quantize else base

    def plain_abstract(self) -> Any:
        """ShapeDtypeStructs (with shardings) of :meth:`merged`'s output."""
        shapes = jax.eval_shape(L.dequantize_base, self.base)
        return jax.tree.map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh), shapes, self.param_sh)


BASE_RECORD = "lora_base.json"   # <workdir>/lora_base.json: what the adapters in checkpoints/ were trained on
BASE_RTOL = 1e-4   # the same weights on another mesh sum in another order; positive sums only, so relative holds


@functools.partial(jax.jit, out_shardings=None)
def _leaf_sums(tree):
    return jax.tree.map(lambda x: jnp.stack([jnp.sum(jnp.abs(x.astype(jnp.float32))),
                                             jnp.sum(jnp.square(x.astype(jnp.float32)))]), tree)


def base_fingerprint(frozen: FrozenBase) -> dict[str, list[float]]:
    """Per leaf of the frozen base (quantized codes and scales under QLoRA), by path: [sum of
    absolute values, sum of squares] (no signed sum: one near 0 would make a relative check
    fail on rounding alone). One pass over the weights on the mesh (a collective with several
    processes)."""
    sums = jax.device_get(_leaf_sums(frozen.base))
    paths = jax.tree.leaves(jax.tree_util.tree_map_with_path(lambda p, _: jax.tree_util.keystr(p), frozen.base))
    return {p: [float(v) for v in s] for p, s in zip(paths, jax.tree.leaves(sums))}


def check_base(frozen: FrozenBase | None, config, workdir: str, resumed: bool, is_main: bool = True) -> None:
    """LoRA runs: the checkpoints hold only adapters and a resumed run reads its base again
    (``model.hf_path``), so the base must be the one they were trained on. A fresh run records
    its base's fingerprint in ``<workdir>/lora_base.json``; a resumed run compares (ConfigError
    naming model.hf_path / model.quantize and the record when the base differs). Collective."""
    if frozen is None:
        return
    path = os.path.join(workdir, BASE_RECORD)
    now = {"model.hf_path": os.path.abspath(config.model.hf_path) if config.model.hf_path else "",
           "model.quantize": frozen.quantize, "leaves": base_fingerprint(frozen)}
    if resumed and os.path.exists(path):
        with open(path) as f:
            was = json.load(f)
        if was.get("model.quantize", "") != now["model.quantize"]:
            raise ConfigError(f"config key model.quantize = {now['model.quantize']!r}: the adapters in {workdir} "
                              f"were trained on a base quantized as {was.get('model.quantize', '')!r} ({path})")
        bad = next((p for p in sorted(set(was["leaves"]) | set(now["leaves"]))
                    if p not in was["leaves"] or p not in now["leaves"]
                    or not np.allclose(now["leaves"][p], was["leaves"][p], rtol=BASE_RTOL, atol=0)), None)
        if bad is not None:
            raise ConfigError(f"config key model.hf_path = {config.model.hf_path!r}: this base differs from the one the "
                              f"adapters in {workdir}/checkpoints were trained on ({was['model.hf_path'] or 'a random init'}"
                              f", recorded in {path}; first differing parameter {bad}); resume with that base or "
                              f"start a new workdir")
        return
    if is_main:
        write_json(path, now)


def export_adapter(frozen: FrozenBase | None, adapters, model_config, base_path: str, workdir: str,
                   is_main: bool = True) -> str | None:
    """LoRA runs: write the adapters (the train state's params, on the mesh) as a PEFT folder
    ``<workdir>/adapter`` of the base at ``base_path`` (recorded as base_model_name_or_path;
    '' for a random-init base). A collective with several processes (every process calls
    it; ``is_main`` writes). None without LoRA."""
    if frozen is None:
        return None
    from guilibra_jax import lora_export
    from guilibra_jax.train import multihost as MH
    adapters = MH.host_params(adapters)
    if not is_main:
        return None
    out = os.path.join(workdir, ADAPTER_DIR)
    lora_export.save_peft_adapter(adapters, frozen.spec, model_config,
                                  os.path.abspath(base_path) if base_path else None, out)
    log.info("exported the LoRA adapter (PEFT format) to %s", out)
    return out
