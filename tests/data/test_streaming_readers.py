"""Readers at scale: each record is read through an index (JSON array element offsets,
parquet row groups, Uni-GUI (episode, step) pairs) and the reads stay bounded:
counted through wrapped files and parsers, never timed. Records equal those read the
old way (whole file / table), indexes are cached and rebuilt when the file changes,
and Uni-GUI's other_label becomes an alternative scored as the UI-MOPD release does."""
import builtins
import io
import json
import os
import pickle
import shlex
import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from guilibra_jax import rewards as RW
from guilibra_jax.data import bad_records as B
from guilibra_jax.data import index_cache
from guilibra_jax.data import json_array as JA
from guilibra_jax.data import parquet_rows as PR
from guilibra_jax.data import readers as R
from guilibra_jax.data import writers as W
from guilibra_jax.data.native import record_from_dict
from guilibra_jax.errors import UserError
from launch import convert_data


# --------------------------------------------------------------------------------------
# JSON arrays: the scanner against the json module
# --------------------------------------------------------------------------------------

_scalars = st.none() | st.booleans() | st.integers(-10 ** 12, 10 ** 12) | \
    st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12)
_values = st.recursive(_scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=5), c, max_size=4),
                       max_leaves=12)


@settings(max_examples=120, deadline=None)
@given(arr=st.lists(_values, max_size=6), indent=st.sampled_from([None, 0, 2]), ascii_=st.booleans(),
       chunk=st.sampled_from([1, 2, 3, 5, 16, 4096]))
def test_json_array_scan_finds_each_element(arr, indent, ascii_, chunk):
    data = json.dumps(arr, indent=indent, ensure_ascii=ascii_).encode("utf-8")
    starts, ends = JA.scan_json_array(io.BytesIO(data), chunk_bytes=chunk)
    assert [json.loads(data[s:e]) for s, e in zip(starts, ends)] == json.loads(data)


@pytest.mark.parametrize("text", [b"", b"{}", b"[1,]", b"[,1]", b"[1,,2]", b"[1", b'["ab', b"[1]]",
                                  b"[1] x", b"[{]}", b'[{"a": 1,}]', b'["\xff"]', b"[1 2]"])
def test_json_array_scan_rejects_what_json_rejects(text):
    try:
        assert not isinstance(json.loads(text), list)
    except ValueError:
        pass
    with pytest.raises(UserError, match="not a JSON array of records"):
        JA.scan_json_array(io.BytesIO(text), "f.json", chunk_bytes=2)


class _CountingBytes(io.BytesIO):
    def __init__(self, data):
        super().__init__(data)
        self.sizes = []

    def read(self, n=-1):
        out = super().read(n)
        self.sizes.append(len(out))
        return out


def test_json_array_scan_reads_in_chunks():
    items = [{"i": i, "text": "x" * 50} for i in range(400)]
    f = _CountingBytes(json.dumps(items).encode())
    starts, _ = JA.scan_json_array(f, chunk_bytes=256)
    assert len(starts) == 400 and max(f.sizes) <= 512 and len(f.sizes) > 100


def _sft_file(native_dataset, tmp_path):
    sft = str(tmp_path / "sft.json")
    assert convert_data.main([f"--input={native_dataset}", "--format=native", "--to=guilibra_sft",
                              f"--output={sft}"]) == 0
    return sft


def test_sft_json_reader_never_parses_the_whole_array(native_dataset, tmp_path, monkeypatch):
    sft = _sft_file(native_dataset, tmp_path)
    size = os.path.getsize(sft)
    whole = json.load(open(sft))
    old = [record_from_dict(R.guilibra_sft_to_native(it, f"{os.path.abspath(sft)}[{i}]", str(tmp_path)),
                            f"{sft}[{i}]") for i, it in enumerate(whole)]
    parsed = []
    real_loads = json.loads
    monkeypatch.setattr(json, "load", lambda *a, **k: pytest.fail("json.load of a whole file"))
    monkeypatch.setattr(json, "loads", lambda s, *a, **k: (parsed.append(len(s)), real_loads(s, *a, **k))[1])
    src = R.open_source(sft, "guilibra_sft")
    recs = [src[i] for i in range(len(src))]
    metas = [src.meta(i) for i in range(len(src))]
    assert len(recs) == 24 and parsed and max(parsed) < size / 10   # one element per parse
    assert [r.to_dict() for r in recs] == [r.to_dict() for r in old]
    assert metas == [R.RecordMeta(r.platform, r.step, r.source, r.reasoning is not None, r.split) for r in old]
    clone = pickle.loads(pickle.dumps(src))   # as grain sends it to a worker: offsets, no descriptor
    assert clone.items._array._fd is None and [clone[i].to_dict() for i in (3, 17)] == [recs[3].to_dict(), recs[17].to_dict()]


def test_json_array_index_is_cached_and_rebuilt_when_the_file_changes(tmp_path):
    cache = str(tmp_path / "cache")
    path = tmp_path / "a.json"
    path.write_text(json.dumps([{"a": 1}, {"b": [2, 3]}]))
    first = JA.JsonArrayIndex(str(path), cache)
    again = JA.JsonArrayIndex(str(path), cache)
    assert not first.from_cache and again.from_cache and len(again) == 2
    assert json.loads(again.read(1)) == {"b": [2, 3]}
    path.write_text(json.dumps([{"a": 1}, {"b": [2, 3]}, "third"], indent=1))
    changed = JA.JsonArrayIndex(str(path), cache)
    assert not changed.from_cache and [json.loads(changed.read(i)) for i in range(3)] == [{"a": 1}, {"b": [2, 3]}, "third"]
    st_ = os.stat(path)   # same size, new mtime: rebuilt too
    os.utime(path, ns=(st_.st_atime_ns, st_.st_mtime_ns + 10 ** 9))
    assert not JA.JsonArrayIndex(str(path), cache).from_cache
    assert JA.JsonArrayIndex(str(path), cache).from_cache
    assert os.path.dirname(index_cache.cache_path(str(path), JA.INDEX_KIND, cache)) == cache


def test_unwritable_cache_folder_still_reads(tmp_path, caplog):
    path = tmp_path / "a.json"
    path.write_text("[1, 2]")
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("")
    idx = JA.JsonArrayIndex(str(path), str(blocker / "cache"))
    assert [json.loads(idx.read(i)) for i in range(2)] == [1, 2] and "cannot cache" in caplog.text


# --------------------------------------------------------------------------------------
# GUI-Libra RL parquet: one row group per read
# --------------------------------------------------------------------------------------

class _CountingFile(io.FileIO):
    """A file whose reads are logged as (offset, length)."""

    def __init__(self, path):
        super().__init__(path, "r")
        self.reads = []

    def read(self, n=-1):
        pos = self.tell()
        out = super().read(n)
        self.reads.append((pos, len(out)))
        return out

    def readinto(self, b):
        pos = self.tell()
        n = super().readinto(b)
        self.reads.append((pos, n))
        return n


def _rl_file(native_dataset, tmp_path, row_group_mb=0.05):
    rl = str(tmp_path / "rl.parquet")
    src = R.open_source(native_dataset, "native")
    W.native_to_guilibra_rl([src[i] for i in range(len(src))], rl, row_group_mb=row_group_mb)
    return rl


def _chunk_ranges(path):
    """{(row group, top-level column): (start, end)} byte ranges of the column chunks."""
    import pyarrow.parquet as pq
    md = pq.ParquetFile(path).metadata
    out = {}
    for g in range(md.num_row_groups):
        rg = md.row_group(g)
        for j in range(rg.num_columns):
            c = rg.column(j)
            start = c.dictionary_page_offset if c.has_dictionary_page else c.data_page_offset
            top = c.path_in_schema.split(".")[0]
            lo, hi = out.get((g, top), (start, start + c.total_compressed_size))
            out[(g, top)] = (min(lo, start), max(hi, start + c.total_compressed_size))
    return out, md.serialized_size


def _touched(reads, ranges, file_size):
    """(row group, column) chunks that the logged reads overlap; reads of the footer
    (those that end at the end of the file) left out."""
    got = set()
    for pos, n in reads:
        if n == 0 or pos + n == file_size:
            continue
        hit = {k for k, (lo, hi) in ranges.items() if pos < hi and pos + n > lo}
        assert hit, f"read of {n} bytes at {pos} outside every column chunk"
        got |= hit
    return got


def test_rl_reader_touches_only_the_requested_row_group(native_dataset, tmp_path):
    rl = _rl_file(native_dataset, tmp_path)
    ranges, _ = _chunk_ranges(rl)
    size = os.path.getsize(rl)
    files = []

    def opener(p):
        files.append(_CountingFile(p))
        return files[-1]

    src = R.GuiLibraRlSource(rl, open_file=opener)
    n_groups = src.rows.num_row_groups
    assert n_groups >= 6 and len(src) == 24
    for i in (13, 2, 21):
        g = src.rows.group_of(i)
        before = len(files[0].reads) if files else 0
        assert not isinstance(src[i], B.Dropped)
        touched = _touched(files[0].reads[before:], ranges, size)
        assert {t[0] for t in touched} == {g} and ("images", g) in {(c, gg) for gg, c in touched}
    before = len(files[0].reads)
    metas = [src.meta(i) for i in range(len(src))]
    touched = _touched(files[0].reads[before:], ranges, size)
    assert all(m is not None for m in metas)
    assert {c for _, c in touched} and "images" not in {c for _, c in touched}   # meta never reads screenshots
    assert len(files) == 1   # one open file per process


def test_rl_reader_equals_the_whole_table_reader(native_dataset, tmp_path):
    import pyarrow.parquet as pq
    rl = _rl_file(native_dataset, tmp_path)
    rows = pq.read_table(rl).to_pylist()
    src = R.open_source(rl, "guilibra_rl")
    for i, row in enumerate(rows):
        old = record_from_dict(R.guilibra_rl_to_native(row, src.where(i)), src.where(i))
        assert src[i].to_dict() == old.to_dict()
        assert src.meta(i) == R.RecordMeta(old.platform, old.step, old.source, old.reasoning is not None, old.split)
    again = R.open_source(rl, "guilibra_rl")
    assert again.rows.from_cache and not src.rows.from_cache


def test_rl_row_group_index_is_rebuilt_when_the_file_changes(native_dataset, tmp_path):
    rl = _rl_file(native_dataset, tmp_path, row_group_mb=0.05)
    first = R.open_source(rl, "guilibra_rl")
    assert not first.rows.from_cache and R.open_source(rl, "guilibra_rl").rows.from_cache
    records = [first[i] for i in range(len(first))]
    os.unlink(rl)                                            # same path, one row group now
    W.native_to_guilibra_rl(records, rl, row_group_mb=1000)
    again = R.open_source(rl, "guilibra_rl")
    assert not again.rows.from_cache and again.rows.num_row_groups == 1 < first.rows.num_row_groups
    assert [again[i].to_dict() for i in range(len(again))] == [r.to_dict() for r in records]


def test_rl_source_pickles_without_its_open_file(native_dataset, tmp_path):
    from concurrent.futures import ThreadPoolExecutor
    rl = _rl_file(native_dataset, tmp_path)
    src = R.open_source(rl, "guilibra_rl")
    want = [src[i].to_dict() for i in range(len(src))]
    blob = pickle.dumps(src)
    assert len(blob) < 4096    # the index travels, not the table
    clone = pickle.loads(blob)
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda i: clone[(i * 7) % len(clone)].to_dict(), range(96)))
    assert got == [want[(i * 7) % len(want)] for i in range(96)]


def test_too_large_row_groups_name_the_file_and_the_rewrite(native_dataset, tmp_path):
    import pyarrow.parquet as pq
    big = _rl_file(native_dataset, tmp_path, row_group_mb=1000)   # one row group
    assert pq.ParquetFile(big).metadata.num_row_groups == 1
    with pytest.raises(PR.RowGroupTooLarge) as e:
        R.open_source(big, "guilibra_rl", max_row_group_mb=0.1)
    msg = str(e.value)
    assert isinstance(e.value, UserError) and big in msg and "24 rows" in msg
    cmd = shlex.split(msg.split("smaller row groups: ")[1])
    assert cmd[:3] == ["python", "-m", "launch.convert_data"]
    args = [a if not a.startswith("--row_group_mb=") else "--row_group_mb=0.05" for a in cmd[3:]]
    assert convert_data.main(args) == 0
    out = next(a.split("=", 1)[1] for a in args if a.startswith("--output="))
    assert pq.read_table(out).equals(pq.read_table(big))
    small = R.open_source(out, "guilibra_rl", max_row_group_mb=0.1)
    assert small.rows.num_row_groups >= 6 and small.rows.largest_group_mb() < 0.1
    ref = R.open_source(big, "guilibra_rl")
    assert [small[i].to_dict() for i in range(24)] == [ref[i].to_dict() for i in range(24)]


def test_rl_loader_gives_the_same_batches_with_0_and_2_workers(native_dataset, tmp_path, qwen_tok, qwen25_config):
    from guilibra_jax.data import pipeline as PL
    from test_pipeline import _same   # the batch comparison of the native 0-vs-2-workers test
    rl = _rl_file(native_dataset, tmp_path)
    cfg = dict(inputs=rl, format="guilibra_rl", batch_size=4, max_pixels=64 * 64, patch_bucket=64,
               seq_buckets=(1024, 2048), seed=5, num_epochs=1)
    ref = list(PL.make_rl_loader(cfg, qwen_tok, qwen25_config, shard_index=0, shard_count=1))
    it = PL.make_rl_loader({**cfg, "num_workers": 2}, qwen_tok, qwen25_config, shard_index=0, shard_count=1)
    got = list(it)
    it.close()
    assert len(got) == len(ref) == 6
    for a, b in zip(got, ref):
        _same(a, b)


# --------------------------------------------------------------------------------------
# Uni-GUI: lazy episodes and other_label
# --------------------------------------------------------------------------------------

def test_uni_gui_opens_no_screenshot_before_its_step_is_requested(uni_gui_dir, monkeypatch):
    opened = []
    real_open = builtins.open

    def spy(file, *a, **k):
        opened.append(str(file))
        return real_open(file, *a, **k)

    monkeypatch.setattr(builtins, "open", spy)
    src = R.open_source(uni_gui_dir, "uni_gui")
    metas = [src.meta(i) for i in range(len(src))]
    recs = [src[i] for i in range(len(src))]
    assert all(m is not None for m in metas) and len(recs) == 17
    assert opened and all(p.endswith("task.json") for p in opened)
    clone = pickle.loads(pickle.dumps(src))
    assert clone[5].to_json() == recs[5].to_json()
    from guilibra_jax.data import images as I
    opened.clear()
    I.load_image(recs[5].image)
    assert opened == [recs[5].image]


_DESK = "desktop/00af4cc2-25da-46cc-bbc9-c48f1d7dd242"
_MOB = "mobile/AdjustBrightnessMinimumTask_v1"


def _episode_with(uni_gui_dir, tmp_path, rel, step_index, **fields):
    """A copy of a real episode whose step ``step_index`` carries ``fields`` (the
    screenshots are linked, not copied)."""
    src_dir = os.path.join(uni_gui_dir, rel)
    dst = tmp_path / rel.replace("/", "_")
    dst.mkdir()
    for name in os.listdir(src_dir):
        if name != "task.json":
            os.symlink(os.path.join(src_dir, name), dst / name)
    task = json.load(open(os.path.join(src_dir, "task.json")))
    task["data"][step_index].update(fields)
    (dst / "task.json").write_text(json.dumps(task))
    return str(dst)


def _tool(name, **args):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def _target_of_step(root, step):
    src = R.open_source(root, "uni_gui", include_unused=True)
    rec = next(src[i] for i in range(len(src)) if src[i].step == step)
    return rec


# Desktop step 1: left_click [18, 491], bbox [[5, 473], [31, 509]] (the real label).
# Release semantics (gui_agent.compute_score): Plan A against the label; if not 1.0,
# Plan B against other_label with bbox = other_bbox if present else the label's bbox.
_DESKTOP_TABLE = [
    # extra_info,                                                        response,                                   reward
    ({"other_label": _tool("computer_use", action="double_click", coordinate=[18, 491])},
     _tool("computer_use", action="double_click", coordinate=[20, 500]), 1.0),     # B with the main bbox
    ({"other_label": _tool("computer_use", action="double_click", coordinate=[18, 491])},
     _tool("computer_use", action="double_click", coordinate=[100, 100]), -0.5),   # outside the main bbox
    ({"other_label": _tool("computer_use", action="double_click", coordinate=[105, 105]),
      "other_bbox": [[120, 120], [90, 90]]},
     _tool("computer_use", action="double_click", coordinate=[100, 100]), 1.0),    # other_bbox, corners swapped
    ({"other_label": _tool("computer_use", action="double_click", coordinate=[105, 105]),
      "other_bbox": [[90, 90], [120, 120]]},
     _tool("computer_use", action="double_click", coordinate=[20, 500]), -0.5),    # main bbox no longer counts
    ({"other_label": _tool("computer_use", action="double_click", coordinate=[105, 105]), "other_bbox": None},
     _tool("computer_use", action="double_click", coordinate=[105, 105]), 1.0),    # no box: exact coordinate
    ({"other_label": _tool("computer_use", action="double_click", coordinate=[105, 105]), "other_bbox": None},
     _tool("computer_use", action="double_click", coordinate=[106, 105]), -0.5),
    ({"other_label": _tool("computer_use", action="double_click", coordinate=[18, 491])},
     _tool("computer_use", action="left_click", coordinate=[20, 500]), 1.0),       # A still counts
    ({"other_label": "Action: press enter instead\n" + _tool("computer_use", action="key", keys=["Enter"])},
     _tool("computer_use", action="key", keys=["enter"]), 1.0),                    # keys compared as lower-case sets
    ({"other_label": "not a tool call"},
     _tool("computer_use", action="double_click", coordinate=[20, 500]), -0.5),    # unparseable: no Plan B
]


@pytest.mark.parametrize("extra,response,reward", _DESKTOP_TABLE)
def test_other_label_scores_as_the_release(uni_gui_dir, tmp_path, extra, response, reward):
    root = _episode_with(uni_gui_dir, tmp_path, _DESK, 0, extra_info=extra)
    rec = _target_of_step(root, 0)
    assert RW.mopd_reward(response, rec.reward_target()) == reward


def test_other_label_swipe_falls_back_to_each_main_box(uni_gui_dir, tmp_path):
    # Mobile step 2: swipe [500, 762] -> [500, 381], bbox [[450, 712], [550, 812]], bbox2 from the episode.
    alt = _tool("mobile_use", action="swipe", coordinate=[500, 900], coordinate2=[500, 100])
    root = _episode_with(uni_gui_dir, tmp_path, _MOB, 1, other_label=alt, other_bbox2=[[400, 50], [600, 150]])
    rec = _target_of_step(root, 1)
    (a,) = rec.alternatives
    assert a.action_type == "Swipe" and a.value == "up" and a.bbox == rec.target.bbox
    assert a.bbox2 == pytest.approx((400 / 999, 50 / 999, 600 / 999, 150 / 999))
    inside_both = _tool("mobile_use", action="swipe", coordinate=[500, 760], coordinate2=[500, 100])
    wrong_end = _tool("mobile_use", action="swipe", coordinate=[500, 760], coordinate2=[500, 300])
    assert RW.mopd_reward(inside_both, rec.reward_target()) == 1.0
    assert RW.mopd_reward(wrong_end, rec.reward_target()) == -0.5


def test_other_label_travels_through_native_jsonl_and_the_rl_loader(uni_gui_dir, tmp_path, qwen_tok, qwen3_config):
    from guilibra_jax.data import pipeline as PL
    extra = {"other_label": _tool("computer_use", action="double_click", coordinate=[18, 491])}
    root = _episode_with(uni_gui_dir, tmp_path, _DESK, 0, extra_info=extra)
    out = str(tmp_path / "steps.jsonl")
    assert convert_data.convert(root, "uni_gui", out)["written"] == 7
    back = R.open_source(out, "native")
    rec = next(back[i] for i in range(len(back)) if back[i].step == 0)
    assert len(rec.alternatives) == 1 and rec.alternatives[0].tool_call.action == "double_click"
    cfg = dict(inputs=root, format="uni_gui", method="mopd", batch_size=1, max_pixels=128 * 128, patch_bucket=64,
               seq_buckets=(2048, 4096), shuffle=False, splits=None, drop_remainder=False)
    it = PL.make_rl_loader(cfg, qwen_tok, qwen3_config, shard_index=0, shard_count=1)
    target = next(it)["reward_targets"][0]
    it.close()
    assert RW.mopd_reward(_tool("computer_use", action="double_click", coordinate=[20, 500]), target) == 1.0


@pytest.mark.parametrize("fields,why", [
    ({"other_label": _tool("mobile_use", action="click", coordinate=[1, 1])}, "mobile_use"),
    ({"other_label": _tool("computer_use", action="left_click", coordinate=[5, 5]), "other_bbox": [1, 2, 3]},
     "other_bbox"),
])
def test_bad_other_label_keeps_the_record_and_warns(uni_gui_dir, tmp_path, caplog, fields, why):
    root = _episode_with(uni_gui_dir, tmp_path, _DESK, 0, **fields)
    rec = _target_of_step(root, 0)
    assert rec.alternatives == () and rec.target.action_type == "Click"
    assert "other_label left out" in caplog.text and why in caplog.text


def test_uni_gui_source_index_is_two_small_arrays(uni_gui_dir):
    src = R.open_source(uni_gui_dir, "uni_gui")
    assert len(pickle.dumps(src)) < 4096
    assert [src.item(i)[1] for i in range(3)] == [0, 1, 2]
    assert np.all(np.diff([src.item(i)[1] for i in range(7)]) > 0)
