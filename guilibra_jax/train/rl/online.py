"""Online RL prompts from live episodes: MiniWoB++ pages (``rl.world = "miniwob"``) or the
synthetic world (``rl.world = "synthetic"``, :class:`envs.synthetic_pool.SyntheticPool`,
in process; its tasks are the platforms of ``data.synthetic.platforms`` on train task seeds
of ``data.synthetic.seed``): GUI-Libra's GRPO on on-policy states ("state groups").

    prompts = OnlinePrompts(config, tokenizer, model_config, workdir)   # W browsers (envs.miniwob.pool)
    batch = next(prompts)      # the W live states as a collate_rl batch (the dataset path's prompt code)
    ro = phases.rollout(...)  # G responses per state; rewards: the verifier against the expert's label
    prompts.advance(ro)        # each episode takes one step with its state's first response
    prompts.metrics()          # online/episodes, online/episode_success, online/step_reward, ...

Each of the ``rl.online.workers`` slots of an :class:`EnvPool` holds one live episode. A
batch is the slots' current states as native records whose target is the scripted
expert's action in that very state (``SlotResult.record()``), turned into prompts by
``data.pipeline.make_rl_loader`` over an in-memory source (the dataset path's encoder and
``collate_rl``, in slot order), so the loop's reward phase verifies each of the G responses
against that label. After the rollout the loop calls :meth:`advance`: slot i executes the
first response of its group in the page; an episode that ends (the page's verdict, or
``rl.online.max_steps`` actions; with ``rl.online.stop_at_mistake`` also its first wrong
action), a state the expert cannot label, or a state whose prompt was dropped is replaced
by the next (task, seed) of an :class:`EpisodeSchedule` over train seeds only (``data.seed``; the held-out seeds ``launch.eval`` plays are never trained on).

Finished episodes are appended to ``workdir/online_episodes.jsonl`` ({round, task, seed,
success, steps}; ``online_episodes.p<k>.jsonl`` on process k > 0). ``get_state()`` holds the
schedule's counter, the pool's per-slot (task, seed, executed actions) and the counters;
``set_state()`` replays the actions (the same pages mid-episode) and cuts the episode log
back to the checkpoint, so a resumed run continues exactly where the checkpoint was taken.
"""

from __future__ import annotations

import atexit
import collections
import json
import logging
import os
from typing import Any, Sequence

import jax
import numpy as np

from guilibra_jax import actions as A
from guilibra_jax.data import bad_records as B
from guilibra_jax.data import native as N
from guilibra_jax.data import readers as R
from guilibra_jax.train import data_source as DS

log = logging.getLogger(__name__)

WINDOW = 100        # online/episode_success: success rate of the last WINDOW finished episodes
MAX_EMPTY = 3       # batches in a row without one valid prompt before giving up


def online_tasks(config) -> tuple[str, ...]:
    """``rl.online.tasks``, or every task with an expert (the synthetic world: its platforms)."""
    if config.rl.world == "synthetic":
        return tuple(config.data.synthetic.platforms)
    from guilibra_jax.envs.miniwob.experts import TASKS
    return tuple(config.rl.online.tasks) or tuple(TASKS)


def _make_pool(config, family: str):
    """The live episodes of ``rl.world``: W browsers, or W synthetic-world slots whose
    responses are read in the coordinate space and resized sizes the policy's prompts use."""
    o = config.rl.online
    if config.rl.world == "synthetic":
        from guilibra_jax.envs.synthetic_pool import SyntheticPool
        budgets = DS.pixel_budgets(config.data)

        def resized(size, platform):
            lo, hi = budgets.bounds(platform)
            return A.resized_size_for(size, family, min_pixels=lo, max_pixels=hi)

        return SyntheticPool(int(o.workers), coord_space=A.FAMILY_COORD_SPACE[family], resized_size=resized,
                             max_steps=int(o.max_steps))
    from guilibra_jax.envs.miniwob.pool import EnvPool
    space, resized = policy_coords(config, family)
    return EnvPool(int(o.workers), scale=float(o.scale), max_steps=int(o.max_steps), coord_space=space,
                   resized_size=resized)


def policy_coords(config, family: str) -> tuple[str, tuple[int, int]]:
    """(coordinate space, resized (w, h)) of the policy's answers on MiniWoB++ screenshots at
    ``rl.online.scale`` under the run's pixel budgets: what the pool executes them in, and
    what ``collate_rl`` reports for the same images."""
    from guilibra_jax.envs.miniwob.browser import TASK_HEIGHT, TASK_WIDTH
    from guilibra_jax.envs.miniwob.env import PLATFORM
    scale = float(config.rl.online.scale)
    size = (round(TASK_WIDTH * scale), round(TASK_HEIGHT * scale))
    lo, hi = DS.pixel_budgets(config.data).bounds(PLATFORM)
    return A.FAMILY_COORD_SPACE[family], A.resized_size_for(size, family, min_pixels=lo, max_pixels=hi)


class SlotSource(R.StepSource):
    """The live slots' states as records (``SlotResult.record()``); a slot the expert cannot
    label is a filtered (not bad) record, ``no_label``; so is a label the record format refuses
    (the expert clicks an element partly below the screenshot: its point lies outside the
    image), under its bad-record reason: the slot starts a new episode, the run goes on."""

    def __init__(self, results: Sequence[Any]):
        self.results = list(results)

    def __len__(self) -> int:
        return len(self.results)

    def where(self, i: int) -> str:
        r = self.results[i]
        return f"slot {i} ({r.task}-{r.seed} step {r.step})"

    def __getitem__(self, i: int):
        r = self.results[i]
        if r.label is None:
            return B.Dropped("no_label", self.where(i), "the episode is over or the expert has no action here",
                             bad=False)
        try:
            return r.record(split="train")
        except N.RecordError as e:
            return B.Dropped(B.classify_record_error(str(e)), self.where(i), f"the expert's label: {e}", bad=False)


class OnlinePrompts:
    """The RL loop's prompt source over live browser episodes (see the module doc).
    ``pool``: an :class:`envs.miniwob.pool.EnvPool` to use instead of starting one (tests)."""

    def __init__(self, config, tokenizer, model_config, workdir: str, *, pool=None):
        from guilibra_jax.envs.miniwob.pool import EpisodeSchedule
        self.tokenizer, self.model_config = tokenizer, model_config
        self.tasks = online_tasks(config)
        if config.rl.world == "synthetic":    # the world's train seeds: never a held-out task
            s = config.data.synthetic
            self.schedule = EpisodeSchedule(self.tasks, seed=s.seed, split="train", split_fraction=s.test_fraction)
        else:
            self.schedule = EpisodeSchedule(self.tasks, seed=config.data.seed, split="train")
        self.stop_at_mistake = bool(config.rl.online.stop_at_mistake)
        self.pool = pool if pool is not None else _make_pool(config, model_config.family)
        self._own_pool = pool is None
        if self._own_pool:
            atexit.register(self.close)
        # the evaluation loader's settings (one epoch, no shuffle, no rebalancing): rows in slot order
        self.cfg = DS.data_config(config, [], for_eval=True)
        self.cfg.update(batch_size=self.pool.size, shuffle=False)
        k = jax.process_index()
        name = "online_episodes.jsonl" if k == 0 else f"online_episodes.p{k}.jsonl"
        self.episode_log = os.path.join(workdir, name)
        self.results: list | None = None     # SlotResult per slot: the live states
        self._where: list[str] = []          # the last batch's rows -> slot ("where" of SlotSource)
        self.rounds = 0                      # rollouts advanced so far
        self.episodes = self.successes = self.abandoned = self.env_steps = self.dropped = 0
        self.recent: collections.deque = collections.deque(maxlen=WINDOW)
        self._step_rewards: list[float] = []
        self._logged = 0                     # lines of the episode log written by this run's history

    # ------------------------------------------------------------------ the loop's calls
    def __next__(self) -> dict:
        self._ensure()
        from guilibra_jax.data.pipeline import make_rl_loader
        for _ in range(MAX_EMPTY):
            source = SlotSource(self.results)
            loader = make_rl_loader(self.cfg, self.tokenizer, self.model_config, shard_index=0, shard_count=1,
                                    source=source)
            try:
                batch = next(loader)
            finally:
                loader.close()
            self._where = list(batch["where"])
            self.dropped += len(batch["dropped"])
            if np.any(batch["row_valid"]):
                return batch
            self._restart([i for i in range(len(source))])   # nothing to prompt: new episodes everywhere
        raise RuntimeError(f"{MAX_EMPTY} online batches in a row hold no valid prompt (the expert labels no "
                           f"state, or every prompt is longer than data.max_length = {self.cfg['max_length']})")

    def advance(self, ro, play: Sequence[str] | None = None) -> None:
        """Step every slot's episode with the first of its G responses in ``ro`` (the rollout
        of the last batch), or with ``play[row]`` (one response per prompt row: the greedy
        play); restart finished episodes and slots without a prompt."""
        slot_of = {SlotSource(self.results).where(i): i for i in range(len(self.results))}
        responses: list[str | None] = [None] * len(self.results)
        for row, where in enumerate(self._where):
            responses[slot_of[where]] = ro.texts[row * ro.group_size] if play is None else play[row]
        restart = [i for i, r in enumerate(responses) if r is None]
        self.abandoned += len(restart)
        self._step_rewards = []
        for i, res in enumerate(self.pool.step(responses)):
            if res is None:
                continue
            self.results[i] = res
            self.env_steps += 1
            if res.step_reward is not None:
                self._step_rewards.append(float(res.step_reward["total"]))
            wrong = res.step_reward is not None and float(res.step_reward["accuracy"]) < 1.0
            if res.done or (self.stop_at_mistake and wrong):
                self._finished(res, cut=not res.done)
                restart.append(i)
            elif res.label is None:      # the expert has no action in this live state
                self.abandoned += 1
                restart.append(i)
        self.rounds += 1
        self._restart(sorted(restart))

    def metrics(self) -> dict[str, float]:
        """This process's online counters for the step's metrics row."""
        row = {"online/episodes": self.episodes, "online/env_steps": self.env_steps,
               "online/abandoned": self.abandoned, "online/dropped_prompts": self.dropped}
        if self.recent:
            row["online/episode_success"] = float(np.mean(self.recent))
        if self._step_rewards:
            row["online/step_reward"] = float(np.mean(self._step_rewards))
        return row

    def get_state(self) -> dict:
        self._ensure()
        return {"schedule": self.schedule.state(), "pool": self.pool.state(), "rounds": self.rounds,
                "counts": [self.episodes, self.successes, self.abandoned, self.env_steps, self.dropped],
                "recent": [int(x) for x in self.recent], "logged": self._logged}

    def set_state(self, state: dict) -> None:
        slots = state["pool"]
        if len(slots) != self.pool.size:
            from guilibra_jax.errors import ConfigError
            raise ConfigError(f"config key rl.online.workers = {self.pool.size} is invalid: expected "
                              f"{len(slots)}, the browser slots of the checkpoint this run resumes")
        self.schedule.set_state(state["schedule"])
        self.results = self.pool.restore(slots)
        self.rounds = int(state["rounds"])
        self.episodes, self.successes, self.abandoned, self.env_steps, self.dropped = (int(x) for x in state["counts"])
        self.recent = collections.deque((bool(x) for x in state["recent"]), maxlen=WINDOW)
        self._logged = int(state["logged"])
        _truncate_lines(self.episode_log, self._logged)   # episodes played after the checkpoint replay

    def close(self) -> None:
        if self._own_pool and self.pool is not None:
            self.pool.close()
            self.pool = None

    # ------------------------------------------------------------------ helpers
    def _ensure(self) -> None:
        if self.results is None:
            self.results = self.pool.reset([next(self.schedule) for _ in range(self.pool.size)])

    def _restart(self, slots: Sequence[int]) -> None:
        if not slots:
            return
        jobs: list = [None] * self.pool.size
        for i in slots:
            jobs[i] = next(self.schedule)
        for i, res in enumerate(self.pool.reset(jobs)):
            if res is not None:
                self.results[i] = res

    def _finished(self, res, cut: bool = False) -> None:
        """Count and log a finished episode; ``cut``: ended at a mistake (rl.online.stop_at_mistake), failed."""
        success = bool(res.success) and not cut
        self.episodes += 1
        self.successes += int(success)
        self.recent.append(success)
        row = {"round": self.rounds, "task": res.task, "seed": res.seed, "success": success, "steps": res.step}
        if cut:
            row["cut"] = True
        with open(self.episode_log, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        self._logged += 1


def _truncate_lines(path: str, n: int) -> None:
    """Keep the first ``n`` lines of ``path`` (missing file: nothing to keep)."""
    if not os.path.exists(path):
        return
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()[:n]
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(lines)


def per_task_success(path: str) -> dict[str, dict[str, float]]:
    """{task: {episodes, success_rate}} of an ``online_episodes.jsonl``."""
    acc: dict[str, list[bool]] = collections.defaultdict(list)
    with open(path, encoding="utf-8") as f:
        for line in f:
            e = json.loads(line)
            acc[e["task"]].append(bool(e["success"]))
    return {t: {"episodes": len(v), "success_rate": float(np.mean(v))} for t, v in sorted(acc.items())}
