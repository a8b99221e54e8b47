"""The one run harness every trainer shares.

``train(config, workdir)`` is what ``python -m launch.train`` runs: it records the config
and the run history, builds the mesh and the tokenizer, has the method's trainer
(``sft/trainer.py`` for ``method=sft``, ``rl/trainer.py`` for ``grpo`` / ``mopd``) build
its model, state, jitted step and data, writes the memory plan, restores the newest
checkpoint, and runs the preemption-safe step loop: metrics, progress, profiler,
evaluator, divergence guard, periodic / final / preemption checkpoints, then the export.
Re-running it on the same workdir resumes from the latest complete checkpoint (params,
optimizer state, step and every process's data iterator together); SIGTERM saves a
checkpoint and returns.

A trainer (:class:`Trainer`) holds only what is particular to its method.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Protocol

import jax

from guilibra_jax import atomic
from guilibra_jax.train import checkpoint as C
from guilibra_jax.train import compilation_cache, data_source, model_factory, run_health, run_history
from guilibra_jax.train import config as run_config
from guilibra_jax.train import multihost as MH
from guilibra_jax.train import plan as PLAN
from guilibra_jax.train import workdir_lock
from guilibra_jax.train.curves import write_curves
from guilibra_jax.train.guards import Divergence, Preemption
from guilibra_jax.train.lora_state import check_base
from guilibra_jax.train.metrics import Progress, writer_for_run
from guilibra_jax.train.optimizer import averaged
from guilibra_jax.train.profiler import StepProfiler
from guilibra_jax.train.rl.trainer import RLTrainer
from guilibra_jax.train.sft.trainer import SFTTrainer

log = logging.getLogger(__name__)


class Trainer(Protocol):
    """What the harness drives. ``graphdef``, ``model_config`` and ``tokenizer`` are the
    export's; ``eval_at_start``: a fresh run logs the evaluator's row at step 0."""

    graphdef: Any
    model_config: Any
    eval_at_start: bool
    lora_base: Any      # LoRA: lora_state.FrozenBase (the state's params are adapters); else None

    def plan(self, state: dict, device_memory_gib: float | None) -> dict:
        """The memory plan of the trainer's programs on its mesh (``state``: the train state)."""

    def open_data(self):
        """This process's data (``next``, ``get_state``, ``set_state``, optional ``close``)."""

    def make_evaluator(self) -> Callable[[Any, int], dict] | None:
        """``(params, step) -> metrics row`` run every ``train.eval_every`` steps, or None."""

    def step(self, state: dict, step: int) -> tuple[dict, Any, list]:
        """One optimizer step (or a stage-2 round of updates) from ``state`` at ``step``:
        (state, metrics, applied: whether each update was finite: device or host bools)."""

    def log_row(self, metrics) -> dict:
        """The metrics row to write at a log step (host floats)."""

    def model_params(self, state: dict) -> Any:
        """The model's parameters in ``state`` (evaluation, export): ``state["params"]``, or
        with LoRA the base and the adapters merged."""

    def export_extras(self, state: dict, is_main: bool) -> None:
        """What the trainer exports beside the Hugging Face folder (LoRA: the PEFT adapter)."""


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
                        preempted: bool, model_params: Callable = lambda st: st["params"]) -> dict:
    """The end of a step: the periodic eval hook (its row merged into ``last_row``) and the
    periodic / final / preemption checkpoint. ``model_params``: the trainer's."""
    if evaluator is not None and (step % tc.eval_every == 0 or step == tc.steps):
        eval_row = evaluator(model_params(state), step)
        writer.write(step, eval_row)
        last_row = {**last_row, **eval_row}
    if step % tc.checkpoint_every == 0 or step == tc.steps or preempted:
        ckpt.save(step, state, MH.process_states(data_state()), force=True)
    return last_row


def finish_run(step: int, state, tc, ckpt, progress, writer, trainer, tokenizer, workdir: str,
               is_main: bool = True) -> None:
    """Wait for checkpoints, export a Hugging Face folder (and the trainer's extras) if
    the run completed, close logs. With ``optim.ema_decay`` the export is of the
    parameters' moving average."""
    ckpt.wait()
    progress.close()
    if step >= tc.steps and tc.export:
        state = averaged(state)
        params = MH.host_params(trainer.model_params(state))   # a collective with several processes
        if is_main:
            export_dir = tc.export_dir or os.path.join(workdir, "export")
            model_factory.export(trainer.graphdef, params, trainer.model_config, tokenizer, export_dir,
                                 config=run_config.load_run_config(workdir))
            log.info("exported Hugging Face checkpoint to %s", export_dir)
        del params
        trainer.export_extras(state, is_main)
    ckpt.close()
    writer.close()
    if is_main and tc.curves:
        path = write_curves(workdir)
        if path:
            log.info("training curves: %s", path)


class _Applied:
    """Feeds the divergence guard: device flags are read one step late (no stall on the
    step just dispatched), host flags at once."""

    def __init__(self, divergence: Divergence):
        self.divergence = divergence
        self.pending: tuple[int, list] | None = None

    def add(self, step: int, applied: list) -> None:
        self.flush()
        if all(isinstance(ok, bool) for ok in applied):
            for ok in applied:
                self.divergence.update(step, ok)
        else:
            self.pending = (step, applied)

    def flush(self) -> None:
        if self.pending is not None:
            step, applied = self.pending
            self.pending = None
            for ok in applied:
                self.divergence.update(step, bool(jax.device_get(ok)))


def run(config, workdir: str, make_trainer: Callable) -> dict:
    """Run (or resume) the job of ``config`` in ``workdir`` with the trainer
    ``make_trainer(config, workdir, mesh, tokenizer) -> (trainer, state, state shardings)``;
    returns the last logged metrics row. The workdir's lock is held throughout: a run on
    a workdir whose run is alive stops at once (``workdir_lock``)."""
    os.makedirs(workdir, exist_ok=True)
    if config.train.export:   # an export_dir the export may not replace fails now, not after the training
        atomic.check_replaceable(config.train.export_dir or os.path.join(workdir, "export"),
                                 "config key train.export_dir")
    with workdir_lock.run_lock(workdir):
        return _run(config, workdir, make_trainer)


def _run(config, workdir: str, make_trainer: Callable) -> dict:
    tc = config.train
    is_main = jax.process_index() == 0
    run_health.watch()
    run_history.record_config(config, workdir, is_main=is_main)
    compilation_cache.enable(tc.compilation_cache_dir, workdir)

    mesh = MH.run_mesh(config)
    data_source.per_process_batch(config)   # bad batch / process counts fail before any model
    tokenizer = data_source.prepare_tokenizer(config, workdir)
    trainer, state, _ = make_trainer(config, workdir, mesh, tokenizer)
    if tc.memory_plan:
        report = trainer.plan(state, PLAN.device_memory_gib(mesh))
        if is_main:
            C.write_json(os.path.join(workdir, "memory_plan.json"), report)
        log.info("memory plan (GiB per device): %s", PLAN.summary_line(report))

    data = trainer.open_data()
    ckpt, start, state = open_checkpoints(workdir, tc, state, data)
    check_base(trainer.lora_base, config, workdir, resumed=start > 0, is_main=is_main)
    writer = writer_for_run(config, workdir, enabled=is_main)
    progress = Progress(tc.steps, start, enabled=is_main and tc.progress)
    profiler = StepProfiler(workdir, tc.profile_steps, enabled=is_main)
    evaluator = trainer.make_evaluator() if tc.eval_every > 0 else None
    if evaluator is not None and trainer.eval_at_start and start == 0:   # the starting policy, for comparison
        writer.write(0, evaluator(trainer.model_params(state), 0))
    applied = _Applied(Divergence(tc.max_skipped_updates, ckpt.latest_step))
    last_row: dict = {}
    step = start
    with Preemption() as preempt:
        while step < tc.steps:
            profiler.before(step + 1)
            state, metrics, ok = trainer.step(state, step)
            step += 1
            profiler.after(step, state)
            applied.add(step, ok)
            if step % tc.log_every == 0 or step == tc.steps:
                last_row = writer.write(step, {**trainer.log_row(metrics), **run_health.row()})
                progress.update(step, last_row)
            stop = preempt.should_stop()
            last_row = eval_and_checkpoint(step, state, last_row, tc, evaluator, writer, ckpt, data.get_state, stop,
                                           trainer.model_params)
            if stop:
                break
        applied.flush()
    profiler.close()
    finish_run(step, state, tc, ckpt, progress, writer, trainer, tokenizer, workdir, is_main)
    log.info("data: %s", data_source.drop_report(data))
    if hasattr(data, "close"):
        data.close()
    return last_row


def train(config, workdir: str, *, data_factory: Callable | None = None) -> dict:
    """Run (or resume) the job of ``config`` (``config.method``: sft, grpo or mopd) in
    ``workdir``; returns the last logged metrics row. ``data_factory`` replaces the ASFT
    trainer's data (``data_source.make_train_data``'s signature)."""
    if config.method == "sft":
        return run(config, workdir, lambda *a: SFTTrainer.build(*a, data_factory=data_factory))
    return run(config, workdir, RLTrainer.build)
