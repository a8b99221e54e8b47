"""Fixtures of the train tests: one persistent XLA compilation cache per session for the
tests that launch ``python -m launch.train`` several times (a rerun reuses the compiled
steps instead of paying the compile again)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(scope="session")
def compile_cache(tmp_path_factory):
    """The session's cache (tests/conftest.py sets JAX_COMPILATION_CACHE_DIR)."""
    return os.environ.get("JAX_COMPILATION_CACHE_DIR") or str(tmp_path_factory.mktemp("jax_compile_cache"))
