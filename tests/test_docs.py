"""The README and docs/ point only at files the repository holds, and the README stays short.

(a) every relative link (``[text](path)`` or ``![alt](path)``) in README.md and docs/**/*.md
resolves to an existing file or folder, relative to the page (anchors stripped; http(s) and
mailto links ignored); (b) every path under ``benchmarks/results/`` or ``docs/study/`` that a
page names, as a link or in backticks, exists; (c) README.md is at most 320 lines.
"""
import glob
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
MAX_README_LINES = 320

LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^\s*(```|~~~)")
TRACKED_DIRS = ("benchmarks/results/", "docs/study/")
TEMPLATE_CHARS = set("<>*{}[]$")   # a pattern such as plan-<recipe>.json names no file


def pages() -> list[str]:
    return [README] + sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))


def _rel(page: str) -> str:
    return os.path.relpath(page, ROOT)


def _prose_and_code(page: str) -> tuple[list[str], list[str]]:
    """(lines outside fenced code blocks, lines inside them)."""
    prose, code, fenced = [], [], False
    with open(page, encoding="utf-8") as f:
        for line in f:
            if FENCE.match(line):
                fenced = not fenced
                continue
            (code if fenced else prose).append(line)
    return prose, code


def _links(page: str) -> list[str]:
    prose, _ = _prose_and_code(page)
    text = "".join(CODE_SPAN.sub("", line) for line in prose)   # links inside `code` are not links
    return LINK.findall(text)


def _is_external(target: str) -> bool:
    return re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) is not None   # http:, https:, mailto:, ...


@pytest.mark.parametrize("page", pages(), ids=_rel)
def test_relative_links_resolve(page):
    missing = []
    for target in _links(page):
        if _is_external(target):
            continue
        path = target.split("#", 1)[0]
        if not path:            # a link to an anchor of the same page
            continue
        resolved = os.path.normpath(os.path.join(os.path.dirname(page), path))
        if not os.path.exists(resolved):
            missing.append(target)
    assert not missing, f"{_rel(page)} links to missing files: {missing}"


def _named_tracked_paths(page: str) -> list[tuple[str, str]]:
    """(as written, path from the repository root) of every benchmarks/results/ or docs/study/
    path the page names in a link or in backticks (code blocks included)."""
    out = []
    for target in _links(page):
        if _is_external(target):
            continue
        path = target.split("#", 1)[0]
        full = os.path.normpath(os.path.join(os.path.dirname(page), path))
        rel = os.path.relpath(full, ROOT).replace(os.sep, "/")
        if rel.startswith(TRACKED_DIRS):
            out.append((target, rel))
    prose, code = _prose_and_code(page)
    spans = [s for line in prose for s in CODE_SPAN.findall(line)]
    for text in spans + code:
        for word in re.split(r"[\s=,;()'\"]+", text):
            for prefix in TRACKED_DIRS:
                i = word.find(prefix)
                if i < 0:
                    continue
                path = word[i:].rstrip(".:")
                if path == prefix.rstrip("/") or set(path) & TEMPLATE_CHARS:
                    continue
                out.append((word, path))
    return out


@pytest.mark.parametrize("page", pages(), ids=_rel)
def test_named_results_and_study_files_exist(page):
    missing = [written for written, path in _named_tracked_paths(page)
               if not os.path.exists(os.path.join(ROOT, path))]
    assert not missing, f"{_rel(page)} names files that do not exist: {missing}"


def test_readme_is_short():
    with open(README, encoding="utf-8") as f:
        n = sum(1 for _ in f)
    assert n <= MAX_README_LINES, f"README.md has {n} lines; keep it at most {MAX_README_LINES} (move detail into docs/)"


def test_the_checks_see_links_and_paths():
    """The parsers above find what they must (so an empty result is not a silent pass)."""
    assert any(t.startswith("docs/") for t in _links(README))
    assert any(p.startswith("benchmarks/results/") for _, p in _named_tracked_paths(README))
