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
