"""Shared test setup: offline by construction (tests needing several devices start a
subprocess with --xla_force_host_platform_device_count), and one
persistent XLA compilation cache for the whole session (``JAX_COMPILATION_CACHE_DIR``,
inherited by every ``python -m launch.*`` a test starts, whose ``train.compilation_cache_dir
= "auto"`` then uses it): the many launches of the same smoke recipes compile once."""
import atexit
import os
import shutil
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="guilibra-test-xla-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)

# XLA's CPU back end without LLVM optimisation (inherited by the tests' subprocesses; the
# multi-device ones append their device count): the tests' tiny programs spend far longer
# compiling than running, and this cuts a file's time by about a quarter (test_learning +
# test_parity: 191 -> 142 s, same machine, back to back). The HLO passes, sharding and buffer
# assignment are unchanged; only the emitted machine code is less optimised. Set the flag in
# XLA_FLAGS yourself to test another level.
if "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()


# Heaviest test files first: with ``--dist loadfile`` each file runs whole on one worker in
# collection order, so a heavy file collected last keeps one worker busy alone at the end.
# tests/durations.json holds seconds per file from a full run (tests/update_durations.py).
_DURATIONS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "durations.json")


def pytest_collection_modifyitems(config, items):
    import json
    if not os.path.exists(_DURATIONS):
        return
    with open(_DURATIONS) as f:
        seconds = json.load(f)
    items.sort(key=lambda item: -seconds.get(item.nodeid.split("::")[0], 0.0))   # stable: file order kept
