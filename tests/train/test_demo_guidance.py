"""``rl.demo_in_failed_groups``: GRPO's off-policy guidance. In a group where no sampled
response passes, the last response becomes the record's demonstrated action as SFT
renders it; the real reward must pass it (the label survives rendering, tokenizing,
decoding and parsing), the group then carries a signal, and the old log-probs are
recomputed (the sampler never drew those tokens)."""
import json
import os

import numpy as np
import pytest

from guilibra_jax.errors import ConfigError
from guilibra_jax.train.rl import rollout as RO
from guilibra_jax.train.rl.setup import reuse_sampler_log_probs

STOP, PAD = 9, 0


def _rollout(labels, group=2, slots=4):
    n = len(labels) * group
    return RO.Rollout(group_size=group, prompt_ids=np.zeros((n, 2), np.int32), prompt_mask=np.ones((n, 2), np.int32),
                      positions=np.zeros((3, n, 2), np.int32), rope_deltas=np.zeros(n, np.int32), grids=[None] * n,
                      pixels=[None] * n, valid=np.ones(n, bool), targets=[None] * n, platform=["web"] * n,
                      resized_size=[(8, 8)] * n, tokens=np.full((n, slots), 5, np.int32),
                      lengths=np.full(n, slots, np.int32), sample_logp=np.full((n, slots), -1.0, np.float32),
                      texts=["s"] * n, label_ids=[lab for lab in labels for _ in range(group)])


def test_the_demo_replaces_the_last_response_of_failed_groups_only():
    labels = [np.array([1, 2, STOP, 7]),        # group 0: fails -> replaced (cut after its stop token)
              np.array([3, STOP]),              # group 1: a response passed -> kept
              np.array([1, 2, 3, 4, STOP]),     # group 2: fails, but needs 5 slots of 4 -> kept
              np.array([1, 2]),                 # group 3: fails, no stop token -> kept
              np.array([4, STOP])]              # group 4: fails, invalid group -> kept
    ro = _rollout(labels)
    ro.valid[8:] = False
    passed = np.zeros(ro.rows, bool)
    passed[2] = True
    out, replaced, unplaced = RO.insert_demos(ro, passed, (STOP,), PAD, lambda ids: "demo:" + ",".join(map(str, ids)))
    np.testing.assert_array_equal(replaced, [0, 1, 0, 0, 0, 0, 0, 0, 0, 0])
    assert unplaced == 2                          # groups 2 and 3: failed, but no demo fits
    np.testing.assert_array_equal(out.tokens[1], [1, 2, STOP, PAD])
    assert out.lengths[1] == 3 and out.texts[1] == "demo:1,2,9" and (out.sample_logp[1] == 0).all()
    keep = ~replaced
    np.testing.assert_array_equal(out.tokens[keep], ro.tokens[keep])
    assert [t for t, k in zip(out.texts, keep) if k] == ["s"] * 9
    assert (ro.tokens == 5).all()                 # the input rollout is not modified


def test_take_rows_and_concat_keep_each_rows_label():
    ro = _rollout([np.array([1, STOP]), np.array([2, STOP])])
    both = RO.concat([RO.take_rows(ro, [2, 3]), RO.take_rows(ro, [0, 1])])
    assert [int(x[0]) for x in both.label_ids] == [2, 2, 1, 1]


def test_the_sampler_log_probs_are_not_reused_with_demos():
    import ml_collections as mlc
    rl = mlc.ConfigDict(dict(old_logprobs="auto", top_p=1.0, top_k=0, demo_in_failed_groups=False))
    assert reuse_sampler_log_probs(rl)
    rl.demo_in_failed_groups = True
    assert not reuse_sampler_log_probs(rl)


@pytest.mark.parametrize("override, key", [(dict(method="mopd"), "rl.demo_in_failed_groups"),
                                           (dict(old_logprobs="sampler"), "rl.old_logprobs")])
def test_bad_combinations_name_the_key(override, key):
    from configs import grpo_demo
    from guilibra_jax.train.config import validate
    c = grpo_demo.get_config("smoke")
    c.rl.demo_in_failed_groups = True
    if "method" in override:
        c.method = c.data.method = "mopd"
        c.rl.teachers = {"mobile": "/t", "desktop": "/t", "web": "/t"}
    else:
        c.rl.old_logprobs = override["old_logprobs"]
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate(c)


def _demo_run(tmp_path, max_new_tokens):
    from configs import grpo_demo
    from guilibra_jax.train.run import train
    c = grpo_demo.get_config("smoke")
    c.rl.demo_in_failed_groups = True
    c.rl.max_new_tokens = max_new_tokens
    c.train.tensorboard = c.train.curves = c.train.export = False
    workdir = str(tmp_path / "run")
    train(c, workdir)
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    steps = [r for r in rows if "demo/inserted" in r]
    assert len(steps) == c.train.steps
    return c, steps


def test_a_random_policy_gets_a_passing_demo_in_every_failed_group(tmp_path):
    """A random tiny policy fails every group, so every group gets the demo; the real reward
    passes each one, and the run's advantages are no longer all 0."""
    c, steps = _demo_run(tmp_path, 64)      # room for a demonstrated answer (~20-40 tokens of the demo BPE)
    for r in steps:   # every group held no passing sample; now each holds its demo, which passes
        assert r["demo/inserted"] == c.data.batch_size and r["demo/passed"] == r["demo/inserted"], r
        assert r["demo/unplaced"] == 0, r
        assert r["failed_groups"] == 0 and r["advantage_abs_mean"] > 0, r


def test_demos_longer_than_the_response_slots_are_counted_not_inserted(tmp_path):
    c, steps = _demo_run(tmp_path, 8)
    for r in steps:
        assert (r["demo/inserted"], r["demo/unplaced"], r["failed_groups"]) == (0, c.data.batch_size, 1.0), r
