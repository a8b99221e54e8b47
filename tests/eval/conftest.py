"""Fixtures of the eval tests: one tiny training workdir for the whole session."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from eval_fixtures import build_run  # noqa: E402


@pytest.fixture(scope="session")
def run(tmp_path_factory):
    """A training workdir as launch.train leaves it (checkpoints at steps 1, 2, 3; the
    latest holds ``run.params``) and its HF export (eval_fixtures.build_run)."""
    return build_run(str(tmp_path_factory.mktemp("run")))
