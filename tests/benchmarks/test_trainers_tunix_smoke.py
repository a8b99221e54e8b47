"""benchmarks/trainers_tunix.py: our GRPO step against tunix's GRPOLearner. The end-to-end run
(one timed step of 4 tokens per side: both run, the results JSON carries what it claims, our
loss equals tunix's on identical inputs) needs tunix's own virtual environment, which this
suite never creates: it runs only where one exists already (``python -m
benchmarks.trainers_tunix`` creates it; GUILIBRA_TUNIX_VENV names another) and skips otherwise."""
import json
import os

import pytest

from benchmarks import trainers_tunix as TT

VENV = os.environ.get("GUILIBRA_TUNIX_VENV", TT.DEFAULT_VENV)


def test_a_missing_tunix_venv_is_refused_without_creating_it(tmp_path, capsys):
    venv = str(tmp_path / "no-venv")
    with pytest.raises(SystemExit) as e:
        TT.ensure_venv(venv, create=False)
    assert e.value.code == 2 and not os.path.exists(venv)
    assert "creates it" in capsys.readouterr().err


def test_trainers_tunix_runs_both_sides_and_the_objectives_agree(tmp_path):
    pytest.importorskip("torch")        # (the model folders: transformers builds and converts them)
    if not TT.venv_ready(VENV):
        pytest.skip(f"no google-tunix {TT.TUNIX_VERSION} venv at {VENV} (python -m benchmarks.trainers_tunix "
                    f"creates it)")
    res = TT.main(["--steps=1", "--max_new_tokens=4", f"--out_dir={tmp_path}", f"--tunix_venv={VENV}",
                   "--no_create_venv"])
    files = list(tmp_path.glob("trainers-tunix-tiny-*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["benchmark"] == "trainers_tunix"
    assert res["versions"]["jax"] and res["tunix"]["versions"]["google-tunix"] == TT.TUNIX_VERSION
    assert res["machine"]["slug"] and "commit" in res["git"]
    assert res["prompts_match"]["identical_ids"], res["prompts_match"]
    assert res["text_model_check"]["logits_max_abs_diff"] < 1e-4, res["text_model_check"]
    obj = res["objective"]
    assert obj["ok"] and obj["tunix"]["logp_max_abs_diff"] < 1e-4, obj
    assert obj["ours"]["kl"] > 0.01 and obj["clipped_fraction"] > 0 and obj["response_tokens"] > 0
    for name in ("guilibra_jax", "tunix"):
        side = res["sides"][name]
        assert len(side["step_s_each"]) == 1 and side["step_s"] > 0, side
        assert all(side[k] >= 0 for k in TT.T.PHASES) and side["response_tokens_per_s"] > 0
        assert side["peak_rss_bytes"] > 0
    assert set(res["tunix_over_ours"]) == {"step_s", *TT.T.PHASES}
    assert [len(res["per_round"][name]) for name in ("guilibra_jax", "tunix")] == [2, 2]   # warm-up + 1
