"""The stage-2 trainer the run harness (``train/run.py``) drives for ``method=grpo|mopd``:
one harness step is one round of the phases (``rl/phases.py``): collect -> advantages ->
score -> ``rl.ppo_epochs x rl.minibatches`` updates (then, every ``rl.sft_replay.every``
rounds, one ASFT step on the training files: ``rl/replay.py``)."""

from __future__ import annotations

import time

import jax
import numpy as np

from guilibra_jax import served_scorer as SV
from guilibra_jax.data.pipeline import make_rl_loader
from guilibra_jax.train import data_source
from guilibra_jax.train import multihost as MH
from guilibra_jax.train.config import check_teachers
from guilibra_jax.train.lora_state import export_adapter
from guilibra_jax.train.rl import advantages as ADV
from guilibra_jax.train.rl import frozen as FZ
from guilibra_jax.train.rl import phases as PH
from guilibra_jax.train.rl import replay as RP
from guilibra_jax.train.rl.online import OnlinePrompts
from guilibra_jax.train.rl.plan import plan_stage2
from guilibra_jax.train.rl.setup import setup


class Prompts:
    """Endless RL prompt batches of this process; skips (and counts) batches with no valid prompt."""

    MAX_EMPTY = 3

    def __init__(self, loader):
        self.loader = loader
        self.empty = 0

    def __next__(self) -> dict:
        for _ in range(self.MAX_EMPTY):
            batch = next(self.loader)
            if np.any(batch["row_valid"]):
                return batch
            self.empty += 1
        raise RuntimeError(f"{self.MAX_EMPTY} consecutive RL batches hold no valid prompt "
                           f"(bad or filtered: {self.loader.bad_records.summary()}); raise data.max_length?")

    def get_state(self):
        return self.loader.get_state()

    def set_state(self, state):
        self.loader.set_state(state)

    def close(self):
        self.loader.close()


class RLTrainer:
    """GRPO / MOPD rounds over ``Stage2`` (``rl/setup.py``)."""

    def __init__(self, s: PH.Stage2, workdir: str, state_sh):
        self.s, self.workdir, self.state_sh = s, workdir, state_sh
        self.lora_base = s.lora
        self.config, self.graphdef, self.model_config = s.config, s.graphdef, s.model_config
        self.eval_at_start = True   # the starting (SFT) policy, for comparison
        self.prompts = self.replay_data = None
        self.base_key = jax.random.PRNGKey(self.config.data.seed + 7919 * self.config.model.seed)
        limit = self.config.rl.served.max_failed_steps
        self.served_watch = {f.name: SV.FailedSteps(f.key, limit) for f in s.frozen.values() if FZ.is_served(f)}

    @classmethod
    def build(cls, config, workdir: str, mesh, tokenizer):
        """(trainer, initial train state, its shardings)."""
        s, state, state_sh = setup(config, mesh, tokenizer)
        return cls(s, workdir, state_sh), state, state_sh

    def plan(self, state, device_memory_gib):
        return plan_stage2(self.s, state, self.state_sh, device_memory_gib=device_memory_gib)

    def open_data(self):
        config, s = self.config, self.s
        if config.rl.world:   # live browser states
            self.prompts = OnlinePrompts(config, s.tokenizer, s.model_config, self.workdir)
        else:
            dcfg = data_source.data_config(config, data_source.train_files(config, self.workdir))
            self.prompts = Prompts(make_rl_loader(dcfg, s.tokenizer, s.model_config, shard_index=jax.process_index(),
                                                  shard_count=jax.process_count()))
            data_source.record_data_info(self.workdir, self.prompts.loader.info)
        if config.method == "mopd":   # every platform of the data has a teacher (ConfigError naming rl.teachers)
            check_teachers(config.rl.teachers, MH.gather_strings(list(self.prompts.loader.info.get("platforms", []))))
        if RP.every(config):
            self.replay_data = RP.open_replay(config, s.tokenizer, s.model_config, self.workdir)
        return RP.RunData(self.prompts, self.replay_data)

    def make_evaluator(self):
        if self.config.method != "grpo":
            return None
        return data_source.make_evaluator(self.config, self.s.tokenizer, self.s.model_config, self.s.graphdef,
                                          self.workdir, self.s.mesh)

    def step(self, state: dict, step: int):
        s, rl, prompts = self.s, self.config.rl, self.prompts
        t0 = time.time()
        policy = s.policy(state["params"])          # with LoRA: base + adapters, merged once per step
        c = PH.collect(s, policy, prompts, step, self.base_key)
        adv = ADV.compute(c.scored.reward, c.scored.success & c.ro.valid, rl.group_size, self.config.method, rl)
        adv["advantages"] = np.where(c.ro.valid, adv["advantages"], 0.0).astype(np.float32)
        t1 = time.time()
        scores = PH.score(s, policy, c.ro)
        del policy
        t2 = time.time()
        state, metrics, applied = PH.update(s, state, c.ro, adv, scores)
        t3 = time.time()
        replayed = {}
        if RP.every(self.config) and (step + 1) % RP.every(self.config) == 0:
            state, replayed, ok = RP.replay(s, state, self.replay_data)
            applied.append(ok)
        t4 = time.time()
        if replayed:
            replayed["sft_replay_s"] = t4 - t3
        row = PH.rollout_metrics(c, adv, self.config.method, rl.max_new_tokens, rl.group_filter.enabled,
                                 rl.demo_in_failed_groups)  # collective
        row.update(PH.teacher_kl_metrics(s, metrics))   # (pops the update's per-teacher sums)
        row.update({k: float(v) for k, v in metrics.items()})
        row.update(replayed)
        row.update(PH.served_metrics(s, scores, self.served_watch))   # collective
        row.update(sample_s=t1 - t0, score_s=t2 - t1, update_s=t3 - t2, step_s=t4 - t0)
        row.update(data_source.drop_metrics(prompts))   # process 0's record counts
        if hasattr(prompts, "metrics"):                  # process 0's episodes (rl.world)
            row.update(prompts.metrics())
        return state, row, applied

    def log_row(self, metrics) -> dict:
        return metrics

    def model_params(self, state: dict):
        return self.s.policy(state["params"])

    def export_extras(self, state: dict, is_main: bool) -> None:
        """LoRA: the adapters alone as a PEFT folder ``<workdir>/adapter`` of the base."""
        export_adapter(self.s.lora, state["params"], self.s.model_config, self.config.model.hf_path, self.workdir,
                       is_main)
