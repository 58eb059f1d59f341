"""Autoscaling: instances that start, warm up, drain and stop, and the process that decides when.

With ``cluster.autoscaling`` the cluster's ``instances`` are its *fleet*: every instance that may
ever serve. ``initial_instances`` of them are ready at the start; the others are cold. An
instance goes through

    cold -> loading -> warming -> ready -> draining -> stopped (-> loading again)

*Loading* lasts its weights' bytes per GPU over ``load_bandwidth`` (or ``load_time``), *warming*
lasts ``warmup``; only a *ready* instance is routed to (the router, the gateway's detector and
admission see the ready instances only: :class:`ReadyView`). A *draining* instance takes no new
request, finishes the ones it has (queued, running, or still on their way to it) and then stops;
a stopped instance's GPU memory is gone, so its prefix cache is emptied.

The :class:`Fleet`'s autoscaler process samples the cluster every ``interval`` (on its own
period, as the gateway's saturation detector does), asks the autoscaler policy for a count,
clamps it to ``[min_instances, max_instances]`` and acts on it unless a cooldown holds it back:
a scale-up waits ``scale_up_cooldown`` after the previous one; a scale-down waits
``scale_down_cooldown`` after any scaling action (the start of the run counts as one). It samples only while work remains (arrivals
to come, requests in the system), so a run without a horizon still ends.

GPU time runs from the start of loading to the stop (from 0 for the initial instances, to the
end of the run for those still up); every state change is logged with its time (``events``),
and every routing decision with the number of changes before it (``routed``), for the auditor.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from servesim.components.record import FLEET_STATES, STATUS_COMPLETED
from servesim.components.router import SnapshotProvider
from servesim.policies.autoscaling import FleetSignals
from servesim.simcore import registry
from servesim.simcore.errors import ScenarioError

COLD, LOADING, WARMING, READY, DRAINING, STOPPED = range(6)
STATES = FLEET_STATES
"""The state names, by code (the codes of ``events`` in the run record)."""

NEXT_STATES = {
    COLD: (LOADING,),
    LOADING: (WARMING,),
    WARMING: (READY,),
    READY: (DRAINING,),
    DRAINING: (STOPPED,),
    STOPPED: (LOADING,),
}
"""The allowed state changes (the auditor checks the log against them)."""

UP = (LOADING, WARMING, READY, DRAINING)
"""The states that hold GPUs."""


class ReadyView(SnapshotProvider):
    """The snapshot provider of an autoscaled cluster: what the router, the gateway's detector
    and admission see is the ready instances' snapshots (the whole list, with its index, while
    every instance is ready). The fleet keeps the ready list; a view costs no scan."""

    fleet: Fleet

    def view(self):
        snapshots = super().view()
        fleet = self.fleet
        return snapshots if fleet.all_ready else fleet.ready


class Fleet:
    """The instances' states, the ready list, the GPU time, and the autoscaler process."""

    def __init__(self, cluster: Any, config: Any, busy: Callable[[], bool]):
        self.env = env = cluster.env
        self.cluster = cluster
        self.instances = cluster.instances
        self.provider: ReadyView = cluster.provider
        self.provider.fleet = self
        self.config = config
        self.busy = busy
        self.policy = registry.get("autoscaler", config.policy.name).from_config(
            config.policy.params, registry.PluginContext("cluster.autoscaling.policy")
        )
        n = len(self.instances)
        self.high = config.max_instances or n
        self.low = config.min_instances
        initial = config.initial_instances or self.low
        specs = cluster.scenario.instance_specs
        self.load_us = [load_time_us(cluster.scenario, spec, config) for spec in specs]
        self.gpus = [spec.engine.parallel.rank_gpus(spec.tp) for spec in specs]
        self.state = [READY if k < initial else COLD for k in range(n)]
        self.since = [0 if k < initial else -1 for k in range(n)]  # start of the GPU period
        self.gpu_us = [0] * n
        # every state change: time, instance, new state (flat: 3 numbers each)
        self.events = array("q")
        for k in range(initial):
            self.events.extend((0, k, READY))
        self.routed = array("q")  # per decision: request id, time, instance, changes before it
        self.ready: list = []
        self.all_ready = False
        self._update_ready()
        self.last_up: int | None = None
        self.last_action = 0  # the starting fleet counts as an action: no scale-down before
        self.samples = array("q")  # per sample: time, capacity, desired (after clamping)
        # requests that ended since the last sample, and those within the TTFT target
        self.finished = 0
        self.attained = 0
        for instance in self.instances:
            instance.on_idle = self._idle
        self.process = env.process(self._run())

    # ------------------------------------------------------------------ the ready list
    def _update_ready(self) -> None:
        """Rebuild the ready list, in instance order (on a state change, never per request)."""
        snapshots = self.provider.snapshots
        state = self.state
        self.ready = [snapshots[k] for k in range(len(state)) if state[k] == READY]
        self.all_ready = len(self.ready) == len(state)

    def _enter(self, k: int, new: int, _event: Any = None) -> None:
        now = self.env.now
        was = self.state[k]
        self.state[k] = new
        self.events.extend((now, k, new))
        if READY in (was, new):
            self._update_ready()
        if new == LOADING:
            self.since[k] = now
        elif new == STOPPED:
            self.gpu_us[k] += now - self.since[k]
            self.since[k] = -1
            forget_cache(self.instances[k].engine, now)
        if new == READY:
            gateway = self.cluster.gateway
            if gateway is not None and gateway.size:
                gateway.poke()  # room for the requests it holds back

    def watch(self, decide: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """``decide`` (the routing decision), logging each decision for the auditor."""
        routed = self.routed
        events = self.events
        env = self.env

        def decide_and_log(req: Any) -> Any:
            instance = decide(req)
            routed.extend((req.id, env.now, instance.index, len(events) // 3))
            return instance

        return decide_and_log

    def counting(self, append: Callable[..., None]) -> Callable[..., None]:
        """``append`` (the cluster's: a request's row), counting each ended request and whether
        it completed within the policy's TTFT target (for an autoscaler that judges TTFT)."""
        target = self.policy.ttft_target_us

        def count_and_append(req: Any, status: int, first: int, *rest: Any) -> None:
            self.finished += 1
            if status == STATUS_COMPLETED and first - req.arrival_us <= target:
                self.attained += 1
            append(req, status, first, *rest)

        return count_and_append

    # ------------------------------------------------------------------ start and stop
    def start(self, k: int) -> None:
        """Start instance ``k``: load its weights, then warm up, then ready."""
        self._enter(k, LOADING)
        env = self.env
        warmup = self.config.warmup_us

        def loaded(_event: Any) -> None:
            self._enter(k, WARMING)
            env.timeout(warmup).callbacks.append(partial(self._enter, k, READY))

        env.timeout(self.load_us[k]).callbacks.append(loaded)

    def drain(self, k: int) -> None:
        """Take instance ``k`` out of routing; it stops once its work is done."""
        self._enter(k, DRAINING)
        self._stop_if_done(k)

    def _idle(self, k: int) -> None:
        """Instance ``k`` ran out of work. Its finished requests leave the router's books
        (in-flight counts) later in this instant: check once they have."""
        if self.state[k] == DRAINING:
            self.env.timeout(0).callbacks.append(partial(self._stop_if_done, k))

    def _stop_if_done(self, k: int, _event: Any = None) -> None:
        if (
            self.state[k] == DRAINING
            and not self.instances[k].engine.has_work()
            and not self.provider.in_flight[k]
        ):
            self._enter(k, STOPPED)

    # ------------------------------------------------------------------ the autoscaler
    def _run(self):
        env = self.env
        interval = self.config.interval_us
        while True:
            yield env.timeout(interval)
            if not self.busy():
                return  # nothing more will arrive: no decision can matter any more
            self.decide()

    def signals(self) -> FleetSignals:
        """What the policy sees now (read from the instances, not the router's snapshots)."""
        now = self.env.now
        state = self.state
        queue = kv = 0.0
        for snap in self.ready:
            instance = self.instances[snap.index]
            queue += len(instance.engine.waiting)
            kv += instance.kv_used_at(now) / snap.total_kv_blocks
        gateway = self.cluster.gateway
        if gateway is not None:
            queue += gateway.size
        ready = len(self.ready)
        signals = FleetSignals(
            now,
            ready,
            starting=sum(1 for s in state if s in (LOADING, WARMING)),
            draining=sum(1 for s in state if s == DRAINING),
            queue_depth=int(queue),
            in_flight=sum(self.provider.in_flight),
            kv_utilization=kv / ready if ready else 0.0,
            finished=self.finished,
            attained=self.attained,
        )
        self.finished = self.attained = 0
        return signals

    def decide(self) -> None:
        """One sample: the policy's count, clamped, acted on unless a cooldown holds it."""
        now = self.env.now
        signals = self.signals()
        capacity = signals.capacity
        want = min(max(int(self.policy.desired(signals)), self.low), self.high)
        self.samples.extend((now, capacity, want))
        c = self.config
        if want > capacity:
            if self.last_up is None or now - self.last_up >= c.scale_up_cooldown_us:
                for k in self._to_start(want - capacity):
                    self.start(k)
                self.last_up = self.last_action = now
        elif want < capacity:
            if now - self.last_action >= c.scale_down_cooldown_us:
                chosen = self._to_drain(capacity - want)
                for k in chosen:
                    self.drain(k)
                if chosen:
                    self.last_action = now

    def _to_start(self, n: int) -> list[int]:
        """The ``n`` stopped or cold instances to start (lowest index first)."""
        idle = [k for k, s in enumerate(self.state) if s in (COLD, STOPPED)]
        return idle[:n]

    def _to_drain(self, n: int) -> list[int]:
        """Up to ``n`` ready instances to drain, least loaded first (ties: the highest index),
        always leaving one ready instance to route to."""
        n = min(n, len(self.ready) - 1)
        if n <= 0:
            return []
        ranked = sorted(self.ready, key=lambda s: (_load(self.instances[s.index]), -s.index))
        return [s.index for s in ranked[:n]]

    # ------------------------------------------------------------------ the books
    def close(self, end_us: int) -> dict[str, Any]:
        """The fleet's part of the run record, with the run's end time ``end_us``."""
        gpu_us = list(self.gpu_us)
        for k, since in enumerate(self.since):
            if since >= 0:
                gpu_us[k] += max(0, end_us - since)
        return {
            "policy": self.config.policy.name,
            "min_instances": self.low,
            "max_instances": self.high,
            "events": np.frombuffer(self.events, dtype=np.int64).reshape(-1, 3).copy(),
            "routed": np.frombuffer(self.routed, dtype=np.int64).reshape(-1, 4).copy(),
            "samples": np.frombuffer(self.samples, dtype=np.int64).reshape(-1, 3).copy(),
            "gpu_us": gpu_us,
            "gpus": list(self.gpus),
            "state_at_end": [STATES[s] for s in self.state],
            "cost_per_gpu_hour": self.cost_per_gpu_hour(),
        }

    def cost_per_gpu_hour(self) -> float:
        given = self.config.cost_per_gpu_hour
        if given >= 0:
            return given
        cost = getattr(self.cluster.scenario.gpu, "cost_per_hour", None)
        return float(cost) if cost is not None else 0.0


def _load(instance: Any) -> int:
    engine = instance.engine
    return len(engine.waiting) + len(engine.running)


def load_time_us(scenario: Any, spec: Any, config: Any) -> int:
    """An instance's loading time: ``load_time`` when given, else the weight bytes on its busiest
    GPU (every GPU reads its own share at once) over ``load_bandwidth``."""
    if config.load_time_us:
        return config.load_time_us
    from servesim.latency.kvcapacity import rank_weights_bytes, weights_bytes

    model = scenario.model.spec
    if model is None:
        raise ScenarioError(
            "cluster.autoscaling.load_time",
            0,
            f"the weights of model {scenario.model.name!r} are unknown, so the loading time "
            "cannot be derived; give cluster.autoscaling.load_time (e.g. 60s)",
        )
    parallel = spec.engine.parallel
    if parallel.plain:
        per_gpu = weights_bytes(model) / spec.tp
    else:
        per_gpu = rank_weights_bytes(model, spec.tp, parallel)
    return max(1, round(per_gpu / config.load_bandwidth_bytes_s * 1e6))


def forget_cache(engine: Any, now: int) -> None:
    """A stopped instance's GPU memory and offload tiers are gone at ``now``: empty its caches.
    Every block is free by then; taking them all and giving them back unnamed evicts the cached
    ones (counted as evictions, not as misses; a delayed cache view sees them go at ``now``)."""
    kv = engine.kv
    n = kv.free_count
    if n == kv.total_blocks:
        kv.now = now
        kv.pop_blocks(n)
        kv.miss_blocks -= n
        kv.release(n, [])
    for tier in getattr(kv, "tiers", None) or ():
        # the stopped instance's offload tiers (host memory, local disk) go with it: every block
        # they held counts as evicted, so that stored - evicted = held still balances
        tier.evictions += len(tier._lru)
        tier._lru.clear()


def check_fleet_scenario(scenario: Any) -> None:
    """The configurations autoscaling does not combine with (yet), as errors naming the field."""
    if scenario.pd is not None:
        raise ScenarioError(
            "cluster.autoscaling",
            scenario.cluster.autoscaling.policy.name,
            "autoscaling with disaggregated pools is not modelled; remove cluster.pools or "
            "cluster.autoscaling",
        )
    if len({spec.group for spec in scenario.instance_specs}) > 1:
        raise ScenarioError(
            "cluster.autoscaling",
            scenario.cluster.autoscaling.policy.name,
            "autoscaling a fleet of several groups is not modelled; use identical instances "
            "(no cluster.groups)",
        )
    if any(spec.engine.dp > 1 for spec in scenario.instance_specs):
        raise ScenarioError(
            "engine.dp",
            scenario.instance_specs[0].engine.dp,
            "autoscaling starts and stops single instances; use engine.dp 1 with autoscaling",
        )


def fleet_summary(fleet: dict[str, Any]) -> dict[str, Any]:
    """``summary.json``'s ``autoscaling`` block from the fleet's books (:meth:`Fleet.close`):
    scaling actions, the ready count's peak, GPU-hours and their cost, and every state change."""
    events = fleet["events"]
    states = events[:, 2] if len(events) else np.zeros(0, dtype=np.int64)
    ready = np.cumsum(np.where(states == READY, 1, np.where(states == DRAINING, -1, 0)))
    hours = [us * gpus / 3.6e9 for us, gpus in zip(fleet["gpu_us"], fleet["gpus"])]
    total = sum(hours)
    return {
        "policy": fleet["policy"],
        "min_instances": fleet["min_instances"],
        "max_instances": fleet["max_instances"],
        "scale_ups": int(np.sum(states == LOADING)),
        "scale_downs": int(np.sum(states == DRAINING)),
        "peak_ready": int(ready.max()) if len(ready) else 0,
        "gpu_hours": total,
        "cost_per_gpu_hour": fleet["cost_per_gpu_hour"],
        "cost_usd": total * fleet["cost_per_gpu_hour"],
        "per_instance": [
            {"index": k, "gpu_hours": h, "state_at_end": state}
            for k, (h, state) in enumerate(zip(hours, fleet["state_at_end"]))
        ],
        "events": [
            {"time_s": int(t) / 1e6, "instance": int(k), "state": STATES[int(s)]}
            for t, k, s in events
        ],
    }
