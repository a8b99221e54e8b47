"""Opening a file that is not what its data format says stops with one line naming the
file (and the config key that named it), for every format: a table of malformed inputs
per format, each written here. Bad records inside a readable file stay Dropped markers
(tests/data/test_bad_records.py); these are whole files a reader cannot open or index."""
import gzip
import json
import os
import re
import shutil

import pytest

from data_fixtures import native_record
from guilibra_jax.data import readers as R
from guilibra_jax.data import writers as W
from guilibra_jax.data.file_errors import DataFileError
from guilibra_jax.data.native import record_from_dict
from guilibra_jax.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AS_ROOT = os.name == "posix" and os.geteuid() == 0
needs_non_root = pytest.mark.skipif(AS_ROOT, reason="root reads files whatever their permissions")


def _write(path, data) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
    return path


def _record_line(i=0) -> str:
    return json.dumps(native_record(i, "img/0.png"))


def _parquet(path, n=3, **kw) -> str:
    records = [record_from_dict(native_record(i, {"png_b64": ""}), str(i)) for i in range(n)]
    for r in records:
        object.__setattr__(r, "image", {"bytes": b"\x89PNG" + bytes(64)})
    os.makedirs(os.path.dirname(path), exist_ok=True)
    W.native_to_guilibra_rl(records, path, **kw)
    return path


def _table(path, columns: dict) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(pa.table(columns), path)
    return path


def _no_permission(path) -> str:
    os.chmod(path, 0)
    return path


def _folder(d, *files) -> str:
    os.makedirs(d, exist_ok=True)
    for name in files:
        _write(os.path.join(d, name), "x")
    return d


def _bad_footer(d) -> str:
    p = _parquet(os.path.join(d, "f.parquet"))
    data = bytearray(open(p, "rb").read())
    data[-8:-4] = (len(data) * 3).to_bytes(4, "little")       # a footer longer than the file
    return _write(p, bytes(data))


def _garbled_footer(d) -> str:
    p = _parquet(os.path.join(d, "f.parquet"))
    data = bytearray(open(p, "rb").read())
    n = int.from_bytes(data[-8:-4], "little")
    data[-8 - n:-8] = os.urandom(n)                           # the footer's bytes, garbled
    return _write(p, bytes(data))


def _task(steps=None, **kw) -> dict:
    steps = steps if steps is not None else [
        {"step": 1, "query": "q", "action": "tap", "screenshot": "0.png",
         "plan": {"name": "mobile_use", "arguments": {"action": "click", "coordinate": [500, 500]}}}]
    return {"task": "t", "app": "a", "screen_resolution": [1080, 2400], "query": "q", "episode_id": "e",
            "is_delete": False, "device": "mobile", "data": steps, **kw}


def _episode(d, task, name="ep") -> str:
    _write(os.path.join(d, name, "task.json"), task if isinstance(task, (str, bytes)) else json.dumps(task))
    return d


def _step(**kw) -> dict:
    return {**_task()["data"][0], **kw}


# (case id, builder(tmp dir) -> path given to open_source, regex the message must match[, kwargs])
NATIVE = [
    ("no_such_file", lambda d: os.path.join(d, "nope.jsonl"), "no such file or folder"),
    ("empty_file", lambda d: _write(os.path.join(d, "a.jsonl"), ""), "holds no records"),
    ("blank_lines", lambda d: _write(os.path.join(d, "a.jsonl"), "\n  \n\t\n"), "holds no records"),
    ("parquet_file", lambda d: _parquet(os.path.join(d, "a.jsonl")), "not native JSONL.*binary data"),
    ("json_array_one_line", lambda d: _write(os.path.join(d, "a.jsonl"), f"[{_record_line()}]\n"),
     r"not native JSONL.*line 1: starts with '\[.*a JSON array\?"),
    ("json_array_pretty", lambda d: _write(os.path.join(d, "a.jsonl"), json.dumps([native_record(0, "x")], indent=2)),
     r"line 1: starts with '\['"),
    ("python_source", lambda d: shutil.copy(os.path.join(ROOT, "setup.py"), os.path.join(d, "a.jsonl")),
     "not native JSONL.*starts with"),
    ("random_bytes", lambda d: _write(os.path.join(d, "a.jsonl"), bytes(range(256)) * 64), "binary data"),
    ("utf16", lambda d: _write(os.path.join(d, "a.jsonl"), (_record_line() + "\n").encode("utf-16")), "binary data"),
    ("gzip", lambda d: _write(os.path.join(d, "a.jsonl"), gzip.compress((_record_line() + "\n").encode() * 3)),
     "not native JSONL"),
    ("lines_of_arrays", lambda d: _write(os.path.join(d, "a.jsonl"), "[1, 2]\n[3]\n"), "starts with '\\[1, 2\\]'"),
    ("lines_of_strings", lambda d: _write(os.path.join(d, "a.jsonl"), '"a"\n"b"\n'), "not native JSONL"),
    ("pretty_object", lambda d: _write(os.path.join(d, "a.jsonl"), json.dumps(native_record(0, "x"), indent=2)),
     "not valid JSON"),
    ("latin1", lambda d: _write(os.path.join(d, "a.jsonl"), '{"a": "caf\xe9"}\n'.encode("latin-1") * 2),
     "not valid JSON"),
    ("csv", lambda d: _write(os.path.join(d, "a.jsonl"), "a,b,c\n1,2,3\n"), "starts with 'a,b,c'"),
    ("folder_without_jsonl", lambda d: _folder(os.path.join(d, "data"), "a.json", "b.txt"),
     r"a folder with no \*\.jsonl files"),
    ("empty_folder", lambda d: _folder(os.path.join(d, "data")), r"a folder with no \*\.jsonl files"),
    ("glob_matches_nothing", lambda d: os.path.join(d, "*.jsonl"), "the pattern matches no file"),
    ("glob_matches_a_folder", lambda d: os.path.join(_folder(os.path.join(d, "x.jsonl")), "..", "*.jsonl"),
     "a folder, not a file"),
    ("only_a_truncated_line", lambda d: _write(os.path.join(d, "a.jsonl"), _record_line()[:40]), "not valid JSON"),
    pytest.param("permission_denied", lambda d: _no_permission(_write(os.path.join(d, "a.jsonl"), _record_line())),
                 "permission denied", marks=needs_non_root),
]

SFT_ITEM = {"image": "a.png", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "x"}]}
SFT = [
    ("no_such_file", lambda d: os.path.join(d, "nope.json"), "no such file or folder"),
    ("empty_file", lambda d: _write(os.path.join(d, "a.json"), ""), "not a JSON array of records: no array found"),
    ("empty_array", lambda d: _write(os.path.join(d, "a.json"), "[]"), "holds no records"),
    ("object_not_array", lambda d: _write(os.path.join(d, "a.json"), json.dumps(SFT_ITEM)), r"expected '\['"),
    ("truncated_array", lambda d: _write(os.path.join(d, "a.json"), "[" + json.dumps(SFT_ITEM) + ","),
     "not closed"),
    ("trailing_comma", lambda d: _write(os.path.join(d, "a.json"), "[" + json.dumps(SFT_ITEM) + ",]"),
     "trailing comma"),
    ("text_after_array", lambda d: _write(os.path.join(d, "a.json"), "[" + json.dumps(SFT_ITEM) + "] more"),
     "text after the array"),
    ("bad_element", lambda d: _write(os.path.join(d, "a.json"), "[" + json.dumps(SFT_ITEM) + ", {oops}]"),
     "element 1 is not valid JSON"),
    ("parquet_file", lambda d: _parquet(os.path.join(d, "a.json")), "not a JSON array of records"),
    ("random_bytes", lambda d: _write(os.path.join(d, "a.json"), bytes(range(256)) * 8), "not a JSON array"),
    ("utf16", lambda d: _write(os.path.join(d, "a.json"), json.dumps([SFT_ITEM]).encode("utf-16")),
     "invalid UTF-8"),
    ("array_of_numbers", lambda d: _write(os.path.join(d, "a.json"), "[1, 2, 3]"),
     "not GUI-Libra SFT records.*element 0: starts with '1'"),
    ("array_of_strings", lambda d: _write(os.path.join(d, "a.json"), '["a.png", "b.png"]'),
     "not GUI-Libra SFT records"),
    ("array_of_arrays", lambda d: _write(os.path.join(d, "a.json"), "[[1], [2]]"), "not GUI-Libra SFT records"),
    ("jsonl_in_a_json_file", lambda d: _write(os.path.join(d, "a.json"), (json.dumps(SFT_ITEM) + "\n") * 2),
     r"expected '\['"),
    ("python_source", lambda d: shutil.copy(os.path.join(ROOT, "setup.py"), os.path.join(d, "a.json")),
     r"expected '\['"),
    ("empty_jsonl", lambda d: _write(os.path.join(d, "a.jsonl"), "\n"), "holds no records"),
    ("array_in_a_jsonl_file", lambda d: _write(os.path.join(d, "a.jsonl"), json.dumps([SFT_ITEM, SFT_ITEM])),
     r"not GUI-Libra SFT records.*starts with '\[\{.*a JSON array\?"),
    ("folder_without_json", lambda d: _folder(os.path.join(d, "data"), "a.parquet"),
     r"a folder with no \*\.json or \*\.jsonl files"),
    ("glob_matches_nothing", lambda d: os.path.join(d, "sft_*.json"), "the pattern matches no file"),
    ("glob_matches_a_folder", lambda d: os.path.join(_folder(os.path.join(d, "x.json")), "..", "*.json"),
     "a folder, not a file"),
    pytest.param("permission_denied", lambda d: _no_permission(_write(os.path.join(d, "a.json"), "[]")),
                 "permission denied", marks=needs_non_root),
]

RL = [
    ("no_such_file", lambda d: os.path.join(d, "nope.parquet"), "no such file or folder"),
    ("empty_file", lambda d: _write(os.path.join(d, "a.parquet"), b""), "an empty file, not a parquet file"),
    ("text_file", lambda d: shutil.copy(os.path.join(ROOT, "setup.py"), os.path.join(d, "a.parquet")),
     "not a parquet file"),
    ("json_file", lambda d: _write(os.path.join(d, "a.parquet"), json.dumps([SFT_ITEM])), "not a parquet file"),
    ("first_half", lambda d: _write(os.path.join(d, "a.parquet"),
                                    open(_parquet(os.path.join(d, "full.parquet")), "rb").read()[:300]),
     "not a parquet file"),
    ("end_magic_cut", lambda d: _write(os.path.join(d, "a.parquet"),
                                       open(_parquet(os.path.join(d, "full.parquet")), "rb").read()[:-4]),
     "not a parquet file"),
    ("magic_only", lambda d: _write(os.path.join(d, "a.parquet"), b"PAR1"), "parquet"),
    ("magic_around_garbage", lambda d: _write(os.path.join(d, "a.parquet"), b"PAR1" + os.urandom(200) + b"PAR1"),
     "parquet file"),
    ("footer_longer_than_file", _bad_footer, "truncated or corrupt parquet file|cannot be read as parquet"),
    ("garbled_footer", _garbled_footer, "truncated or corrupt parquet file|cannot be read as parquet"),
    ("no_images_column", lambda d: _table(os.path.join(d, "a.parquet"), {"answer": ["{}"], "context": ["c"]}),
     "not GUI-Libra RL parquet: no column 'images' \\(its columns: answer, context\\)"),
    ("no_answer_column", lambda d: _table(os.path.join(d, "a.parquet"), {"images": [b"x"]}),
     "no column 'answer'"),
    ("unrelated_table", lambda d: _table(os.path.join(d, "a.parquet"), {"a": [1], "b": ["x"]}),
     "no column 'images' or 'answer'"),
    ("image_paths_not_bytes", lambda d: _table(os.path.join(d, "a.parquet"), {"images": [["a.png"]], "answer": ["{}"]}),
     "column 'images' is list<.*string>, expected image bytes"),
    ("answer_is_a_number", lambda d: _table(os.path.join(d, "a.parquet"), {"images": [b"x"], "answer": [3]}),
     "column 'answer' is int64"),
    ("no_rows", lambda d: _parquet(os.path.join(d, "a.parquet"), n=0), "holds no records"),
    ("folder_without_parquet", lambda d: _folder(os.path.join(d, "data"), "a.json"),
     r"a folder with no \*\.parquet files"),
    ("glob_matches_nothing", lambda d: os.path.join(d, "*.parquet"), "the pattern matches no file"),
    ("glob_matches_a_folder", lambda d: os.path.join(_folder(os.path.join(d, "x.parquet")), "..", "*.parquet"),
     "a folder, not a parquet file"),
    ("row_groups_too_large", lambda d: _parquet(os.path.join(d, "a.parquet"), n=4), "row group 0 .*Rewrite the file",
     {"max_row_group_mb": 1e-4}),
    pytest.param("permission_denied", lambda d: _no_permission(_parquet(os.path.join(d, "a.parquet"))),
                 "permission denied", marks=needs_non_root),
]

UNI_GUI = [
    ("no_such_folder", lambda d: os.path.join(d, "nope"), "no such file or folder"),
    ("empty_folder", lambda d: _folder(os.path.join(d, "eps")), "no task.json under it"),
    ("only_screenshots", lambda d: _folder(os.path.join(d, "eps"), "0.png", "1.png"), "no task.json under it"),
    ("glob_matches_nothing", lambda d: os.path.join(d, "eps*"), "no task.json under it"),
    ("empty_task_file", lambda d: _write(os.path.join(d, "task.json"), ""), "not a Uni-GUI task.json \\(JSONDecodeError"),
    ("python_task_file", lambda d: shutil.copy(os.path.join(ROOT, "setup.py"), os.path.join(d, "task.json")),
     "not a Uni-GUI task.json"),
    ("parquet_task_file", lambda d: _parquet(os.path.join(d, "task.json")), "not a Uni-GUI task.json"),
    ("array_task_file", lambda d: _write(os.path.join(d, "task.json"), "[]"), "not a Uni-GUI task.json \\(TypeError"),
    ("no_data_key", lambda d: _write(os.path.join(d, "task.json"), json.dumps({"device": "mobile"})),
     "no key 'data'"),
    ("data_not_a_list", lambda d: _write(os.path.join(d, "task.json"), json.dumps(_task(steps={"a": 1}))),
     "'data' is a dict, not a list of steps"),
    ("steps_not_objects", lambda d: _write(os.path.join(d, "task.json"), json.dumps(_task(steps=["tap"]))),
     "not a Uni-GUI task.json \\(AttributeError"),
    ("invalid_utf8", lambda d: _write(os.path.join(d, "task.json"), b'{"data": ["\xff\xfe"]}'),
     "not a Uni-GUI task.json \\(UnicodeDecodeError"),
    ("only_episode_truncated", lambda d: _episode(d, json.dumps(_task())[:50]),
     "not a Uni-GUI task.json .* no task.json under .* could be read"),
    ("every_episode_broken", lambda d: _episode(_episode(d, "{", "a"), "[1, 2", "b"), "could be read"),
    ("no_steps", lambda d: _episode(d, _task(steps=[])), "no usable Uni-GUI steps in 1 task.json file\\(s\\) \\(no steps\\)"),
    ("every_step_deleted", lambda d: _episode(d, _task(steps=[_step(is_delete=True), _step(is_delete=True)])),
     "left out: deleted_step=2"),
    ("episode_deleted", lambda d: _episode(d, _task(is_delete=True)), "left out: deleted_episode=1"),
    ("every_step_unused", lambda d: _episode(d, _task(steps=[_step(is_use=False)])), "left out: unused_step=1"),
    ("task_json_is_a_folder", lambda d: os.path.dirname(os.path.dirname(_folder(os.path.join(d, "ep", "task.json")))),
     "no task.json under it"),
    pytest.param("permission_denied", lambda d: _no_permission(_write(os.path.join(d, "task.json"), "{}")),
                 "permission denied", marks=needs_non_root),
]


TABLES = {"native": NATIVE, "guilibra_sft": SFT, "guilibra_rl": RL, "uni_gui": UNI_GUI}


def _cases():
    """pytest params (format, name, build, pattern, open_source kwargs) of every table."""
    out = []
    for fmt, table in TABLES.items():
        for c in table:
            values, marks = (c.values, c.marks) if hasattr(c, "marks") else (c, ())
            values = tuple(values) + (None,) * (4 - len(values))
            out.append(pytest.param(fmt, *values, id=f"{fmt}-{values[0]}", marks=marks))
    return out


@pytest.mark.parametrize("fmt,name,build,pattern,kwargs", _cases())
def test_malformed_input_is_one_line_naming_the_key_and_the_file(fmt, name, build, pattern, kwargs, tmp_path):
    d = str(tmp_path / name)
    os.makedirs(d, exist_ok=True)
    given = build(d)
    with pytest.raises(DataFileError) as e:
        R.open_source([given], fmt, index_cache=str(tmp_path / "cache"), config_key="data.train_files",
                      **(kwargs or {}))
    msg = str(e.value)
    assert isinstance(e.value, UserError) and "\n" not in msg, msg
    assert msg.startswith(f"data.train_files (format {fmt}): "), msg
    assert d in msg, f"the message names no file under {d}: {msg}"
    assert re.search(pattern, msg), f"{pattern!r} not in: {msg}"


def test_tables_hold_at_least_15_cases_per_format():
    for table in TABLES.values():
        assert len([c for c in table if not hasattr(c, "marks")]) >= 15   # permission cases aside


def test_without_a_config_key_the_message_starts_with_the_file(tmp_path):
    p = _write(str(tmp_path / "a.parquet"), b"not parquet")
    with pytest.raises(DataFileError, match=f"^{p}: not a parquet file"):
        R.open_source(p, "guilibra_rl", index_cache=str(tmp_path / "cache"))


def test_a_readable_file_next_to_a_bad_one_still_names_the_bad_one(tmp_path):
    good = _write(str(tmp_path / "good.jsonl"), _record_line() + "\n")
    bad = _write(str(tmp_path / "bad.jsonl"), "")
    with pytest.raises(DataFileError, match=f"^data.eval_files \\(format native\\): {bad}: holds no records"):
        R.open_source([good, bad], "native", config_key="data.eval_files")


def test_bad_lines_in_a_jsonl_file_are_still_dropped_records(tmp_path):
    """The sniff looks for one record among the first lines; bad lines after it (or
    before it) stay Dropped markers, as designed."""
    p = _write(str(tmp_path / "a.jsonl"), "{oops\n" + _record_line() + "\n[1]\n")
    src = R.open_source(p, "native")
    assert len(src) == 3
    assert [type(src[i]).__name__ for i in range(3)] == ["Dropped", "StepRecord", "Dropped"]


@pytest.mark.parametrize("error,words", [(PermissionError(13, "Permission denied"), "permission denied"),
                                         (IsADirectoryError(21, "Is a directory"), "a folder, not a file"),
                                         (FileNotFoundError(2, "No such file"), "no such file or folder")])
def test_os_errors_while_opening_are_named(error, words):
    """What the permission cases above check when not run as root."""
    def make(_):
        raise error
    with pytest.raises(DataFileError, match=f"^/data/a.jsonl: {words}$"):
        R._opened("/data/a.jsonl", "native", make)
