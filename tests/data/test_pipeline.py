"""The grain pipeline: batch layout, determinism across worker counts, exact resume,
per-process shards, mixing, rebalancing, packing and RL prompt batches."""
import json

import numpy as np
import pytest

from guilibra_jax.data import mixing as M
from guilibra_jax.data import pipeline as PL
from guilibra_jax.data import readers as R
from guilibra_jax.data import tokenize as T
from guilibra_jax.models import get_rope_index

BASE = dict(format="native", batch_size=4, max_pixels=64 * 64, patch_bucket=64, seq_buckets=(1024, 2048),
            seed=3, num_epochs=2)


def _cfg(path, **kw):
    return {**BASE, "inputs": path, **kw}


def _same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if k == "dropped":
            continue
        if isinstance(a[k], dict):
            _same(a[k], b[k])
        elif isinstance(a[k], np.ndarray):
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
        elif isinstance(a[k], list) and any(isinstance(x, np.ndarray) for x in a[k]):   # label_ids
            assert len(a[k]) == len(b[k]), k
            for x, y in zip(a[k], b[k]):
                np.testing.assert_array_equal(x, y, err_msg=k)
        else:
            assert a[k] == b[k], k


def test_sft_batch_layout(native_dataset, qwen_tok, qwen25_config):
    it = PL.make_sft_loader(_cfg(native_dataset, num_epochs=1), qwen_tok, qwen25_config, shard_index=0,
                            shard_count=1)
    b = next(it)
    B_, T_ = b["input_ids"].shape
    assert (B_, T_) == (4, 1024) and b["positions"].shape == (3, 4, 1024)
    np.testing.assert_array_equal(b["targets"][:, :-1], b["input_ids"][:, 1:])
    real = b["segment_ids"] > 0
    assert set(np.unique(b["loss_segments"][real]).tolist()) <= {0, 1, 2, 3}
    assert (b["loss_segments"][~real] == 0).all()
    # each row: loss only on target tokens; reasoning before action; im_end is the last target
    for r in range(B_):
        ids = b["input_ids"][r][real[r]]
        pos, _ = get_rope_index(ids[None], None, b["image_grid_thw"][r:r + 1], qwen25_config)
        np.testing.assert_array_equal(b["positions"][:, r, :len(ids)], pos[:, 0])
        seg = b["loss_segments"][r][:len(ids) - 1]
        first = int(np.argmax(seg > 0))
        assert (seg[first:] > 0).all() and ids[-1] == qwen_tok.convert_tokens_to_ids("<|im_end|>")
    n_real = int(b["image_grid_thw"].prod(-1).sum())
    assert b["pixel_values"].shape[0] % 64 == 0 and b["pixel_values"].shape[0] >= n_real
    assert (b["pixel_values"][n_real:] == 0).all() and b["vision"]["token_slot"].shape[0] * 4 == b["pixel_values"].shape[0]
    it.close()


def test_mix_yields_reasoning_and_direct_twins(native_dataset):
    src = R.open_source(native_dataset, "native")
    metas = [src.meta(i) for i in range(len(src))]
    both = M.mix_index(metas, "both")
    assert len(both) == 48 and sorted(both[:, 1].tolist()) == [0] * 24 + [1] * 24
    assert len(M.mix_index(metas, "direct")) == 24
    half = M.mix_index(metas, 0.5, seed=1)
    assert len(half) == 24 and 4 < (half[:, 1] == 0).sum() < 20


def test_rebalance_reports_before_and_after(native_dataset):
    src = R.open_source(native_dataset, "native")
    metas = [src.meta(i) for i in range(len(src))]
    keep, report = M.rebalance(metas, step_keep={0: 0.0, 1: 0.5}, max_share={"mobile": 0.5}, seed=0)
    assert report["before"]["n"] == 24 and report["before"]["step"]["0"] == 5
    assert report["after"]["step"].get("0", 0) == 0 and report["after"]["n"] == len(keep)
    after = report["after"]["platform"]
    assert after.get("mobile", 0) <= after.get("web", 0)
    assert json.loads(json.dumps(report)) == report


def test_resume_yields_exactly_the_remaining_batches(native_dataset, qwen_tok, qwen25_config):
    cfg = _cfg(native_dataset)
    full = list(PL.make_sft_loader(cfg, qwen_tok, qwen25_config, shard_index=0, shard_count=1))
    assert len(full) == 24  # 24 records x 2 variants x 2 epochs / 4
    it = PL.make_sft_loader(cfg, qwen_tok, qwen25_config, shard_index=0, shard_count=1)
    for _ in range(7):
        next(it)
    state = json.loads(json.dumps(it.get_state()))
    fresh = PL.make_sft_loader(cfg, qwen_tok, qwen25_config, shard_index=0, shard_count=1)
    fresh.set_state(state)
    rest = list(fresh)
    assert len(rest) == len(full) - 7
    for a, b in zip(rest, full[7:]):
        _same(a, b)
    assert fresh.bad_records.kept == it.bad_records.kept + sum(b["num_samples"] for b in rest)


def test_zero_and_two_workers_give_the_same_batches(native_dataset, qwen_tok, qwen25_config):
    cfg = _cfg(native_dataset, num_epochs=1)
    ref = list(PL.make_sft_loader(cfg, qwen_tok, qwen25_config, shard_index=0, shard_count=1))
    it = PL.make_sft_loader({**cfg, "num_workers": 2}, qwen_tok, qwen25_config, shard_index=0, shard_count=1)
    got = list(it)
    it.close()
    assert len(got) == len(ref) == 12
    for a, b in zip(got, ref):
        _same(a, b)


def test_grain_checkpoint_handler_saves_and_restores(native_dataset, qwen_tok, qwen25_config, tmp_path):
    import grain
    import etils.epath as epath
    cfg = _cfg(native_dataset, num_epochs=1)
    it = PL.make_sft_loader(cfg, qwen_tok, qwen25_config, shard_index=0, shard_count=1)
    next(it), next(it)
    h = grain.checkpoint.CheckpointHandler()
    h.save(epath.Path(tmp_path), args=grain.checkpoint.CheckpointSave(it))
    want = next(it)
    fresh = PL.make_sft_loader(cfg, qwen_tok, qwen25_config, shard_index=0, shard_count=1)
    h.restore(epath.Path(tmp_path), args=grain.checkpoint.CheckpointRestore(fresh))
    _same(next(fresh), want)


def test_each_process_reads_only_its_shard(native_dataset, qwen_tok, qwen25_config):
    cfg = _cfg(native_dataset, num_epochs=1, mix="direct", batch_size=2)
    seen = []
    for si in range(3):
        it = PL.make_sft_loader(cfg, qwen_tok, qwen25_config, shard_index=si, shard_count=3)
        seen.append({w for b in it for w in b["where"]})
    assert all(len(s) == 8 for s in seen)
    assert not (seen[0] & seen[1]) and not (seen[1] & seen[2]) and not (seen[0] & seen[2])


def test_process_batches_together_equal_one_process_with_their_summed_batch_size(native_dataset, qwen_tok,
                                                                                 qwen25_config):
    """Batch k of 2 processes (batch 2 each, rows in process order) is batch k of one
    process with batch 4: runs do not depend on the process count."""
    cfg = _cfg(native_dataset, num_epochs=1, mix="direct")
    one = list(PL.make_sft_loader({**cfg, "batch_size": 4}, qwen_tok, qwen25_config, shard_index=0, shard_count=1))
    two = [list(PL.make_sft_loader({**cfg, "batch_size": 2}, qwen_tok, qwen25_config, shard_index=i, shard_count=2))
           for i in range(2)]
    assert len(one) == len(two[0]) == len(two[1]) >= 2
    for k, batch in enumerate(one):
        assert batch["where"] == two[0][k]["where"] + two[1][k]["where"]


def test_packing_keeps_samples_apart(native_dataset, qwen_tok, qwen25_config):
    cfg = _cfg(native_dataset, num_epochs=1, pack=True, pack_samples=4, batch_size=2, pack_length=2048)
    it = PL.make_sft_loader(cfg, qwen_tok, qwen25_config, shard_index=0, shard_count=1)
    b = next(it)
    assert b["input_ids"].shape == (2, 2048) and b["num_samples"] == 4
    assert b["segment_ids"].max() >= 2
    im_end = qwen_tok.convert_tokens_to_ids("<|im_end|>")
    for r in range(2):
        for k in range(1, b["segment_ids"][r].max() + 1):
            sel = np.where(b["segment_ids"][r] == k)[0]
            ids = b["input_ids"][r, sel]
            assert sel[0] + len(sel) - 1 == sel[-1]                     # contiguous
            assert b["positions"][0, r, sel[0]] == 0                   # positions restart per sample
            assert ids[0] == qwen_tok.convert_tokens_to_ids("<|im_start|>") and ids[-1] == im_end
            assert b["loss_segments"][r, sel[-1]] == 0                 # no loss across the boundary
    it.close()


def test_rl_batch_has_left_padded_prompts_and_targets(uni_gui_dir, qwen_tok, qwen3_config):
    from guilibra_jax import rewards as RW
    cfg = dict(inputs=uni_gui_dir, format="uni_gui", method="mopd", batch_size=4, max_pixels=128 * 128,
               patch_bucket=64, seq_buckets=(1024, 2048), shuffle=False, splits=None)
    it = PL.make_rl_loader(cfg, qwen_tok, qwen3_config, shard_index=0, shard_count=1)
    b = next(it)
    ids, mask = b["prompt_ids"], b["prompt_mask"]
    assert ids.shape == mask.shape and mask[:, -1].all() and not mask[:, 0].all()
    assert (ids[:, -3:] == np.array(qwen_tok.encode("<|im_start|>assistant\n"))).all()
    pos, deltas = get_rope_index(ids, mask, b["image_grid_thw"], qwen3_config)
    np.testing.assert_array_equal(b["positions"], pos)
    np.testing.assert_array_equal(b["rope_deltas"], deltas)
    assert len(b["reward_targets"]) == 4 and all(isinstance(t, RW.Target) for t in b["reward_targets"])
    assert b["platform"] == ["desktop"] * 4 and all(t.tool_call is not None for t in b["reward_targets"])
    # What MOPD checks its teachers against, and steps left out before reading, counted.
    from guilibra_jax.train import data_source
    assert it.info["platforms"] == ["desktop", "mobile"]
    counts = data_source.drop_metrics(it)
    assert counts["data/excluded/uni_gui_unused_step"] == 3 and counts["data/kept"] == 4
    assert "left out when indexing: uni_gui_unused_step=3" in data_source.drop_report(it)
    it.close()


def test_tokenizer_and_model_ids_must_agree(native_dataset, qwen_tok, qwen25_config):
    with pytest.raises(ValueError, match="image_token_id"):
        PL.make_sft_loader(_cfg(native_dataset), qwen_tok, qwen25_config.replace(image_token_id=5),
                           shard_index=0, shard_count=1)


def test_demo_tokenizer_loads_offline_and_drives_the_pipeline(native_dataset, qwen25_config, tmp_path):
    from transformers import AutoTokenizer
    from guilibra_jax.data import demo_tokenizer as D
    src = R.open_source(native_dataset, "native")
    tok = D.build_demo_tokenizer(D.demo_corpus([src[i] for i in range(len(src))]), 600, str(tmp_path / "tok"))
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    assert len(tok) == 600
    ids = T.SpecialIds.of(tok)
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}]
    assert "<|vision_start|><|image_pad|><|vision_end|>hi" in tok.apply_chat_template(msgs, tokenize=False)
    for t in ("<think>", "</think>", "<tool_call>", "</tool_call>", "<|im_start|>"):
        assert len(tok.encode(t)) == 1
    mc = qwen25_config.replace(image_token_id=ids.image_pad, vision_start_token_id=ids.vision_start,
                               vision_end_token_id=ids.vision_end)
    b = next(PL.make_sft_loader(_cfg(native_dataset), tok, mc, shard_index=0, shard_count=1))
    assert b["input_ids"].max() < 600 and (b["loss_segments"] == 3).any()
