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
from typing import Any, Mapping, Sequence

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


class _Retryable(Exception):
    def __init__(self, reason: str, retry_after: float | None = None):
        super().__init__(reason)
        self.reason, self.retry_after = reason, retry_after


class _Fatal(Exception):
    def __init__(self, reason: str, detail: str = ""):
        super().__init__(reason)
        self.reason, self.detail = reason, detail


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
    by default: lossless, so the server sees exactly these pixels)."""
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
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def _count(self, reason: str) -> None:
        with self._lock:
            self.counts[reason] += 1

    def _request(self, request: Mapping[str, Any]) -> ChatResult:
        body = {"model": self.model, **self.defaults, **request}
        data = json.dumps(body).encode("utf-8")
        result = ChatResult(text=None)
        t0 = time.monotonic()
        for attempt in range(self.retries + 1):
            result.attempts = attempt + 1
            try:
                text, finish, usage = self._post(data)
            except _Retryable as e:
                self._count(e.reason)
                result.errors.append(e.reason)
                result.error = e.reason
                if attempt < self.retries:
                    time.sleep(self._delay(attempt, e.retry_after))
                continue
            except _Fatal as e:
                self._count(e.reason)
                result.errors.append(e.reason)
                result.error = f"{e.reason}: {e.detail}" if e.detail else e.reason
                break
            self._count("ok")
            result.text, result.error, result.finish_reason, result.usage = text, None, finish, usage
            break
        if result.text is None:
            self._count("failed")
        result.seconds = time.monotonic() - t0
        return result

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, self.max_backoff)
        with self._lock:
            jitter = 0.5 + 0.5 * self._rng.random()
        return min(self.backoff * (2 ** attempt) * jitter, self.max_backoff)

    def _post(self, data: bytes) -> tuple[str, str | None, dict | None]:
        req = urllib.request.Request(self.url, data=data, headers=self._headers(), method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            code = e.code
            detail = e.read()[:300].decode("utf-8", "replace") if e.fp is not None else ""
            if code in RETRIED_HTTP or code >= 500:
                retry_after = e.headers.get("Retry-After") if e.headers else None
                raise _Retryable(f"http_{code}", _seconds(retry_after)) from None
            raise _Fatal(f"http_{code}", detail) from None
        except (socket.timeout, TimeoutError):
            raise _Retryable("timeout") from None
        except urllib.error.URLError as e:
            if isinstance(e.reason, (socket.timeout, TimeoutError)):
                raise _Retryable("timeout") from None
            raise _Retryable("connection") from None
        except (ConnectionError, OSError):
            raise _Retryable("connection") from None
        try:
            reply = json.loads(raw)
            choice = reply["choices"][0]
            text = choice["message"]["content"]
            if not isinstance(text, str):
                raise TypeError("content is not a string")
        except (ValueError, KeyError, IndexError, TypeError):
            raise _Retryable("malformed") from None
        return text, choice.get("finish_reason"), reply.get("usage")


def _seconds(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None
