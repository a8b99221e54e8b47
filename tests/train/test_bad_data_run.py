"""A training run over a dataset with 20% corrupted records of mixed kinds trains on
every good record and reports exactly what it dropped, by reason, in metrics.jsonl and
at the end of the run."""
import json
import logging
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data"))
from data_fixtures import native_record, write_image  # noqa: E402

GOOD = 24


def _dataset(folder: str) -> str:
    """24 good records and 6 corrupted ones (20%): bad JSON, a missing image, an
    unreadable image, an unknown action, a point outside the image, an over-long one."""
    os.makedirs(os.path.join(folder, "img"), exist_ok=True)
    lines = []
    for i in range(GOOD):
        name = f"img/{i:03d}.png"
        write_image(os.path.join(folder, name), (96, 64), i)
        lines.append(json.dumps(native_record(i, name, (96, 64))))
    write_image(os.path.join(folder, "img", "ok.png"), (96, 64), 99)
    with open(os.path.join(folder, "img", "broken.png"), "wb") as f:
        f.write(b"\x89PNG not really")
    bad = native_record(90, "img/ok.png", (96, 64))
    corrupted = [
        '{"trajectory_id": "x", "step": 0, "platform": "mob',                              # invalid_json
        json.dumps({**bad, "image": "img/missing.png"}),                                   # unreadable_image
        json.dumps({**bad, "image": "img/broken.png"}),                                    # unreadable_image
        json.dumps({**bad, "target": {**bad["target"], "action_type": "Teleport"}}),        # unknown_action
        json.dumps({**bad, "target": {**bad["target"], "point": [1.4, 0.5]}}),              # coords_outside_image
        json.dumps({**bad, "instruction": " ".join(f"step{k} of the long task" for k in range(300))}),  # too_long
    ]
    for k, line in enumerate(corrupted):
        lines.insert(4 * k + 2, line)
    path = os.path.join(folder, "data.jsonl")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def test_training_over_20_percent_corrupted_records_uses_every_good_one_and_counts_the_rest(tmp_path, caplog):
    from configs import demo
    from guilibra_jax.train.run import train

    c = demo.get_config("smoke")
    c.data.synthetic.enabled = False
    c.data.train_files = (_dataset(str(tmp_path / "data")),)
    c.data.mix = "direct"                # one sample per record: samples count records
    c.data.batch_size = 6                # 30 records = 5 batches = exactly one epoch
    c.data.max_bad_fraction = 0.25       # 5 bad of 30 (the over-long one is filtered, not bad)
    c.train.steps = 5
    c.train.checkpoint_every = 5
    c.train.export = False
    c.train.tensorboard = False
    workdir = str(tmp_path / "run")
    with caplog.at_level(logging.INFO):
        final = train(c, workdir)
    rows = [json.loads(l) for l in open(os.path.join(workdir, "metrics.jsonl"))]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5] and final["step"] == 5
    counts = {k: v for k, v in rows[-1].items() if k.startswith("data/")}
    assert counts == {"data/kept": GOOD, "data/bad": 5, "data/filtered": 1,
                      "data/bad/invalid_json": 1, "data/bad/unreadable_image": 2, "data/bad/unknown_action": 1,
                      "data/bad/coords_outside_image": 1, "data/filtered/too_long": 1}
    assert rows[0]["data/kept"] + rows[0]["data/bad"] + rows[0]["data/filtered"] == 6  # counted as consumed
    report = [r.getMessage() for r in caplog.records if r.getMessage().startswith("data: ")]
    assert report == [f"data: {GOOD} samples used, 5 bad records skipped (coords_outside_image=1, invalid_json=1, "
                      f"unknown_action=1, unreadable_image=2), 1 filtered (too_long=1)"]
