"""The router process, and its view of the instances: snapshots with the freshness rules of INV-7.

:class:`RouterProcess` serves routing requests from a FIFO store in arrival order: each
decision is taken ``routing_latency`` after the request reached the router (``concurrency``
decisions at most in progress at once; 0 = no limit, every request's latency runs in parallel).
The decision itself (snapshots → routing policy → in-flight count) is the function it is given.

* ``in_flight`` (requests routed to an instance and not yet finished) is the router's own count:
  always exact.
* Queue depth, batch size, KV utilisation and preemptions are re-read from an instance when the
  snapshot is older than ``snapshot_interval`` (0 = every decision). Snapshots start at zero and
  the first refresh happens once ``now >= snapshot_interval`` (as BLIS does).
* Prefix-cache queries see each instance's KV cache as it was ``cache_signal_delay`` ago
  (0 = live): blocks cached since are not visible yet, blocks evicted since still are.

Reading an instance never wakes it: inside a fast-forwarded window the KV use at ``now`` comes from
the window's precomputed allocations (``Instance.kv_used_at``).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from simpy.events import Event

from servesim.components.instance import Instance
from servesim.policies.index import SnapshotGroups
from servesim.policies.snapshot import ClusterState, InstanceSnapshot, SnapshotList


class SnapshotProvider:
    """One reusable :class:`InstanceSnapshot` per instance, refreshed lazily on access."""

    def __init__(
        self,
        env,
        instances: Sequence[Instance],
        *,
        snapshot_interval_us: int = 0,
        cache_signal_delay_us: int = 0,
        reads_prefix_cache: bool = False,
    ):
        self.env = env
        self.instances = list(instances)
        self.interval = snapshot_interval_us
        self.delay = cache_signal_delay_us
        self.in_flight = [0] * len(self.instances)
        self._refreshed = [0] * len(self.instances)
        # instances by last refresh, oldest first (refreshes happen in time order): a view
        # refreshes the stale ones from the front instead of checking every instance
        self._by_age: deque[int] = deque(range(len(self.instances)))
        self.indexes: list[SnapshotGroups] = []
        # block id -> instances whose cache may hold it, kept by the caches themselves: a
        # prefix-cache scorer asks those instead of every instance
        holders: dict[int, set[int]] | None = {} if reads_prefix_cache else None
        self.snapshots = SnapshotList(holders=holders)
        for instance in self.instances:
            kv = instance.engine.kv
            query = self._cache_query(instance) if reads_prefix_cache else None
            if reads_prefix_cache and self.delay > 0:
                kv.eviction_log = OrderedDict()
            if holders is not None:
                kv.track_holders(holders, instance.index)
            self.snapshots.append(
                InstanceSnapshot(
                    instance.index,
                    free_kv_blocks=kv.total_blocks,
                    total_kv_blocks=kv.total_blocks,
                    cached_prefix=query,
                )
            )

    def _cache_query(self, instance: Instance):
        kv = instance.engine.kv
        env = self.env
        delay = self.delay
        if delay <= 0:
            return kv.cached_prefix
        return lambda block_ids: kv.cached_prefix(block_ids, env.now - delay)

    def attach(self, index: SnapshotGroups | None) -> None:
        """Keep ``index`` (a routing policy's, when it has one) up to date with the snapshots."""
        if index is not None:
            index.attach(self.snapshots)
            self.indexes.append(index)

    def view(self) -> list[InstanceSnapshot]:
        """The snapshots as the router may see them now: the stale ones are refreshed (all of
        them with ``snapshot_interval`` 0); ``in_flight`` is kept current by :meth:`add_in_flight`."""
        now = self.env.now
        interval = self.interval
        if interval == 0:
            for k in range(len(self.snapshots)):
                self._refresh(k, now)
            return self.snapshots
        by_age = self._by_age
        refreshed = self._refreshed
        while now - refreshed[by_age[0]] >= interval:
            k = by_age.popleft()
            self._refresh(k, now)
            by_age.append(k)
        return self.snapshots

    def add_in_flight(self, k: int, change: int) -> None:
        """A request routed to instance ``k`` (+1) or finished or moved off it (-1)."""
        count = self.in_flight[k] + change
        self.in_flight[k] = count
        snap = self.snapshots[k]
        snap.in_flight = count
        for index in self.indexes:
            index.update(snap)

    def _refresh(self, k: int, now: int) -> None:
        instance = self.instances[k]
        engine = instance.engine
        snap = self.snapshots[k]
        used = instance.kv_used_at(now)
        total = snap.total_kv_blocks
        snap.queue_depth = len(engine.waiting)
        snap.batch_size = len(engine.running)
        snap.kv_utilization = used / total
        snap.free_kv_blocks = total - used
        snap.preemptions = engine.preemptions
        self._refreshed[k] = now
        for index in self.indexes:
            index.update(snap)

    def state(self, max_num_seqs: int) -> ClusterState:
        return ClusterState(self.env.now, self.view(), max_num_seqs)


class RouterProcess:
    """The router: a process fed by a FIFO store, deciding in arrival order (module docstring).

    The store is a deque plus a wake event for an idle router (the semantics of a
    ``simpy.Store`` with unbounded capacity, at a third of its cost per request: no put and get
    events, one wake event only when the router was idle)."""

    def __init__(
        self,
        env,
        decide: Callable[[Any], Instance],
        *,
        latency_us: int = 0,
        concurrency: int = 0,
    ):
        self.env = env
        self.decide = decide
        self.latency = latency_us
        self.queue: deque = deque()  # (request, its routed event), in arrival order
        self._idle: deque[Event] = deque()  # wake events of idle router processes, FIFO
        if concurrency:
            self.processes = [env.process(self._serve(slot=True)) for _ in range(concurrency)]
        else:
            self.processes = [env.process(self._serve())]

    def decide_now(self, req):
        """With no routing latency and an idle router (its store empty), the decision is taken in
        the arriving request's own turn: the chosen instance, else None (then :meth:`route`).
        Same order as through the store, without its two events per request."""
        if self.latency or self.queue or not self._idle:
            return None
        return self.decide(req)

    def route(self, req) -> Event:
        """Queue ``req`` for a decision; the event's value will be the chosen instance."""
        routed = Event(self.env)
        self.queue.append((req, routed))
        if self._idle:
            self._idle.popleft().succeed()
        return routed

    def _take(self):
        """Wait until a request is queued (nothing to do while the store is empty)."""
        wake = Event(self.env)
        self._idle.append(wake)
        return wake

    def _serve(self, slot: bool = False):
        """Take the queued requests in arrival order and decide each after its latency.

        Without a concurrency limit the latency runs as a timer and the next request is taken
        at once; as one of ``concurrency`` decision slots (``slot``), the slot waits the latency
        out itself, so a request waits in the store for a free slot."""
        env = self.env
        queue = self.queue
        latency = self.latency
        decide = self.decide
        while True:
            if not queue:
                yield self._take()
                continue
            req, routed = queue.popleft()
            if not latency:
                routed.succeed(decide(req))
            elif slot:
                yield env.timeout(latency)
                routed.succeed(decide(req))
            else:
                env.timeout(latency).callbacks.append(partial(self._decide, req, routed))

    def _decide(self, req, routed: Event, _event=None) -> None:
        routed.succeed(self.decide(req))
