"""benchmarks/trainers.py end to end on the tiny model, one timed step per side: both sides run,
the results JSON carries what it claims, and our GRPO loss equals TRL's on identical inputs."""
import json

import pytest

pytest.importorskip("trl", reason="the [bench] extra: pip install -e '.[bench]'")
pytest.importorskip("torch")


def test_trainers_benchmark_runs_both_sides_and_the_objectives_agree(tmp_path):
    from benchmarks import trainers

    res = trainers.main(["--steps=1", "--steps_per_turn=2", "--max_new_tokens=4", f"--out_dir={tmp_path}"])
    files = list(tmp_path.glob("trainers-tiny-*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["benchmark"] == "trainers"
    assert res["versions"]["jax"] and res["versions"]["torch"] and res["trl_versions"]["trl"] == "1.16.0"
    assert res["machine"]["slug"] and "commit" in res["git"]
    assert res["prompts_match"]["identical_ids"], res["prompts_match"]
    obj = res["objective"]
    assert obj["ok"], obj
    assert obj["ours"]["kl"] > 0.01 and obj["response_tokens"] > 0      # the KL term is on
    for name in ("guilibra_jax", "trl"):
        side = res["sides"][name]
        # one round of two steps per side: the turn's first reported apart, the second timed
        assert len(side["step_s_each"]) == 1 and len(side["turn_first_each"]) == 1 and side["step_s"] > 0, side
        assert all(side[k] >= 0 for k in trainers.PHASES) and side["response_tokens_per_s"] > 0
        assert side["peak_rss_bytes"] > 0
    assert set(res["trl_over_ours"]) == {"step_s", *trainers.PHASES}
    assert [len(res["per_round"][name]) for name in ("guilibra_jax", "trl")] == [3, 3]   # warm-up + 2


def test_trainers_distill_pair_runs_both_sides_and_the_reverse_kls_agree(tmp_path):
    """--pair=distill: our MOPD step (one teacher, full_kl, no task reward) against TRL's
    DistillationTrainer (beta 1), one timed step of 4 tokens: both run, the losses and gradient
    norms agree on identical inputs."""
    from benchmarks import trainers

    res = trainers.main(["--pair=distill", "--steps=1", "--max_new_tokens=4", f"--out_dir={tmp_path}"])
    assert [f.name.startswith("trainers-distill-tiny-") for f in tmp_path.glob("*.json")] == [True]
    assert res["pair"] == "distill" and res["prompts_match"]["identical_ids"], res["prompts_match"]
    obj = res["objective"]
    assert obj["ok"] and obj["ours"]["loss"] > 0.01 and obj["trl"]["logp_max_abs_diff"] < 1e-4, obj
    for name in ("guilibra_jax", "trl"):
        side = res["sides"][name]
        assert len(side["step_s_each"]) == 1 and side["step_s"] > 0 and side["peak_rss_bytes"] > 0, side
        assert side["kl"] > 0 and side["response_tokens_per_s"] > 0
