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
import logging
import os
from typing import Any

import jax

from guilibra_jax import lora as L
from guilibra_jax import sharding as S

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
    """The frozen base weights of a LoRA run on the mesh, the spec, and fresh adapters
    (replicated: r x (in + out) per adapted kernel) with their shardings."""

    spec: L.LoraSpec
    base: Any
    base_sh: Any
    adapters: Any
    adapter_sh: Any

    @classmethod
    def build(cls, config, params, param_sh, mesh, *, materialize: bool = True) -> "FrozenBase | None":
        """None without LoRA; ConfigError naming model.lora.* for targets that match no
        parameter or no Linear kernel, or a rank above a layer's min(in, out).
        ``materialize=False``: abstract base and adapters (ShapeDtypeStructs with their
        shardings) for ahead-of-time plans; ``params`` may then be abstract."""
        spec = lora_spec(config)
        if spec is None:
            return None
        init = lambda: L.init_adapters(params, spec, jax.random.key(int(config.model.seed) + 1),
                                       dtype=jax.tree.leaves(params)[0].dtype)
        if not materialize:
            abstract = jax.eval_shape(init)
            adapter_sh = jax.tree.map(lambda _: S.replicated(mesh), abstract)
            with_sh = lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh)
            return cls(spec, jax.tree.map(with_sh, params, param_sh), param_sh,
                       jax.tree.map(with_sh, abstract, adapter_sh), adapter_sh)
        adapters = init()
        adapter_sh = jax.tree.map(lambda _: S.replicated(mesh), adapters)
        base = jax.device_put(params, param_sh)
        return cls(spec, base, param_sh, jax.device_put(adapters, adapter_sh), adapter_sh)

    @functools.cached_property
    def _merge(self):
        """The jitted merge, built once: a new jit per call would retrace it every step."""
        return jax.jit(lambda b, a: L.merge(b, a, self.spec), out_shardings=self.base_sh)

    def merged(self, adapters) -> Any:
        """base + (alpha / r) A @ B, in the base's shardings."""
        return self._merge(self.base, adapters)


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
