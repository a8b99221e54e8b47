"""Copy variants: demonstration steps whose typed value is re-drawn, so copying must be learned.

A step that types (or selects) a string quoted in its instruction, e.g. ``Enter "Kasie" into
the text field`` -> ``{"action_type": "Write", "value": "Kasie", ...}``, teaches a model to
copy from the instruction only if the string varies enough. MiniWoB++'s typing tasks draw
names and passwords from short lists, so a small model trained on the demos memorises
``instruction -> value`` pairs instead (docs/miniwob.md). :func:`copy_variants` writes
``n`` copies of such a step with every quoted string of the instruction swapped for another
one, everywhere it occurs in the step's text: instruction, history, reasoning, thought,
the target's and alternatives' description, value, target name and tool-call arguments.
Upper- and lower-case forms are swapped with it (enter-text-2 asks for the string in
upper or lower case). The replacement is, with probability ``random_fraction``, a random
string of the original's shape (each letter a random letter of the same case, each digit a
random digit, other characters kept), else another quoted string of the same file
(``pool``), recased like the original. The screenshot is kept as it is: it may still
show the old string.

Steps that do not copy (their value holds no quoted string of the instruction) have no
variants; a quoted string shorter than :data:`MIN_CHARS` makes a step ineligible (a one-
letter swap would hit unrelated words). :func:`eligible` says why a step is left out.
"""

from __future__ import annotations

import dataclasses
import random
import re
import string
from typing import Any, Callable, Sequence

from guilibra_jax import actions as A
from guilibra_jax.data.native import StepRecord, StepTarget

QUOTED = re.compile(r'"([^"\n]+)"')
MIN_CHARS = 2
ID_SUFFIX = "~copy"


def quoted_strings(instruction: str) -> list[str]:
    """The distinct double-quoted strings of an instruction, first occurrence first."""
    return list(dict.fromkeys(m.group(1) for m in QUOTED.finditer(instruction)))


def _forms(s: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys((s, s.upper(), s.lower())))


def eligible(record: StepRecord) -> str | None:
    """None when ``record`` copies a quoted string of its instruction into its value, else
    the reason it has no variants (``no_value``, ``no_quoted_string``, ``value_not_quoted``,
    ``short_quoted_string``)."""
    value = record.target.value
    if not value:
        return "no_value"
    quoted = quoted_strings(record.instruction)
    if not quoted:
        return "no_quoted_string"
    if not any(f in value for q in quoted for f in _forms(q)):
        return "value_not_quoted"
    if any(len(q) < MIN_CHARS for q in quoted):
        return "short_quoted_string"
    return None


def _same_shape(s: str, rng: random.Random) -> str:
    out = []
    for ch in s:
        if ch.isupper() and ch.isascii():
            out.append(rng.choice(string.ascii_uppercase))
        elif ch.islower() and ch.isascii():
            out.append(rng.choice(string.ascii_lowercase))
        elif ch.isdigit() and ch.isascii():
            out.append(rng.choice(string.digits))
        else:
            out.append(ch)
    return "".join(out)


def _recased(like: str, s: str) -> str:
    """``s`` in ``like``'s case when ``like`` is all upper, all lower or title case."""
    if like.isupper():
        return s.upper()
    if like.islower():
        return s.lower()
    if like.istitle():
        return s[:1].upper() + s[1:].lower()
    return s


def _draw(old: str, pool: Sequence[str], rng: random.Random, random_fraction: float) -> str:
    others = [p for p in pool if p.lower() != old.lower()]
    for _ in range(20):
        if not others or rng.random() < random_fraction:
            new = _same_shape(old, rng)
        else:
            new = _recased(old, rng.choice(others))
        if new.lower() != old.lower():
            return new
    return old + rng.choice(string.ascii_lowercase)


def _substituter(mapping: dict[str, str]) -> Callable[[str], str]:
    """Replace each key where it stands alone (no letter or digit on either side)."""
    keys = sorted(mapping, key=len, reverse=True)
    pattern = re.compile(r"(?<![^\W_])(" + "|".join(map(re.escape, keys)) + r")(?![^\W_])")
    return lambda text: pattern.sub(lambda m: mapping[m.group(1)], text)


def _map_any(x: Any, sub: Callable[[str], str]) -> Any:
    if isinstance(x, str):
        return sub(x)
    if isinstance(x, dict):
        return {k: _map_any(v, sub) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_map_any(v, sub) for v in x)
    return x


def _target(t: StepTarget, sub: Callable[[str], str]) -> StepTarget:
    opt = lambda s: None if s is None else sub(s)   # noqa: E731
    call = None if t.tool_call is None else A.ToolCall(t.tool_call.name, _map_any(dict(t.tool_call.arguments), sub))
    return dataclasses.replace(t, action_description=sub(t.action_description), value=opt(t.value),
                               action_target=opt(t.action_target), tool_call=call)


def variant(record: StepRecord, swap: dict[str, str], k: int) -> StepRecord:
    """``record`` with each quoted string ``old`` replaced by ``swap[old]`` (and its upper /
    lower forms by the new string's), trajectory id suffixed ``~copy<k>``."""
    mapping: dict[str, str] = {}
    for old, new in swap.items():
        for f_old, f_new in zip((old, old.upper(), old.lower()), (new, new.upper(), new.lower())):
            mapping.setdefault(f_old, f_new)
    sub = _substituter(mapping)
    opt = lambda s: None if s is None else sub(s)   # noqa: E731
    return dataclasses.replace(
        record, trajectory_id=f"{record.trajectory_id}{ID_SUFFIX}{k}", instruction=sub(record.instruction),
        history=tuple(sub(h) for h in record.history), reasoning=opt(record.reasoning), thought=opt(record.thought),
        target=_target(record.target, sub), alternatives=tuple(_target(a, sub) for a in record.alternatives))


def copy_variants(record: StepRecord, n: int, seed: int = 0, pool: Sequence[str] = (),
                  random_fraction: float = 0.5) -> list[StepRecord]:
    """``n`` variants of an eligible ``record`` (``[]`` when :func:`eligible` says no).
    Variant ``k``'s swap is drawn from ``(seed, trajectory_id, k)`` alone, so the steps of
    one episode swap the same strings the same way; ``pool``: strings to draw from (the
    file's quoted strings)."""
    if eligible(record) is not None:
        return []
    pool = sorted(set(pool))
    out = []
    for k in range(n):
        rng = random.Random(f"{seed}:{record.trajectory_id}:{k}")
        swap: dict[str, str] = {}
        for old in quoted_strings(record.instruction):
            taken = {v.lower() for v in swap.values()}
            swap[old] = _draw(old, [p for p in pool if p.lower() not in taken], rng, random_fraction)
        out.append(variant(record, swap, k))
    return out
