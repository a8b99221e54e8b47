"""Fixtures of the curation tests: a synthetic world with known label errors (shared by
the session), and a tiny training workdir (the eval tests' ``build_run``)."""
import os
import sys

import pytest

HERE = os.path.dirname(__file__)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "eval"))
from curate_fixtures import make_world  # noqa: E402
from eval_fixtures import build_run  # noqa: E402


@pytest.fixture(scope="session")
def world(tmp_path_factory):
    return make_world(str(tmp_path_factory.mktemp("world")))


@pytest.fixture(scope="session")
def run(tmp_path_factory):
    """A tiny random-weights training workdir (checkpoints, tokenizer, synthetic data)."""
    return build_run(str(tmp_path_factory.mktemp("run")))
