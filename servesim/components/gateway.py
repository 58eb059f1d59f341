"""Gateway flow control: a queue in front of the router, released while the cluster has room.

Admitted requests wait here instead of going straight to the router: a request's process waits
on its release event (:meth:`Gateway.enqueue`). Two processes serve the queue. The *dispatcher* is
woken when the detector's inputs just changed (a request arrives at the gateway, leaves an
instance, or is routed); the *saturation detector* samples the cluster on its own period while
requests wait (``tick``, counted from the last attempt that left them waiting; queue-depth and KV
signals also change at step boundaries, which only the period sees). Each attempt samples the
detector, publishes its reading (``saturation``) and, unless the cluster is saturated
(saturation >= 1), releases the next waiting request — one per attempt, as BLIS does; the next
release waits until that one has been routed. Same instant: all of this runs at normal priority,
before any instance forms its next batch.

Order: ``fifo`` (arrival order), ``priority`` (highest SLO priority band first, FIFO within a
band), ``slo-deadline`` (earliest gateway arrival + the class's TTFT target first). Capacity:
``max_queue`` requests in all (0 = unbounded) and ``per_band_capacity`` per priority band; a full
queue rejects the newcomer, unless ``shedding`` is on and a waiting *sheddable* request of lower
priority exists — then the newest such request is shed to make room. ``ttl`` expires requests that
waited too long.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from typing import Any

from simpy.events import Event

from servesim.policies.snapshot import is_sheddable

ORDERS = ("fifo", "priority", "slo-deadline")
SETTINGS = ("order", "max_queue", "per_band_capacity", "shedding", "ttl_us", "tick_us")
"""The gateway's keyword settings, named as the scenario's ``flow_control`` section names them."""
COUNTERS = ("enqueued", "dispatched", "rejected", "shed", "expired", "peak_depth")
"""What the gateway counts over a run (all start at 0); the run record reports them by name."""


class Gateway:
    """The queue, its capacity rules and the dispatcher (see module docstring)."""

    def __init__(
        self,
        env,
        detector: Any,
        state: Callable[[], Any],
        on_drop: Callable[[Any, str, int], None],
        *,
        order: str = "priority",
        max_queue: int = 0,
        per_band_capacity: int = 0,
        shedding: bool = False,
        ttl_us: int = 0,
        tick_us: int = 1000,
        deadline_us: Callable[[Any], int] | None = None,
    ):
        if order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}")
        self.env = env
        self.detector = detector
        self.state = state
        self.on_drop = on_drop
        self.order = order
        self.max_queue = max_queue
        self.per_band_capacity = per_band_capacity
        self.shedding = shedding
        self.ttl = ttl_us
        self.tick = tick_us
        self.deadline_us = deadline_us or (lambda req: 0)
        self.bands: dict[int, deque] = {}  # band key -> FIFO of (seq, req)
        self._heap: list[tuple[int, int, Any]] = []  # slo-deadline: (deadline, seq, req)
        self._gone: set[int] = set()  # ids removed from the heap lazily (shed / expired)
        self.size = 0
        self._seq = 0
        self._attempt_pending = False
        self._tick_pending = False
        self.saturation = 0.0  # the detector's last published reading
        self._wake = Event(env)  # the dispatcher waits on it; a poke triggers it
        self._armed = Event(env)  # the detector's period starts when requests are left waiting
        self.dispatcher = env.process(self._dispatcher())
        self.sampler = env.process(self._detector()) if tick_us else None
        self._awaiting_route = False  # a released request is still being routed (routing latency)
        self._missed = False  # an attempt found a release still being routed
        self._released: dict[int, Event] = {}  # request id -> the event its process waits on
        for name in COUNTERS:
            setattr(self, name, 0)
        self.enqueue_us: dict[int, int] = {}

    # ------------------------------------------------------------------ arrivals
    def _band(self, req) -> int:
        return req.priority if self.order == "priority" else 0

    def enqueue(self, req) -> Event:
        """Queue ``req``; the returned event's value is True when it is released (then call
        :meth:`routed` once it is routed), False when it is refused (rejected, shed or expired:
        ``on_drop`` has been told)."""
        event = self._released[req.id] = Event(self.env)
        self._enqueue(req)
        return event

    def _enqueue(self, req) -> None:
        now = self.env.now
        band = self._band(req)
        queue = self.bands.get(band)
        if self.per_band_capacity and queue is not None and len(queue) >= self.per_band_capacity:
            self._drop(req, "rejected", "gateway_band_full")
            return
        if self.max_queue and self.size >= self.max_queue:
            victim = self._shed_victim(req) if self.shedding else None
            if victim is None:
                self._drop(req, "rejected", "gateway_full")
                return
            self._remove(victim)
            self._drop(victim, "shed", "gateway_shed")
        if queue is None:
            queue = self.bands[band] = deque()
        seq = self._seq
        self._seq += 1
        queue.append((seq, req))
        if self.order == "slo-deadline":
            heapq.heappush(self._heap, (now + self.deadline_us(req), seq, req))
        self.size += 1
        self.enqueued += 1
        self.enqueue_us[req.id] = now
        if self.size > self.peak_depth:
            self.peak_depth = self.size
        self.poke()

    def _shed_victim(self, incoming):
        """The newest waiting sheddable request of the lowest priority, if below the newcomer's."""
        best, best_key = None, None
        for queue in self.bands.values():
            for seq, req in queue:
                if is_sheddable(req.priority):
                    key = (req.priority, -seq)
                    if best_key is None or key < best_key:
                        best, best_key = req, key
        if best is not None and incoming.priority > best.priority:
            return best
        return None

    def _remove(self, req) -> None:
        queue = self.bands[self._band(req)]
        for i, (_, queued) in enumerate(queue):
            if queued is req:
                del queue[i]
                break
        if self.order == "slo-deadline":
            self._gone.add(req.id)
        self.size -= 1

    def _drop(self, req, status: str, reason: str) -> None:
        if status == "rejected":
            self.rejected += 1
        elif status == "shed":
            self.shed += 1
        else:
            self.expired += 1
        self.on_drop(req, status, reason)
        event = self._released.pop(req.id, None)
        if event is not None:
            event.succeed(False)

    # ------------------------------------------------------------------ dispatch
    def poke(self) -> None:
        """Ask for a dispatch attempt in this instant (several pokes at one instant make one)."""
        if self._attempt_pending or not self.size:
            return
        self._attempt_pending = True
        if not self._wake.triggered:  # else the dispatcher is already due to attempt this instant
            self._wake.succeed()

    def _dispatcher(self):
        """The dispatcher process: each time it is woken (an arrival at the gateway, a request
        leaving an instance, a routing decision), one attempt."""
        env = self.env
        while True:
            yield self._wake
            self._wake = Event(env)
            self._attempt()

    def _detector(self):
        """The saturation detector's own period: while requests wait, it samples the cluster every
        ``tick`` after the last attempt that left them waiting, and the dispatcher acts on it."""
        env = self.env
        while True:
            yield self._armed
            self._armed = Event(env)
            yield env.timeout(self.tick)
            self._tick_pending = False
            self._attempt()

    def sample(self) -> float:
        """The detector reads the cluster now and publishes its saturation (≥ 1: saturated)."""
        self.saturation = self.detector.saturation(self.state())
        return self.saturation

    def _attempt(self, _event=None) -> None:
        self._attempt_pending = False
        now = self.env.now
        if self.ttl:
            self._expire(now)
        # At most one release per attempt (as BLIS does): the detector's signals (queue depth,
        # KV use) only move once a released request reaches an instance, so releasing in a loop
        # would empty the queue on one stale reading. Attempts come with every arrival, every
        # request that leaves an instance, every routing decision and every tick.
        if self.size and not self._awaiting_route and self.sample() < 1.0:
            req = self._pop()
            self.size -= 1
            self.dispatched += 1
            # a release not yet routed is not yet in the detector's inputs: hold the next one
            # until it is (``routed``)
            self._released.pop(req.id).succeed(True)  # its process goes on to the router
            self._awaiting_route = True
        elif self.size and self._awaiting_route:
            self._missed = True
        if self.size and self.tick and not self._tick_pending:
            self._tick_pending = True
            self._armed.succeed()

    def routed(self, again: bool = True) -> None:
        """The request released last has been routed: the cluster state now counts it. Attempt
        again if ``again`` (a decision that took time) or if an attempt was held meanwhile."""
        self._awaiting_route = False
        if again or self._missed:
            self._missed = False
            self.poke()

    def _pop(self):
        if self.order == "slo-deadline":
            heap = self._heap
            while True:
                _, _, req = heapq.heappop(heap)
                if req.id in self._gone:
                    self._gone.discard(req.id)
                    continue
                queue = self.bands[0]
                for i, (_, queued) in enumerate(queue):
                    if queued is req:
                        del queue[i]
                        break
                return req
        for band in sorted(self.bands, reverse=True):
            queue = self.bands[band]
            if queue:
                return queue.popleft()[1]
        raise RuntimeError("gateway queue size out of sync")  # pragma: no cover - invariant

    def _expire(self, now: int) -> None:
        limit = now - self.ttl
        for queue in self.bands.values():
            while queue and self.enqueue_us[queue[0][1].id] <= limit:
                _, req = queue.popleft()
                if self.order == "slo-deadline":
                    self._gone.add(req.id)
                self.size -= 1
                self._drop(req, "expired", "gateway_ttl")

    def waiting(self) -> list:
        """Requests still in the gateway (for the end-of-run books)."""
        out = []
        for queue in self.bands.values():
            out.extend(req for _, req in queue)
        return out
