"""The ASFT trainer the run harness (``train/run.py``) drives: the model, its sharded
state and jitted step (``sft/step.py``), and this process's token-packed batches."""

from __future__ import annotations

import time
from typing import Callable

import jax
import numpy as np
from flax import nnx

from guilibra_jax import sharding as S
from guilibra_jax.train import data_source, model_factory
from guilibra_jax.train.batching import put_batch, stack_micro_batches
from guilibra_jax.train.lora_state import FrozenBase, export_adapter
from guilibra_jax.train.sft.plan import plan_sft
from guilibra_jax.train.sft.step import sft_step_from_config
from guilibra_jax.train.state import jit_update, optimizer_from_config, sharded_state


class SFTTrainer:
    """One ASFT optimizer step per harness step: ``train.grad_accum`` micro-batches of
    ``data.batch_size`` packed rows."""

    eval_at_start = False

    def __init__(self, config, workdir: str, mesh, tokenizer, graphdef, model_config, state_sh, jit_step,
                 data_factory: Callable | None = None, frozen: FrozenBase | None = None):
        self.config, self.workdir, self.mesh, self.tokenizer = config, workdir, mesh, tokenizer
        self.graphdef, self.model_config, self.state_sh, self.jit_step = graphdef, model_config, state_sh, jit_step
        self.frozen = self.lora_base = frozen    # LoRA: the frozen base (the state's params are the adapters)
        self._frozen_args = () if frozen is None else (frozen.base,)
        self.data_factory = data_factory or data_source.make_train_data
        self.data = None
        self._t_last: float | None = None
        self._tokens = 0.0
        self._seq_length = 0

    @classmethod
    def build(cls, config, workdir: str, mesh, tokenizer, *, data_factory: Callable | None = None):
        """(trainer, initial train state, its shardings)."""
        model, model_config = model_factory.build_model(config, tokenizer, mesh=mesh)
        graphdef, pstate, rest = nnx.split(model, nnx.Param, ...)
        if jax.tree.leaves(rest):
            raise ValueError(f"the model holds non-parameter state the trainer does not handle: "
                             f"{list(nnx.to_pure_dict(rest))[:5]}")
        param_sh = S.param_shardings(pstate, mesh)
        params = nnx.to_pure_dict(pstate)
        del model, pstate
        frozen = FrozenBase.build(config, params, param_sh, mesh)
        if frozen is not None:   # LoRA: the adapters train, the base is a frozen argument of the step
            params, param_sh = frozen.adapters, frozen.adapter_sh
        tx, schedule = optimizer_from_config(config, params, config.train.steps)
        state, state_sh = sharded_state(params, tx, param_sh, mesh)
        del params
        jit_step = jit_update(sft_step_from_config(config, graphdef, tx, schedule), mesh, state_sh,
                              None if frozen is None else frozen.base_sh)
        return cls(config, workdir, mesh, tokenizer, graphdef, model_config, state_sh, jit_step,
                   data_factory, frozen), state, state_sh

    def plan(self, state, device_memory_gib):
        return plan_sft(self.config, self.mesh, self.graphdef, state, self.state_sh, self.jit_step, self.model_config,
                        device_memory_gib=device_memory_gib, processes=jax.process_count(), frozen=self.frozen)

    def model_params(self, state: dict):
        """The model's parameters of ``state``: its params, or (LoRA) base + adapters merged."""
        return state["params"] if self.frozen is None else self.frozen.merged(state["params"])

    def export_extras(self, state: dict, is_main: bool) -> None:
        """LoRA: the adapters alone as a PEFT folder ``<workdir>/adapter`` of the base."""
        export_adapter(self.frozen, state["params"], self.model_config, self.config.model.hf_path, self.workdir,
                       is_main)

    def open_data(self):
        self.data = self.data_factory(self.config, self.tokenizer, self.model_config, jax.process_index(),
                                      jax.process_count(), self.workdir)
        return self.data

    def make_evaluator(self):
        return data_source.make_evaluator(self.config, self.tokenizer, self.model_config, self.graphdef,
                                          self.workdir, self.mesh)

    def step(self, state: dict, step: int):
        if self._t_last is None:
            self._t_last = time.time()
        host = stack_micro_batches([next(self.data) for _ in range(self.config.train.grad_accum)])
        self._tokens += float(np.sum(host["segment_ids"] > 0)) * jax.process_count()
        self._seq_length = int(host["segment_ids"].shape[-1])   # the step's sequence bucket
        state, metrics = self.jit_step(state, put_batch(host, self.mesh, model_config=self.model_config),
                                       *self._frozen_args)
        return state, metrics, [metrics["update_ok"]]

    def log_row(self, metrics) -> dict:
        metrics = jax.device_get(metrics)
        now = time.time()
        metrics["tokens_per_s"] = self._tokens / max(now - self._t_last, 1e-9)
        metrics["sys/seq_length"] = self._seq_length
        metrics.update(data_source.drop_metrics(self.data))
        self._t_last, self._tokens = now, 0.0
        return metrics
