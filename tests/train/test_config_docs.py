"""The config's docs come from its one table (``train/config.py`` KEYS): every key has a
one-line doc, docs/config.md is what the generator writes now (regenerate with
``python -m guilibra_jax.train.config``), and ``launch.train --help`` lists every key.
Validating a config imports no jax."""
import os
import subprocess
import sys

from guilibra_jax.train import config as C

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_key_has_a_one_line_doc():
    for key, k in C.KEYS.items():
        assert k.doc.strip() and "\n" not in k.doc and k.doc == k.doc.strip(), key
        assert len(k.doc) <= 200, f"{key}: doc of {len(k.doc)} characters (one line: move details to SECTIONS)"
    assert set(C.SECTIONS) <= {key.rpartition(".")[0] for key in C.KEYS}


def test_docs_config_md_is_generated_from_the_table():
    path = os.path.join(ROOT, "docs", "config.md")
    assert os.path.abspath(C.DOCS_PATH) == path
    with open(path) as f:
        current = f.read()
    assert current == C.key_table_markdown(), \
        "docs/config.md is stale: run python -m guilibra_jax.train.config"
    for key, k in C.KEYS.items():
        assert f"| `{key}` | `{k.default!r}` |" in current, key


def test_help_key_list_names_every_key_with_its_default():
    text = C.key_list_text()
    for key, k in C.KEYS.items():
        assert f"\n  {key} = {k.default!r}: {k.doc}\n" in text, key


def test_config_and_choices_import_no_jax():
    code = ("import sys, guilibra_jax.choices, guilibra_jax.train.config as C; C.validate(C.base_config(), "
            "planning=True); assert 'jax' not in sys.modules, 'jax imported'")
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
