"""A real local HTTP server that streams OpenAI-style SSE tokens with scripted delays.

``with StreamingServer(script) as server`` starts it in a child process (so that the client's
timing never waits for this server's Python threads to give up the interpreter lock), listening on
127.0.0.1 at a free port. It answers ``POST /v1/completions`` and ``/v1/chat/completions`` with
``Transfer-Encoding: chunked`` server-sent events, and records, per request, when it was received
and when each text chunk was written. The clock is ``time.perf_counter_ns``, CLOCK_MONOTONIC on
Linux, shared by every process, so a test compares the client's times with the server's directly
(``server.served()`` fetches them from ``GET /served``).

A script is data (JSON, passed to the child): ``first_s`` and ``gap_s`` (token ``k`` is written
at receive + first_s + k × gap_s, so late wake-ups do not accumulate; ``max_tokens`` tokens), and
``requests``: per request index, changes such as ``{"status": 500}``, ``{"drop_after": 2}`` (cut
the connection before token 2), ``{"error_after": 1}`` (an error event before token 1),
``{"delays_s": [...]}`` or ``{"tokens_per_chunk": 2}``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PROMPT_OVERHEAD = 1
"""Tokens the server adds to every prompt's word count in its usage (a BOS token)."""


def _plan(script: dict[str, Any], body: dict[str, Any], index: int) -> dict[str, Any]:
    """The answer to request ``index``: the script's defaults with its per-request changes."""
    plan = {"status": 200, "drop_after": None, "error_after": None, "tokens_per_chunk": 1}
    tokens = int(body["max_tokens"])
    plan["delays_s"] = [script.get("first_s", 0.001)] + [script.get("gap_s", 0.001)] * (tokens - 1)
    plan.update((script.get("requests") or {}).get(str(index), {}))
    return plan


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path == "/v1/models":
            data = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]})
        else:
            with self.server.lock:
                data = json.dumps(self.server.served)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data.encode())))
        self.end_headers()
        self.wfile.write(data.encode())

    def handle_one_request(self) -> None:
        """http.server's own, with the receive time taken when the request line arrives (before
        the headers are parsed, which takes http.server a fraction of a millisecond)."""
        self.raw_requestline = self.rfile.readline(65537)
        self.received_ns = time.perf_counter_ns()
        if not self.raw_requestline:
            self.close_connection = True
            return
        if not self.parse_request():
            return
        getattr(self, "do_" + self.command)()
        self.wfile.flush()

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        received = self.received_ns
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        written: list[int] = []
        with self.server.lock:
            index = len(self.server.served)
            self.server.served.append(
                {
                    "body": body,
                    "headers": dict(self.headers),
                    "received_ns": received,
                    "written_ns": written,
                }  # fmt: skip
            )
        plan = _plan(self.server.script, body, index)
        if plan["status"] != 200:
            data = json.dumps({"error": {"message": "scripted failure", "code": plan["status"]}})
            self.send_response(plan["status"])
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data.encode())
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        chat = "messages" in body
        due = received
        delays = plan["delays_s"]
        per_chunk = plan["tokens_per_chunk"]
        for k, delay in enumerate(delays):
            if k == plan["drop_after"]:
                self.close_connection = True
                self.wfile.flush()
                self.connection.shutdown(2)  # cut: no last chunk, no [DONE]
                return
            if k == plan["error_after"]:
                self._event({"error": {"message": "scripted stream error"}})
                self._end()
                return
            due += int(delay * 1e9)
            pause = (due - time.perf_counter_ns()) / 1e9
            if pause > 0:
                time.sleep(pause)
            text = " tok" * per_chunk
            finish = "length" if k == len(delays) - 1 else None
            if chat:
                choice = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text, "finish_reason": finish}
            data = b"data: " + json.dumps({"id": "x", "choices": [choice]}).encode() + b"\n\n"
            written.append(time.perf_counter_ns())
            self._chunk(data)
        prompt = body["messages"][0]["content"] if chat else body["prompt"]
        usage = {
            "prompt_tokens": len(prompt.split()) + PROMPT_OVERHEAD,
            "completion_tokens": len(delays) * per_chunk,
        }
        if (body.get("stream_options") or {}).get("include_usage"):
            self._event({"id": "x", "choices": [], "usage": usage})
        self._chunk(b"data: [DONE]\n\n")
        self._end()

    def _event(self, data: dict[str, Any]) -> None:
        self._chunk(b"data: " + json.dumps(data).encode() + b"\n\n")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _end(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Quiet when a client hangs up mid-answer (the interruption tests do it on purpose)."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)

    script: dict[str, Any]
    served: list[dict[str, Any]]
    lock: threading.Lock


class StreamingServer:
    """``with StreamingServer(script) as s:`` serves at ``s.url`` until the block ends."""

    def __init__(self, script: dict[str, Any] | None = None):
        self.script = script or {}
        self._child: subprocess.Popen[str] | None = None
        self.url = ""

    def served(self) -> list[dict[str, Any]]:
        """What the server did for each request so far, in the order received."""
        with urllib.request.urlopen(self.url + "/served", timeout=10) as answer:
            return json.loads(answer.read())

    def __enter__(self) -> StreamingServer:
        self._child = subprocess.Popen(
            [sys.executable, __file__, json.dumps(self.script)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._child.stdout is not None
        line = self._child.stdout.readline().strip()
        if not line.startswith("http://"):
            self._child.kill()
            raise RuntimeError(f"the streaming server did not start: {line!r}")
        self.url = line
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self._child is not None
        self._child.terminate()
        self._child.wait(timeout=10)
        if self._child.stdout is not None:
            self._child.stdout.close()


def _serve(script: dict[str, Any]) -> None:
    sys.setswitchinterval(1e-4)  # a woken handler thread runs at once, not after 5 ms
    server = _Server(("127.0.0.1", 0), _Handler)
    server.script = script
    server.served = []
    server.lock = threading.Lock()
    host, port = server.server_address[:2]
    print(f"http://{host}:{port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    _serve(json.loads(sys.argv[1]))
