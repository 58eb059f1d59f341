"""Offering the request stream to the server: open loop, closed loop, warm-up, calibration.

* **Open loop** (a rate, a trace or a workload spec): request *k* is due at ``t0 +
  arrival_us[k]`` whatever the server is doing; with ``max_concurrency`` a due request waits for a
  free slot (as vLLM's ``benchmark_serving --max-concurrency``), and both times are kept: the
  arrival it was due at and the moment it was sent.
* **Closed loop** (``max_concurrency`` alone): that many users each send their next request the
  moment their previous one ends; arrivals are the send times.

Measurement starts at ``t0``, after the warm-up requests (distinct prompts of the first requests'
sizes, no shared prefix, not recorded) have finished. ``duration_s`` stops sending new requests
that long after ``t0``; requests in flight then still finish. :meth:`Observer.stop` (Ctrl-C) stops
sending and cuts the requests in flight, which are recorded as ``incomplete``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
import time
from collections.abc import Sequence
from typing import Any

import attrs

from servesim.observe.client import Outcome, endpoint, models_url, payload, stream_request
from servesim.observe.prompts import PromptBuilder, fit_correction
from servesim.simcore.errors import ScenarioError
from servesim.workloads.base import RequestSpec

CALIBRATION_SIZES = (64, 256)
"""Prompt sizes (tokens as first built) of the calibration probes, two of each."""


@attrs.define(kw_only=True)
class ObserveSettings:
    """How to reach the server and how to offer it the requests."""

    url: str
    model: str
    chat: bool = False
    api_key: str | None = None
    ignore_eos: bool = True
    usage: bool = True
    max_concurrency: int | None = None
    closed_loop: bool = False
    warmup: int = 0
    duration_s: float | None = None
    timeout_s: float = 600.0
    calibrate: bool = False

    def check(self) -> None:
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ScenarioError("--max-concurrency", self.max_concurrency, "must be at least 1")
        if self.closed_loop and self.max_concurrency is None:
            raise ScenarioError("--max-concurrency", None, "a closed loop needs a concurrency")
        if self.warmup < 0:
            raise ScenarioError("--warmup", self.warmup, "must be 0 or more requests")
        if self.duration_s is not None and not (
            self.duration_s > 0 and math.isfinite(self.duration_s)
        ):
            raise ScenarioError(
                "--duration", self.duration_s, "must be a positive number of seconds"
            )
        if not self.timeout_s > 0:
            raise ScenarioError("--timeout", self.timeout_s, "must be a positive number of seconds")
        if not self.url.startswith(("http://", "https://")):
            raise ScenarioError("--url", self.url, "give an http:// or https:// address")


@attrs.define(kw_only=True)
class Observation:
    """The measured run: every recorded request (in send order) and how the run went."""

    outcomes: list[Outcome]
    t0_ns: int
    wall_start: float
    """time.time() at ``t0``."""
    planned: int
    stopped_by: str = ""
    """Why sending stopped early: "duration", "interrupted", or "" (every request sent)."""
    warmup_failed: int = 0
    calibration: dict[str, Any] = attrs.field(factory=dict)
    builder: PromptBuilder | None = None
    served_models: list[str] | None = None
    """The server's ``/v1/models`` listing (None when it has none)."""
    notes: list[str] = attrs.field(factory=list)


class Observer:
    """Runs one observation: ``await Observer(...).run(specs)`` (or :func:`observe_requests`)."""

    def __init__(self, settings: ObserveSettings, builder: PromptBuilder, client: Any = None):
        settings.check()
        self.settings = settings
        self.builder = builder
        self.url = endpoint(settings.url, settings.chat)
        self.headers = {"Content-Type": "application/json"}
        if settings.api_key:
            self.headers["Authorization"] = f"Bearer {settings.api_key}"
        self._client = client
        self.notes: list[str] = []
        self._stopping = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()

    def stop(self) -> None:
        """Stop sending and cut the requests in flight (they are recorded as incomplete)."""
        self._stopping.set()
        for task in list(self._tasks):
            task.cancel()

    async def run(self, specs: Sequence[RequestSpec]) -> Observation:
        import httpx

        s = self.settings
        own = self._client is None
        if own:
            limit = s.max_concurrency or 1000
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(s.timeout_s, connect=min(s.timeout_s, 30.0)),
                limits=httpx.Limits(max_connections=limit, max_keepalive_connections=limit),
            )
        loop = asyncio.get_running_loop()
        handled = _on_interrupt(loop, self.stop)
        try:
            served = await self._preflight()
            calibration: dict[str, Any] = {}
            if s.calibrate and not self._stopping.is_set():
                calibration = await self._calibrate()
            warm_failed = await self._warm_up(specs) if s.warmup else 0
            observation = Observation(
                outcomes=[],
                t0_ns=time.perf_counter_ns(),
                wall_start=time.time(),
                planned=len(specs),
                warmup_failed=warm_failed,
                calibration=calibration,
                builder=self.builder,
                served_models=served,
                notes=list(self.notes),
            )
            if not self._stopping.is_set():
                if s.closed_loop:
                    await self._closed(specs, observation)
                else:
                    await self._open(specs, observation)
            if self._stopping.is_set():
                observation.stopped_by = "interrupted"
            observation.outcomes.sort(key=lambda o: (o.send_ns or o.scheduled_ns, o.index))
            return observation
        finally:
            if handled:
                loop.remove_signal_handler(signal.SIGINT)
            if own:
                await self._client.aclose()
                self._client = None

    # ---- the measured phase

    async def _open(self, specs: Sequence[RequestSpec], obs: Observation) -> None:
        s = self.settings
        gate = asyncio.Semaphore(s.max_concurrency) if s.max_concurrency else None
        end = _deadline(obs.t0_ns, s.duration_s)
        for index, spec in enumerate(specs):
            due = obs.t0_ns + spec.arrival_us * 1000
            if due > end:
                obs.stopped_by = "duration"
                break
            if await self._sleep_until(due):
                break
            out = Outcome(spec, index, due)
            obs.outcomes.append(out)
            self._spawn(self._one(out, gate))
        await self._drain()

    async def _closed(self, specs: Sequence[RequestSpec], obs: Observation) -> None:
        s = self.settings
        end = _deadline(obs.t0_ns, s.duration_s)
        queue = iter(enumerate(specs))

        async def user() -> None:
            for index, spec in queue:
                now = time.perf_counter_ns()
                if now > end:
                    obs.stopped_by = "duration"
                    return
                out = Outcome(spec, index, now)
                obs.outcomes.append(out)
                try:
                    await self._one(out, None)
                finally:  # a closed loop's arrival is its send
                    out.scheduled_ns = out.send_ns or out.scheduled_ns
                if self._stopping.is_set():
                    return

        assert s.max_concurrency is not None
        for _ in range(s.max_concurrency):
            self._spawn(user())
        await self._drain()

    async def _one(self, out: Outcome, gate: asyncio.Semaphore | None) -> None:
        s = self.settings
        spec = out.spec
        body = payload(
            s.model,
            self.builder.prompt(spec),
            spec.output_tokens,
            chat=s.chat,
            ignore_eos=s.ignore_eos,
            usage=s.usage,
        )
        if gate is None:
            await stream_request(self._client, self.url, body, self.headers, out)
            return
        async with gate:
            await stream_request(self._client, self.url, body, self.headers, out)

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _drain(self) -> None:
        """Wait for every task (a cancelled one has recorded itself as incomplete)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def _sleep_until(self, due_ns: int) -> bool:
        """Sleep until ``due_ns`` (perf_counter); True when stopped meanwhile."""
        delay = (due_ns - time.perf_counter_ns()) / 1e9
        if delay > 0:
            with contextlib.suppress(asyncio.TimeoutError):  # the usual case: slept the delay
                await asyncio.wait_for(self._stopping.wait(), delay)
        return self._stopping.is_set()

    # ---- before measurement

    async def _preflight(self) -> list[str] | None:
        """Ask the server for its models (``GET /v1/models``) before anything is timed: an
        unreachable server or a refused key is a clear error now rather than N failed requests,
        and the HTTP client's first-use work (imports, a connection) is done before ``t0``."""
        import httpx

        url = models_url(self.settings.url)
        try:
            answer = await self._client.get(url, headers=self.headers)
        except httpx.HTTPError as exc:
            raise ScenarioError(
                "--url",
                self.settings.url,
                f"no server answers there ({type(exc).__name__}: {exc}); start it or fix --url",
            ) from None
        if answer.status_code in (401, 403):
            raise ScenarioError(
                "--api-key",
                "given" if self.settings.api_key else None,
                f"the server refused it (HTTP {answer.status_code} on {url}); give the server's "
                "key with --api-key or $SERVESIM_API_KEY",
            )
        if answer.status_code != 200:
            return None  # not every server lists its models
        try:
            models = [str(m["id"]) for m in answer.json()["data"]]
        except (ValueError, KeyError, TypeError):
            return None
        if self.settings.model not in models:
            self.notes.append(
                f"the server lists {', '.join(models) or 'no model'}, not {self.settings.model}"
            )
        return models

    async def _warm_up(self, specs: Sequence[RequestSpec]) -> int:
        """Send ``warmup`` requests shaped like the first ones (distinct text, no shared prefix),
        ``max_concurrency`` at a time (all at once without it); return how many failed."""
        s = self.settings
        shapes = [specs[i % len(specs)] for i in range(s.warmup)] if specs else []
        width = min(len(shapes), s.max_concurrency or len(shapes)) or 1
        gate = asyncio.Semaphore(width)
        outs = [Outcome(spec, i, 0) for i, spec in enumerate(shapes)]

        async def one(out: Outcome) -> None:
            body = payload(
                s.model,
                self.builder.prompt(out.spec, salt=f"warm-up {out.index}"),
                out.spec.output_tokens,
                chat=s.chat,
                ignore_eos=s.ignore_eos,
                usage=s.usage,
            )
            async with gate:
                await stream_request(self._client, self.url, body, self.headers, out)

        for out in outs:
            self._spawn(one(out))
        await self._drain()
        return sum(1 for o in outs if not o.ok)

    async def _calibrate(self) -> dict[str, Any]:
        """Measure the server's count of prompts built at two sizes (one output token each) and
        fit the builder's correction; the probes are not recorded."""
        s = self.settings
        samples: list[tuple[int, int]] = []
        errors: list[str] = []
        for size in CALIBRATION_SIZES:
            for rep in range(2):
                probe = RequestSpec(-1 - rep, 0, size, 1)
                body = payload(
                    s.model,
                    self.builder.prompt(probe, salt=f"calibration {size} {rep}"),
                    1,
                    chat=s.chat,
                    ignore_eos=s.ignore_eos,
                    usage=True,
                )
                out = Outcome(probe, -1, 0)
                await stream_request(self._client, self.url, body, self.headers, out)
                if out.prompt_tokens is None:
                    errors.append(out.error or "no usage.prompt_tokens in the answer")
                else:
                    samples.append((size, out.prompt_tokens))
        if len(samples) < 4:
            raise ScenarioError(
                "--calibrate-ratio",
                self.url,
                "the server did not report prompt token counts for the calibration probes ("
                + "; ".join(dict.fromkeys(errors))
                + "); give --words-per-token instead",
            )
        overhead, scale = fit_correction(samples)
        self.builder = self.builder.calibrated(overhead, scale)
        return {
            "samples": [list(p) for p in samples],
            "overhead_tokens": round(overhead, 3),
            "scale": round(scale, 5),
            "words_per_token": None
            if self.builder.tokenizer is not None
            else round(self.builder.words_per_token / scale, 5),
        }


def _deadline(t0_ns: int, duration_s: float | None) -> float:
    return math.inf if duration_s is None else t0_ns + duration_s * 1e9


def _on_interrupt(loop: asyncio.AbstractEventLoop, stop: Any) -> bool:
    """Make Ctrl-C call ``stop`` (finish cleanly, write what finished); False where signals
    cannot be handled here (not the main thread, or a platform without it)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return False
    try:
        loop.add_signal_handler(signal.SIGINT, stop)
    except (NotImplementedError, RuntimeError, ValueError):
        return False
    return True


def observe_requests(
    specs: Sequence[RequestSpec], settings: ObserveSettings, builder: PromptBuilder
) -> Observation:
    """Run :class:`Observer` on ``specs`` to the end (blocking)."""
    return asyncio.run(Observer(settings, builder).run(specs))
