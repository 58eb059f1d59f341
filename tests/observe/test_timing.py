"""The client's timings against a real streaming server that follows a script.

The server (``streaming_server.py``, a child process) writes token ``k`` at its receive time +
``first_s + k × gap_s`` and records when it received the request and wrote each chunk, on the
same monotonic clock as the client. The client under test must time every chunk within 1 ms of
the moment the server wrote it: TTFT, every inter-token gap and E2E. Requests are spaced so that
they do not overlap: one request's chunk handling never delays another's timestamp.
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("httpx")

from servesim.observe import Observer, ObserveSettings, PromptBuilder  # noqa: E402
from servesim.workloads.base import RequestSpec  # noqa: E402
from tests.observe.streaming_server import StreamingServer  # noqa: E402

TOLERANCE_NS = 1_000_000
FIRST_S, GAP_S, TOKENS = 0.006, 0.003, 6


def _observe(url: str, specs: list[RequestSpec], **settings) -> object:
    settings.setdefault("warmup", 1)  # opens the connection the measured requests reuse
    return asyncio.run(
        Observer(ObserveSettings(url=url, model="m", **settings), PromptBuilder()).run(specs)
    )


def _deviations(observation, served) -> list[int]:
    """|client − server| in ns for every TTFT, gap and E2E; asserts what must hold exactly."""
    out_of = []
    assert [o.status for o in observation.outcomes] == ["ok"] * len(served)
    for out, did in zip(observation.outcomes, served):
        written = did["written_ns"]
        assert len(out.chunk_ns) == len(written) == TOKENS
        assert out.send_ns <= did["received_ns"]  # the request left before the server read it
        # the server played its script, never early (a busy machine may wake it late: hence the
        # client is held to what the server did, recorded on the same clock)
        script = [did["received_ns"] + int((FIRST_S + k * GAP_S) * 1e9) for k in range(TOKENS)]
        assert all(at >= due for at, due in zip(written, script))
        assert out.prompt_tokens == 24 + 1  # the server's count: 24 words + its BOS
        assert out.output_tokens == TOKENS and out.finish_reason == "length"
        assert len(out.gaps_ns()) == TOKENS - 1
        out_of.append(abs(out.ttft_ns - (written[0] - out.send_ns)))
        server_gaps = [b - a for a, b in zip(written, written[1:])]
        out_of.extend(abs(mine - theirs) for mine, theirs in zip(out.gaps_ns(), server_gaps))
        out_of.append(abs(out.e2e_ns - (written[-1] - out.send_ns)))
        out_of.extend(abs(c - w) for c, w in zip(out.chunk_ns, written))
    return out_of


def test_ttft_every_gap_and_e2e_are_within_1_ms_of_what_the_server_did():
    # A timestamp taken in the wrong place (after parsing, at the stream's end) is off in every
    # attempt; a busy shared machine that leaves the client unscheduled for a few ms is off in
    # some. So the exchange (two requests) is tried up to six times and one attempt must have
    # every TTFT, gap and E2E within 1 ms; the median over all attempts must be well within.
    specs = [RequestSpec(i, i * 40_000, 24, TOKENS) for i in range(2)]  # 40 ms apart, 21 ms each
    worst: list[int] = []
    every: list[int] = []
    with StreamingServer({"first_s": FIRST_S, "gap_s": GAP_S}) as server:
        for _ in range(6):
            before = len(server.served())
            observation = _observe(server.url, specs)
            served = server.served()[before + 1 :]  # after the warm-up request
            deviations = _deviations(observation, served)
            every.extend(deviations)
            worst.append(max(deviations))
            if worst[-1] < TOLERANCE_NS:
                break
    assert min(worst) < TOLERANCE_NS, f"worst deviation per attempt (ns): {worst}"
    assert sorted(every)[len(every) // 2] < TOLERANCE_NS // 2


def test_a_chunk_of_several_tokens_is_one_gap_and_the_usage_count_is_kept():
    specs = [RequestSpec(0, 0, 8, 6)]
    script = {"first_s": 0.002, "gap_s": 0.002, "requests": {"1": {"tokens_per_chunk": 2,
                                                                     "delays_s": [0.002] * 3}}}  # fmt: skip
    with StreamingServer(script) as server:
        observation = _observe(server.url, specs)
    out = observation.outcomes[0]
    assert out.ok
    assert len(out.chunk_ns) == 3 and len(out.gaps_ns()) == 2
    assert out.tokens_out() == 6  # the server's usage, not the chunk count


def test_without_usage_the_output_is_one_token_per_chunk_and_the_prompt_unknown():
    specs = [RequestSpec(0, 0, 8, 3)]
    with StreamingServer({"first_s": 0.001, "gap_s": 0.001}) as server:
        observation = _observe(server.url, specs, usage=False, warmup=0)
        body = server.served()[0]["body"]
    out = observation.outcomes[0]
    assert "stream_options" not in body
    assert out.ok and out.prompt_tokens is None and out.tokens_out() == 3
