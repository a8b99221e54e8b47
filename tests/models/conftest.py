"""Session-scoped tiny Hugging Face models (the independent reference) and their JAX ports."""
import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from hf_fixtures import build_hf  # noqa: E402

FAMILIES = ("qwen2_5_vl", "qwen3_vl")


@pytest.fixture(scope="session")
def hf_dirs(tmp_path_factory):
  """family -> (torch model, saved checkpoint folder)."""
  out = {}
  for family in FAMILIES:
    model = build_hf(family)
    path = tmp_path_factory.mktemp(family)
    model.save_pretrained(path)
    out[family] = (model, str(path))
  return out


@pytest.fixture(scope="session")
def loaded(hf_dirs):
  """family -> (torch model, jax model, ModelConfig, checkpoint folder)."""
  from guilibra_jax.models import load_hf
  out = {}
  for family, (hf, path) in hf_dirs.items():
    model, config = load_hf(path)
    out[family] = (hf, model, config, path)
  return out
