"""SFT replay in a stage-2 run (``rl.sft_replay``): after every ``rl.sft_replay.every``
RL rounds, one ASFT optimizer step (``sft/step.py``, the run's ``loss.*``) on batches of
``data.train_files``, with the RL updates' optimizer and state. The demonstrations the
SFT start learned from keep pulling on the policy while GRPO / MOPD moves it: a guard
against forgetting the tasks the rollouts rarely visit (interleaved SFT steps, not a
term of the RL loss: each replay step is an optimizer step of its own)."""

from __future__ import annotations

import jax

from guilibra_jax.errors import ConfigError
from guilibra_jax.train import data_source
from guilibra_jax.train.batching import put_batch, stack_micro_batches
from guilibra_jax.train.sft.step import sft_step_from_config
from guilibra_jax.train.state import jit_update

METRICS = ("loss", "loss_reasoning", "loss_action", "loss_grounding", "loss_tokens", "grad_norm", "update_ok")


def every(config) -> int:
    """RL rounds per replay step (0: no replay)."""
    return int(config.rl.sft_replay.every)


def optimizer_steps(config) -> int:
    """Replay steps of the whole run (the optimizer schedule counts them)."""
    return config.train.steps // every(config) if every(config) else 0


def replay_config(config):
    """``config`` with data.batch_size = rl.sft_replay.batch_size (0: data.batch_size):
    what the replay's loader and memory plan read."""
    c = config.copy_and_resolve_references()
    with c.unlocked():
        c.data.batch_size = c.rl.sft_replay.batch_size or c.data.batch_size
    return c


def make_replay_fn(config, graphdef, tx, schedule, mesh, state_sh, lora=None):
    """The jitted ASFT step ``(state, batch[, lora base]) -> (state, metrics)`` on the RL
    state, or None without replay."""
    if not every(config):
        return None
    return jit_update(sft_step_from_config(config, graphdef, tx, schedule), mesh, state_sh,
                      None if lora is None else lora.base_sh)


def open_replay(config, tokenizer, model_config, workdir: str):
    """This process's endless ASFT batches of the run's training files (shuffled, repeated)."""
    from guilibra_jax.data.pipeline import make_sft_loader
    c = replay_config(config)
    files = data_source.train_files(c, workdir)
    if not files:
        raise ConfigError(f"config key rl.sft_replay.every = {every(config)} is invalid without training records: "
                          f"set data.train_files (the demonstrations to replay) or data.synthetic.enabled")
    loader = make_sft_loader(data_source.data_config(c, files), tokenizer, model_config,
                             shard_index=jax.process_index(), shard_count=jax.process_count())
    return data_source.TrainData(loader, c.data.max_length)


def replay(s, state: dict, data) -> tuple[dict, dict, bool]:
    """One replay step on ``train.grad_accum`` batches of ``data``: (state, ``sft_replay/*``
    metrics, whether the update was applied)."""
    host = stack_micro_batches([next(data) for _ in range(s.config.train.grad_accum)])
    frozen = () if s.lora is None else (s.lora.base,)
    state, metrics = s.replay_fn(state, put_batch(host, s.mesh, model_config=s.model_config), *frozen)
    metrics = jax.device_get(metrics)
    return state, {f"sft_replay/{k}": float(metrics[k]) for k in METRICS}, bool(metrics["update_ok"])


class RunData:
    """The data of a stage-2 run as the harness sees it: the RL prompts and, with replay,
    the replay's batches (``replay_data``; None without), checkpointed together."""

    KEYS = {"prompts", "sft_replay"}

    def __init__(self, prompts, replay_data=None):
        self.prompts, self.replay = prompts, replay_data
        self.loader = getattr(prompts, "loader", None)   # (data_source.drop_report counts the prompts')

    def __next__(self):
        return next(self.prompts)

    def get_state(self):
        if self.replay is None:        # (the data state of runs without replay, unchanged)
            return self.prompts.get_state()
        return {"prompts": self.prompts.get_state(), "sft_replay": self.replay.get_state()}

    def set_state(self, state) -> None:
        written = isinstance(state, dict) and set(state) == self.KEYS
        if written != (self.replay is not None):
            raise ConfigError(f"config key rl.sft_replay.every is invalid for this checkpoint: it was written by a run "
                              f"{'with' if written else 'without'} SFT replay; resume with rl.sft_replay.every "
                              f"{'> 0' if written else '= 0'} or start a new workdir")
        if written:
            self.prompts.set_state(state["prompts"])
            self.replay.set_state(state["sft_replay"])
        else:
            self.prompts.set_state(state)

    def close(self) -> None:
        for d in (self.prompts, self.replay):
            if d is not None and hasattr(d, "close"):
                d.close()
