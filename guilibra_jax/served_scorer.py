"""Served scorers: a frozen model of stage 2 (``rl.teachers.<label>``, ``rl.reference``)
that another machine serves behind an OpenAI-compatible endpoint (vLLM ``serve``), given
as its URL. It returns the log-probs of our sampled response tokens after our prompt.

Protocol (the shapes of vLLM's ``vllm/entrypoints/openai/completion/protocol.py``,
``CompletionRequest`` / ``CompletionResponseChoice``, as stored at commit 002032ee2b18):
one ``POST <url>/completions`` per ``rl.served.rows_per_request`` rows, with

    {"model": M, "prompt": [[prompt ids + response ids], ...], "max_tokens": 1,
     "temperature": 0.0, "prompt_logprobs": 0, "return_token_ids": true, "add_special_tokens": false}

``prompt`` as lists of token ids: the server tokenizes nothing, so it scores exactly our
tokens. The reply's ``choices[i]`` (ordered by ``index``) carries ``prompt_logprobs``: one
entry per prompt token, the first ``null``, entry j a dict ``{"<token id>": {"logprob",
"rank", "decoded_token"}}`` that holds token j (``prompt_logprobs: 0``: that token only;
more ids may appear, ours must be among them), and, when the server returns them,
``prompt_token_ids``. Both are checked against our ids: a difference is a one-line
ConfigError naming the config key and the first differing position (a server that
tokenizes, truncates or drops tokens is never silently trusted). ``M`` is the model the
server lists first at ``<url>/models`` unless the URL ends in ``#<model name>``.

Limits:
* vLLM's completions API takes no images: rows whose prompt holds an image are a one-line
  error (not scored). Images would need the chat API (same commit,
  ``vllm/entrypoints/openai/chat_completion/protocol.py``: ``ChatCompletionRequest`` takes
  ``prompt_logprobs``, ``chat_template`` and ``mm_processor_kwargs``;
  ``ChatCompletionResponse`` returns ``prompt_logprobs`` and ``prompt_token_ids`` at its
  top level) with our prompt rebuilt as text + images (a verbatim chat template, the
  screenshot rebuilt from our pixel patches) and the server's expanded image tokens
  checked against ours the same way: not built.
* vLLM's prompt log-probs are of the raw logits (``--logprobs-mode`` raw_logprobs, its
  default): temperature 1 over the whole vocabulary. ``rl.temperature`` must be 1.0 (a
  ConfigError otherwise) and the vision tokens our on-mesh scorers ban are not excluded
  from the normalisation (their mass under a trained model is ~0).
* ``rl.mopd.estimator = full_kl`` needs a teacher's logits on the mesh: a ConfigError.

Failures: retries with backoff, timeouts and counting by reason are
:mod:`guilibra_jax.chat_endpoint`'s (:func:`~guilibra_jax.chat_endpoint.with_retries`);
malformed replies (no ``choices``, a wrong count, no log-prob for a token) are retried. A
request that fails every attempt leaves its rows unscored (``None``), as does every row
of a call while the server cannot even list its models: the caller drops them from the KL
term and counts them. :class:`FailedSteps` stops a run after
``rl.served.max_failed_steps`` consecutive steps in which a scorer scored none of its rows.
"""

from __future__ import annotations

import collections
import json
import random
import threading
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

import numpy as np

from guilibra_jax import chat_endpoint as CE
from guilibra_jax.errors import ConfigError

SCHEMES = ("http", "https")


def is_url(spec: str) -> bool:
    """``spec`` names a served scorer (anything with ``://``; :func:`check_url` validates it)."""
    return isinstance(spec, str) and "://" in spec


def check_url(key: str, spec: str) -> None:
    """ConfigError naming ``key`` unless ``spec`` is an http(s) URL with a host."""
    try:
        u = urllib.parse.urlsplit(spec)
        u.port  # noqa: B018 - raises on a malformed port
    except ValueError as e:
        raise ConfigError(f"config key {key} = {spec!r} is invalid: a malformed URL ({e})") from None
    if u.scheme not in SCHEMES:
        raise ConfigError(f"config key {key} = {spec!r} is invalid: a served scorer's URL must be http:// or "
                          f"https://, not {u.scheme}://")
    if not u.hostname or any(c.isspace() for c in spec):
        raise ConfigError(f"config key {key} = {spec!r} is invalid: a URL with a host, e.g. http://host:8000/v1")


def split_url(spec: str) -> tuple[str, str]:
    """(the completions URL, the model name after ``#`` or '')."""
    base, _, model = spec.partition("#")
    base = base.rstrip("/")
    return (base if base.endswith("/completions") else base + "/completions"), model


def models_url(completions: str) -> str:
    return completions[: -len("/completions")] + "/models"


def request_body(model: str, seqs: Sequence[Sequence[int]]) -> dict:
    """The completions request scoring ``seqs`` (token ids) in one call (module doc)."""
    return {"model": model, "prompt": [[int(t) for t in s] for s in seqs], "max_tokens": 1, "temperature": 0.0,
            "prompt_logprobs": 0, "return_token_ids": True, "add_special_tokens": False}


class Mismatch(Exception):
    """The server scored other tokens than ours: (row in the request, position, ours, theirs)."""

    def __init__(self, row: int, pos: int, ours, theirs):
        super().__init__(row, pos, ours, theirs)
        self.row, self.pos, self.ours, self.theirs = row, pos, ours, theirs


def first_difference(ours: Sequence[int], theirs: Sequence[int]) -> int | None:
    """The first position where two id sequences differ (lengths included), or None."""
    for j, (a, b) in enumerate(zip(ours, theirs)):
        if int(a) != int(b):
            return j
    return None if len(ours) == len(theirs) else min(len(ours), len(theirs))


def parse_reply(reply, seqs: Sequence[Sequence[int]], n_prompt: Sequence[int]) -> list[np.ndarray]:
    """The response tokens' log-probs [len(seq) - n_prompt] (float32) of each sequence from a
    completions reply; raises :class:`Mismatch` when the server's tokens differ from ours
    and ``Retryable("malformed")`` when the reply lacks what we asked for."""
    try:
        choices = sorted(reply["choices"], key=lambda c: int(c.get("index", 0)))
        if len(choices) != len(seqs):
            raise ValueError("choices")
        out = []
        for i, (choice, seq, p) in enumerate(zip(choices, seqs, n_prompt)):
            theirs = choice.get("prompt_token_ids")
            if theirs is not None and (j := first_difference(seq, theirs)) is not None:
                raise Mismatch(i, j, _at(seq, j), _at(theirs, j))
            lps = choice["prompt_logprobs"]
            if len(lps) != len(seq):
                j = min(len(lps), len(seq))
                raise Mismatch(i, j, _at(seq, j), f"{len(lps)} scored tokens")
            row = np.empty(len(seq) - p, np.float32)
            for j in range(1, len(seq)):     # every scored position holds our token (prompt included)
                entry = lps[j]
                got = entry.get(str(int(seq[j]))) if isinstance(entry, dict) else None
                if got is None:
                    raise Mismatch(i, j, int(seq[j]), sorted(entry) if isinstance(entry, dict) else entry)
                if j >= p:
                    row[j - p] = float(got["logprob"] if isinstance(got, dict) else got)
            out.append(row)
        return out
    except Mismatch:
        raise
    except (KeyError, IndexError, TypeError, ValueError, AttributeError):
        raise CE.Retryable("malformed") from None


def _at(seq, j):
    return int(seq[j]) if j < len(seq) else "end"


class ServedScorer:
    """The served model of config key ``key`` at ``url`` (module doc). Thread-safe counts:
    :attr:`counts` (each attempt's outcome by reason, cumulative)."""

    served = True
    params = None

    def __init__(self, key: str, url: str, *, timeout: float = 120.0, retries: int = 3, backoff: float = 1.0,
                 max_backoff: float = 30.0, concurrency: int = 8, rows_per_request: int = 8, api_key: str = "",
                 seed: int = 0):
        check_url(key, url)
        self.key, self.url = key, url
        self.name = key.split(".")[-1]
        self.completions, self._model = split_url(url)
        self.timeout, self.retries, self.backoff, self.max_backoff = timeout, retries, backoff, max_backoff
        self.concurrency, self.rows_per_request, self.api_key = int(concurrency), int(rows_per_request), api_key
        self.counts: collections.Counter = collections.Counter()
        self._lock = threading.Lock()
        self._rng = random.Random(seed)

    def model(self) -> str | None:
        """The model name sent: the URL's ``#<name>``, else the first the server lists
        (None while the server cannot be reached: the rows of that call go unscored)."""
        if not self._model:
            self._model, _, _, _ = CE.with_retries(self._list_models, self.retries, self._delay,
                                                   lambda r: self._count(f"models_{r}"))
            self._model = self._model or ""
        return self._model or None

    def score(self, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]]) -> list:
        """Per row: its response tokens' log-probs [len(response)] (float32), or None when
        every attempt of its request failed. Concurrent requests of ``rows_per_request`` rows."""
        if not prompts:
            return []
        seqs = [list(map(int, p)) + list(map(int, r)) for p, r in zip(prompts, responses)]
        n_prompt = [len(p) for p in prompts]
        if self.model() is None:       # resolved once, before the threads
            self._count("failed_requests")
            return [None] * len(seqs)
        n = self.rows_per_request
        parts = [(seqs[i:i + n], n_prompt[i:i + n], i) for i in range(0, len(seqs), n)]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(parts))) as pool:
            results = list(pool.map(lambda part: self._request(*part), parts))
        return [row for rows in results for row in rows]

    # ------------------------------------------------------------------ internals
    def _request(self, seqs, n_prompt, first_row) -> list:
        data = json.dumps(request_body(self._model, seqs)).encode("utf-8")
        send = lambda: parse_reply(CE.post_json(self.completions, data, self._headers(), self.timeout), seqs, n_prompt)
        try:
            value, _, _, _ = CE.with_retries(send, self.retries, self._delay, self._count)
        except Mismatch as m:
            raise ConfigError(f"config key {self.key} = {self.url!r}: the server scored other tokens than ours "
                              f"(row {first_row + m.row}, first difference at position {m.pos}: ours {m.ours}, "
                              f"the server's {m.theirs}); serve the same tokenizer and send token ids") from None
        if value is None:
            self._count("failed_requests")
            return [None] * len(seqs)
        return value

    def _list_models(self) -> str:
        import urllib.request
        req = urllib.request.Request(models_url(self.completions), headers=self._headers(), method="GET")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read())["data"][0]["id"]
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            raise CE.Retryable("connection") from None

    def _headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def _count(self, reason: str) -> None:
        with self._lock:
            self.counts[reason] += 1

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        with self._lock:
            return CE.backoff_delay(attempt, retry_after, self.backoff, self.max_backoff, self._rng)


class FailedSteps:
    """Consecutive steps in which a served scorer scored none of its rows (over all
    processes); :meth:`note` raises a one-line RuntimeError at ``limit`` (0: never)."""

    def __init__(self, key: str, limit: int):
        self.key, self.limit, self.run = key, int(limit), 0

    def note(self, ok_rows: int, rows: int, reasons: str = "") -> None:
        if rows == 0:
            return
        self.run = self.run + 1 if ok_rows == 0 else 0
        if self.limit and self.run >= self.limit:
            raise RuntimeError(f"config key {self.key}: the served scorer failed every row for {self.run} "
                               f"consecutive steps ({reasons or 'no reply'}); check the server, or raise "
                               f"rl.served.max_failed_steps (0 = never stop)")
