"""A rerun is checked against the run's saved config: the same config resumes; a
different one refuses to start and names every differing key, unless
train.allow_config_change, which records the change in config_history.jsonl and keeps
config.json as the run started."""
import json
import os

import pytest

from configs import demo
from guilibra_jax.errors import ConfigError
from guilibra_jax.train import run_history as H


def _config(**changes):
    c = demo.get_config("smoke")
    for key, value in changes.items():
        section, name = key.split("__")
        c[section][name] = value
    return c


def test_first_run_writes_config_and_the_same_config_reruns(tmp_path):
    H.record_config(_config(), str(tmp_path))
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved == json.loads(json.dumps(_config().to_dict()))
    H.record_config(_config(), str(tmp_path))  # a resume with the same command
    assert not (tmp_path / H.HISTORY_FILE).exists()


def test_a_changed_config_refuses_to_start_and_names_each_differing_key(tmp_path):
    H.record_config(_config(), str(tmp_path))
    with pytest.raises(ConfigError) as e:
        H.record_config(_config(train__steps=8, optim__lr=1e-3), str(tmp_path))
    msg = str(e.value)
    assert "train.steps: 4 -> 8" in msg and "optim.lr: 0.003 -> 0.001" in msg and "allow_config_change" in msg
    assert "\n" not in msg and "data.max_length" not in msg


def test_an_accepted_change_is_recorded_and_config_json_keeps_the_original(tmp_path):
    H.record_config(_config(), str(tmp_path))
    changed = _config(train__steps=8)
    changed.train.allow_config_change = True
    H.record_config(changed, str(tmp_path))
    assert json.loads((tmp_path / "config.json").read_text())["train"]["steps"] == 4
    entries = [json.loads(l) for l in (tmp_path / H.HISTORY_FILE).read_text().splitlines()]
    assert len(entries) == 1 and entries[0]["changes"] == {"train.steps": [4, 8]} and entries[0]["time"]
    # The run now holds steps=8: the same command again needs no flag, and records nothing.
    H.record_config(_config(train__steps=8), str(tmp_path))
    assert len((tmp_path / H.HISTORY_FILE).read_text().splitlines()) == 1
    with pytest.raises(ConfigError, match=r"train\.steps: 8 -> 4"):
        H.record_config(_config(), str(tmp_path))


def test_where_the_job_runs_is_not_a_change_nor_a_key_added_since(tmp_path):
    H.record_config(_config(), str(tmp_path))
    moved = _config(distributed__coordinator_address="10.0.0.1:1234", train__progress=True)
    H.record_config(moved, str(tmp_path))
    # A config.json written before a key existed: the key at today's default is no change.
    saved = json.loads((tmp_path / "config.json").read_text())
    del saved["train"]["allow_config_change"]
    (tmp_path / "config.json").write_text(json.dumps(saved))
    H.record_config(_config(), str(tmp_path))
    assert not os.path.exists(tmp_path / H.HISTORY_FILE)
