"""The run's metric writer (metrics.jsonl; TensorBoard through tensorboardX, read back
with TensorBoard's own reader; W&B offline), the progress line, the profiler trace,
the persistent compilation cache and the curves PNG."""
import io
import json
import math
import os
import sys
import time

import numpy as np
import pytest

from guilibra_jax.errors import ConfigError
from guilibra_jax.train.metrics import MetricsWriter, Progress


def test_jsonl_and_tensorboard_scalars_round_trip(tmp_path):
    pytest.importorskip("tensorboardX", reason="the tensorboard extra (pip install -e .[tensorboard])")
    pytest.importorskip("tensorboard", reason="TensorBoard's event reader checks what tensorboardX wrote")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    w = MetricsWriter(str(tmp_path), tensorboard=True)
    w.write(1, {"loss": 2.5, "lr": 1e-5, "note": "text is not a scalar"})
    w.write(2, {"loss": 1.25, "grad_norm": float("nan")})
    w.close()
    rows = [json.loads(l) for l in open(tmp_path / "metrics.jsonl")]
    assert rows == [{"step": 1, "loss": 2.5, "lr": 1e-5}, {"step": 2, "loss": 1.25, "grad_norm": "nan"}]
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert sorted(acc.Tags()["scalars"]) == ["loss", "lr"]
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(1, 2.5), (2, 1.25)]
    assert math.isclose(acc.Scalars("lr")[0].value, 1e-5, rel_tol=1e-6)


def test_tensorboard_off_writes_no_events(tmp_path):
    w = MetricsWriter(str(tmp_path), tensorboard=False)
    w.write(1, {"loss": 1.0})
    w.close()
    assert not (tmp_path / "tensorboard").exists()


def test_missing_tensorboardx_warns_on_auto_and_fails_when_asked(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)      # import tensorboardX -> ImportError
    with caplog.at_level("WARNING"):
        w = MetricsWriter(str(tmp_path), tensorboard="auto")
    w.write(1, {"loss": 1.0})
    w.close()
    assert "pip install" in caplog.text and "tensorboardX" in caplog.text
    assert (tmp_path / "metrics.jsonl").exists()
    with pytest.raises(ConfigError, match="train.tensorboard = True"):
        MetricsWriter(str(tmp_path), tensorboard=True)
    with pytest.raises(ConfigError, match="train.tensorboard"):
        MetricsWriter(str(tmp_path), tensorboard="sometimes")


def test_wandb_missing_is_a_config_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ConfigError, match="train.wandb.project"):
        MetricsWriter(str(tmp_path), wandb={"project": "p", "mode": "offline"})
    MetricsWriter(str(tmp_path), wandb={"project": ""}).close()     # off: no import


def _history_items(blob: bytes) -> set[tuple[str, str]]:
    """(key, value_json) of the short HistoryItem messages in a .wandb record file
    (protobuf: field 2 key, field 16 value_json, one-byte lengths)."""
    out = set()
    for p in range(len(blob) - 5):
        if blob[p] != 0x12 or not 0 < blob[p + 1] < 0x80:
            continue
        n = blob[p + 1]
        q = p + 2 + n
        if blob[q:q + 2] == b"\x82\x01" and q + 2 < len(blob) and 0 < blob[q + 2] < 0x80:
            m = blob[q + 2]
            try:
                out.add((blob[p + 2:q].decode(), blob[q + 3:q + 3 + m].decode()))
            except UnicodeDecodeError:
                pass
    return out


def test_wandb_offline_logs_rows_and_a_resumed_run_keeps_its_id(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="the wandb extra (pip install -e .[wandb])")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))
    from guilibra_jax.train.config import base_config
    cfg = {"project": "guilibra-test", "mode": "offline", "name": "", "entity": "", "tags": ("t",)}
    w = MetricsWriter(str(tmp_path), tensorboard=False, wandb=cfg, config=base_config())
    w.write(1, {"loss": 2.0})
    w.write(2, {"loss": 1.5, "eval/step_acc": 0.25})
    w.close()
    run_id = (tmp_path / "wandb_run_id.txt").read_text()
    runs = [d for d in os.listdir(tmp_path / "wandb") if d.startswith("offline-run-") and d.endswith(run_id)]
    assert len(runs) == 1
    run_dir = tmp_path / "wandb" / runs[0]
    want = {("loss", "2"), ("_step", "1"), ("loss", "1.5"), ("eval/step_acc", "0.25"), ("_step", "2")}
    for _ in range(300):      # wandb-core may still be writing the record file after finish()
        pairs = _history_items((run_dir / f"run-{run_id}.wandb").read_bytes())
        if want <= pairs:
            break
        time.sleep(0.1)
    assert want <= pairs
    w = MetricsWriter(str(tmp_path), tensorboard=False, wandb=cfg)       # resumed: same W&B run
    w.close()
    assert (tmp_path / "wandb_run_id.txt").read_text() == run_id


def test_progress_line_shows_steps_loss_tokens_per_second_and_eta():
    out = io.StringIO()
    p = Progress(100, start=10, stream=out)
    p.update(20, {"loss": 1.23456, "tokens_per_s": 8123.4})
    p.close()
    line = out.getvalue()
    assert "20/100" in line and "loss=1.2346" in line and "tok/s=8123" in line
    assert "<" in line          # elapsed<remaining: tqdm's ETA


def test_profiler_writes_a_trace_of_the_chosen_steps(tmp_path):
    import jax
    import jax.numpy as jnp

    from guilibra_jax.train.profiler import StepProfiler, parse_steps
    f = jax.jit(lambda x: jnp.tanh(x @ x))
    prof = StepProfiler(str(tmp_path), (2, 4))
    x = jnp.ones((64, 64))
    started = []
    for step in range(1, 6):
        prof.before(step)
        started.append(prof.active)
        x = f(x)
        prof.after(step, x)
    prof.close()
    assert started == [False, True, True, False, False]
    traces = [os.path.join(d, n) for d, _, names in os.walk(tmp_path / "profile") for n in names]
    assert any(t.endswith(".xplane.pb") for t in traces), traces
    assert parse_steps(()) is None
    with pytest.raises(ConfigError, match="train.profile_steps"):
        parse_steps((3, 3))


def test_compilation_cache_folder_of_a_run(monkeypatch):
    from guilibra_jax.train.compilation_cache import cache_dir_for_run
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/cluster/xla")
    assert cache_dir_for_run("auto", "/runs/a") == "/cluster/xla" and cache_dir_for_run("", "/runs/a") is None
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
    assert cache_dir_for_run("auto", "/runs/a") == "/runs/a/compilation_cache"
    assert cache_dir_for_run("", "/runs/a") is None
    assert cache_dir_for_run("/shared/xla", "/runs/a") == "/shared/xla"


def test_curves_png_draws_the_logged_series(tmp_path):
    from PIL import Image

    from guilibra_jax.train.curves import COLORS, PANEL, write_curves
    with open(tmp_path / "metrics.jsonl", "w") as f:
        for step in range(10, 110, 10):
            f.write(json.dumps({"step": step, "loss": 5.0 / step}) + "\n")
        f.write(json.dumps({"step": 100, "eval/step_acc": 0.7, "eval/desktop/step_acc": 0.8,
                            "eval/constant_baseline_step_acc": 0.2}) + "\n")
    img = np.asarray(Image.open(write_curves(str(tmp_path))).convert("RGB"))
    assert img.shape == (PANEL[1], 2 * PANEL[0], 3)
    left, right = img[:, :PANEL[0]], img[:, PANEL[0]:]
    blue = np.all(left == COLORS[0], axis=-1)
    rows, cols = np.nonzero(blue[:, 56:PANEL[0] - 160])        # the loss line, left of its legend
    assert rows[np.argmin(cols)] < rows[np.argmax(cols)]      # falling loss: the line ends lower (larger row)
    assert np.any(np.all(right == COLORS[1], axis=-1)) and np.any(np.all(right == COLORS[4], axis=-1))
