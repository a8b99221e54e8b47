"""metrics.jsonl rows and TensorBoard scalars, read back with TensorBoard's own reader."""
import json
import math

import pytest

from guilibra_jax.train.metrics import MetricsWriter


def test_jsonl_and_tensorboard_scalars_round_trip(tmp_path):
    pytest.importorskip("tensorboard")  # the test extra installs it
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    w = MetricsWriter(str(tmp_path))
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
