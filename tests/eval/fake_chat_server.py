"""A local OpenAI-compatible chat server for tests (127.0.0.1, a free port, stops with
the test). Each request's behaviour is scripted by a keyword found in its text:
``server.script["KEY"] = ["slow", "500", "ok"]`` answers the first request holding KEY
slowly, the second with HTTP 500, then normally. Behaviours: ok, slow (waits
``slow_seconds`` then answers; ``slow_seconds=None``: answers only when the server
stops, so the client's timeout always comes first, however loaded the machine), together
(answers once ``together`` requests have been in flight at once: concurrency shown by the
server's counters, not by wall time), 500, 503, 429 (with Retry-After: 0), 400,
malformed (not JSON), empty (JSON without choices), drop (closes the connection).
``closing`` is set when the server stops (a ``reply_fn`` can wait on it to hang)."""
from __future__ import annotations

import contextlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeChatServer:
    def __init__(self, reply: str = "<answer>{}</answer>", slow_seconds: float | None = 1.0,
                 model: str = "fake-model", together: int = 0):
        self.reply, self.slow_seconds, self.model, self.together = reply, slow_seconds, model, together
        self.closing = threading.Event()
        self.script: dict[str, list[str]] = {}
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.reply_fn = None                       # optional: request body -> reply text
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.closing.set()   # held replies end now
        with self._changed:
            self._changed.notify_all()
        self.httpd.shutdown()
        self.httpd.server_close()

    def _behaviour(self, body: dict) -> str:
        text = json.dumps(body.get("messages", ""))
        with self._lock:
            for key, queue in self.script.items():
                if key in text and queue:
                    return queue.pop(0)
        return "ok"

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, code: int, payload: bytes, headers: dict | None = None):
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self._leave()
                self.end_headers()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.wfile.write(payload)

            def do_GET(self):
                if self.path.endswith("/models"):
                    self._send(200, json.dumps({"data": [{"id": server.model}]}).encode())
                else:
                    self._send(404, b"{}")

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server._lock:
                    server.requests.append(body)
                    server.headers.append(dict(self.headers))
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                    server._changed.notify_all()
                self._counted = True
                try:
                    self._answer(body, server._behaviour(body))
                finally:
                    self._leave()

            def _leave(self):
                # Leave the in-flight count BEFORE the client can see the answer: otherwise the
                # client's next request can arrive while this one still counts (a false overlap).
                if getattr(self, "_counted", False):
                    self._counted = False
                    with server._lock:
                        server.in_flight -= 1

            def _answer(self, body, behaviour):
                if behaviour == "slow":
                    server.closing.wait(server.slow_seconds)
                if behaviour == "together":
                    with server._changed:
                        server._changed.wait_for(lambda: server.max_in_flight >= server.together
                                                 or server.closing.is_set(), timeout=60)
                if behaviour in ("500", "503", "400"):
                    return self._send(int(behaviour), b'{"error": "scripted"}')
                if behaviour == "429":
                    return self._send(429, b'{"error": "busy"}', {"Retry-After": "0"})
                if behaviour == "malformed":
                    return self._send(200, b"<html>not json")
                if behaviour == "empty":
                    return self._send(200, json.dumps({"choices": []}).encode())
                if behaviour == "drop":
                    self.close_connection = True
                    self._leave()
                    with contextlib.suppress(OSError):
                        self.connection.shutdown(2)
                    return None
                text = server.reply_fn(body) if server.reply_fn else server.reply
                reply = {"id": "x", "object": "chat.completion", "model": body.get("model"),
                         "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                      "finish_reason": "stop"}],
                         "usage": {"prompt_tokens": 1, "completion_tokens": 1}}
                return self._send(200, json.dumps(reply).encode())

        return Handler
