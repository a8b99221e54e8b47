"""Our checkpoint as the curation sampler: its prompts are the training pipeline's, its
greedy answers equal generate() on the RL loader's batches (an independent path), and a
stage killed after some blocks continues to exactly the rows an uninterrupted run logs,
sampling included."""
import json
import os
import shutil

import jax
import numpy as np
import pytest

from configs import curate
from guilibra_jax import generate as G
from guilibra_jax.curate import prompts as CP
from guilibra_jax.curate import run as CRUN
from guilibra_jax.curate.samplers import SamplingParams
from guilibra_jax.data.pipeline import make_rl_loader
from guilibra_jax.models.vision import device_vision_inputs
from guilibra_jax.train import data_source as DS


def model_config(run, **kw):
    cfg = curate.get_config()
    cfg.data.inputs = (run.test_path,)
    cfg.model.path = run.workdir
    cfg.batch_size = 4
    for k, v in kw.items():
        section, _, key = k.rpartition("__")
        (cfg[section] if section else cfg)[key] = v
    return cfg


@pytest.fixture(scope="module")
def sampler(run):
    cfg = model_config(run, stages=("consistency",))
    return CRUN.build_samplers(cfg, {})["consistency"]


def loader_batches(run):
    cfg = DS.data_config(run.config, [run.test_path], for_eval=True)
    cfg.update(shuffle=False, batch_size=4)
    return list(make_rl_loader(cfg, run.tokenizer, run.model_config, shard_index=0, shard_count=1))


def test_action_prompts_are_the_training_pipelines(run, sampler):
    batch = loader_batches(run)[0]
    for row, r in enumerate(run.records[:4]):
        ids, grid, pixels = sampler._encode(CP.action_prompt(_abs(r, run), sampler.spec, sampler.frame(r)))
        want = batch["prompt_ids"][row][batch["prompt_mask"][row] > 0]
        np.testing.assert_array_equal(ids, want)
        np.testing.assert_array_equal(grid[0], batch["image_grid_thw"][row])
        assert sampler.frame(r).resized == batch["resized_size"][row]


def _abs(r, run):
    import dataclasses
    return dataclasses.replace(r, image=os.path.join(run.base, r.image))


def test_greedy_answers_equal_generate_on_the_loader_batch(run, sampler):
    batch = loader_batches(run)[0]
    params = SamplingParams(n=2, temperature=0.0, max_new_tokens=8)
    records = [_abs(r, run) for r in run.records[:3]]
    replies = sampler.sample([CP.action_prompt(r, sampler.spec, sampler.frame(r)) for r in records], params, 0)
    cfg = G.SamplingConfig(temperature=0.0, max_new_tokens=8, stop_token_ids=sampler.stop,
                           pad_token_id=sampler.pad_id, banned_token_ids=sampler.banned)
    out = G.generate(run.graphdef, run.params, batch["prompt_ids"], batch["prompt_mask"], batch["positions"],
                     batch["rope_deltas"], batch["pixel_values"], device_vision_inputs(batch["vision"]),
                     jax.random.PRNGKey(0), cfg)
    tokens, lengths = jax.device_get((out.tokens, out.lengths))
    for row, reps in enumerate(replies):
        want = G.decode_response(run.tokenizer, tokens[row, :lengths[row]], sampler.stop)
        assert [x.text for x in reps] == [want, want] and want


def _rows(path):
    with open(path) as f:
        return {r["id"]: r for r in map(json.loads, f)}


def test_a_killed_stage_continues_to_the_uninterrupted_result(run, tmp_path):
    kw = dict(stages=("consistency", "rebalance"), batch_size=2, consistency__samples=3,
              consistency__max_new_tokens=6, consistency__threshold=0.0)
    full = str(tmp_path / "full")
    CRUN.run_curation(model_config(run, **kw), full)
    log = os.path.join(full, "stages", "consistency.jsonl")
    rows = _rows(log)
    assert len(rows) == len(run.records) >= 5
    texts = [t for r in rows.values() for t in r["responses"]]
    assert len(set(texts)) > 1                       # sampled (temperature 1), not one fixed answer
    # a run killed during the third block: the first two blocks written, a torn line after them
    cut = str(tmp_path / "cut")
    shutil.copytree(full, cut, ignore=shutil.ignore_patterns("curated", "curation_report.*", "*.png"))
    with open(log, "rb") as f:
        lines = f.readlines()
    with open(os.path.join(cut, "stages", "consistency.jsonl"), "wb") as f:
        f.writelines(lines[:4])
        f.write(lines[4][:25])
    CRUN.run_curation(model_config(run, **kw), cut)
    assert _rows(os.path.join(cut, "stages", "consistency.jsonl")) == rows
    for name in ("sft.jsonl", "rl.jsonl", "match_frequency.jsonl"):
        with open(os.path.join(full, "curated", name)) as a, open(os.path.join(cut, "curated", name)) as b:
            assert a.read() == b.read(), name
    # other sampling settings on the same workdir are refused, naming them
    from guilibra_jax.errors import UserError
    with pytest.raises(UserError, match="params"):
        CRUN.run_curation(model_config(run, **dict(kw, consistency__samples=4)), cut)
