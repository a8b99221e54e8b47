"""The ASFT training loop: model + data + mesh + jitted step + checkpoints + logs.

``train(config, workdir)`` is what ``python -m launch.train`` runs. Re-running it on
the same workdir resumes from the latest complete checkpoint (params, optimizer
state, step and data iterator together). SIGTERM saves a checkpoint and returns.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Callable

import jax
import numpy as np
from flax import nnx

from guilibra_jax import sharding as S
from guilibra_jax.errors import ConfigError
from guilibra_jax.train import checkpoint as C
from guilibra_jax.train import compilation_cache
from guilibra_jax.train import config as run_config
from guilibra_jax.train import model_factory, run_history
from guilibra_jax.train import multihost as MH
from guilibra_jax.train.batching import put_batch, stack_micro_batches  # noqa: F401 (re-exported)
from guilibra_jax.train.curves import write_curves
from guilibra_jax.train.guards import Divergence, Preemption
from guilibra_jax.train.metrics import Progress, writer_for_run
from guilibra_jax.train.optimizer import make_optimizer, param_paths, unmatched_patterns
from guilibra_jax.train.profiler import StepProfiler
from guilibra_jax.train.sft_step import sft_step_from_config
from guilibra_jax.train.step_core import init_state

log = logging.getLogger(__name__)


def optimizer_from_config(config, params, total_steps: int):
    """(tx, schedule) of ``config.optim`` over ``total_steps`` optimizer updates. A
    freeze / lr-multiplier regex that matches no parameter path is a ConfigError."""
    o = config.optim
    for key, patterns in (("optim.freeze", tuple(o.freeze)), ("optim.lr_multipliers", tuple(o.lr_multipliers))):
        unmatched = unmatched_patterns(params, patterns)
        if unmatched:
            example = jax.tree.leaves(param_paths(params))[:3]
            raise ConfigError(f"config key {key} pattern {unmatched[0]!r} matches no parameter path (paths look "
                              f"like {', '.join(example)}; re.search over '/'-joined paths)")
    return make_optimizer(params, lr=o.lr, total_steps=total_steps, warmup_steps=o.warmup_steps,
                          schedule=o.schedule, weight_decay=o.weight_decay, b1=o.b1, b2=o.b2, eps=o.eps,
                          clip_norm=o.clip_norm, lr_multipliers=dict(o.lr_multipliers), freeze=tuple(o.freeze),
                          end_lr_fraction=o.end_lr_fraction)


def sharded_state(params, tx, param_sh, mesh, *, materialize: bool = True) -> tuple[dict, dict]:
    """(train state, its shardings): params from their logical names, optimizer state
    following params, scalars replicated. ``materialize=False``: an abstract state
    (ShapeDtypeStructs with shardings, nothing allocated) for ahead-of-time plans."""
    opt_sh = S.opt_state_shardings(tx, params, param_sh, mesh)
    rep = S.replicated(mesh)
    state_sh = {"step": rep, "params": param_sh, "opt_state": opt_sh, "skipped": rep}
    if not materialize:
        shapes = jax.eval_shape(lambda p: init_state(p, tx), params)
        return jax.tree.map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh), shapes,
                            state_sh), state_sh
    params = jax.device_put(params, param_sh)
    return jax.jit(lambda p: init_state(p, tx), out_shardings=state_sh)(params), state_sh


def open_checkpoints(workdir: str, tc, state, data) -> tuple[C.Checkpointer, int, dict]:
    """(checkpointer, start step, state): the newest checkpoint of ``workdir`` that
    restores (damaged newer ones skipped with a warning, see
    ``Checkpointer.restore_latest``), into ``state``'s shardings and ``data``'s
    iterator; or step 0 as given when there is none. Logs which step it resumed from."""
    ckpt = C.Checkpointer(os.path.join(workdir, "checkpoints"), max_to_keep=tc.keep_checkpoints,
                          async_save=tc.async_checkpoints)
    restored = ckpt.restore_latest(state)
    if restored is None:
        log.info("no checkpoint in %s: starting from step 0", ckpt.directory)
        return ckpt, 0, state
    start, state, data_state = restored
    if data_state is not None:
        data.set_state(MH.own_state(data_state))
    log.info("resumed from step %d (%s)", start, ckpt.step_dir(start))
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
        ckpt.save(step, state, MH.process_states(data_state()), force=True)
    return last_row


def finish_run(step: int, state, tc, ckpt, progress, writer, graphdef, model_config, tokenizer, workdir: str,
               is_main: bool = True) -> None:
    """Wait for checkpoints, export a Hugging Face folder if the run completed, close logs."""
    ckpt.wait()
    progress.close()
    if step >= tc.steps and tc.export:
        params = MH.host_params(state["params"])   # a collective with several processes
        if is_main:
            export_dir = tc.export_dir or os.path.join(workdir, "export")
            model_factory.export(graphdef, params, model_config, tokenizer, export_dir,
                                 config=run_config.load_run_config(workdir))
            log.info("exported Hugging Face checkpoint to %s", export_dir)
    ckpt.close()
    writer.close()
    if is_main and tc.get("curves", True):
        path = write_curves(workdir)
        if path:
            log.info("training curves: %s", path)


def train(config, workdir: str, *, data_factory: Callable | None = None) -> dict:
    """Run (or resume) the ASFT job described by ``config`` in ``workdir``; returns
    the last logged metrics row."""
    from guilibra_jax.train import data_source

    os.makedirs(workdir, exist_ok=True)
    is_main = jax.process_index() == 0
    run_history.record_config(config, workdir, is_main=is_main)
    compilation_cache.enable(config.train.compilation_cache_dir, workdir)

    mesh = MH.run_mesh(config)
    data_source.per_process_batch(config)   # bad batch / process counts fail before any model
    tokenizer = data_source.prepare_tokenizer(config, workdir)
    model, model_config = model_factory.build_model(config, tokenizer, mesh=mesh)
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

    step_fn = sft_step_from_config(config, graphdef, tx, schedule)
    jit_step = jax.jit(S.traced_on(mesh, step_fn), in_shardings=(state_sh, None), out_shardings=(state_sh, None),
                       donate_argnums=0)
    if tc.memory_plan:
        from guilibra_jax.train import plan as PLAN
        report = PLAN.plan_sft(config, mesh, graphdef, state, state_sh, jit_step, model_config,
                               device_memory_gib=PLAN.device_memory_gib(mesh), processes=jax.process_count())
        if is_main:
            C.write_json(os.path.join(workdir, "memory_plan.json"), report)
        log.info("memory plan (GiB per device): %s", PLAN.summary_line(report))

    data = (data_factory or data_source.make_train_data)(config, tokenizer, model_config,
                                                         jax.process_index(), jax.process_count(), workdir)
    ckpt, start, state = open_checkpoints(workdir, tc, state, data)

    writer = writer_for_run(config, workdir, enabled=is_main)
    progress = Progress(tc.steps, start, enabled=is_main and tc.progress)
    profiler = StepProfiler(workdir, tc.profile_steps, enabled=is_main)
    evaluator = data_source.make_evaluator(config, tokenizer, model_config, graphdef, workdir, mesh) \
        if tc.eval_every > 0 else None
    divergence = Divergence(tc.max_skipped_updates, ckpt.latest_step)
    last_row: dict = {}
    step = start
    t_last, tokens_since = time.time(), 0.0
    pending = None   # (step, update_ok) of the previous step, read one step late (no stall)
    with Preemption() as preempt:
        while step < tc.steps:
            host = stack_micro_batches([next(data) for _ in range(tc.grad_accum)])
            tokens_since += float(np.sum(host["segment_ids"] > 0)) * jax.process_count()
            profiler.before(step + 1)
            state, metrics = jit_step(state, put_batch(host, mesh, model_config=model_config))
            step += 1
            profiler.after(step, metrics)
            if pending is not None:
                divergence.update(pending[0], bool(jax.device_get(pending[1])))
            pending = (step, metrics["update_ok"])
            if step % tc.log_every == 0 or step == tc.steps:
                metrics = jax.device_get(metrics)
                now = time.time()
                metrics["tokens_per_s"] = tokens_since / max(now - t_last, 1e-9)
                metrics.update(data_source.drop_metrics(data))
                t_last, tokens_since = now, 0.0
                last_row = writer.write(step, metrics)
                progress.update(step, last_row)
            stop = preempt.should_stop()
            last_row = eval_and_checkpoint(step, state, last_row, tc, evaluator, writer, ckpt, data.get_state, stop)
            if stop:
                break
        if pending is not None:
            divergence.update(pending[0], bool(jax.device_get(pending[1])))
    profiler.close()
    finish_run(step, state, tc, ckpt, progress, writer, graphdef, model_config, tokenizer, workdir, is_main)
    log.info("data: %s", data_source.drop_report(data))
    if hasattr(data, "close"):
        data.close()
    return last_row
