"""One streamed request to an OpenAI-compatible server, timed chunk by chunk.

The request is ``POST /v1/completions`` (or ``/v1/chat/completions``) with ``stream: true``,
``max_tokens`` set to the target output length, ``ignore_eos: true`` (vLLM and SGLang honour it,
so the server generates exactly the target; turn it off for servers that refuse the field) and
``stream_options: {include_usage: true}``, so the last event carries the server's own token counts.

Timing: ``time.perf_counter_ns`` when the request's first bytes start onto the wire (send: the
HTTP library's ``send_request_headers.started`` trace event, so neither its own ~1 ms of Python
work before that nor opening a new connection counts as server time; the moment the request was
handed to it is kept as ``issued_ns``), at each server-sent event that carries text (chunk), and
when the stream ends. TTFT is first text chunk − send; E2E is last text chunk − send (the simulator's completion is its last token; the
end of the stream, a moment later with the usage event, is kept as ``end_ns``). Each gap between
consecutive text chunks is one inter-token gap. A server may pack several tokens into one chunk
(speculative decoding, a stream interval): then the gap is recorded once per chunk, as vLLM's own
benchmark records ITL, ``num_chunks`` is below the token count, and TPOT, (E2E − TTFT) / (tokens −
1), stays exact.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from servesim.workloads.base import RequestSpec

OK, ERROR, INCOMPLETE, TIMEOUT = "ok", "error", "incomplete", "timeout"
"""Per-request status: finished; refused or failed by the server; stream cut before its end
(dropped connection, interruption); no answer within ``--timeout``."""


class Outcome:
    """What happened to one request: its times (perf_counter ns), token counts and status."""

    __slots__ = (
        "spec",
        "index",
        "scheduled_ns",
        "issued_ns",
        "send_ns",
        "chunk_ns",
        "end_ns",
        "prompt_tokens",
        "output_tokens",
        "status",
        "error",
        "finish_reason",
    )

    def __init__(self, spec: RequestSpec, index: int, scheduled_ns: int):
        self.spec = spec
        self.index = index
        self.scheduled_ns = scheduled_ns
        self.issued_ns = 0  # handed to the HTTP client
        self.send_ns = 0  # its first bytes started onto the wire
        self.chunk_ns: list[int] = []
        self.end_ns = 0
        self.prompt_tokens: int | None = None  # the server's usage.prompt_tokens
        self.output_tokens: int | None = None  # the server's usage.completion_tokens
        self.status = INCOMPLETE
        self.error = ""
        self.finish_reason = ""

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def ttft_ns(self) -> int | None:
        return self.chunk_ns[0] - self.send_ns if self.chunk_ns else None

    @property
    def e2e_ns(self) -> int | None:
        return self.chunk_ns[-1] - self.send_ns if self.chunk_ns else None

    def gaps_ns(self) -> list[int]:
        """Every gap between consecutive text chunks."""
        c = self.chunk_ns
        return [c[i] - c[i - 1] for i in range(1, len(c))]

    def tokens_out(self) -> int:
        """Output tokens: the server's count when it gave one, else one per text chunk."""
        return self.output_tokens if self.output_tokens is not None else len(self.chunk_ns)

    def fail(self, status: str, error: str) -> None:
        self.status = status
        self.error = error.replace("\n", " ").strip()[:300]


def endpoint(url: str, chat: bool) -> str:
    """The completions endpoint for ``url``: a base (``http://host:8000``), a ``/v1`` base, or
    the full endpoint path."""
    base = url.rstrip("/")
    if base.endswith("/completions"):
        return base
    if not base.endswith("/v1"):
        base += "/v1"
    return base + ("/chat/completions" if chat else "/completions")


def models_url(url: str) -> str:
    """The ``/v1/models`` listing beside the completions endpoint of ``url``."""
    base = endpoint(url, False).removesuffix("/completions")
    return base + "/models"


def payload(
    model: str,
    prompt: str,
    max_tokens: int,
    *,
    chat: bool,
    ignore_eos: bool,
    usage: bool,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON body of one streamed request."""
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "stream": True}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if ignore_eos:
        body["ignore_eos"] = True
    if usage:
        body["stream_options"] = {"include_usage": True}
    if extra:
        body.update(extra)
    return body


async def stream_request(
    client: Any, url: str, body: dict[str, Any], headers: dict[str, str], out: Outcome
) -> None:
    """Send ``body`` to ``url`` and record the stream into ``out``; never raises for a server
    or network failure (it is recorded), only for cancellation (after recording it)."""
    import httpx

    perf = time.perf_counter_ns
    done = False

    async def trace(event: str, info: Any) -> None:
        if event.endswith("send_request_headers.started"):
            out.send_ns = perf()

    out.issued_ns = out.send_ns = perf()
    try:
        async with client.stream(
            "POST", url, json=body, headers=headers, extensions={"trace": trace}
        ) as response:
            if response.status_code >= 400:
                text = (await response.aread()).decode("utf-8", "replace")
                out.end_ns = perf()
                out.fail(ERROR, f"HTTP {response.status_code}: {_error_text(text)}")
                return
            async for line in response.aiter_lines():
                now = perf()
                if not line.startswith("data:"):
                    continue  # blank separators, comments, event: lines
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                if _event(data, now, out):
                    return  # the server reported an error inside the stream
        out.end_ns = perf()
    except httpx.TimeoutException as exc:
        out.end_ns = perf()
        out.fail(TIMEOUT, f"no answer in time ({type(exc).__name__})")
        return
    except httpx.HTTPError as exc:
        out.end_ns = perf()
        out.fail(INCOMPLETE if out.chunk_ns else ERROR, f"{type(exc).__name__}: {exc}")
        return
    except asyncio.CancelledError:
        out.end_ns = perf()
        out.fail(INCOMPLETE, "interrupted before the stream ended")
        raise
    if not done and not out.finish_reason:
        out.fail(INCOMPLETE, "the stream ended before [DONE] and without a finish_reason")
    elif not out.chunk_ns:
        out.fail(ERROR, "the stream carried no text")
    else:
        out.status = OK


def _event(data: str, now: int, out: Outcome) -> bool:
    """Record one ``data:`` event; True when it reports an error (recorded in ``out``)."""
    try:
        event = json.loads(data)
    except ValueError:
        out.end_ns = now
        out.fail(ERROR, f"an event is not JSON: {data[:80]}")
        return True
    if not isinstance(event, dict):
        return False
    if "error" in event:
        out.end_ns = now
        out.fail(ERROR, "the server reported " + _error_text(json.dumps(event["error"])))
        return True
    for choice in event.get("choices") or ():
        text = choice.get("text")
        if text is None:
            text = (choice.get("delta") or {}).get("content")
        if text:
            out.chunk_ns.append(now)
        if choice.get("finish_reason"):
            out.finish_reason = str(choice["finish_reason"])
        break  # one prompt per request: only choice 0
    usage = event.get("usage")
    if isinstance(usage, dict):
        if isinstance(usage.get("prompt_tokens"), int):
            out.prompt_tokens = usage["prompt_tokens"]
        if isinstance(usage.get("completion_tokens"), int):
            out.output_tokens = usage["completion_tokens"]
    return False


def _error_text(text: str) -> str:
    """The message of an OpenAI-style error body, else the body itself (short)."""
    try:
        data = json.loads(text)
    except ValueError:
        return text.strip()[:200]
    if isinstance(data, dict):
        inner = data.get("error", data)
        if isinstance(inner, dict) and "message" in inner:
            return str(inner["message"])[:200]
        if "message" in data:
            return str(data["message"])[:200]
    return text.strip()[:200]
