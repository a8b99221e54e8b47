"""The recipes in ``configs/`` as ``--help`` lists them: name, arguments, one line.

Read from the files' source (``ast``), nothing imported: the first line of each
module docstring, and the arguments ``get_config(arg)`` accepts, taken from (in order)
a module-level ``ARGS`` tuple, a ``RECIPES`` dict (or one imported from another
recipe), or the string literals ``arg`` is compared with in ``get_config``.
"""

from __future__ import annotations

import ast
import os
import re
from typing import NamedTuple

CONFIGS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


class Recipe(NamedTuple):
    path: str              # configs/X.py
    kind: str              # "train" (builds on train.config.base_config), "curate" (launch.curate's), "eval"
                           # or "study" (launch.study's: its stages' train configs and plan())
    args: tuple[str, ...]  # accepted ``:arg`` values ("" = none)
    default: str | None    # get_config's default argument
    summary: str           # the docstring's first sentence or line


def _literal_names(node) -> tuple[str, ...] | None:
    try:
        value = ast.literal_eval(node)
    except ValueError:
        return None
    if isinstance(value, dict):
        return tuple(str(k) for k in value)
    if isinstance(value, (tuple, list)):
        return tuple(str(v) for v in value)
    return None


def _module_names(tree: ast.Module, name: str, configs_dir: str) -> tuple[str, ...] | None:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return _literal_names(node.value)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("configs.") and \
                any(a.name == name and a.asname is None for a in node.names):
            other = os.path.join(configs_dir, node.module.split(".", 1)[1] + ".py")
            if os.path.exists(other):
                with open(other) as f:
                    return _module_names(ast.parse(f.read()), name, configs_dir)
    return None


def _compared_strings(fn: ast.FunctionDef) -> tuple[str, ...]:
    out: list[str] = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) and node.left.id == "arg":
            for comp in node.comparators:
                for c in ast.walk(comp):
                    if isinstance(c, ast.Constant) and isinstance(c.value, str) and c.value not in out:
                        out.append(c.value)
    return tuple(out)


def _summary(doc: str | None, width: int = 120) -> str:
    """The docstring's first sentence, cut at a clause boundary to fit one line."""
    if not doc:
        return ""
    first = " ".join(doc.strip().split("\n\n")[0].split()).replace("``", "")
    end = first.find(". ")
    first = (first if end < 0 else first[:end]).rstrip(".:")
    if len(first) > width:
        cuts = [first.find(" (")] + [first.rfind(sep, 0, width) for sep in (", ", "; ", " ")]
        cut = next((c for c in cuts if 10 < c <= width), width)
        first = first[:cut]
    return first.rstrip(".:,; ")


def read_recipe(path: str, configs_dir: str = CONFIGS_DIR) -> Recipe | None:
    """The recipe in ``path``, or None for a file without ``get_config``."""
    with open(path) as f:
        source = f.read()
    tree = ast.parse(source)
    kind = "study" if "launch.study" in source else (   # a study's stages (launch.study) are train configs
        "train" if "base_config" in source or re.search(r"^from configs[. ]", source, re.M) else (
            "curate" if "launch.curate" in source else "eval"))
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_config"), None)
    if fn is None:
        return None
    defaults = fn.args.defaults
    default = None
    if defaults and isinstance(defaults[-1], ast.Constant):
        default = defaults[-1].value
    args = (_module_names(tree, "ARGS", configs_dir) or _module_names(tree, "RECIPES", configs_dir)
            or _compared_strings(fn))
    return Recipe(os.path.relpath(path, os.path.dirname(configs_dir)), kind, tuple(args), default,
                  _summary(ast.get_docstring(tree)))


def list_recipes(configs_dir: str = CONFIGS_DIR, kind: str | None = None) -> list[Recipe]:
    """The recipes in ``configs_dir`` (of ``kind`` "train" / "eval" when given), by name."""
    out = []
    for name in sorted(os.listdir(configs_dir)):
        if name.endswith(".py") and not name.startswith("_"):
            r = read_recipe(os.path.join(configs_dir, name), configs_dir)
            if r is not None and kind in (None, r.kind):
                out.append(r)
    return out


def help_text(kind: str = "train", configs_dir: str = CONFIGS_DIR) -> str:
    """The recipe list ``launch.train --help`` (kind "train"), ``launch.plan --help``
    ("plan": the train recipes) or ``launch.eval --help`` ("eval") prints."""
    lines = ["", "Recipes (--config=configs/X.py[:arg]):"]
    for r in list_recipes(configs_dir, "train" if kind == "plan" else kind):
        if r.args:
            default = f"; default {r.default}" if r.default else ""
            args = f"  [:{'|'.join(r.args)}{default}]"
        else:
            args = ""
        lines.append(f"  {r.path}{args}")
        if r.summary:
            lines.append(f"      {r.summary}")
    if kind == "train":
        lines += ["", "Every key can be overridden with --config.a.b=value; --config.print_only=True (or --dry_run)",
                  "prints the resolved, validated config and exits. The keys, their defaults and what they do are",
                  "listed below (with their allowed values: docs/config.md)."]
    elif kind == "plan":
        lines += ["", "Every key can be overridden with --config.a.b=value (keys, defaults and allowed values: "
                  "docs/config.md, or launch.train --help)."]
    elif kind == "study":
        lines = ["", "Studies (--study=X runs configs/study_X.py's plan; one stage alone: launch.train "
                 "--config=configs/study_X.py:<stage>):"] + lines[2:]
    else:
        lines += ["", "Every key can be overridden with --config.a.b=value (keys: the recipe file)."]
    return "\n".join(lines) + "\n"


LAUNCHER_OF_KIND = {"train": "launch.train / launch.plan", "eval": "launch.eval", "curate": "launch.curate",
                    "study": "launch.study"}


def index_text(configs_dir: str = CONFIGS_DIR) -> str:
    """The recipes in ``configs_dir`` by kind, one line per kind: what the ``--help`` of
    a launcher that takes no recipe (convert, merge, ...) ends with."""
    by_kind: dict[str, list[str]] = {}
    for r in list_recipes(configs_dir):
        by_kind.setdefault(r.kind, []).append(r.path)
    lines = ["", "Recipes in configs/, by the launcher that runs them (its --help lists their arguments):"]
    for kind, paths in by_kind.items():
        lines.append(f"  {LAUNCHER_OF_KIND.get(kind, kind)}: {', '.join(paths)}")
    return "\n".join(lines) + "\n"
