"""The "checkpoint" agent: prompts equal the training pipeline's (from a workdir or an HF
folder), greedy responses equal generate() on the RL loader's batches, run_eval scores it
in its training space, and a bad workdir / folder is named in the error."""

import json
import os
import shutil

import jax
import ml_collections as mlc
import numpy as np
import pytest
from flax import nnx

from configs import eval_demo
from eval_fixtures import BATCH, N_NEW, doc_commands, parse_eval_flags, random_params
from guilibra_jax import actions as A
from guilibra_jax import generate as G
from guilibra_jax.data.pipeline import make_rl_loader
from guilibra_jax.envs.export import load_records
from guilibra_jax.eval.agents import make_agent, observation_from_record, responses_for_records
from guilibra_jax.eval.run import run_eval
from guilibra_jax.models.vision import device_vision_inputs
from guilibra_jax.train import checkpoint as C
from guilibra_jax.train import data_source as DS
from guilibra_jax.train import model_factory as MF

PROMPT_KEYS = ("prompt_ids", "prompt_mask", "positions", "rope_deltas", "image_grid_thw", "row_valid")


@pytest.fixture(scope="module")
def agent(run):
    return make_agent("checkpoint", workdir=run.workdir, batch_size=BATCH, max_new_tokens=N_NEW)


def observations(run):
    return [observation_from_record(r, run.base) for r in run.records]


def loader_batches(run, method="guilibra"):
    """The trainer's held-out RL batches (data_source.data_config, as make_evaluator), in
    file order."""
    cfg = DS.data_config(run.config, [run.test_path], for_eval=True)
    cfg.update(method=method, shuffle=False)
    return list(make_rl_loader(cfg, run.tokenizer, run.model_config, shard_index=0, shard_count=1))


def hf_agent(run, settings, **kw):
    """The agent of the exported folder, with the run's data settings from its workdir
    ("run_config") or one by one ("overrides"; the padding keeps base_config's patch_bucket)."""
    d = run.config.data
    if settings == "run_config":
        kw.update(run_config=run.workdir)
    else:
        kw.update(min_pixels=d.min_pixels, max_pixels=d.max_pixels, max_length=d.max_length,
                  system_prompt=d.system_prompt, dtype="float32")
    return make_agent("checkpoint", hf_path=run.hf, batch_size=BATCH, **kw)


@pytest.mark.parametrize("source,method", [("workdir", "guilibra"), ("workdir", "mopd"),
                                           ("run_config", "mopd"), ("overrides", "guilibra")])
def test_prompts_equal_the_rl_loader_prompts(run, agent, source, method):
    """source: a training workdir, or its HF export with the run's settings given either way."""
    if source != "workdir":
        agent = hf_agent(run, source, method=method)
        jax.tree.map(np.testing.assert_array_equal, agent.params, run.params)   # same weights, too
    elif method != "guilibra":
        agent = make_agent("checkpoint", workdir=run.workdir, batch_size=BATCH, method=method)
    assert agent.fmt == {"guilibra": "guilibra", "mopd": "tool_call"}[method]
    got, want = list(agent.prompt_batches(observations(run))), loader_batches(run, method)
    assert len(got) == len(want) == -(-len(run.records) // BATCH) >= 2
    for g, w in zip(got, want):
        for k in PROMPT_KEYS:
            np.testing.assert_array_equal(g[k], w[k], err_msg=k)
        n = int(np.prod(w["image_grid_thw"], axis=1).sum())    # image rows, then zero padding
        np.testing.assert_array_equal(g["pixel_values"][:n], w["pixel_values"][:n])
        assert not g["pixel_values"][n:].any()
        assert source == "overrides" or g["pixel_values"].shape == w["pixel_values"].shape
        assert g["prompt_ids"].shape[0] == BATCH and g["resized_size"] == w["resized_size"]
    # the stated image size is the space the agent's points are scored in
    sizes = [s for w in want for s in w["resized_size"]]
    assert [tuple(agent.resized_size(r.image_size)) for r in run.records] == sizes
    assert agent.coord_space == A.FAMILY_COORD_SPACE["qwen2_5_vl"] == "resized_pixels"
    text = run.tokenizer.decode(want[0]["prompt_ids"][0][want[0]["prompt_mask"][0] > 0])
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n") and run.records[0].instruction in text


def reference_responses(run):
    """Greedy generate() on the RL loader's batches with the saved params, decoded."""
    im_end = run.tokenizer.convert_tokens_to_ids("<|im_end|>")
    sampling = G.SamplingConfig(temperature=0.0, max_new_tokens=N_NEW, stop_token_ids=(im_end,),
                                pad_token_id=run.tokenizer.pad_token_id)
    out = []
    for b in loader_batches(run):
        gen = G.generate(run.graphdef, run.params, b["prompt_ids"], b["prompt_mask"], b["positions"],
                         b["rope_deltas"], b["pixel_values"], device_vision_inputs(b["vision"]),
                         jax.random.key(0), sampling)
        tokens, lengths = jax.device_get((gen.tokens, gen.lengths))
        for i in range(b["num_samples"]):
            text = run.tokenizer.decode(tokens[i, :lengths[i]], skip_special_tokens=False)
            out.append(text.removesuffix("<|im_end|>"))
    return out


def test_greedy_responses_equal_generate_on_the_loader_batches(run, agent):
    calls = []
    respond = agent.respond_batch
    agent.respond_batch = lambda obs: calls.append(len(obs)) or respond(obs)
    try:
        responses = responses_for_records(agent, run.records, run.base)
    finally:
        del agent.respond_batch
    n = len(run.records)
    assert calls == [BATCH] * (n // BATCH) + ([n % BATCH] if n % BATCH else [])
    ref = reference_responses(run)
    assert responses == ref
    assert len(set(ref)) > 1, "responses should depend on the prompt"


def test_run_eval_scores_the_checkpoint_in_its_training_space(run, tmp_path):
    config = eval_demo.get_config("smoke")
    config.agents = ("checkpoint",)
    config.agent_kwargs.checkpoint.update(dict(workdir=run.workdir, max_new_tokens=N_NEW, batch_size=BATCH))
    config.data.n_tasks = run.config.data.synthetic.tasks
    config.platforms = ("desktop",)
    config.online.episodes = 1
    out = run_eval(config, str(tmp_path))
    n_steps = len(load_records(str(tmp_path / "data" / "test.jsonl")))
    offline = json.loads((tmp_path / "offline_checkpoint.json").read_text())
    assert offline["overall"]["n"] == n_steps == sum(r.platform == "desktop" for r in run.records)
    assert offline["coord_space"] == "resized_pixels"
    assert sum(g["n"] for g in offline["by_platform"].values()) == n_steps
    online = json.loads((tmp_path / "online_checkpoint.json").read_text())
    assert online["overall"]["episodes"] == 1
    assert all(1 <= e["steps"] <= config.online.max_steps for e in online["episodes"])
    rep = json.loads((tmp_path / "report.json").read_text())
    assert [c["name"] for c in rep["checkpoints"]] == ["checkpoint"] and set(out["summary"]) == {"checkpoint"}
    traj = tmp_path / "trajectories" / "checkpoint"
    assert os.listdir(traj) == ["desktop-3"]


def test_dropped_prompts_answer_empty_and_rows_map_back(run):
    """A prompt past max_length yields no row; the others keep their own answers although
    collate_rl moves them up (here each "answer" is the row's prompt length)."""
    obs = observations(run)
    lengths = sorted(int(m.sum()) for b in loader_batches(run) for m in b["prompt_mask"][:b["num_samples"]])
    # max_length bounds an RL prompt: the longest prompt is past it; the first steps' (short history) fit
    short = make_agent("checkpoint", workdir=run.workdir, batch_size=BATCH, max_length=lengths[-1] - 1)
    short._generate = lambda b: [str(int(m.sum())) for m in b["prompt_mask"][:b["num_samples"]]]
    alone = []
    for o in obs:
        (b,) = short.prompt_batches([o], rows=1)
        alone.append(str(int(b["prompt_mask"].sum())) if b["num_samples"] else "")
    assert "" in alone and any(alone)
    assert short.respond_batch(obs) == alone


def test_eval_demo_documents_working_overrides():
    commands = doc_commands()
    assert len(commands) == 3
    for args in commands:
        agents, kw = parse_eval_flags(args)
        assert "checkpoint" in agents and bool(kw["workdir"]) != bool(kw["hf_path"])


def test_errors_name_the_path_or_key(run, tmp_path):
    with pytest.raises(ValueError, match="exactly one of workdir .* and hf_path"):
        make_agent("checkpoint")
    with pytest.raises(ValueError, match="exactly one of workdir"):
        make_agent("checkpoint", workdir=run.workdir, hf_path=run.hf)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=f"{empty}.*config.json"):
        make_agent("checkpoint", workdir=str(empty))
    # config.json + tokenizer, no checkpoints
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(os.path.join(run.workdir, "config.json"), bare)
    with pytest.raises(FileNotFoundError, match=f"no checkpoints folder {bare}"):
        make_agent("checkpoint", workdir=str(bare))
    (bare / "checkpoints").mkdir()
    with pytest.raises(FileNotFoundError, match="tokenizer"):
        make_agent("checkpoint", workdir=str(bare))
    shutil.copytree(os.path.join(run.workdir, "tokenizer"), bare / "tokenizer")
    with pytest.raises(FileNotFoundError, match=f"no complete checkpoint under .*{bare}"):
        make_agent("checkpoint", workdir=str(bare))
    with pytest.raises(FileNotFoundError, match="step 7"):
        make_agent("checkpoint", workdir=run.workdir, step=7)
    with pytest.raises(FileNotFoundError, match="hf_path.*not a folder"):
        make_agent("checkpoint", hf_path=str(tmp_path / "nowhere"))
    weights_only = tmp_path / "weights_only"
    weights_only.mkdir()
    for f in ("config.json", "model.safetensors"):
        shutil.copy(os.path.join(run.hf, f), weights_only)
    with pytest.raises(FileNotFoundError, match=f"hf_path: no tokenizer in '{weights_only}'"):
        make_agent("checkpoint", hf_path=str(weights_only))
    with pytest.raises(ValueError, match="run_config.*is for hf_path"):
        make_agent("checkpoint", workdir=run.workdir, run_config=run.workdir)
    with pytest.raises(FileNotFoundError, match=f"run_config: {empty}.*config.json"):
        make_agent("checkpoint", hf_path=run.hf, run_config=str(empty))
    with pytest.raises(ValueError, match="method"):
        make_agent("checkpoint", workdir=run.workdir, method="sft")


def test_a_run_config_older_than_the_code_takes_new_keys_defaults(run, tmp_path):
    from guilibra_jax.eval.model_agent import load_run_config
    old = run.config.to_dict()
    del old["data"]["system_prompt"], old["train"]
    C.write_json(str(tmp_path / "config.json"), old)
    config = load_run_config(str(tmp_path))
    assert config.data.system_prompt == "" and config.train.steps > 0
    assert config.data.max_length == run.config.data.max_length
    expected = mlc.ConfigDict(run.config.to_dict())
    expected.data.system_prompt = ""
    assert DS.data_config(config, [], for_eval=True) == DS.data_config(expected, [], for_eval=True)


def test_a_qwen3_vl_model_is_scored_in_0_1000(run, tmp_path):
    config = mlc.ConfigDict(run.config.to_dict())
    config.model.tiny.family = "qwen3_vl"
    abstract = nnx.eval_shape(lambda: MF.build_model(config, run.tokenizer)[0])
    graphdef, pstate, _ = nnx.split(abstract, nnx.Param, ...)
    hf = MF.export(graphdef, random_params(nnx.to_pure_dict(pstate)), abstract.config, run.tokenizer,
                   str(tmp_path / "qwen3"))
    agent = make_agent("checkpoint", hf_path=hf, run_config=run.workdir)
    assert agent.model_config.family == "qwen3_vl"
    assert (agent.coord_space, agent.fmt) == (A.FAMILY_COORD_SPACE["qwen3_vl"], "guilibra") == ("norm1000", "guilibra")
