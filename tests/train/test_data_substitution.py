"""Data is never silently substituted: files given with the synthetic world are a
ConfigError naming both keys unless data.synthetic.mix_with_files asks for both (then
the run reads both), and a file a reader cannot open stops ``launch.train`` with one
line naming the config key and the file."""
import concurrent.futures
import json
import os
import subprocess
import sys

import pytest

from configs import demo
from guilibra_jax.errors import ConfigError
from guilibra_jax.train import config as C

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(ROOT, "README.md")


def _demo(**data):
    c = demo.get_config("smoke")
    for k, v in data.items():
        node = c.data
        *path, last = k.split(".")
        for p in path:
            node = node[p]
        node[last] = v
    return c


@pytest.mark.parametrize("key,verb", [("train_files", "trains on"), ("eval_files", "evaluates on")])
def test_files_with_the_synthetic_world_name_both_keys(key, verb):
    with pytest.raises(ConfigError) as e:
        C.validate(_demo(**{key: (README,)}))
    msg = str(e.value)
    assert f"data.{key} = ('{README}',) is set while data.synthetic.enabled=True" in msg and verb in msg
    assert "data.synthetic.enabled=False" in msg and "data.synthetic.mix_with_files=True" in msg and "\n" not in msg


def test_files_alone_or_both_on_request_validate():
    C.validate(_demo(**{"synthetic.enabled": False, "train_files": (README,), "eval_files": (README,)}))
    C.validate(_demo(**{"synthetic.mix_with_files": True, "train_files": (README,), "eval_files": (README,)}))
    C.validate(_demo(**{"synthetic.mix_with_files": True}))        # both, with no files: the world alone


@pytest.mark.parametrize("data,key", [
    ({"synthetic.enabled": False, "synthetic.mix_with_files": True, "train_files": (README,)},
     "data.synthetic.mix_with_files"),
    ({"synthetic.mix_with_files": True, "train_files": (README,), "format": "guilibra_rl"}, "data.format"),
    ({"synthetic.mix_with_files": True, "train_files": ("/nope/*.jsonl",)}, "data.train_files"),
    ({"synthetic.mix_with_files": True, "eval_files": ("/nope/test.jsonl",)}, "data.eval_files"),
])
def test_bad_mixes_name_the_key(data, key):
    with pytest.raises(ConfigError, match=f"config key {key.replace('.', chr(92) + '.')} = "):
        C.validate(_demo(**data))


def test_a_mixed_run_reads_the_world_and_the_files(tmp_path):
    from guilibra_jax.train import data_source as DS
    mine = tmp_path / "mine.jsonl"
    own = {"trajectory_id": "mine", "step": 0, "platform": "mobile", "instruction": "my task", "history": [],
           "image": "x.png", "image_size": [8, 8], "target": {"action_type": "Click", "point": [0.5, 0.5]},
           "reasoning": None, "alternatives": [], "source": "mine", "split": "train"}
    mine.write_text(json.dumps(own) + "\n")
    c = _demo(**{"synthetic.mix_with_files": True, "train_files": (str(mine),), "eval_files": (str(mine),)})
    C.validate(c)
    work = str(tmp_path / "run")
    train, held_out = DS.train_files(c, work), DS.eval_files(c, work)
    assert train == [os.path.join(DS.synthetic_dir(work), "train.jsonl"), str(mine)]
    assert held_out == [os.path.join(DS.synthetic_dir(work), "test.jsonl"), str(mine)]
    records = DS.readable_records(c, train)
    assert records[-1].trajectory_id == "mine" and len({r.source for r in records}) > 1
    c.data.synthetic.mix_with_files = False
    c.data.train_files = c.data.eval_files = ()
    assert DS.train_files(c, work) == train[:1] and DS.eval_files(c, work) == held_out[:1]


def _train(*args, workdir):
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "launch.train", "--config=configs/demo.py:smoke",
                           f"--workdir={workdir}", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)


def test_launch_train_stops_on_one_line(tmp_path):
    """The issue's two commands: files given with the demo's synthetic world, and a
    Python file read as GUI-Libra RL parquet."""
    runs = {
        "substituted": (["--config.data.train_files=('setup.py',)"], tmp_path / "a"),
        "not_parquet": (["--config.data.synthetic.enabled=False", "--config.data.format=guilibra_rl",
                         "--config.data.train_files=('setup.py',)"], tmp_path / "b"),
    }
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        out = dict(zip(runs, pool.map(lambda r: _train(*r[0], workdir=r[1]), runs.values())))
    for name, p in out.items():
        assert p.returncode == 2 and "Traceback" not in p.stderr, (name, p.stderr[-3000:])
        errors = [line for line in p.stderr.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and p.stderr.rstrip().endswith(errors[0]), (name, p.stderr[-3000:])
    first = [line for line in out["substituted"].stderr.splitlines() if line.startswith("error: ")][0]
    assert "data.train_files" in first and "data.synthetic.enabled=True" in first
    assert not (tmp_path / "a").exists()                 # refused before the workdir is touched
    second = [line for line in out["not_parquet"].stderr.splitlines() if line.startswith("error: ")][0]
    assert second.startswith(f"error: data.train_files (format guilibra_rl): {os.path.join(ROOT, 'setup.py')}: "
                             f"not a parquet file"), second
