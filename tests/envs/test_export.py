"""Dataset export: native records that load, splits by task seed, full-credit targets."""

import json
import os

import pytest
from PIL import Image

from guilibra_jax import actions as A
from guilibra_jax import rewards as R
from guilibra_jax.data import native as N
from guilibra_jax.envs.export import export_dataset, heldout_task_seeds, task_split


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("world")
    manifest = export_dataset(str(out), ("desktop", "mobile"), n_tasks=30, seed=0, split_fraction=0.3)
    return str(out), manifest


def _lines(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(l) for l in f if l.strip()]


def _records(out):
    recs = []
    for split in ("train", "test"):
        path = os.path.join(out, f"{split}.jsonl")
        recs += [N.record_from_dict(d, f"{path}:{k}") for k, d in enumerate(_lines(path))]
    return recs


def test_records_load_and_images_lie_next_to_them(dataset):
    out, manifest = dataset
    recs = _records(out)
    assert len(recs) == manifest["records"]["train"] + manifest["records"]["test"] > 100
    for r in recs[::7]:
        assert not os.path.isabs(r.image)
        img = Image.open(os.path.join(out, r.image))
        assert img.format == "PNG" and img.size == tuple(r.image_size)
    assert {r.platform for r in recs} == {"desktop", "mobile"}


def test_split_is_by_task_seed_and_the_same_on_both_platforms(dataset):
    out, manifest = dataset
    recs = _records(out)
    split_of = {}
    for r in recs:
        seed = int(r.trajectory_id.rsplit("-", 1)[1])
        assert r.split == task_split(seed, 0.3)
        split_of.setdefault(seed, set()).add(r.split)
    assert all(len(v) == 1 for v in split_of.values())
    assert manifest["tasks"]["test"] > 0 and manifest["tasks"]["train"] > 0
    assert all(task_split(s, 0.3) == "test" for s in heldout_task_seeds(20, 0, 0.3))


def test_trajectories_are_ordered_with_growing_history(dataset):
    out, _ = dataset
    by_traj = {}
    for r in _records(out):
        by_traj.setdefault(r.trajectory_id, []).append(r)
    for rs in by_traj.values():
        assert [r.step for r in rs] == list(range(len(rs)))
        for k, r in enumerate(rs):
            assert r.history == tuple(x.target.action_description for x in rs[:k])


def test_expert_target_rendered_gets_full_reward_in_both_formats(dataset):
    out, _ = dataset
    for r in _records(out):
        tgt = r.reward_target()
        for space, kw in (("norm1000", {}), ("pixels", {"image_size": r.image_size})):
            text = A.render_response(r.target.action(space, **kw), r.reasoning)
            rw = R.guilibra_reward(text, tgt, coord_space=space)
            assert rw.total == 1.0, (r.trajectory_id, r.step, rw)
        call = r.target.tool_call
        assert call.name == A.TOOL_FOR_PLATFORM[r.platform]
        for v in call.arguments.values():
            if isinstance(v, list) and v and isinstance(v[0], int):
                assert all(0 <= c <= A.TOOL_SCREEN_SIZE[call.name] for c in v)
        text = A.render_tool_call_response(call, r.reasoning, r.target.action_description)
        assert R.mopd_reward(text, tgt) == 1.0


def test_alternatives_are_filled_and_rewarded_as_valid(dataset):
    out, _ = dataset
    recs = _records(out)
    with_alts = [r for r in recs if r.alternatives]
    assert len(with_alts) > 0.2 * len(recs)
    types = set()
    for r in with_alts:
        tgt = r.reward_target()
        for alt in r.alternatives:
            types.add(alt.action_type)
            assert alt.action_type != r.target.action_type or alt.bbox != r.target.bbox \
                or alt.value != r.target.value
            rw = R.guilibra_reward(A.render_response(alt.action("norm1000")), tgt)
            assert rw.accuracy == 1.0
            if alt.tool_call is not None:
                assert R.mopd_reward(A.render_tool_call_response(alt.tool_call), tgt) == 1.0
    assert {"KeyboardPress", "OpenApp", "Click", "Scroll", "Write", "Select", "NavigateBack"} <= types


def test_export_is_deterministic(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    export_dataset(str(a), ("desktop", "mobile"), n_tasks=4, seed=3, split_fraction=0.5)
    export_dataset(str(b), ("desktop", "mobile"), n_tasks=4, seed=3, split_fraction=0.5)
    for split in ("train", "test"):
        assert (a / f"{split}.jsonl").read_bytes() == (b / f"{split}.jsonl").read_bytes()
    names = sorted(os.listdir(a / "images"))
    assert names == sorted(os.listdir(b / "images"))
    for n in names:
        assert (a / "images" / n).read_bytes() == (b / "images" / n).read_bytes()


def test_one_screen_size_for_all_platforms(tmp_path):
    m = export_dataset(str(tmp_path), ("desktop", "mobile"), n_tasks=2, seed=1, screen_size=(112, 112))
    for r in _records(str(tmp_path)):
        assert r.image_size == (112, 112)
    assert m["screen_size"] == [112, 112] or m["screen_size"] == (112, 112)


def test_guilibra_sft_and_rl_copies_read_back_as_the_same_steps(dataset):
    from guilibra_jax.data.readers import open_source
    out, manifest = dataset
    native = {(r.trajectory_id, r.step): r for r in _records(out) if r.split == "test"}
    for fmt, name in (("guilibra_sft", "test_sft.json"), ("guilibra_rl", "test_rl.parquet")):
        assert manifest["extra_formats"][name] == len(native)
        back = list(open_source(os.path.join(out, name), fmt))
        assert len(back) == len(native)
        for r in back:
            n = native[(r.trajectory_id, r.step)]
            assert (r.target.action_type, r.target.value, r.instruction) == \
                (n.target.action_type, n.target.value, n.instruction)


def test_per_platform_task_counts_take_a_prefix_of_the_task_seeds(tmp_path):
    """{platform: count}: each platform's tasks are the first ``count`` task seeds, so a 5:1
    mix holds the same mobile tasks as an equal export cut to that count."""
    mixed, equal = str(tmp_path / "mixed"), str(tmp_path / "equal")
    m = export_dataset(mixed, ("desktop", "mobile"), n_tasks={"desktop": 10, "mobile": 2}, seed=3, extra_formats=())
    export_dataset(equal, ("desktop", "mobile"), n_tasks=2, seed=3, extra_formats=())
    assert m["n_tasks_per_platform"] == {"desktop": 10, "mobile": 2}
    assert sum(m["tasks"].values()) == 12

    def tasks(d, platform):
        return {r.trajectory_id for r in _records(d) if r.platform == platform}
    assert len(tasks(mixed, "desktop")) == 10
    assert tasks(mixed, "mobile") == tasks(equal, "mobile")
    with pytest.raises(ValueError, match=r"no count for \['mobile'\]"):
        export_dataset(str(tmp_path / "bad"), ("desktop", "mobile"), n_tasks={"desktop": 3})


def test_platform_tasks_config_names_its_key():
    from configs import demo
    from guilibra_jax.errors import ConfigError
    from guilibra_jax.train import config as C
    from guilibra_jax.train.data_source import synthetic_tasks
    c = demo.get_config()
    assert synthetic_tasks(c.data.synthetic) == c.data.synthetic.tasks
    c.data.synthetic.platform_tasks = {"mobile": 96}
    C.validate(c, planning=True)
    assert synthetic_tasks(c.data.synthetic) == {"desktop": c.data.synthetic.tasks, "mobile": 96}
    for bad in ({"mobile": 0}, {"tv": 3}):
        c.data.synthetic.platform_tasks = bad
        with pytest.raises(ConfigError, match="data.synthetic.platform_tasks"):
            C.validate(c, planning=True)
    c.data.synthetic.platform_tasks = {"mobile": 3}
    c.data.synthetic.platforms = ("desktop",)
    with pytest.raises(ConfigError, match=r"data.synthetic.platform_tasks .*\['mobile'\] are not"):
        C.validate(c, planning=True)
