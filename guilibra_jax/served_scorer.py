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

Image rows (every GUI prompt holds a screenshot; the completions API takes token ids only)
go through the chat API (same commit: ``vllm/entrypoints/openai/chat_completion/protocol.py``,
``ChatCompletionRequest`` / ``ChatCompletionResponse``, which ``serving.py`` fills), one
request per row to ``<url>/chat/completions``:

    {"model": M, "messages": [{"role": "system", "content": "<system text>"},
                              {"role": "user", "content": [{"type": "image_url", "image_url":
                                   {"url": "data:image/png;base64,..."}}, {"type": "text", "text": "..."}]},
                              {"role": "assistant", "content": "<generation prefix><response text>"}],
     "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0, "return_token_ids": true,
     "add_generation_prompt": false, "continue_final_message": true, "add_special_tokens": false,
     "mm_processor_kwargs": {"min_pixels": lo, "max_pixels": hi}}

The messages are our prompt's own turns, decoded from its token ids (each vision block an
``image_url`` part, text around it as text parts), the last one the open assistant turn:
the prompt's generation prefix (``<think>\\n`` for Thinking templates) + the response's text
(its stop token included), continued, not closed. The screenshot is rebuilt exactly from
our pixel patches (:func:`data.images.patches_to_image`), i.e. already resized within the
row's platform bounds ``data.min_pixels`` / ``data.max_pixels`` / ``data.pixels``, which
``mm_processor_kwargs`` passes on (a Qwen-VL processor given them leaves that size as it is;
one that takes its bounds otherwise, e.g. a ``size`` of shortest / longest edge, must be
served with bounds that admit our sizes: the token check below tells).
The reply carries ``prompt_logprobs`` and ``prompt_token_ids`` at its top level; the server's
ids must equal our prompt + response ids, image pads expanded per image grid included:

* a difference in the prompt's turns before the assistant's (up to its ``<|im_start|>``:
  the server's chat template renders other text, or its image processor expands the
  screenshot to other tokens) is a one-line ConfigError naming the key and the first
  differing position: serve the policy's chat template and keep our pixel bounds;
* a difference after that is our assistant text (generation prefix + response) tokenized
  or rendered otherwise (the sampler may emit a split of its text the tokenizer never
  makes, e.g. ``i n`` for ``in``; a template may rewrite the turn): not the server's error.
  Such rows carry no KL term and are counted (``served/<label>/retokenized``, within
  ``dropped_rows``). Rows our own tokenizer already finds non-canonical (the assistant turn
  re-encoded from its ``<|im_start|>``) are not sent.

Limits:
* one chat request per image row (a conversation each): the G rows of a group send their
  prompt's screenshot G times (encoded once here; vLLM's multi-modal cache processes it
  once), and ``rl.served.rows_per_request`` batches text rows only.
* image rows are rendered by the server's own chat template (no ``chat_template`` is sent:
  vLLM may refuse request templates): it must render our turns as our prompt code does
  (the model's template, as ``data.prompts`` reproduces it). A Thinking template rewrites
  the final assistant turn's think block (``<think>\\n`` + reasoning stripped of newlines +
  ``\\n</think>\\n\\n``; an empty block before a response cut short inside its
  reasoning): rows whose text differs from that form come back retokenized. A template
  that cannot continue the turn answers an HTTP error (the row is dropped, counted as a
  failed request).
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
import dataclasses
import json
import random
import re
import threading
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

import numpy as np

from guilibra_jax import chat_endpoint as CE
from guilibra_jax.data import images as I
from guilibra_jax.data import prompts as P
from guilibra_jax.errors import ConfigError

SCHEMES = ("http", "https")
RETOKENIZED = "retokenized"    # a row whose response the server's tokenizer makes other tokens of (no KL)


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


def chat_url(completions: str) -> str:
    return completions[: -len("/completions")] + "/chat/completions"


def request_body(model: str, seqs: Sequence[Sequence[int]]) -> dict:
    """The completions request scoring ``seqs`` (token ids) in one call (module doc)."""
    return {"model": model, "prompt": [[int(t) for t in s] for s in seqs], "max_tokens": 1, "temperature": 0.0,
            "prompt_logprobs": 0, "return_token_ids": True, "add_special_tokens": False}


def chat_request_body(model: str, messages: list, min_pixels: int, max_pixels: int) -> dict:
    """The chat completions request scoring one image row (module doc): the final assistant
    turn continued, not closed; the server's image processor given our pixel bounds."""
    return {"model": model, "messages": messages, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0,
            "return_token_ids": True, "add_generation_prompt": False, "continue_final_message": True,
            "add_special_tokens": False,
            "mm_processor_kwargs": {"min_pixels": int(min_pixels), "max_pixels": int(max_pixels)}}


# ----------------------------------------------------------------------------- image rows as chat messages
_TURN_RE = re.compile(r"<\|im_start\|>(\w+)\n(.*?)<\|im_end\|>\n", re.DOTALL)
_VISION_RE = re.compile(r"<\|vision_start\|>(?:<\|image_pad\|>)+<\|vision_end\|>")


def chat_messages(prompt_text: str, response_text: str, images: Sequence) -> list[dict]:
    """The chat messages whose rendering by a Qwen chat template, final assistant turn left
    open, is ``prompt_text + response_text``: each ``<|im_start|>role\\n...<|im_end|>\\n``
    turn of the prompt (a string, or text and ``image_url`` parts where it holds vision
    blocks: ``images`` in order, anything ``chat_endpoint.image_part`` takes), then the
    assistant turn: the prompt's generation prefix + the response. ValueError for a prompt
    of another layout."""
    i = prompt_text.rfind(P.ASSISTANT_START)
    if i < 0:
        raise ValueError("the prompt does not end with an open assistant turn")
    head, messages, pos, images, n = prompt_text[:i], [], 0, list(images), len(images)
    for m in _TURN_RE.finditer(head):
        if m.start() != pos:
            break
        pos = m.end()
        messages.append({"role": m.group(1), "content": _content(m.group(2), images)})
    if pos != len(head) or not messages:
        raise ValueError(f"the prompt is not a sequence of chat turns (at character {pos})")
    if images:
        raise ValueError(f"{n} images but {n - len(images)} vision blocks in the prompt")
    return messages + [{"role": "assistant", "content": prompt_text[i + len(P.ASSISTANT_START):] + response_text}]


def _content(text: str, images: list):
    """A turn's content: the text itself, or its parts around its vision blocks (consumes ``images``)."""
    parts, last = [], 0
    for m in _VISION_RE.finditer(text):
        if not images:
            raise ValueError("more vision blocks than images in the prompt")
        parts += ([CE.text_part(text[last:m.start()])] if m.start() > last else []) + [CE.image_part(images.pop(0))]
        last = m.end()
    if not parts:
        return text
    return parts + ([CE.text_part(text[last:])] if last < len(text) else [])


def assistant_turn(tokenizer, prompt_ids: Sequence[int]) -> int:
    """The position of the prompt's last ``<|im_start|>``: the open assistant turn (0 if none)."""
    start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    return max((j for j, t in enumerate(prompt_ids) if int(t) == start), default=0)


def canonical(tokenizer, prompt_ids: Sequence[int], response_ids: Sequence[int]) -> bool:
    """Whether ``response_ids`` are the tokens ``tokenizer`` makes of their text after the
    prompt (the assistant turn re-encoded from its ``<|im_start|>``: what a server that
    renders the text tokenizes). A sampler may emit other splits of the same text."""
    ids = [int(t) for t in prompt_ids[assistant_turn(tokenizer, prompt_ids):]] + [int(t) for t in response_ids]
    text = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) == ids


@dataclasses.dataclass
class ChatRow:
    """One image row's chat request: messages, our tokens (prompt + response), how many of
    them the server must render exactly (the turns before the assistant's, its
    ``<|im_start|>`` included: a difference there is a ConfigError; after it, our assistant
    text rendered otherwise: the row is retokenized), and the screenshot's pixel bounds."""

    messages: list
    seq: list
    n_prompt: int
    n_fixed: int
    min_pixels: int
    max_pixels: int


def screenshot_url(pixels: np.ndarray, grid: Sequence[int], image_cfg: I.ImageProcessorConfig) -> str:
    """The PNG data URL of the image our pixel patches hold, exactly as resized here."""
    return CE.image_data_url(I.patches_to_image(pixels, grid, image_cfg))


def chat_row(tokenizer, prompt_ids: Sequence[int], response_ids: Sequence[int], images: Sequence,
             image_cfg: I.ImageProcessorConfig) -> ChatRow | str:
    """The :class:`ChatRow` of a row whose prompt holds ``images`` (:func:`screenshot_url`),
    resized within ``image_cfg``'s pixel bounds, or :data:`RETOKENIZED` when its response is
    not the canonical tokenization of its text (the server would score other tokens).
    ValueError for a prompt that is no chat of turns."""
    if not canonical(tokenizer, prompt_ids, response_ids):
        return RETOKENIZED
    decode = lambda ids: tokenizer.decode([int(t) for t in ids], skip_special_tokens=False,
                                          clean_up_tokenization_spaces=False)
    seq = [int(t) for t in prompt_ids] + [int(t) for t in response_ids]
    return ChatRow(chat_messages(decode(prompt_ids), decode(response_ids), images), seq, len(prompt_ids),
                   assistant_turn(tokenizer, prompt_ids) + 1, image_cfg.min_pixels, image_cfg.max_pixels)


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


def scored_logprobs(seq: Sequence[int], n_prompt: int, theirs, lps) -> np.ndarray:
    """The response tokens' log-probs [len(seq) - n_prompt] (float32) from one sequence's
    ``prompt_token_ids`` (``theirs``, None: not returned) and ``prompt_logprobs``; raises
    :class:`Mismatch` (row 0) where the server's tokens differ from ``seq``."""
    if theirs is not None and (j := first_difference(seq, theirs)) is not None:
        raise Mismatch(0, j, _at(seq, j), _at(theirs, j))
    if len(lps) != len(seq):
        j = min(len(lps), len(seq))
        raise Mismatch(0, j, _at(seq, j), f"{len(lps)} scored tokens")
    row = np.empty(len(seq) - n_prompt, np.float32)
    for j in range(1, len(seq)):     # every scored position holds our token (prompt included)
        entry = lps[j]
        got = entry.get(str(int(seq[j]))) if isinstance(entry, dict) else None
        if got is None:
            raise Mismatch(0, j, int(seq[j]), sorted(entry) if isinstance(entry, dict) else entry)
        if j >= n_prompt:
            row[j - n_prompt] = float(got["logprob"] if isinstance(got, dict) else got)
    return row


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
            try:
                out.append(scored_logprobs(seq, p, choice.get("prompt_token_ids"), choice["prompt_logprobs"]))
            except Mismatch as m:
                raise Mismatch(i, m.pos, m.ours, m.theirs) from None
        return out
    except Mismatch:
        raise
    except (KeyError, IndexError, TypeError, ValueError, AttributeError):
        raise CE.Retryable("malformed") from None


def parse_chat_reply(reply, seq: Sequence[int], n_prompt: int) -> np.ndarray:
    """:func:`parse_reply` of a chat completions reply (one sequence; ``prompt_logprobs``
    and ``prompt_token_ids`` at the reply's top level)."""
    try:
        return scored_logprobs(seq, n_prompt, reply.get("prompt_token_ids"), reply["prompt_logprobs"])
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
        self.chat = chat_url(self.completions)
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
        stop = threading.Event()   # set by a ConfigError: the requests not yet sent are not sent
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(parts))) as pool:
            results = list(pool.map(lambda part: self._request(*part, stop=stop), parts))
        return [row for rows in results for row in rows]

    def score_chat(self, rows: Sequence[ChatRow]) -> list:
        """Per image row (:func:`chat_row`), one chat request each, concurrently: its response
        tokens' log-probs, None when every attempt failed, or :data:`RETOKENIZED` when the
        server's tokens differ from ours after the prompt (counted; a difference inside the
        prompt is a ConfigError)."""
        if not rows:
            return []
        if self.model() is None:
            self._count("failed_requests")
            return [None] * len(rows)
        stop = threading.Event()   # set by a ConfigError: the requests not yet sent are not sent
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(rows))) as pool:
            return list(pool.map(lambda row, i: self._chat_request(row, i, stop), rows, range(len(rows))))

    # ------------------------------------------------------------------ internals
    def _chat_request(self, row: ChatRow, i: int, stop: threading.Event):
        if stop.is_set():         # an earlier row's ConfigError ends the call; its result is never read
            return None
        data = json.dumps(chat_request_body(self._model, row.messages, row.min_pixels, row.max_pixels)).encode()
        send = lambda: parse_chat_reply(CE.post_json(self.chat, data, self._headers(), self.timeout), row.seq,
                                        row.n_prompt)
        try:
            value, _, _, _ = CE.with_retries(send, self.retries, self._delay, self._count)
        except Mismatch as m:
            if m.pos >= row.n_fixed:      # our assistant text, rendered / tokenized otherwise: no KL on the row
                self._count(RETOKENIZED)
                return RETOKENIZED
            stop.set()
            raise ConfigError(f"config key {self.key} = {self.url!r}: the server's chat prompt differs from ours "
                              f"(image row {i}, first difference at position {m.pos} of {row.n_prompt} prompt "
                              f"tokens: ours {m.ours}, the server's {m.theirs}); serve the policy's chat template "
                              f"and an image processor that keeps our min/max pixels") from None
        if value is None:
            self._count("failed_requests")
        return value

    def _request(self, seqs, n_prompt, first_row, stop: threading.Event) -> list:
        if stop.is_set():         # an earlier request's ConfigError ends the call; its result is never read
            return [None] * len(seqs)
        data = json.dumps(request_body(self._model, seqs)).encode("utf-8")
        send = lambda: parse_reply(CE.post_json(self.completions, data, self._headers(), self.timeout), seqs, n_prompt)
        try:
            value, _, _, _ = CE.with_retries(send, self.retries, self._delay, self._count)
        except Mismatch as m:
            stop.set()
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
        return CE.json_headers(self.api_key)

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
