"""Online RL in the browser (``rl.world=miniwob``, ``train/rl/online.py``): the live states'
prompts are the dataset path's prompts for the same records, the loop's reward of an
expert response is the pool's verdict on the page, a restored source replays the same
pages, and ``python -m launch.train`` runs GRPO on live pages, logs episode metrics and
resumes from its checkpoint (replaying the browsers' pages; continuing on the same pages is
the restore test's).

The browser tests skip (with the reason) without the ``[miniwob]`` extra or Chromium; the
config checks run everywhere."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from guilibra_jax.envs.miniwob.browser import available
from guilibra_jax.errors import ConfigError
from guilibra_jax.train import config as run_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REASON = available()
browser = pytest.mark.skipif(REASON is not None, reason=f"MiniWoB++ unavailable: {REASON}")
TASKS = ("click-test", "click-button", "enter-text")


def smoke_config():
    from configs import miniwob
    return miniwob.get_config("rl_smoke")


# ----------------------------------------------------------------------------- config (no browser)
@pytest.mark.parametrize("change,key", [
    (dict(method="sft"), "rl.world"),
    (dict(workers=3), "rl.online.workers"),
    (dict(tasks=("click-test", "book-flight")), "rl.online.tasks"),
])
def test_online_world_config_errors_name_the_key(change, key):
    c = smoke_config()
    c.tokenizer.path = ROOT                    # any folder: no records needed for the tokenizer
    if "method" in change:
        c.method = change["method"]
    if "workers" in change:
        c.rl.online.workers = change["workers"]
    if "tasks" in change:
        c.rl.online.tasks = change["tasks"]
    with pytest.raises(ConfigError, match=f"config key {key.replace('.', '[.]')} "):
        run_config.validate(c, planning=True)


def test_online_world_without_chromium_names_rl_world_and_the_missing_piece(monkeypatch):
    monkeypatch.setenv("MINIWOB_CHROME_BINARY", "/nonexistent/chromium")
    c = smoke_config()
    c.tokenizer.path = ROOT
    with pytest.raises(ConfigError, match=r"config key rl\.world = 'miniwob'.*(Chromium|optional extra)"):
        run_config.validate(c)



def test_a_label_outside_the_screenshot_drops_that_slots_prompt_not_the_run():
    """click-collapsible seed 0: the expert clicks a header whose centre lies below the
    screenshot (y 1.008). That slot's prompt is a filtered record naming it; the other slot's
    record is unchanged (a RecordError there ended an online GRPO run at step 3)."""
    import io
    from PIL import Image
    from guilibra_jax.data import bad_records as B
    from guilibra_jax.envs.miniwob.pool import SlotResult
    from guilibra_jax.train.rl.online import SlotSource
    buf = io.BytesIO()
    Image.new("RGB", (320, 420)).save(buf, format="PNG")
    obs = {"png": buf.getvalue(), "instruction": "Expand the section.", "history": (), "platform": "web",
           "elements": (), "screen_size": (320, 420), "step": 0, "task_id": "click-collapsible-0"}

    def slot(i, point):
        label = {"action_type": "Click", "action_description": "Click the header", "value": None,
                 "point": point, "bbox": None, "bbox2": None, "action_target": "the header", "tool_call": None}
        return SlotResult(slot=i, task="click-collapsible", seed=i, step=0, done=False, success=False,
                          raw_reward=None, error=None, obs=obs, label=label)

    src = SlotSource([slot(0, [0.517139, 1.008333]), slot(1, [0.5, 0.5])])
    dropped = src[0]
    assert isinstance(dropped, B.Dropped) and not dropped.bad
    assert dropped.reason == B.COORDS_OUTSIDE_IMAGE and "click-collapsible-0 step 0" in dropped.where
    assert "outside the image" in dropped.message
    assert src[1].target.point == (0.5, 0.5)


# ----------------------------------------------------------------------------- the prompt source
@pytest.fixture(scope="module")
def pool():
    if REASON is not None:
        pytest.skip(f"MiniWoB++ unavailable: {REASON}")
    from guilibra_jax.envs.miniwob.pool import EnvPool
    from guilibra_jax.train.rl.online import policy_coords
    c = smoke_config()
    space, resized = policy_coords(c, c.model.tiny.family)
    p = EnvPool(2, scale=c.rl.online.scale, max_steps=c.rl.online.max_steps, coord_space=space,
                resized_size=resized)
    yield p
    p.close()


@pytest.fixture(scope="module")
def tokenizer_dir(pool, tmp_path_factory):
    """A demo BPE trained on live states of the smoke tasks (what the random policy reads)."""
    from guilibra_jax.data.demo_tokenizer import build_demo_tokenizer, demo_corpus
    records = [r.record() for r in pool.reset([(t, 1) for t in TASKS[:2]])]
    records += [r.record() for r in pool.reset([(TASKS[2], 1), None])[:1]]
    out = str(tmp_path_factory.mktemp("tok"))
    build_demo_tokenizer(demo_corpus(records, "qwen2_5_vl", ("guilibra",)), 1024, out)
    return out


def _source(pool, tokenizer_dir, workdir):
    from guilibra_jax.train import model_factory as MF
    from guilibra_jax.train.data_source import prepare_tokenizer
    from guilibra_jax.train.rl.online import OnlinePrompts, policy_coords
    c = smoke_config()
    c.tokenizer.path = tokenizer_dir
    tok = prepare_tokenizer(c, str(workdir))
    mc = MF.model_config_of(c, tok)
    _, resized = policy_coords(c, mc.family)
    return c, tok, mc, OnlinePrompts(c, tok, mc, str(workdir), pool=pool), resized


def _rows_by_where(batch):
    from guilibra_jax.train.rl import rollout as RO
    ro = RO.expand_groups(batch, 1)
    out = {}
    for r, where in enumerate(batch["where"]):
        m = batch["prompt_mask"][r].astype(bool)
        out[where] = (batch["prompt_ids"][r][m], ro.pixels[r], tuple(ro.grids[r]), batch["reward_targets"][r],
                      tuple(batch["resized_size"][r]))
    return out


@browser
def test_live_batch_is_the_dataset_paths_batch_of_the_same_records(pool, tokenizer_dir, tmp_path):
    from guilibra_jax.data.pipeline import make_rl_loader
    from guilibra_jax.train import data_source as DS
    c, tok, mc, src, _ = _source(pool, tokenizer_dir, tmp_path)
    batch = next(src)
    assert batch["row_valid"].all() and len(batch["where"]) == 2
    # the same states written as a dataset (images as PNG files), read the way the RL trainer reads data
    os.makedirs(tmp_path / "images")
    with open(tmp_path / "train.jsonl", "w") as f:
        for i, res in enumerate(src.results):
            rec = res.record()
            png = f"images/{i}.png"
            (tmp_path / png).write_bytes(rec.image["bytes"])
            f.write(json.dumps({**rec.to_dict(), "image": png}) + "\n")
    loader = make_rl_loader(DS.data_config(c, [str(tmp_path / "train.jsonl")]), tok, mc, shard_index=0,
                            shard_count=1)
    ref = next(loader)
    loader.close()
    live, data = _rows_by_where(batch), _rows_by_where(ref)
    for i in range(2):
        a = live[next(w for w in live if w.startswith(f"slot {i} "))]
        b = data[next(w for w in data if w.endswith(f":{i + 1}"))]
        assert np.array_equal(a[0], b[0])                         # prompt ids
        assert np.array_equal(a[1], b[1]) and a[2] == b[2]        # pixels and grid
        assert a[3] == b[3] and a[4] == b[4]                      # reward target (the expert's label), size
        assert a[3].action_type == src.results[i].label["action_type"]


@browser
def test_expert_answers_score_one_in_the_loop_and_succeed_on_the_page(pool, tokenizer_dir, tmp_path):
    """The loop's reward of a response and the pool's step reward of the same response in the
    page agree; an expert response earns 1 and (click-test) the page's success."""
    from guilibra_jax import actions as A
    from guilibra_jax.train.rl import rollout as RO
    c, tok, mc, src, resized = _source(pool, tokenizer_dir, tmp_path)
    src._ensure()
    src.results = pool.reset([("click-test", 5), ("click-button", 5)])
    batch = next(src)
    G = 2
    ro = RO.expand_groups(batch, G)
    texts = []
    for r, where in enumerate(batch["where"]):
        slot = int(where.split()[1])
        rec = src.results[slot].record()
        act = rec.target.action("resized_pixels", image_size=rec.image_size, resized_size=resized)
        texts += [A.render_response(act, None, family=mc.family), "not an answer"]
    ro.texts = texts
    scored = RO.score_responses(texts, ro, "grpo", coord_space="resized_pixels")
    np.testing.assert_allclose(scored.reward, [1.0, 0.0, 1.0, 0.0])
    src.advance(ro)
    m = src.metrics()
    assert m["online/step_reward"] == 1.0 and m["online/env_steps"] == 2
    assert m["online/episodes"] >= 1 and m["online/episode_success"] == 1.0      # click-test: one click
    log = [json.loads(l) for l in open(tmp_path / "online_episodes.jsonl")]
    assert {"task": "click-test", "seed": 5, "success": True, "steps": 1}.items() <= log[0].items()


@browser
def test_restored_source_replays_the_same_pages(pool, tokenizer_dir, tmp_path):
    from guilibra_jax.train.rl import rollout as RO
    c, tok, mc, src, _ = _source(pool, tokenizer_dir, tmp_path)
    batch = next(src)
    ro = RO.expand_groups(batch, 2)
    ro.texts = ['<answer>{"action_type": "Click", "action_description": "", "value": "None", '
                '"point_2d": [30, 120]}</answer>'] * ro.rows
    src.advance(ro)                                        # one step into each episode
    state = json.loads(json.dumps(src.get_state()))        # as the checkpoint stores it
    want = _rows_by_where(next(src))
    pool.reset([("enter-text", 99), ("click-button", 98)])  # the browsers move on
    c2, tok2, mc2, again, _ = _source(pool, tokenizer_dir, tmp_path)
    again.set_state(state)
    got = _rows_by_where(next(again))
    assert sorted(got) == sorted(want)
    for w in want:
        assert np.array_equal(got[w][0], want[w][0]) and np.array_equal(got[w][1], want[w][1])
    assert again.schedule.state() == src.schedule.state()


@browser
def test_pool_workers_outlive_signals_meant_for_the_trainer(pool):
    """Ctrl-C / timeout / a scheduler's SIGTERM to the trainer's process group must leave the
    browsers alive: the preemption checkpoint reads the pool's state after the signal."""
    import signal
    before = pool.state()
    for p in pool._procs:
        assert os.getpgid(p.pid) != os.getpgid(0)          # not in the trainer's group
        os.kill(p.pid, signal.SIGTERM)
        os.kill(p.pid, signal.SIGINT)
    assert pool.state() == before and all(p.is_alive() for p in pool._procs)


# ----------------------------------------------------------------------------- launch.train
def _launch(workdir, tokenizer_dir, cache, *extra):
    cmd = [sys.executable, "-m", "launch.train", "--config=configs/miniwob.py:rl_smoke", f"--workdir={workdir}",
           f"--config.tokenizer.path={tokenizer_dir}", f"--config.train.compilation_cache_dir={cache}", *extra]
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout + out.stderr


@browser
def test_grpo_on_live_pages_runs_logs_episodes_and_resumes(tokenizer_dir, tmp_path):
    workdir, cache = str(tmp_path / "run"), str(tmp_path / "cache")
    log1 = _launch(workdir, tokenizer_dir, cache)
    assert "no checkpoint" in log1
    rows = [json.loads(l) for l in open(os.path.join(workdir, "metrics.jsonl"))]
    steps = [r for r in rows if "reward_mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert {"online/episodes", "online/env_steps", "online/step_reward", "loss", "kl"} <= set(r)
        assert r["online/env_steps"] == 2 * r["step"]          # two slots, one step each per rollout
    assert steps[-1]["online/episodes"] + steps[-1]["online/abandoned"] >= 2   # max_steps 2: all ended
    log2 = _launch(workdir, tokenizer_dir, cache)               # the same command again: resumes, replays
    assert "resumed from step 2" in log2
    episodes = [json.loads(l) for l in open(os.path.join(workdir, "online_episodes.jsonl"))]
    assert len(episodes) == steps[-1]["online/episodes"]      # the log matches the checkpoint's counters
    assert all(e["task"] in TASKS for e in episodes)
