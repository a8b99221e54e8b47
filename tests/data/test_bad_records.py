"""Corrupted records are skipped, counted by reason and logged with file and line;
no valid record is lost; the run stops only past the bad-fraction threshold."""
import json
import os

import pytest

from guilibra_jax.data import bad_records as B
from guilibra_jax.data import pipeline as PL

from data_fixtures import native_record, write_image


def _corrupted_dataset(folder, n_valid=20):
    os.makedirs(os.path.join(folder, "img"), exist_ok=True)
    lines, valid = [], []
    for i in range(n_valid):
        name = f"img/{i:03d}.png"
        write_image(os.path.join(folder, name), (64, 48), i)
        lines.append(json.dumps(native_record(i, name, (64, 48))))
        valid.append(len(lines))
    write_image(os.path.join(folder, "img", "ok.png"), (64, 48), 99)
    with open(os.path.join(folder, "img", "broken.png"), "wb") as f:
        f.write(b"\x89PNG not really")
    bad = dict(native_record(90, "img/ok.png", (64, 48)))
    lines.append('{"trajectory_id": "x", "step": 0, "platform": "mob')                       # invalid_json
    lines.append(json.dumps({**bad, "image": "img/missing.png"}))                             # unreadable_image
    lines.append(json.dumps({**bad, "image": "img/broken.png"}))                              # unreadable_image
    lines.append(json.dumps({**bad, "target": {**bad["target"], "action_type": "Teleport"}}))  # unknown_action
    lines.append(json.dumps({**bad, "target": {**bad["target"], "point": [1.4, 0.5]}}))      # coords_outside_image
    lines.append(json.dumps({k: v for k, v in bad.items() if k != "instruction"}))            # missing_field
    lines.insert(5, "")  # a blank line is not a record
    path = os.path.join(folder, "data.jsonl")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


EXPECTED = {B.INVALID_JSON: 1, B.UNREADABLE_IMAGE: 2, B.UNKNOWN_ACTION: 1, B.COORDS_OUTSIDE_IMAGE: 1,
            B.MISSING_FIELD: 1}


def _run(path, qwen_tok, cfg_model, **kw):
    cfg = dict(inputs=path, format="native", batch_size=4, mix="direct", max_pixels=64 * 64, patch_bucket=64,
               seq_buckets=(1024, 2048), drop_remainder=False, bad_record_min_seen=1, **kw)
    it = PL.make_sft_loader(cfg, qwen_tok, cfg_model, shard_index=0, shard_count=1)
    wheres = [w for b in it for w in b["where"]]
    return it, wheres


def test_exact_counts_per_reason_and_no_valid_record_lost(tmp_path, qwen_tok, qwen25_config, caplog):
    path = _corrupted_dataset(str(tmp_path))
    it, wheres = _run(path, qwen_tok, qwen25_config, bad_record_threshold=0.5)
    assert dict(it.bad_records.counts) == EXPECTED
    assert it.bad_records.kept == 20
    # every valid record arrives exactly once, named by file and line
    valid_lines = [i + 1 if i < 5 else i + 2 for i in range(20)]
    assert sorted(wheres) == sorted(f"{path}:{ln}" for ln in valid_lines)
    logged = {w for _, w, _ in it.bad_records.examples}
    assert {f"{path}:{ln}" for ln in range(23, 28)} <= logged
    assert any("skipping bad record" in r.message and "data.jsonl" in r.message for r in caplog.records)


def test_run_stops_past_threshold_with_clear_message(tmp_path, qwen_tok, qwen25_config):
    path = _corrupted_dataset(str(tmp_path))
    with pytest.raises(B.TooManyBadRecords, match=r"config key data\.max_bad_fraction, DataConfig\.bad_record_threshold\)\. By reason: "):
        _run(path, qwen_tok, qwen25_config, bad_record_threshold=0.05)


def test_filters_are_not_bad(tmp_path, qwen_tok, qwen25_config):
    path = _corrupted_dataset(str(tmp_path), n_valid=8)
    it, wheres = _run(path, qwen_tok, qwen25_config, bad_record_threshold=0.9, max_length=10)
    assert wheres == [] and it.bad_records.filtered["too_long"] == 8 and dict(it.bad_records.counts) == EXPECTED
