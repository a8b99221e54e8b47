"""The ASFT training loop: model + data + mesh + jitted step + checkpoints + logs.

``train(config, workdir)`` is what ``python -m launch.train`` runs. Re-running it on
the same workdir resumes from the latest complete checkpoint (params, optimizer
state, step and data iterator together). SIGTERM saves a checkpoint and returns.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from typing import Callable

import jax
import numpy as np
from flax import nnx

from guilibra_jax import sharding as S
from guilibra_jax.train import checkpoint as C
from guilibra_jax.train import model_factory
from guilibra_jax.train.batching import put_batch, stack_micro_batches  # noqa: F401 (re-exported)
from guilibra_jax.train.metrics import MetricsWriter, Progress
from guilibra_jax.train.optimizer import make_optimizer
from guilibra_jax.train.sft_step import make_sft_step
from guilibra_jax.train.step_core import init_state

log = logging.getLogger(__name__)


class _Preemption:
    """Remembers a SIGTERM so that the loop can checkpoint and stop cleanly."""

    def __init__(self):
        self.requested = False
        self._previous = None

    def __enter__(self):
        try:
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        except ValueError:  # not the main thread
            self._previous = None
        return self

    def _handle(self, signum, frame):
        log.warning("SIGTERM received: saving a checkpoint and stopping")
        self.requested = True

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


def optimizer_from_config(config, params, total_steps: int):
    """(tx, schedule) of ``config.optim`` over ``total_steps`` optimizer updates."""
    o = config.optim
    return make_optimizer(params, lr=o.lr, total_steps=total_steps, warmup_steps=o.warmup_steps,
                          schedule=o.schedule, weight_decay=o.weight_decay, b1=o.b1, b2=o.b2, eps=o.eps,
                          clip_norm=o.clip_norm, lr_multipliers=dict(o.lr_multipliers), freeze=tuple(o.freeze),
                          end_lr_fraction=o.end_lr_fraction)


def sharded_state(params, tx, param_sh, mesh) -> tuple[dict, dict]:
    """(train state, its shardings): params from their logical names, optimizer state
    following params, scalars replicated."""
    opt_sh = S.opt_state_shardings(tx, params, param_sh, mesh)
    rep = S.replicated(mesh)
    state_sh = {"step": rep, "params": param_sh, "opt_state": opt_sh, "skipped": rep}
    params = jax.device_put(params, param_sh)
    return jax.jit(lambda p: init_state(p, tx), out_shardings=state_sh)(params), state_sh


def open_checkpoints(workdir: str, tc, state, data) -> tuple[C.Checkpointer, int, dict]:
    """(checkpointer, start step, state): the latest complete checkpoint of ``workdir``
    restored into ``state``'s shardings and ``data``'s iterator, or step 0 as given."""
    ckpt = C.Checkpointer(os.path.join(workdir, "checkpoints"), max_to_keep=tc.keep_checkpoints,
                          async_save=tc.async_checkpoints)
    start = 0
    if ckpt.latest_step() is not None:
        start, state, data_state = ckpt.restore(state)
        if data_state is not None:
            data.set_state(data_state)
        log.info("resumed from step %d", start)
    return ckpt, start, state


def eval_and_checkpoint(step: int, state, last_row: dict, tc, evaluator, writer, ckpt, data_state: Callable,
                        preempted: bool) -> dict:
    """The end of a step every trainer shares: the periodic eval hook (its row merged into
    ``last_row``) and the periodic / final / preemption checkpoint."""
    if evaluator is not None and (step % tc.eval_every == 0 or step == tc.steps):
        eval_row = evaluator(state["params"], step)
        writer.write(step, eval_row)
        last_row = {**last_row, **eval_row}
    if step % tc.checkpoint_every == 0 or step == tc.steps or preempted:
        ckpt.save(step, state, data_state(), force=True)
    return last_row


def finish_run(step: int, state, tc, ckpt, progress, writer, graphdef, model_config, tokenizer, workdir: str,
               is_main: bool = True) -> None:
    """Wait for checkpoints, export a Hugging Face folder if the run completed, close logs."""
    ckpt.wait()
    progress.close()
    if step >= tc.steps and tc.export and is_main:
        export_dir = tc.export_dir or os.path.join(workdir, "export")
        model_factory.export(graphdef, jax.device_get(state["params"]), model_config, tokenizer, export_dir)
        log.info("exported Hugging Face checkpoint to %s", export_dir)
    ckpt.close()
    writer.close()


def train(config, workdir: str, *, data_factory: Callable | None = None) -> dict:
    """Run (or resume) the ASFT job described by ``config`` in ``workdir``; returns
    the last logged metrics row."""
    from guilibra_jax.train import data_source

    os.makedirs(workdir, exist_ok=True)
    is_main = jax.process_index() == 0
    if is_main:
        C.write_json(os.path.join(workdir, "config.json"), config.to_dict())

    mesh = S.make_mesh(dict(config.mesh))
    tokenizer = data_source.prepare_tokenizer(config, workdir)
    model, model_config = model_factory.build_model(config, tokenizer)
    graphdef, pstate, rest = nnx.split(model, nnx.Param, ...)
    if jax.tree.leaves(rest):
        raise ValueError(f"the model holds non-parameter state the trainer does not handle: "
                         f"{list(nnx.to_pure_dict(rest))[:5]}")
    param_sh = S.param_shardings(pstate, mesh)
    params = nnx.to_pure_dict(pstate)
    del model, pstate

    tc = config.train
    tx, schedule = optimizer_from_config(config, params, tc.steps)
    state, state_sh = sharded_state(params, tx, param_sh, mesh)
    del params

    step_fn = make_sft_step(graphdef, tx, alpha_action=config.loss.alpha_action,
                            alpha_grounding=config.loss.alpha_grounding, normalize=config.loss.normalize,
                            schedule=schedule, logits_chunk=config.loss.logits_chunk)
    jit_step = jax.jit(step_fn, in_shardings=(state_sh, None), out_shardings=(state_sh, None), donate_argnums=0)

    data = (data_factory or data_source.make_train_data)(config, tokenizer, model_config,
                                                         jax.process_index(), jax.process_count(), workdir)
    ckpt, start, state = open_checkpoints(workdir, tc, state, data)

    writer = MetricsWriter(workdir, enabled=is_main, tensorboard=tc.tensorboard)
    progress = Progress(tc.steps, start, enabled=is_main and tc.progress)
    evaluator = data_source.make_evaluator(config, tokenizer, model_config, graphdef, workdir) \
        if tc.eval_every > 0 else None
    last_row: dict = {}
    step = start
    t_last, tokens_since = time.time(), 0.0
    with _Preemption() as preempt:
        while step < tc.steps:
            host = stack_micro_batches([next(data) for _ in range(tc.grad_accum)])
            tokens_since += float(np.sum(host["segment_ids"] > 0)) * jax.process_count()
            state, metrics = jit_step(state, put_batch(host, mesh, model_config=model_config))
            step += 1
            if step % tc.log_every == 0 or step == tc.steps:
                metrics = jax.device_get(metrics)
                now = time.time()
                metrics["tokens_per_s"] = tokens_since / max(now - t_last, 1e-9)
                t_last, tokens_since = now, 0.0
                last_row = writer.write(step, metrics)
                progress.update(step, last_row)
            last_row = eval_and_checkpoint(step, state, last_row, tc, evaluator, writer, ckpt, data.get_state,
                                           preempt.requested)
            if preempt.requested:
                break
    finish_run(step, state, tc, ckpt, progress, writer, graphdef, model_config, tokenizer, workdir, is_main)
    if hasattr(data, "close"):
        data.close()
    return last_row
