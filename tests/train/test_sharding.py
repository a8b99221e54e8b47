"""Sharded runs equal single-device runs: 8 fake CPU devices (FSDP 2x4, tensor 1x8);
2 processes x 4 devices on localhost equal 1 process x 8 devices, with images too.
Each run is a fresh process (the device count is fixed when jax starts)."""
import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

WORKER = os.path.join(os.path.dirname(__file__), "sharded_worker.py")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_worker(*args, timeout=600):
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = subprocess.run([sys.executable, WORKER, *args], capture_output=True, text=True, timeout=timeout, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_sharded_losses_equal_single_device():
    runs = run_worker("--mesh=1,1,1;2,4,1;1,1,8;8,1,1")
    single, *sharded = runs
    assert single["devices"] == 1 and single["sharded_params"] == 0
    assert single["losses"][0] != single["losses"][-1]  # steps really updated params
    for run, min_sharded in zip(sharded, (10, 10, 0)):
        assert run["devices"] == 8
        assert run["sharded_params"] >= min_sharded, run  # the mesh really shards parameters
        # float32 with another reduction order: ~1e-6 relative observed
        np.testing.assert_allclose(run["losses"], single["losses"], rtol=2e-5, err_msg=str(run["mesh"]))


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_of_four_devices_equal_one_process_of_eight():
    """Image batches whose processes hold different images and patch counts (and rows
    without images): each process feeds its rows and images, one process feeds the same
    global batch; the losses agree. (The text rows of these batches cover text-only
    assembly; the "text" data of the worker is the same check without images.)"""
    env = {**os.environ, "PYTHONPATH": ROOT}
    common = ["--mesh=2,4,1", "--data=mixed"]
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, WORKER, "--devices=8", *common],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)]
    procs += [subprocess.Popen([sys.executable, WORKER, "--devices=4", *common, "--num_processes=2",
                                f"--process_id={i}", f"--port={port}"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for i in range(2)]
    outs = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=600)
        assert p.returncode == 0, stderr[-3000:]
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    ref, *multi = outs
    assert [r["data"] for r in ref] == ["mixed"]
    for runs in multi:
        for run, want in zip(runs, ref):
            assert run["devices"] == 8 and run["data"] == want["data"]
            np.testing.assert_allclose(run["losses"], want["losses"], rtol=2e-5, err_msg=run["data"])
