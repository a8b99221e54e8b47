"""Online RL on the synthetic world (``rl.world=synthetic``, ``envs/synthetic_pool.py`` behind
``train/rl/online.py``): the expert's answers, read back through the loop's own prompts and
reward, score 1 at every state and finish every episode with the world's goal reached; a
mistake leads to a state the expert labels with its recovery; a restored source replays the
same states; training episodes never use a held-out task seed; ``launch.train`` runs GRPO on
live episodes, logs them and resumes."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from guilibra_jax.errors import ConfigError
from guilibra_jax.train import config as run_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def smoke_config(tokenizer_dir=ROOT):
    from configs import grpo_demo
    c = grpo_demo.get_config("smoke")
    c.rl.world = "synthetic"
    c.rl.online.workers = c.data.batch_size
    c.rl.online.max_steps = 15
    c.tokenizer.path = tokenizer_dir
    return c


def test_synthetic_world_config_errors_name_the_key():
    c = smoke_config()
    c.rl.online.tasks = ("click-test",)
    with pytest.raises(ConfigError, match=r"config key rl\.online\.tasks "):
        run_config.validate(c, planning=True)
    c = smoke_config()
    c.rl.online.workers = 3
    with pytest.raises(ConfigError, match=r"config key rl\.online\.workers "):
        run_config.validate(c, planning=True)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """A demo BPE over the world's expert records (what the random smoke policy reads)."""
    from guilibra_jax.data.demo_tokenizer import build_demo_tokenizer, demo_corpus
    from guilibra_jax.envs.export import expert_episode, step_record
    records = [step_record(env, step, {"bytes": b""}, "train") for p in ("desktop", "mobile")
               for env, step, _ in expert_episode(p, 3)]
    out = str(tmp_path_factory.mktemp("tok"))
    build_demo_tokenizer(demo_corpus(records, "qwen2_5_vl", ("guilibra",)), 1024, out)
    return out


def _source(tokenizer_dir, workdir, workers=None):
    from guilibra_jax.train import model_factory as MF
    from guilibra_jax.train.data_source import prepare_tokenizer
    from guilibra_jax.train.rl.online import OnlinePrompts
    c = smoke_config(tokenizer_dir)
    if workers:
        c.rl.online.workers = c.data.batch_size = workers
    tok = prepare_tokenizer(c, str(workdir))
    mc = MF.model_config_of(c, tok)
    return c, mc, OnlinePrompts(c, tok, mc, str(workdir))


def _expert_texts(src, batch, mc, G):
    """G copies of the expert's answer per row, rendered as the policy writes them (points in
    the row's resized pixels)."""
    from guilibra_jax import actions as A
    texts = []
    for r, where in enumerate(batch["where"]):
        rec = src.results[int(where.split()[1])].record()
        act = rec.target.action("resized_pixels", image_size=rec.image_size,
                                resized_size=tuple(batch["resized_size"][r]))
        texts += [A.render_response(act, None, family=mc.family)] * G
    return texts


def test_expert_answers_score_one_in_the_loop_and_finish_every_episode(tokenizer_dir, tmp_path):
    from guilibra_jax.train.rl import rollout as RO
    c, mc, src = _source(tokenizer_dir, tmp_path)
    G = 2
    while src.episodes < 4:
        batch = next(src)
        assert batch["row_valid"].all()
        ro = RO.expand_groups(batch, G)
        ro.texts = _expert_texts(src, batch, mc, G)
        scored = RO.score_responses(ro.texts, ro, "grpo", coord_space="resized_pixels")
        np.testing.assert_allclose(scored.reward, 1.0)
        src.advance(ro)
        assert src.metrics()["online/step_reward"] == 1.0
    m = src.metrics()
    assert m["online/episode_success"] == 1.0 and m["online/abandoned"] == 0
    log = [json.loads(l) for l in open(tmp_path / "online_episodes.jsonl")]
    assert {e["task"] for e in log} == {"desktop", "mobile"} and all(e["success"] for e in log)


def test_a_mistake_is_labelled_with_the_experts_recovery(tokenizer_dir, tmp_path):
    """A wrong action (Home from a task's start) leaves the episode running; the next label
    is the expert's action from the new state, and following it still reaches the goal."""
    from guilibra_jax.envs.synthetic_pool import SyntheticPool
    pool = SyntheticPool(1, coord_space="unit")
    seeds = [s for s in range(200) if pool.reset([("mobile", s)])[0].label["action_type"] == "Click"]
    res = pool.reset([("mobile", seeds[0])])[0]
    first = res.label
    res = pool.step(['<answer>{"action_type": "NavigateHome", "action_description": "home", "value": "None", '
                     '"point_2d": "none"}</answer>'])[0]
    assert not res.done and res.step_reward["accuracy"] == 0.0 and res.label is not None
    steps = 0
    while not res.done:
        from guilibra_jax import actions as A
        from guilibra_jax.data import native as N
        t = N.target_from_dict(res.label)
        res = pool.step([A.render_response(t.action("unit", image_size=res.obs["screen_size"]), None,
                                           family="qwen3_vl")])[0]
        assert res.step_reward["accuracy"] == 1.0
        steps += 1
    assert res.success and first is not None and steps >= 1


@pytest.mark.parametrize("stop", [False, True])
def test_stop_at_mistake_ends_an_episode_at_its_first_wrong_action(tokenizer_dir, tmp_path, stop):
    """rl.online.stop_at_mistake: a wrong executed action ends the episode, logged failed and
    cut, and the slot plays the schedule's next task; off, the episode goes on (recovery)."""
    from guilibra_jax.train.data_source import prepare_tokenizer
    from guilibra_jax.train import model_factory as MF
    from guilibra_jax.train.rl import rollout as RO
    from guilibra_jax.train.rl.online import OnlinePrompts
    c = smoke_config(tokenizer_dir)
    c.rl.online.stop_at_mistake = stop
    tok = prepare_tokenizer(c, str(tmp_path))
    mc = MF.model_config_of(c, tok)
    src = OnlinePrompts(c, tok, mc, str(tmp_path))
    batch = next(src)
    before = [(r.task, r.seed) for r in src.results]
    ro = RO.expand_groups(batch, 2)
    wrong = ('<answer>{"action_type": "NavigateHome", "action_description": "home", "value": "None", '
             '"point_2d": "none"}</answer>')
    ro.texts = [wrong] * ro.rows
    src.advance(ro)
    after = [(r.task, r.seed) for r in src.results]
    log = tmp_path / "online_episodes.jsonl"
    if stop:
        eps = [json.loads(line) for line in open(log)]
        assert len(eps) == len(before) and all(e["cut"] and not e["success"] and e["steps"] == 1 for e in eps)
        assert not set(after) & set(before) and src.metrics()["online/episode_success"] == 0.0
    else:
        assert after == before and not log.exists()
        assert all(r.step == 1 and r.label is not None for r in src.results)


def test_a_state_the_expert_cannot_label_restarts_its_slot(tokenizer_dir, tmp_path, monkeypatch):
    """A mistake can make a task impossible (the item to open deleted): the expert has no
    action there, the slot is counted abandoned and plays the schedule's next task."""
    from guilibra_jax.envs import expert as E
    from guilibra_jax.train.rl import rollout as RO
    c, mc, src = _source(tokenizer_dir, tmp_path)
    batch = next(src)
    before = [(r.task, r.seed) for r in src.results]
    ro = RO.expand_groups(batch, 2)
    ro.texts = _expert_texts(src, batch, mc, 2)
    real, calls = E.Expert.step, []

    def step(self):          # the states the responses lead to have no expert action; new episodes do
        calls.append(1)
        if len(calls) <= len(before):
            raise ValueError("'photo.png' is not in list")
        return real(self)

    monkeypatch.setattr(E.Expert, "step", step)
    src.advance(ro)
    assert src.metrics()["online/abandoned"] == len(before) - src.episodes
    assert all((r.task, r.seed) not in before for r in src.results) and all(r.label for r in src.results)


def test_restored_source_replays_the_same_states(tokenizer_dir, tmp_path):
    from guilibra_jax.train.rl import rollout as RO
    c, mc, src = _source(tokenizer_dir, tmp_path)
    batch = next(src)
    ro = RO.expand_groups(batch, 2)
    ro.texts = ['<answer>{"action_type": "Click", "action_description": "", "value": "None", '
                '"point_2d": [30, 40]}</answer>'] * ro.rows
    src.advance(ro)
    state = json.loads(json.dumps(src.get_state()))        # as the checkpoint stores it
    want = next(src)
    c2, mc2, again = _source(tokenizer_dir, tmp_path)
    again.set_state(state)
    got = next(again)
    assert list(got["where"]) == list(want["where"])
    for key in ("prompt_ids", "prompt_mask"):
        assert np.array_equal(got[key], want[key])
    for a, b in zip(RO.expand_groups(got, 1).pixels, RO.expand_groups(want, 1).pixels):
        assert np.array_equal(a, b)
    assert again.schedule.state() == src.schedule.state()


def test_training_episodes_never_use_a_held_out_task_seed():
    from guilibra_jax.envs.export import heldout_task_seeds
    from guilibra_jax.envs.miniwob.pool import EpisodeSchedule
    s = smoke_config().data.synthetic
    sched = EpisodeSchedule(("desktop", "mobile"), seed=s.seed, split="train", split_fraction=s.test_fraction)
    trained = {next(sched)[1] for _ in range(2000)}
    assert not trained & set(heldout_task_seeds(200, s.seed, s.test_fraction))


def _launch(workdir, tokenizer_dir, cache, *extra):
    cmd = [sys.executable, "-m", "launch.train", "--config=configs/grpo_demo.py:smoke", f"--workdir={workdir}",
           "--config.rl.world=synthetic", "--config.rl.online.workers=2", "--config.rl.online.max_steps=2",
           f"--config.tokenizer.path={tokenizer_dir}", f"--config.train.compilation_cache_dir={cache}", *extra]
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout + out.stderr


def test_grpo_on_live_synthetic_episodes_runs_logs_episodes_and_resumes(tokenizer_dir, tmp_path):
    workdir, cache = str(tmp_path / "run"), str(tmp_path / "cache")
    _launch(workdir, tokenizer_dir, cache, "--config.train.steps=2")
    rows = [json.loads(l) for l in open(os.path.join(workdir, "metrics.jsonl"))]
    steps = [r for r in rows if "reward_mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert {"online/episodes", "online/env_steps", "online/step_reward", "loss", "kl"} <= set(r)
        assert r["online/env_steps"] == 2 * r["step"]          # two slots, one step each per rollout
    log2 = _launch(workdir, tokenizer_dir, cache, "--config.train.steps=3", "--config.train.allow_config_change=True")
    assert "resumed from step 2" in log2
    rows = [json.loads(l) for l in open(os.path.join(workdir, "metrics.jsonl"))]
    last = [r for r in rows if "reward_mean" in r][-1]
    assert last["step"] == 3 and last["online/env_steps"] == 6
    episodes = [json.loads(l) for l in open(os.path.join(workdir, "online_episodes.jsonl"))]
    assert len(episodes) == last["online/episodes"]          # the log matches the checkpoint's counters
    assert {e["task"] for e in episodes} <= {"desktop", "mobile"}


def test_greedy_play_executes_the_policy_greedy_answer_for_each_state(tokenizer_dir, tmp_path):
    """rl.online.play=greedy: each episode executes the greedy response to its state (the
    same text as a near-zero-temperature group's first sample), not a sampled one."""
    import jax
    from guilibra_jax.train import multihost as MH
    from guilibra_jax.train.data_source import prepare_tokenizer
    from guilibra_jax.train.rl import phases as PH
    from guilibra_jax.train.rl.online import OnlinePrompts
    from guilibra_jax.train.rl.setup import setup

    class Recorder:
        """The live prompts, recording what each advance executes."""
        def __init__(self, src):
            self.src, self.played = src, []

        def __next__(self):
            return next(self.src)

        def advance(self, ro, play=None):
            self.played.append(list(play) if play is not None else [ro.texts[i * ro.group_size]
                                                                      for i in range(ro.rows // ro.group_size)])

    played = {}
    for name, play, temperature in (("greedy", "greedy", 1.0), ("cold_first", "first", 1e-4)):
        c = smoke_config(tokenizer_dir)
        c.rl.online.play, c.rl.temperature = play, temperature
        workdir = str(tmp_path / name)
        tok = prepare_tokenizer(c, workdir)
        s, state, _ = setup(c, MH.run_mesh(c), tok)
        rec = Recorder(OnlinePrompts(c, tok, s.model_config, workdir))
        for step in range(2):
            PH._rollout_next(s, state["params"], rec, jax.random.key(step))
        played[name] = rec.played
    assert played["greedy"] == played["cold_first"]
    assert len(played["greedy"]) == 2 and all(t for texts in played["greedy"] for t in texts)


@pytest.mark.parametrize("play", ["first", "greedy"])
def test_each_row_steps_and_scores_its_own_slot_when_an_earlier_slot_has_no_prompt(tokenizer_dir, tmp_path, play):
    """A batch's rows are the slots that have a prompt, in slot order: with slot 0's prompt
    gone, row r is slot r + 1. The reward of a row and the action its episode executes (the
    group's first sample, or with rl.online.play=greedy the row's one greedy text) belong to
    that slot's live state: the expert's answer per row scores 1 in the rollout and, executed,
    in the world; the same answers one row off do not."""
    import dataclasses
    from guilibra_jax.train.rl import rollout as RO
    c, mc, src = _source(tokenizer_dir, tmp_path, workers=4)
    next(src)
    src.results[0] = dataclasses.replace(src.results[0], label=None)   # the expert has no action there
    batch = next(src)
    slots = [int(w.split()[1]) for w in batch["where"]]
    assert slots == list(range(1, len(src.results))) and len(slots) >= 2
    G = 2
    ro = RO.expand_groups(batch, G)
    expert = _expert_texts(src, batch, mc, G)       # the valid rows' groups; the empty last row: ""
    pad = [""] * (ro.rows - len(expert))
    shifted = expert[G:] + expert[:G] + pad
    expert += pad
    right = RO.score_responses(expert, ro, "grpo", coord_space="resized_pixels").reward
    off = RO.score_responses(shifted, ro, "grpo", coord_space="resized_pixels").reward
    np.testing.assert_allclose(right[ro.valid], 1.0)
    assert off[ro.valid].min() < 1.0                 # the states differ: a misrouted answer is caught
    wrong = ('<answer>{"action_type": "NavigateHome", "action_description": "home", "value": "None", '
             '"point_2d": "none"}</answer>')
    if play == "first":
        ro.texts = expert
        src.advance(ro)
    else:                                            # the sampled groups are wrong; the greedy texts right
        ro.texts = [wrong] * ro.rows
        src.advance(ro, expert[:len(slots) * G:G])
    m = src.metrics()
    assert m["online/step_reward"] == 1.0 and m["online/abandoned"] == 1
