"""The encode stage of multimodal requests: colocated on the LLM instance, or an encode pool.

A request whose content carries media items (:func:`~servesim.workloads.multimodal.media_items`)
must have them encoded, once, before its first prefill chunk. Two placements:

* **Colocated** (:class:`ColocatedEncoder`, no encode pool): the instance runs the encoder in the
  step that schedules the request's first prefill chunk, and that step is longer by the encoder's
  time. This is vLLM v1's shape: the scheduler admits a chunk only with the encoder inputs it
  covers (``_try_schedule_encoder_inputs`` in ``vllm/v1/core/sched/scheduler.py``) and the model
  runner runs the encoder for them before the forward pass of the same step
  (``_execute_mm_encoder`` in ``vllm/v1/worker/gpu_model_runner.py``). Simplifications: all of a
  request's items are encoded with its first chunk (vLLM encodes an item with the chunk that
  reaches its position), the encoder budget (``max_num_encoder_input_tokens``) and the encoder
  cache's size do not limit admissions, and a request preempted and recomputed keeps its
  embeddings (vLLM's encoder cache usually still holds them).
  The items of every request first scheduled in one step are one encoder batch: each admission
  adds the batch's growth in time (:meth:`ColocatedEncoder.first_chunk`).
* **Encode pool** (:class:`EncodePool`, ``cluster.pools.encode``; encode-prefill-decode
  disaggregation): a request with media reaching its prefill instance goes first to the encode
  instance with the fewest items queued or in service; each encode instance encodes the
  requests in its FIFO queue in batches (up to ``max_batch_items`` items, whole requests), then
  sends each request's embeddings (tokens x the language model's hidden size x 2 bytes) over its
  own link (processor-sharing, like the KV-transfer links); when they have arrived the request
  joins its prefill instance's wait queue. While it is in the encode stage it counts as in
  transit (a run that ends then records it so).

Every encoding is a row of the :class:`EncodeLog`, which the auditor holds against the requests
(``servesim.audit.encode``).
"""

from __future__ import annotations

from array import array
from collections import deque
from typing import Any

from servesim.components.request import Request
from servesim.components.transfer import TransferLink, TransferLog
from servesim.latency.encoder import EncoderTimer
from servesim.workloads.multimodal import media_items

COLOCATED, POOL = 0, 1
"""Where an encoding ran: on the request's LLM instance, or on an encode instance."""

ENCODE_COLUMNS = (
    "request",
    "mode",
    "server",
    "start_us",
    "end_us",
    "items",
    "tokens",
    "target",
    "transfer_start_us",
    "transfer_end_us",
    "bytes",
)
"""One row per encoding. ``server``: the instance (colocated) or encode instance (pool) that ran
it; ``target``: the LLM instance its embeddings are for; transfer columns -1 when colocated (or
still moving when the run ended)."""


class EncodeLog:
    """Every encoding of a run, in flat int64 columns (:data:`ENCODE_COLUMNS`)."""

    __slots__ = ("columns", "_open")

    def __init__(self) -> None:
        self.columns = {name: array("q") for name in ENCODE_COLUMNS}
        self._open: dict[int, int] = {}  # request id -> its row, while its embeddings move

    def __len__(self) -> int:
        return len(self.columns["request"])

    def add(
        self,
        req_id: int,
        mode: int,
        server: int,
        start: int,
        end: int,
        items: list[int],
        target: int,
    ) -> None:
        c = self.columns
        if mode == POOL:
            self._open[req_id] = len(c["request"])
        for name, value in (
            ("request", req_id),
            ("mode", mode),
            ("server", server),
            ("start_us", start),
            ("end_us", end),
            ("items", len(items)),
            ("tokens", sum(items)),
            ("target", target),
            ("transfer_start_us", -1),
            ("transfer_end_us", -1),
            ("bytes", 0),
        ):
            c[name].append(value)

    def transfer_started(self, req_id: int, now: int, nbytes: int) -> None:
        row = self._open[req_id]
        self.columns["transfer_start_us"][row] = now
        self.columns["bytes"][row] = nbytes

    def transfer_ended(self, req_id: int, now: int) -> None:
        self.columns["transfer_end_us"][self._open.pop(req_id)] = now


class ColocatedEncoder:
    """The encoder of one LLM instance: its time is added to the step that schedules a request's
    first prefill chunk (module docstring). Each step's admissions form one batch."""

    __slots__ = ("timer", "index", "log", "_step_start", "_count", "_flops", "_us")

    def __init__(self, timer: EncoderTimer, index: int, log: EncodeLog):
        self.timer = timer
        self.index = index
        self.log = log
        self._step_start = -1
        self._count = 0
        self._flops = 0.0
        self._us = 0

    def first_chunk(self, r: Request, now: int) -> int:
        """``r``'s first prefill chunk is scheduled in the step starting at ``now``: encode its
        media (if any); return the µs this adds to the step (the step's encoder batch grows)."""
        items = media_items(r.segments)
        if not items:
            return 0
        if now != self._step_start:  # the first admission with media of this step
            self._step_start = now
            self._count, self._flops, self._us = 0, 0.0, 0
        timer = self.timer
        self._count += len(items)
        self._flops += timer.flops(items)
        batch_us = timer.batch_us(self._count, self._flops)
        added = batch_us - self._us
        self._us = batch_us
        self.log.add(r.id, COLOCATED, self.index, now, now + batch_us, items, self.index)
        return added


class _Job:
    """A request in the encode stage: its (sub-)request, items, parent and destination."""

    __slots__ = ("req", "parent", "items", "instance")

    def __init__(self, req: Request, parent: Request, items: list[int], instance: Any):
        self.req = req
        self.parent = parent
        self.items = items
        self.instance = instance


class EncodeGate:
    """Stands in front of an LLM instance in an encode-pool run: what the routing step returns,
    so the request's α delay is the instance's own and its arrival goes through the encode
    stage first. A request without media (or one the instance would refuse) goes straight in."""

    __slots__ = ("instance", "engine", "pool")

    def __init__(self, instance: Any, pool: EncodePool):
        self.instance = instance
        self.engine = instance.engine
        self.pool = pool

    def enqueue(self, req: Request) -> None:
        items = media_items(req.segments)
        if not items or self.engine.guard(req):
            self.instance.enqueue(req)
            return
        parent = req.pd.parent if req.pd is not None else req
        self.pool.submit(_Job(req, parent, items, self.instance))


class EncodePool:
    """Encode instances with FIFO queues, batch encoding and one embedding link each."""

    def __init__(
        self,
        env: Any,
        config: Any,
        timers: list[EncoderTimer],
        in_transit: dict,
        log: EncodeLog,
        embed_bytes_per_token: int,
    ):
        self.env = env
        self.config = config
        self.timers = timers
        self.in_transit = in_transit
        self.log = log
        self.embed_bytes_per_token = embed_bytes_per_token
        n = len(timers)
        self.queues: list[deque[_Job]] = [deque() for _ in range(n)]
        self.load = [0] * n  # items queued or in service, per encode instance
        self._wake: list[Any] = [None] * n
        self.transfer_log = TransferLog()
        self.links = [
            TransferLink(
                env,
                i,
                f"encode{i}",
                config.bandwidth_bytes_s / 1e6,
                config.base_latency_us,
                log=self.transfer_log,
            )
            for i in range(n)
        ]
        self.batches = 0
        for i in range(n):
            env.process(self._serve(i))

    def gate(self, instance: Any) -> EncodeGate:
        return EncodeGate(instance, self)

    def submit(self, job: _Job) -> None:
        """``job`` enters the encode stage: the least-loaded encode instance's queue (ties: the
        lowest index). It counts as in transit until it reaches its LLM instance."""
        load = self.load
        i = min(range(len(load)), key=load.__getitem__)
        load[i] += len(job.items)
        self.in_transit[job.parent.id] = job.parent
        self.queues[i].append(job)
        wake = self._wake[i]
        if wake is not None:
            self._wake[i] = None
            wake.succeed()

    def _serve(self, i: int):
        """Encode instance ``i``: take a batch off its queue, encode it, send the embeddings."""
        env = self.env
        queue = self.queues[i]
        timer = self.timers[i]
        limit = self.config.max_batch_items
        while True:
            if not queue:
                self._wake[i] = env.event()
                yield self._wake[i]
            batch = [queue.popleft()]
            count = len(batch[0].items)
            while queue and count + len(queue[0].items) <= limit:
                job = queue.popleft()
                batch.append(job)
                count += len(job.items)
            start = env.now
            dt = timer.items_us([t for job in batch for t in job.items])
            yield env.timeout(dt)
            self.batches += 1
            end = env.now
            for job in batch:
                self.load[i] -= len(job.items)
                self.log.add(job.req.id, POOL, i, start, end, job.items, job.instance.engine.index)
                self._send(i, job)

    def _send(self, i: int, job: _Job) -> None:
        nbytes = sum(job.items) * self.embed_bytes_per_token
        self.log.transfer_started(job.req.id, self.env.now, nbytes)
        done = self.links[i].start(job.req.id, nbytes, (job.req.id, i, job.instance.engine.index))
        done.callbacks.append(lambda _event, job=job: self._arrived(job))

    def _arrived(self, job: _Job) -> None:
        """The embeddings reached the LLM instance: the request joins its wait queue."""
        self.log.transfer_ended(job.req.id, self.env.now)
        del self.in_transit[job.parent.id]
        job.instance.enqueue(job.req)

    def describe(self) -> list[dict[str, Any]]:
        return [
            {
                "index": link.index,
                "name": link.name,
                "started": link.started,
                "completed": link.completed,
                "bytes_moved": link.bytes_moved,
            }
            for link in self.links
        ]
