"""A client for any OpenAI-compatible chat endpoint (vLLM ``serve``, SGLang, a hosted
model): many chat requests at once, with timeouts, retries with backoff, and every
failure counted by reason, never raised. Standard library only.

    ep = ChatEndpoint("http://localhost:8000/v1", model="runs/demo/export", concurrency=16)
    results = ep.chat_many([{"messages": [{"role": "user", "content": [image_part(img), text_part("hi")]}],
                             "max_tokens": 64}])
    results[0].text, results[0].error, ep.counts      # "...", None, Counter({"ok": 1})

Used by the ``endpoint`` evaluation agent (:mod:`guilibra_jax.eval.endpoint_agent`)
and meant for any caller that needs many completions (e.g. generating reasoning for
data curation). ``url`` is the API base (``.../v1``) or the full
``.../chat/completions`` address.

Retried (up to ``retries`` more attempts, sleeping ``backoff * 2**k`` seconds with
jitter, capped at ``max_backoff``; a 429 or 503's ``Retry-After`` is honoured): timeouts,
connection errors, HTTP 408 / 409 / 429 / 5xx, and malformed replies (not JSON, or no
``choices[0].message.content``). Other HTTP 4xx are the request's fault and are not
retried. Reasons counted in :attr:`ChatEndpoint.counts`: ``ok``, ``timeout``,
``connection``, ``http_<code>``, ``malformed``; ``failed`` counts requests that
ended without a text.
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import io
import json
import random
import socket
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping, Sequence

RETRIED_HTTP = {408, 409, 429}


@dataclasses.dataclass
class ChatResult:
    """One request's outcome: ``text`` (None when every attempt failed), the last
    ``error`` reason (None on success), the reason of each failed attempt, attempts
    made, wall seconds, and the reply's ``usage`` / ``finish_reason`` when given."""

    text: str | None
    error: str | None = None
    errors: list[str] = dataclasses.field(default_factory=list)
    attempts: int = 0
    seconds: float = 0.0
    finish_reason: str | None = None
    usage: dict | None = None

    @property
    def ok(self) -> bool:
        return self.text is not None


class Retryable(Exception):
    """A failed attempt worth retrying; ``reason`` is what gets counted."""

    def __init__(self, reason: str, retry_after: float | None = None):
        super().__init__(reason)
        self.reason, self.retry_after = reason, retry_after


class Fatal(Exception):
    """A failed attempt that retrying cannot fix (the request's fault)."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(reason)
        self.reason, self.detail = reason, detail


def json_headers(api_key: str = "") -> dict[str, str]:
    """A JSON request's headers, with ``Authorization: Bearer`` when ``api_key`` is set."""
    h = {"Content-Type": "application/json"}
    if api_key:
        h["Authorization"] = f"Bearer {api_key}"
    return h


def completions_url(url: str) -> str:
    url = url.rstrip("/")
    return url if url.endswith("/chat/completions") else url + "/chat/completions"


def models_url(url: str) -> str:
    url = url.rstrip("/")
    if url.endswith("/chat/completions"):
        url = url[: -len("/chat/completions")]
    return url + "/models"


def image_data_url(image: Any, fmt: str = "PNG") -> str:
    """A ``data:`` URL of a PIL image, an [H, W, 3] uint8 array, or encoded bytes (PNG
    by default: lossless, so the server sees exactly these pixels); a ``data:`` URL as is."""
    if isinstance(image, str) and image.startswith("data:"):
        return image
    if isinstance(image, (bytes, bytearray)):
        data, mime = bytes(image), "image/png" if bytes(image[:8]) == b"\x89PNG\r\n\x1a\n" else "image/jpeg"
    else:
        from PIL import Image
        if not isinstance(image, Image.Image):
            image = Image.fromarray(image)
        buf = io.BytesIO()
        image.save(buf, format=fmt)
        data, mime = buf.getvalue(), f"image/{fmt.lower()}"
    return f"data:{mime};base64," + base64.b64encode(data).decode("ascii")


def image_part(image: Any) -> dict:
    return {"type": "image_url", "image_url": {"url": image_data_url(image)}}


def text_part(text: str) -> dict:
    return {"type": "text", "text": text}


class ChatEndpoint:
    """Chat completions against ``url`` (module docstring). Thread-safe; ``chat_many``
    runs up to ``concurrency`` requests at a time and keeps the input order."""

    def __init__(self, url: str, model: str = "", api_key: str = "", *, timeout: float = 60.0, retries: int = 3,
                 backoff: float = 1.0, max_backoff: float = 30.0, concurrency: int = 8,
                 defaults: Mapping[str, Any] | None = None, seed: int = 0):
        if not url:
            raise ValueError("ChatEndpoint: url is empty (e.g. http://localhost:8000/v1)")
        if timeout <= 0 or retries < 0 or backoff < 0 or concurrency < 1:
            raise ValueError(f"ChatEndpoint: need timeout > 0, retries >= 0, backoff >= 0, concurrency >= 1; got "
                             f"{timeout}, {retries}, {backoff}, {concurrency}")
        self.url, self.api_key = completions_url(url), api_key
        self._model = model
        self.timeout, self.retries, self.backoff, self.max_backoff = timeout, retries, backoff, max_backoff
        self.concurrency = int(concurrency)
        self.defaults = dict(defaults or {})
        self.counts: collections.Counter = collections.Counter()
        self._lock = threading.Lock()
        self._rng = random.Random(seed)
        self._base = url

    # ------------------------------------------------------------------ public
    @property
    def model(self) -> str:
        """The model name sent; when not given, the first model the server lists."""
        if not self._model:
            self._model = self.list_models()[0]
        return self._model

    def list_models(self) -> list[str]:
        req = urllib.request.Request(models_url(self._base), headers=self._headers(), method="GET")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                ids = [m["id"] for m in json.loads(resp.read())["data"]]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ConnectionError(f"cannot list models at {models_url(self._base)} ({type(e).__name__}: {e}); "
                                  f"is the server up? Or give the model name") from None
        if not ids:
            raise ConnectionError(f"{models_url(self._base)} lists no model")
        return ids

    def chat(self, messages: Sequence[Mapping[str, Any]], **params) -> ChatResult:
        """One chat completion (``params``: temperature, max_tokens, ... over the defaults)."""
        return self._request({"messages": list(messages), **params})

    def chat_many(self, requests: Sequence[Mapping[str, Any]]) -> list[ChatResult]:
        """One result per request (each a dict with ``messages`` and any body keys), in order."""
        if not requests:
            return []
        self.model  # noqa: B018 - resolve the name once, before the threads start
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(requests))) as pool:
            return list(pool.map(self._request, requests))

    def summary(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)

    # ------------------------------------------------------------------ internals
    def _headers(self) -> dict[str, str]:
        return json_headers(self.api_key)

    def _count(self, reason: str) -> None:
        with self._lock:
            self.counts[reason] += 1

    def _request(self, request: Mapping[str, Any]) -> ChatResult:
        body = {"model": self.model, **self.defaults, **request}
        data = json.dumps(body).encode("utf-8")
        result = ChatResult(text=None)
        t0 = time.monotonic()
        out, result.errors, result.attempts, result.error = with_retries(
            lambda: _chat_reply(post_json(self.url, data, self._headers(), self.timeout)), self.retries,
            self._delay, self._count)
        if out is not None:
            result.text, result.finish_reason, result.usage = out
        else:
            self._count("failed")
        result.seconds = time.monotonic() - t0
        return result

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        with self._lock:
            return backoff_delay(attempt, retry_after, self.backoff, self.max_backoff, self._rng)


def backoff_delay(attempt: int, retry_after: float | None, backoff: float, max_backoff: float,
                  rng: random.Random) -> float:
    """Seconds before retry ``attempt + 1``: ``Retry-After`` when given, else
    ``backoff * 2**attempt`` with jitter in [0.5, 1); both capped at ``max_backoff``."""
    if retry_after is not None:
        return min(retry_after, max_backoff)
    return min(backoff * (2 ** attempt) * (0.5 + 0.5 * rng.random()), max_backoff)


def with_retries(send: Callable[[], Any], retries: int, delay: Callable[[int, float | None], float],
                 count: Callable[[str], None]) -> tuple[Any, list[str], int, str | None]:
    """(``send()``'s value or None, each failed attempt's reason, attempts made, the last
    error or None): ``send`` retried on :class:`Retryable` up to ``retries`` more times
    (sleeping ``delay(attempt, retry_after)``), not on :class:`Fatal`; every attempt's
    outcome counted (``count("ok")`` or its reason)."""
    errors: list[str] = []
    error = None
    for attempt in range(retries + 1):
        try:
            value = send()
        except Retryable as e:
            count(e.reason)
            errors.append(e.reason)
            error = e.reason
            if attempt < retries:
                time.sleep(delay(attempt, e.retry_after))
            continue
        except Fatal as e:
            count(e.reason)
            errors.append(e.reason)
            return None, errors, attempt + 1, f"{e.reason}: {e.detail}" if e.detail else e.reason
        count("ok")
        return value, errors, attempt + 1, None
    return None, errors, retries + 1, error


def post_json(url: str, data: bytes, headers: Mapping[str, str], timeout: float) -> Any:
    """The JSON reply of a POST of ``data``; raises :class:`Retryable` (timeouts,
    connection errors, HTTP 408 / 409 / 429 / 5xx, a reply that is not JSON) or
    :class:`Fatal` (other HTTP errors)."""
    req = urllib.request.Request(url, data=data, headers=dict(headers), method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as e:
        code = e.code
        detail = e.read()[:300].decode("utf-8", "replace") if e.fp is not None else ""
        if code in RETRIED_HTTP or code >= 500:
            retry_after = e.headers.get("Retry-After") if e.headers else None
            raise Retryable(f"http_{code}", _seconds(retry_after)) from None
        raise Fatal(f"http_{code}", detail) from None
    except (socket.timeout, TimeoutError):
        raise Retryable("timeout") from None
    except urllib.error.URLError as e:
        if isinstance(e.reason, (socket.timeout, TimeoutError)):
            raise Retryable("timeout") from None
        raise Retryable("connection") from None
    except (ConnectionError, OSError):
        raise Retryable("connection") from None
    try:
        return json.loads(raw)
    except ValueError:
        raise Retryable("malformed") from None


def _chat_reply(reply: Any) -> tuple[str, str | None, dict | None]:
    """(text, finish_reason, usage) of a chat completion; Retryable("malformed") without text."""
    try:
        choice = reply["choices"][0]
        text = choice["message"]["content"]
        if not isinstance(text, str):
            raise TypeError("content is not a string")
    except (KeyError, IndexError, TypeError):
        raise Retryable("malformed") from None
    return text, choice.get("finish_reason"), reply.get("usage")


def _seconds(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None
