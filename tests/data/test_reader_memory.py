"""Reader memory does not grow with the data: for every format that holds screenshots
(parquet bytes, inline base64 in JSON / JSONL, image files named by path), the peak RSS
of opening a source (cold index cache) and reading one record is the same for a file
of 20 and of 200 records of 1 MB incompressible "screenshots".

Each measurement is a fresh Python process that only opens and reads: the files are
written here, in the test process. (Writing a file in the measuring process puts its
rows and the pyarrow table in the peak: that is what made 40 and 400 rows look like
234 and 1,138 MB in issue 32.) ``GUILIBRA_READER_MEMORY_ROWS=40,400`` measures other
sizes."""
import base64
import concurrent.futures
import functools
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROWS = tuple(int(n) for n in os.environ.get("GUILIBRA_READER_MEMORY_ROWS", "20,200").split(","))
IMAGE_BYTES = 1 << 20
ROW = 7                  # the row read (a full 8-row parquet group in either file)
SLACK_MB = 6.0           # allocator noise between two processes
RATIO = 1.2              # the larger file's peak over the smaller's, at most

CHILD = r"""
import json, resource, sys
from guilibra_jax.data import bad_records, readers
import pyarrow.parquet  # noqa: F401 - imported before the baseline, as in any reader process

def peak_mb():
    # VmHWM: this process's own peak. ru_maxrss also holds the peak of the process that
    # spawned it (Linux keeps it across exec), here the test process with its files.
    try:
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1024 if sys.platform != "darwin" else 2 ** 20)

paths, fmt, cache, row = json.loads(sys.argv[1])
base = peak_mb()
source = readers.open_source(paths, fmt, index_cache=cache)
record = source[row]
assert not isinstance(record, bad_records.Dropped), record
print(json.dumps({"base_mb": base, "delta_mb": peak_mb() - base, "records": len(source)}))
"""


def _screenshot(i: int) -> bytes:
    return os.urandom(IMAGE_BYTES - 16) + i.to_bytes(16, "little")


def _native(i: int, image) -> dict:
    return {"trajectory_id": f"t{i // 5}", "step": i % 5, "platform": "mobile", "instruction": f"task {i}",
            "history": [f"did {k}" for k in range(i % 5)], "image": image, "image_size": [1080, 2400],
            "target": {"action_type": "Click", "action_description": "tap", "value": None, "point": [0.5, 0.5],
                       "bbox": None, "bbox2": None, "action_target": "ok", "tool_call": None},
            "reasoning": "the button is there", "alternatives": [], "source": "s", "split": "train"}


def _sft(i: int, image) -> dict:
    from guilibra_jax.data import writers
    from guilibra_jax.data.native import record_from_dict
    return writers.sft_item(record_from_dict(_native(i, "x.png"), str(i)), image)


def _linked_images(folder: str, n: int) -> list[str]:
    """``n`` image files of 1 MB (hard links of one file: a reader never opens them, and
    the disk writes stay small), relative to ``folder``."""
    os.makedirs(os.path.join(folder, "img"), exist_ok=True)
    first = os.path.join(folder, "img", "0.png")
    with open(first, "wb") as f:
        f.write(_screenshot(0))
    for i in range(1, n):
        os.link(first, os.path.join(folder, "img", f"{i}.png"))
    return [f"img/{i}.png" for i in range(n)]


def _lines(path: str, items) -> str:
    with open(path, "w") as f:
        for item in items:
            f.write(json.dumps(item) + "\n")
    return path


@functools.lru_cache(maxsize=1)
def _b64_text() -> str:
    return base64.b64encode(_screenshot(0)).decode("ascii")


def _b64(i: int) -> dict:
    """An inline screenshot (one for all rows: a JSON reader's memory does not depend on
    the bytes, only parquet's could, and there each row has its own)."""
    return {"png_b64": _b64_text()}


def parquet_pyarrow(folder: str, n: int) -> str:
    """GUI-Libra RL parquet as in the issue: ``pa.Table.from_pylist`` and pyarrow's
    defaults (snappy, dictionary, statistics), row groups of 8 rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    rows = [{"images": [{"bytes": _screenshot(i), "path": None}], "system_prompt": "You are a GUI agent.",
             "context": f"Instruction: task {i}\n\nInteraction History: None", "data_source": "s",
             "answer": {"gt_action": "Click", "gt_bbox": [1.0, 2.0, 3.0, 4.0], "gt_point_2d": [0.5, 0.5],
                        "gt_input_text": "no input text", "gt_target": "ok", "image_width": 1080,
                        "image_height": 2400},
             "extra_info": "{}"} for i in range(n)]
    path = os.path.join(folder, "rl.parquet")
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=8)
    return path


def native_inline(folder: str, n: int) -> str:
    return _lines(os.path.join(folder, "data.jsonl"), (_native(i, _b64(i)) for i in range(n)))


def native_paths(folder: str, n: int) -> str:
    return _lines(os.path.join(folder, "data.jsonl"),
                  (_native(i, p) for i, p in enumerate(_linked_images(folder, n))))


def sft_json_inline(folder: str, n: int) -> str:
    path = os.path.join(folder, "sft.json")
    with open(path, "w") as f:
        f.write("[\n")
        for i in range(n):
            f.write(("," if i else "") + json.dumps(_sft(i, _b64(i))) + "\n")
        f.write("]\n")
    return path


def sft_json_paths(folder: str, n: int) -> str:
    path = os.path.join(folder, "sft.json")
    with open(path, "w") as f:
        json.dump([_sft(i, p) for i, p in enumerate(_linked_images(folder, n))], f)
    return path


def uni_gui(folder: str, n: int) -> str:
    """One Uni-GUI episode per 10 steps, screenshots as files."""
    images = _linked_images(folder, n)
    for e in range(0, n, 10):
        ep = os.path.join(folder, f"ep{e}")
        os.makedirs(ep)
        steps = []
        for k in range(e, min(n, e + 10)):
            os.link(os.path.join(folder, images[k]), os.path.join(ep, f"{k}.png"))
            steps.append({"step": k - e + 1, "query": f"task {e}", "thought": "tap it", "action": "tap",
                          "screenshot": f"{k}.png", "plan": {"name": "mobile_use", "arguments": {
                              "action": "click", "coordinate": [500, 500]}}})
        with open(os.path.join(ep, "task.json"), "w") as f:
            json.dump({"task": "t", "app": "a", "screen_resolution": [1080, 2400], "query": f"task {e}",
                       "episode_id": f"ep{e}", "is_delete": False, "device": "mobile", "data": steps}, f)
    return folder


CASES = {  # name: (format, writer)
    "guilibra_rl-pyarrow": ("guilibra_rl", parquet_pyarrow),
    "native-inline": ("native", native_inline),
    "native-paths": ("native", native_paths),
    "guilibra_sft-json-inline": ("guilibra_sft", sft_json_inline),
    "guilibra_sft-json-paths": ("guilibra_sft", sft_json_paths),
    "uni_gui": ("uni_gui", uni_gui),
}


def measure(path: str, fmt: str, cache: str) -> dict:
    """Peak RSS (MB) of a fresh process opening ``path`` and reading row ``ROW``, above
    its baseline after the imports."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps([[path], fmt, cache, ROW])], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", sorted(CASES))
def test_peak_rss_of_open_and_one_read_does_not_grow_with_the_file(case, tmp_path):
    fmt, write = CASES[case]
    small, large = ROWS
    paths = {}
    for n in (small, large):
        folder = tmp_path / str(n)
        folder.mkdir()
        paths[n] = write(str(folder), n)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        got = dict(zip((small, large), pool.map(lambda n: measure(paths[n], fmt, str(tmp_path / f"cache{n}")),
                                                (small, large))))
    assert got[small]["records"] == small and got[large]["records"] == large
    a, b = got[small]["delta_mb"], got[large]["delta_mb"]
    assert b <= RATIO * a + SLACK_MB, (
        f"{case}: opening and reading one record of {large} records peaks {b:.1f} MB above the baseline, "
        f"{small} records {a:.1f} MB: reader memory grows with the file ({got})")
