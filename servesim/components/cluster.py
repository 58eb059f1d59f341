"""Assemble a cluster from a Scenario and run it: the workload source, request lifecycles,
routing, instances, and the recorder that turns finished requests into table rows.
"""

from __future__ import annotations

import time
from collections import deque
from functools import partial
from typing import Any

from servesim.components.engine import Engine, EngineLimits
from servesim.components.gateway import Gateway
from servesim.components.instance import Instance
from servesim.components.kvcache import ContentIds
from servesim.components.record import (
    STATUS_COMPLETED,
    STATUS_DROPPED,
    STATUS_EXPIRED,
    STATUS_GATEWAY,
    STATUS_NOT_ARRIVED,
    STATUS_QUEUED,
    STATUS_REJECTED,
    STATUS_RUNNING,
    STATUS_SHED,
    STATUS_TRANSFERRING,
    PDTable,
    RequestTable,
    StepLog,
)
from servesim.components.request import (
    DROP_DECODE_KV_FULL,
    DROPPED,
    FINISH_LENGTH,
    FINISH_STOP,
    FINISHED,
    Request,
)
from servesim.components.router import SnapshotProvider
from servesim.components.speculative import SpeculativeEngine
from servesim.components.transfer import TransferLink, TransferLog
from servesim.policies.admission import AlwaysAdmit
from servesim.policies.snapshot import DEFAULT_SLO_PRIORITIES
from servesim.simcore import registry
from servesim.simcore.env import SimEnvironment
from servesim.simcore.log import get_logger
from servesim.simcore.rng import RandomStreams


class RunRecord:
    """What a finished run leaves behind: per-request rows, per-instance step logs, counters."""

    def __init__(self) -> None:
        self.requests = RequestTable()
        self.step_logs: list[StepLog] = []
        self.instances: list[dict[str, Any]] = []
        self.arrived = 0
        self.end_us = 0
        self.wall_s = 0.0
        self.kv_problems: list[str] = []
        self.alpha2_us = 0
        self.post_decode_us = 0
        self.instances_alpha2: list[int] = []
        self.instances_post_decode: list[int] = []  # each instance's post-decode overhead (µs)
        self.horizon_us: int | None = None
        self.interrupted = False
        self.admission_rejections = 0
        self.gateway: dict[str, int] = {}
        self.decisions: list | None = None
        # per traced decision: when the oldest snapshot it read was taken (the auditor's own age)
        self.snapshot_taken_us: list[int] = []
        self.exported: list | None = None  # RequestSpecs of every arrival (output.workload_trace)
        self.snapshot_interval_us = 0
        self.sessions: dict[int, str] | None = None  # session id -> completed/cancelled/interrupted
        self.session_rounds = 0
        self.roles: tuple[str, ...] = ()  # each instance's pool (disaggregated serving)
        self.pd: dict[str, Any] | None = None  # PD counters (None: no pools)
        self.pd_table: PDTable | None = None
        self.transfers: TransferLog | None = None
        self.links: list[dict[str, Any]] = []
        self.pd_decider = ""
        self.roles_at_end: tuple[str, ...] = ()
        self.transfer_in_flight = 0
        self.block_bytes: list[int] = []


class PDRecord:
    """A split request's disaggregation state: its prefill sub-request and its timeline."""

    __slots__ = (
        "parent",
        "prefill",
        "prefill_instance",
        "decode_instance",
        "prefill_end_us",
        "transfer_start_us",
        "transfer_end_us",
        "decode_enqueue_us",
        "blocks",
    )

    def __init__(self, parent: Request, prefill: Request, prefill_instance: int, decode: int):
        self.parent = parent
        self.prefill = prefill
        self.prefill_instance = prefill_instance
        self.decode_instance = decode
        self.prefill_end_us = -1
        self.transfer_start_us = -1
        self.transfer_end_us = -1
        self.decode_enqueue_us = -1
        self.blocks = 0


class Cluster:
    """N instances behind a router, fed by the scenario's workload."""

    def __init__(self, scenario: Any, progress: Any = None):
        self.scenario = scenario
        # progress reporting: every `progress.every` finished requests (off: never)
        self.progress = progress
        self._finished = 0
        self._report_at = progress.every if progress is not None else 1 << 62
        self.env = SimEnvironment()
        self.streams = RandomStreams(scenario.seed)
        self.record = RunRecord()
        self.record.horizon_us = scenario.horizon_us
        self.content_ids = ContentIds()  # one table, so block ids mean the same on every instance
        grouped = len({spec.group for spec in scenario.instance_specs}) > 1
        self.instances = [
            self._build_instance(index, spec, grouped)
            for index, spec in enumerate(scenario.instance_specs)
        ]
        e = scenario.engine
        self.router = registry.get("routing", scenario.routing.name).from_config(
            scenario.routing.params, "policies.routing"
        )
        self.reads_prefix_cache = bool(getattr(self.router, "reads_prefix_cache", False))
        self.router.bind(len(self.instances), self.streams.stream("router"))
        self.record.roles = tuple(spec.role for spec in scenario.instance_specs)
        self.pd = scenario.pd
        if self.pd is not None:
            self._setup_pd()
        if self.reads_prefix_cache:
            # A router that reads prefix caches live sees blocks evicted by decode growth step by
            # step, so such runs step exactly (fast-forward would defer those evictions).
            for instance in self.instances:
                instance.exact_steps = True
        self.admission = registry.get("admission", scenario.admission.name).from_config(
            scenario.admission.params, "policies.admission"
        )
        c = scenario.cluster
        self.provider = SnapshotProvider(
            self.env,
            self.instances,
            snapshot_interval_us=c.snapshot_interval_us,
            cache_signal_delay_us=c.cache_signal_delay_us,
            reads_prefix_cache=self.reads_prefix_cache,
        )
        self._routes_blind = not getattr(self.router, "needs_snapshots", True)
        if self.pd is not None:
            self._routes_blind = not any(
                getattr(router, "needs_snapshots", True)
                for router in (self.decode_router, self.prefill_router)
            )
        self._max_num_seqs = e.max_num_seqs
        if self.pd is not None:  # each pool's candidates: the provider's (reused) snapshot objects
            self._decode_snaps = [self.provider.snapshots[i] for i in self.decode_pool]
            self._prefill_snaps = [self.provider.snapshots[i] for i in self.prefill_pool]
        self.gateway: Gateway | None = None
        fc = scenario.flow_control
        if fc is not None:
            detector = registry.get("saturation", fc.detector.name).from_config(
                fc.detector.params, "policies.flow_control.detector"
            )
            slo = scenario.slo
            self.gateway = Gateway(
                self.env,
                detector,
                lambda: self.provider.state(self._max_num_seqs),
                self._dispatch,
                self._on_refused,
                order=fc.order,
                max_queue=fc.max_queue,
                per_band_capacity=fc.per_band_capacity,
                shedding=fc.shedding,
                ttl_us=fc.ttl_us,
                tick_us=fc.tick_us,
                # a class without a TTFT target has no deadline: it sorts last
                deadline_us=lambda req: (
                    (slo[req.slo_class].ttft_us if req.slo_class in slo else 0) or 1 << 62
                ),
            )
        self.decisions: list | None = [] if scenario.output.trace == "decisions" else None
        self._next_id = 0  # request ids in arrival order (session rounds arrive as they are made)
        self.sessions = getattr(scenario.workload, "sessions", None)
        self.session_state: dict[int, str] = {}
        # output.workload_trace: every arrived request, to replay this run's workload exactly
        self.exported: list | None = [] if scenario.output.workload_trace else None
        self._pending_rounds = 0  # follow-up rounds waiting out their think time
        self._follow_ups = scenario.workload.follow_ups(self.streams) if self.sessions else None
        self.admission_rejections = 0
        # no cluster state to build when the policy is the built-in admit-all (not merely its name:
        # register("admission", "always-admit", Mine, replace=True) must take effect)
        self._admit_all = type(self.admission) is AlwaysAdmit
        self.slo_priorities = DEFAULT_SLO_PRIORITIES
        self.record.alpha2_us = self.instances[0].engine.alpha2  # of instance 0 (see per instance)
        self.record.post_decode_us = self.instances[0].engine.post_decode
        self.record.instances_alpha2 = [i.engine.alpha2 for i in self.instances]
        self.record.instances_post_decode = [i.engine.post_decode for i in self.instances]
        self.in_transit: dict[int, Request] = {}
        self.last_arrival_us = 0
        self._codes: dict[str, int] = {}
        self._block_size = e.block_size
        self._kv_every_step = scenario.audit.kv_every_step

    def _build_instance(self, index: int, spec: Any, grouped: bool) -> Instance:
        """One instance from its spec: latency model, engine limits, per-instance policies."""
        from servesim.scenario import latency_context

        scenario = self.scenario
        e = spec.engine
        if scenario.pd is not None and spec.role != "none":
            where = f"cluster.pools.{spec.role}.latency"
        else:
            where = f"cluster.groups[{spec.group}].latency" if grouped else "latency"
        latency = registry.get("latency", spec.latency.name).from_config(
            spec.latency.params, latency_context(scenario.model, spec.gpu, spec.tp), where
        )
        # policies are per instance, so a stateful one never mixes two instances' state
        preemption = registry.get("preemption", scenario.preemption.name).from_config(
            scenario.preemption.params, "policies.preemption"
        )
        scheduler = registry.get("scheduler", scenario.scheduler.name).from_config(
            scenario.scheduler.params, "policies.scheduler"
        )
        limits = EngineLimits(
            max_num_seqs=e.max_num_seqs,
            max_num_batched_tokens=e.max_num_batched_tokens,
            block_size=e.block_size,
            total_blocks=e.kv_blocks,
            max_model_len=e.max_model_len,
            long_prefill_token_threshold=e.long_prefill_token_threshold,
            enable_chunked_prefill=e.enable_chunked_prefill,
            enable_prefix_caching=e.enable_prefix_caching,
            prefill_first=e.prefill_first,
            watermark_blocks=e.watermark_blocks,
            kv_cpu_blocks=e.kv_cpu_blocks,
            cpu_reload_base_us=e.kv_cpu_latency_us,
            cpu_reload_us_per_block=e.cpu_reload_us_per_block,
            # swapping copies over the same GPU-CPU link (PCIe) as the CPU tier's reloads
            swap_blocks=e.swap_blocks if e.preemption_mode == "swap" else -1,
            swap_us_per_block=e.cpu_reload_us_per_block,
        )
        options = dict(
            index=index,
            on_finish=self._on_finish,
            victim=preemption.victim,
            order_waiting=scheduler.order if scheduler.reorders else None,
            content_ids=self.content_ids,
        )
        if e.spec_draft_tokens:
            engine: Engine = SpeculativeEngine(
                limits,
                latency,
                draft_tokens=e.spec_draft_tokens,
                acceptance=e.spec_acceptance,
                draft_cost=e.spec_draft_cost,
                **options,
            )
        else:
            engine = Engine(limits, latency, **options)
        return Instance(self.env, engine, exact_steps=scenario.exact_steps)

    def _setup_pd(self) -> None:
        """Pools, their routers, the decider and the KV-transfer links."""
        pd = self.pd
        roles = self.record.roles
        self.decode_pool = [i for i, role in enumerate(roles) if role in ("decode", "mixed")]
        self.prefill_pool = [i for i, role in enumerate(roles) if role in ("prefill", "mixed")]
        n = len(self.instances)
        routers = {}
        for role in ("decode", "prefill"):
            # each pool routes with its own policy object (its override, else a copy of the main
            # policy): a stateful policy shared by two pools of different sizes skews both (a
            # shared round-robin counter never reaches some instances)
            choice = pd.routing.get(role, self.scenario.routing)
            where = f"cluster.pools.{role}.routing" if role in pd.routing else "policies.routing"
            router = registry.get("routing", choice.name).from_config(choice.params, where)
            router.bind(n, self.streams.stream(f"router/{role}"))
            routers[role] = router
        self.decode_router = routers["decode"]
        self.prefill_router = routers["prefill"]
        self.decider = registry.get("disaggregation", pd.decider.name).from_config(
            pd.decider.params, "policies.disaggregation"
        )
        if any(
            getattr(x, "reads_prefix_cache", False)
            for x in (self.decode_router, self.prefill_router, self.decider)
        ):
            self.reads_prefix_cache = True
        t = pd.transfer
        self.transfer_log = TransferLog()
        self.links: dict[Any, TransferLink] = {}
        self._bandwidth_per_us = t.bandwidth_bytes_s / 1e6
        # KV bytes per block, from each (prefill) instance's model and TP (MLA aware)
        self.block_bytes = [spec.engine.kv_block_bytes for spec in self.scenario.instance_specs]
        self.record.block_bytes = self.block_bytes
        self.record.pd_table = PDTable()
        self.transferring: dict[int, Request] = {}  # prefilled, KV waiting for room or moving
        self._wait_for_kv = t.decode_full in ("wait", "backpressure")
        # backpressure: a prefill instance keeps a finished prompt's KV until its transfer ends
        self._hold_kv = [t.decode_full == "backpressure" and role == "prefill" for role in roles]
        self._blocking_transfers = t.blocking
        self.awaiting_kv = [deque() for _ in self.instances]  # per decode instance, FIFO
        if t.decode_queue_limit:
            for i in self.decode_pool:
                engine = self.instances[i].engine
                engine.remote_queue_limit = t.decode_queue_limit * engine.kv.total_blocks
        for i in self.decode_pool:
            self.instances[i].on_room = self._retry_transfers
        self.pd_counts = dict.fromkeys(
            (
                "split",
                "local",
                "prefill_completed",
                "completed_at_prefill",
                "dropped_at_prefill",
                "dropped_at_decode_kv",
                "transfers_started",
                "transfers_completed",
            ),
            0,
        )

    def _link(self, p: int, d: int) -> TransferLink:
        topology = self.pd.transfer.topology
        if topology == "shared":
            key, name = 0, "fabric"
        elif topology == "pair":
            key, name = (p, d), f"instance{p}->instance{d}"
        elif topology == "prefill-nic":
            key, name = p, f"nic-instance{p}"
        else:
            key, name = d, f"nic-instance{d}"
        link = self.links.get(key)
        if link is None:
            t = self.pd.transfer
            link = self.links[key] = TransferLink(
                self.env,
                len(self.links),
                name,
                self._bandwidth_per_us,
                t.base_latency_us,
                t.sharing,
                self.transfer_log,
            )
        return link

    # ------------------------------------------------------------------ processes
    def _source(self, specs):
        env = self.env
        horizon = self.scenario.horizon_us
        block_size = self._block_size
        in_transit = self.in_transit
        content_ids = self.content_ids
        priorities = self.slo_priorities
        sessions = self.sessions
        lifecycle = self._lifecycle
        process = env.process
        record = self.record
        for spec in specs:
            arrival = spec.arrival_us
            if horizon is not None and arrival >= horizon:
                break
            wait = arrival - env.now
            if wait > 0:
                yield env.timeout(wait)
            rid = self._next_id
            self._next_id += 1
            req = Request(
                rid,
                arrival,
                spec.prompt_tokens,
                spec.output_tokens,
                spec.max_output_tokens,
                spec.prefix_group,
                spec.prefix_tokens,
                spec.slo_class,
                spec.client,
                block_size,
                content_ids,
                spec.tenant,
                priorities.get(spec.slo_class, 3),
                spec.segments,
            )
            record.arrived += 1
            self.last_arrival_us = arrival
            req.continues = spec.continued
            if self.exported is not None:
                self._export(req, spec.segments)
            if sessions is not None:
                req.session_id = rid
                req.continues = sessions.rounds > 1
                self.session_state[rid] = "active"
            in_transit[req.id] = req
            process(lifecycle(req))

    def _lifecycle(self, req: Request):
        """Admission → (gateway queue) → routing → α queueing delay → an instance's wait queue."""
        env = self.env
        c = self.scenario.cluster
        if c.admission_latency_us:
            yield env.timeout(c.admission_latency_us)
        if not self._admit_all and not self.admission.admit(
            req, self.provider.state(self._max_num_seqs)
        ):
            self.admission_rejections += 1
            self._refuse(req, STATUS_REJECTED, "admission")
            return
        if self.gateway is not None:
            self.gateway.enqueue(req)  # the gateway calls _dispatch when the cluster has room
            return
        yield from self._route(req)

    def _dispatch(self, req: Request) -> bool:
        """The gateway releases ``req``. Returns whether the cluster state already counts it.

        Without routing latency the decision is made now, so the gateway's next saturation check
        sees this request in flight; with latency the gateway waits for the decision (``_route``
        pokes it) before releasing another.
        """
        req.gateway_wait_us = self.env.now - self.gateway.enqueue_us.pop(req.id)
        if self.scenario.cluster.routing_latency_us == 0:
            instance = self._choose(req)
            self.env.process(self._send(req, instance))
            return True
        self.env.process(self._route(req))
        return False

    def _route(self, req: Request):
        latency = self.scenario.cluster.routing_latency_us
        if latency:
            yield self.env.timeout(latency)
        instance = self._choose(req)
        if self.gateway is not None and req.gateway_wait_us >= 0:
            self.gateway.routed()
        yield from self._send(req, instance)

    def _choose(self, req: Request) -> Instance:
        """The routing decision: snapshots → policy → in-flight count."""
        if self.pd is not None:
            return self._choose_pd(req)
        router = self.router
        blind = self._routes_blind and self.decisions is None
        snapshots = self.provider.snapshots if blind else self.provider.view()
        if self.decisions is not None:
            self._trace_decision(req, snapshots)
        index = router.route(req, snapshots)
        router.observe(req, index)
        if self.decisions is not None:
            self.decisions[-1][2] = index
        self.provider.in_flight[index] += 1
        req.instance = index
        return self.instances[index]

    def _choose_pd(self, req: Request) -> Instance:
        """Decode-first (llm-d): choose the decode instance, ask the decider, and when it splits
        the request choose the prefill instance and make the prefill sub-request."""
        snapshots = self.provider.snapshots
        if not (self._routes_blind and self.decisions is None):
            self.provider.view()  # refreshes the snapshot objects in place
        decode_snaps = self._decode_snaps
        decisions = self.decisions
        if decisions is not None:
            self._trace_decision(req, decode_snaps, self.decode_router)
        d = self.decode_router.route(req, decode_snaps)
        self.decode_router.observe(req, d)
        in_flight = self.provider.in_flight
        in_flight[d] += 1  # the decode instance is committed now (decode-first)
        req.instance = d
        p = -1
        if self.prefill_pool and self.decider.disaggregate(req, snapshots[d]):
            p = self.prefill_router.route(req, self._prefill_snaps)
            self.prefill_router.observe(req, p)
            if p == d:
                p = -1  # a mixed instance chosen for both phases serves the request itself
        if decisions is not None:
            decisions[-1][2] = d
            decisions[-1].extend(("split" if p >= 0 else "local", p))
        if p < 0:
            self.pd_counts["local"] += 1
            return self.instances[d]
        self.pd_counts["split"] += 1
        in_flight[p] += 1
        sub = Request(
            req.id,
            req.arrival_us,
            req.prompt_tokens,
            1,  # the prefill sub-request makes the first token and stops
            1,
            req.prefix_group,
            req.prefix_tokens,
            req.slo_class,
            req.client,
            req.block_size,
            req.content,
            req.tenant,
            req.priority,
            req.segments,
        )
        sub.gateway_wait_us = req.gateway_wait_us
        sub.hold_kv = self._hold_kv[p]
        sub.session_id = req.session_id
        sub.round_index = req.round_index
        sub.think_us = req.think_us
        req.pd = sub.pd = PDRecord(req, sub, p, d)
        return self.instances[p]

    def _send(self, req: Request, instance: Instance):
        """α queueing delay, then the instance's wait queue (a split request's prefill part)."""
        delay = instance.engine.latency.queueing_time_us(req.prompt_tokens)
        if delay > 0:
            yield self.env.timeout(delay)
        del self.in_transit[req.id]
        pd = req.pd
        instance.enqueue(req if pd is None else pd.prefill)

    def _on_prefill_done(self, sub: Request) -> None:
        """A split request's prefill finished (or was refused): complete it if its first token
        was its last, else reserve KV on the decode instance and start the transfer."""
        pd = sub.pd
        parent = pd.parent
        now = self.env.now
        counts = self.pd_counts
        in_flight = self.provider.in_flight
        in_flight[pd.prefill_instance] -= 1
        if self.awaiting_kv[pd.prefill_instance]:  # a mixed instance: its KV was just freed
            self._retry_transfers(pd.prefill_instance)
        if self.gateway is not None and self.gateway.size:
            self.gateway.poke()
        parent.enqueue_us = sub.enqueue_us
        parent.first_scheduled_us = sub.first_scheduled_us
        parent.cached_tokens = sub.cached_tokens
        parent.preemptions = sub.preemptions
        d = pd.decode_instance
        holding = sub.hold_kv and sub.id in self.instances[pd.prefill_instance].engine.held
        if sub.state == DROPPED:  # the prefill instance's guards refused it
            counts["dropped_at_prefill"] += 1
            in_flight[d] -= 1
            parent.instance = pd.prefill_instance
            self._drop_split(parent, sub.finish_reason)
            return
        counts["prefill_completed"] += 1
        pd.prefill_end_us = now
        parent.num_generated = 1
        parent.first_token_end_us = parent.last_token_end_us = sub.first_token_end_us
        decode = self.instances[d]
        if decode.engine.set_target(parent) <= 1:
            # its first token was its last: nothing to decode, no KV to move
            if holding:
                self.instances[pd.prefill_instance].release_held(sub)
            counts["completed_at_prefill"] += 1
            in_flight[d] -= 1
            engine = self.instances[pd.prefill_instance].engine
            parent.instance = pd.prefill_instance
            parent.state = FINISHED
            parent.finish_reason = FINISH_LENGTH if parent.length_capped else FINISH_STOP
            parent.finish_us = now
            first = parent.first_token_end_us + engine.alpha2
            self._append(parent, STATUS_COMPLETED, first, first + engine.post_decode, 0)
            if parent.session_id >= 0:
                self._end_of_round(parent, True, first + engine.post_decode)
            return
        awaiting = self.awaiting_kv[d]
        if awaiting and self._wait_for_kv:
            awaiting.append(parent)  # FIFO behind those already waiting for this instance's KV
            self.transferring[parent.id] = parent
            return
        self._start_transfer(parent)

    def _start_transfer(self, parent: Request) -> bool:
        """Reserve the prompt's KV on the decode instance and start moving it. When the decode
        instance has no room: wait in its FIFO for a request there to finish (``decode_full:
        wait``), or refuse (``drop``, BLIS). Returns False only while it waits."""
        pd = parent.pd
        d = pd.decode_instance
        blocks = self.instances[d].reserve_remote(parent)
        if blocks < 0:
            if parent.finish_reason == DROP_DECODE_KV_FULL and self._wait_for_kv:
                if parent not in self.awaiting_kv[d]:
                    self.awaiting_kv[d].append(parent)
                    self.transferring[parent.id] = parent
                parent.finish_reason = ""
                return False
            self.pd_counts["dropped_at_decode_kv"] += 1
            if pd.prefill.hold_kv:
                self.instances[pd.prefill_instance].release_held(pd.prefill)
            self.provider.in_flight[d] -= 1
            self.transferring.pop(parent.id, None)
            parent.instance = d
            self._drop_split(parent, parent.finish_reason)
            return True
        now = self.env.now
        self.pd_counts["transfers_started"] += 1
        pd.transfer_start_us = now
        pd.blocks = blocks
        self.transferring[parent.id] = parent
        link = self._link(pd.prefill_instance, d)
        nbytes = blocks * self.block_bytes[pd.prefill_instance]
        done = link.start(parent.id, nbytes, (parent.id, pd.prefill_instance, d, blocks))
        done.callbacks.append(partial(self._on_transferred, parent))
        return True

    def _retry_transfers(self, d: int) -> None:
        """A request left decode instance ``d`` (its KV is free): start the waiting transfers
        that now fit, in arrival order (the head blocks the others, as vLLM's queue does)."""
        awaiting = self.awaiting_kv[d]
        while awaiting:
            parent = awaiting[0]
            if not self._start_transfer(parent):
                return
            awaiting.popleft()

    def _on_transferred(self, parent: Request, _event: Any) -> None:
        """The KV cache arrived: the request joins the decode instance's queue (INV-PD-1)."""
        pd = parent.pd
        now = self.env.now
        self.pd_counts["transfers_completed"] += 1
        pd.transfer_end_us = pd.decode_enqueue_us = now
        if self._blocking_transfers:
            # DistServe's decode instance copies the KV itself between its steps and waits for
            # it: the step that admits the request is longer by the copy's duration
            parent.copy_us = now - pd.transfer_start_us
        del self.transferring[parent.id]
        if pd.prefill.hold_kv:  # back-pressure: the prefill instance's copy is no longer needed
            self.instances[pd.prefill_instance].release_held(pd.prefill)
        self.instances[pd.decode_instance].enqueue_remote(parent)

    def _drop_split(self, parent: Request, reason: str) -> None:
        parent.state = DROPPED
        parent.finish_reason = reason
        parent.finish_us = self.env.now
        self._append(parent, STATUS_DROPPED, -1, -1, 0)
        if parent.session_id >= 0:
            self._end_of_round(parent, False, 0)

    def _trace_decision(self, req: Request, snapshots, router=None) -> None:
        """Record a routing decision: every candidate's score (the policy's own when it has one,
        else minus the effective load), the snapshots' age, and the regret filled in by _route."""
        router = router or self.router
        if hasattr(router, "scores"):
            scores = list(router.scores(req, snapshots))
        else:
            scores = [-float(s.effective_load) for s in snapshots]
        now = self.env.now
        taken = min((self.provider._refreshed[s.index] for s in snapshots), default=now)
        self.record.snapshot_taken_us.append(taken)
        age = max((now - self.provider._refreshed[s.index] for s in snapshots), default=0)
        ranked = sorted(zip(scores, (s.index for s in snapshots)), key=lambda p: (-p[0], p[1]))
        by_instance = {s.index: score for s, score in zip(snapshots, scores)}
        self.decisions.append(
            [now, req.id, -1, by_instance, ranked[: self.scenario.output.counterfactual_k], age]
        )

    def _refuse(self, req: Request, status: int, reason: str) -> None:
        """A request that never reaches an instance (admission, gateway capacity, shed, TTL)."""
        req.finish_reason = reason
        req.finish_us = self.env.now
        self.in_transit.pop(req.id, None)
        if self.gateway is not None:
            self.gateway.enqueue_us.pop(req.id, None)
        self._append(req, status, -1, -1, 0)
        if req.session_id >= 0:
            self._end_of_round(req, False, 0)

    def _on_refused(self, req: Request, status: str, reason: str) -> None:
        code = {"rejected": STATUS_REJECTED, "shed": STATUS_SHED, "expired": STATUS_EXPIRED}[status]
        self._refuse(req, code, reason)

    def _export(self, req: Request, segments) -> None:
        from servesim.workloads.base import RequestSpec

        self.exported.append(
            RequestSpec(
                req.id,
                req.arrival_us,
                req.prompt_tokens,
                req.oracle_output_tokens,
                req.prefix_group,
                req.prefix_tokens,
                req.max_output_tokens,
                req.slo_class,
                req.client,
                req.tenant,
                segments,
            )
        )

    def _end_of_round(self, req: Request, completed: bool, completion_us: int) -> None:
        """Sessions: start the next round after the think time, or close the session."""
        sid = req.session_id
        budget = self.scenario.workload.num_requests
        if not completed:
            self.session_state[sid] = "cancelled"
        elif req.round_index + 1 >= self.sessions.rounds:
            self.session_state[sid] = "completed"
        elif (
            self.sessions.users
            and budget is not None
            and self._next_id + self._pending_rounds >= budget
        ):
            self.session_state[sid] = "exhausted"  # closed-loop users: the request budget is spent
        else:
            self._pending_rounds += 1
            self.env.process(self._next_round(req, completion_us + self.sessions.think_time_us))

    def _next_round(self, prev: Request, arrival: int):
        """The session's next request: a new user turn on top of the conversation so far."""
        env = self.env
        horizon = self.scenario.horizon_us
        if horizon is not None and arrival >= horizon:
            self._pending_rounds -= 1
            self.session_state[prev.session_id] = "interrupted"
            return
        workload = self.scenario.workload
        if workload.duration_us is not None and arrival > workload.start_us + workload.duration_us:
            # the workload's duration is over: no more rounds (closed-loop users stop here)
            self._pending_rounds -= 1
            self.session_state[prev.session_id] = "exhausted"
            return
        if arrival > env.now:
            yield env.timeout(arrival - env.now)
        self._pending_rounds -= 1
        new_input, output = next(self._follow_ups)
        rid = self._next_id
        self._next_id += 1
        if self.sessions.accumulate:
            context = prev.segments + ((2 * prev.id + 1, prev.num_generated),)
        elif prev.prefix_tokens:
            context = prev.segments[:1]
        else:
            context = ()
        shared = sum(length for _, length in context)
        segments = context + ((2 * rid, new_input),)  # the context is shareable: not its own
        budget = output if workload.max_output_tokens == "oracle" else workload.max_output_tokens
        req = Request(
            rid,
            arrival,
            shared + new_input,
            output,
            budget,
            prev.prefix_group,
            prev.prefix_tokens,
            prev.slo_class,
            prev.client,
            self._block_size,
            self.content_ids,
            prev.tenant,
            prev.priority,
            segments,
        )
        req.session_id = prev.session_id
        req.round_index = prev.round_index + 1
        req.think_us = self.sessions.think_time_us
        req.continues = req.round_index + 1 < self.sessions.rounds
        if self.exported is not None:
            self._export(req, segments)
        self.record.arrived += 1
        self.last_arrival_us = arrival
        self.in_transit[rid] = req
        yield from self._lifecycle(req)

    def _on_finish(self, req: Request) -> None:
        pd = req.pd
        if pd is not None and req is pd.prefill:
            self._on_prefill_done(req)
            return
        engine = self.instances[req.instance].engine
        alpha2 = engine.alpha2
        self.provider.in_flight[req.instance] -= 1
        if self.pd is not None and self.awaiting_kv[req.instance]:
            self._retry_transfers(req.instance)
        if self.gateway is not None and self.gateway.size:
            self.gateway.poke()
        if req.state == DROPPED:
            self._append(req, STATUS_DROPPED, -1, -1, 0)
            if req.session_id >= 0:
                self._end_of_round(req, False, 0)
            return
        generated = req.num_generated
        if pd is None:
            first = req.first_token_end_us + alpha2
            completion = req.last_token_end_us + generated * alpha2 + engine.post_decode
        else:  # the first token came from the prefill instance, with its output overhead
            first_alpha2 = self.instances[pd.prefill_instance].engine.alpha2
            first = req.first_token_end_us + first_alpha2
            completion = (
                req.last_token_end_us + first_alpha2 + (generated - 1) * alpha2 + engine.post_decode
            )
        itl_sum = (req.last_token_end_us - req.first_token_end_us) + (generated - 1) * alpha2
        self._append(req, STATUS_COMPLETED, first, completion, itl_sum)
        if req.session_id >= 0:
            self._end_of_round(req, True, completion)

    def _append(self, req: Request, status: int, first: int, completion: int, itl_sum: int) -> None:
        self._finished += 1
        if self._finished >= self._report_at:
            self._report_at += self.progress.every
            self.progress.update(self._finished, self.env.now)
        table = self.record.requests
        codes = self._codes
        slo = codes.get(req.slo_class)
        if slo is None:
            slo = codes[req.slo_class] = table.code("slo_class", req.slo_class)
        table.append(
            (
                req.id,
                req.instance,
                req.arrival_us,
                req.enqueue_us,
                req.first_scheduled_us,
                first,
                completion,
                req.prompt_tokens,
                req.prefix_tokens,
                req.cached_tokens,
                req.num_generated,
                req.oracle_output_tokens,
                req.max_output_tokens,
                req.preemptions,
                itl_sum,
                req.gateway_wait_us,
                req.session_id,
                req.round_index,
                req.think_us,
                status,
                slo,
                table.code("finish_reason", req.finish_reason),
                table.code("client", req.client),
                table.code("tenant", req.tenant),
            )
        )
        pd = req.pd
        if pd is not None:
            self.record.pd_table.rows.extend(
                (
                    req.id,
                    pd.prefill_instance,
                    pd.prefill_end_us,
                    pd.transfer_start_us,
                    pd.transfer_end_us,
                    pd.decode_enqueue_us,
                    pd.blocks,
                )
            )

    # ------------------------------------------------------------------ run
    def run(self) -> RunRecord:
        env = self.env
        started = time.perf_counter()
        env.process(self._source(self.scenario.workload.requests(self.streams)))
        if self._kv_every_step:
            for instance in self.instances:
                _watch_kv(instance, self.record)
        horizon = self.scenario.horizon_us
        try:
            if horizon is None:
                env.run()
            else:
                env.run(until=horizon + 1)  # an event at exactly the horizon still happens
        except KeyboardInterrupt:
            # Keep what was computed: close the books at the current instant, as at a horizon.
            self.record.interrupted = True
            self.record.horizon_us = env.now
        self._finalize()
        if self.progress is not None:
            self.progress.update(self._finished, self.record.end_us)
            self.progress.close()
        self.record.wall_s = time.perf_counter() - started
        get_logger("servesim.run").info(
            "run finished",
            sim_time_us=self.record.end_us,
            requests=self.record.arrived,
            steps=sum(i["steps"] for i in self.record.instances),
            fast_forward_windows=sum(i["windows"] for i in self.record.instances),
            wall_s=round(self.record.wall_s, 3),
            interrupted=self.record.interrupted,
        )
        return self.record

    def _finalize(self) -> None:
        record = self.record
        end = 0
        for instance in self.instances:
            instance.settle(
                self.env.now if record.horizon_us is None else min(self.env.now, record.horizon_us)
            )
            engine = instance.engine
            log = engine.log
            end = max(end, log.last_end_us())
            for req in list(engine.running):
                if req.finish_step >= 0:
                    engine._materialize(req, engine.step)  # tokens of the steps that ended
                self._append(req, STATUS_RUNNING, _first(req, record), -1, 0)
            for req in list(engine.waiting) + list(engine.swapped):
                self._append(req, STATUS_QUEUED, _first(req, record), -1, 0)
            problems = engine.kv.check(engine.kv_owners())
            if engine.limits.swap_blocks >= 0:
                problems.extend(engine.check_swap())
            if (
                not engine.running
                and not engine.reserved
                and not engine.held
                and engine.kv.used_blocks != 0
            ):
                problems.append(
                    f"{engine.kv.used_blocks} KV blocks still in use after the last request left"
                )
            record.kv_problems.extend(f"instance {engine.index}: {p}" for p in problems)
            record.step_logs.append(log)
            record.instances.append(
                {
                    "index": engine.index,
                    "steps": engine.step,
                    "windows": instance.windows,
                    "busy_us": engine.busy_us,
                    "kv_blocks": engine.kv.total_blocks,
                    "kv_hit_blocks": engine.kv.hit_blocks,
                    "kv_miss_blocks": engine.kv.miss_blocks,
                    "kv_evictions": engine.kv.evictions,
                    "kv_cpu_reloaded_blocks": engine.kv.cpu.reloads if engine.kv.cpu else 0,
                    "kv_cpu_stores": engine.kv.cpu.stores if engine.kv.cpu else 0,
                    "kv_cpu_evictions": engine.kv.cpu.evictions if engine.kv.cpu else 0,
                    "kv_cpu_reload_us": engine.reload_us_total,
                    "kv_transfer_stall_us": engine.copy_us_total,
                    "swap_blocks": max(engine.limits.swap_blocks, 0),
                    "swap_outs": engine.swap_outs,
                    "swap_ins": engine.swap_ins,
                    "swap_out_blocks": engine.swap_out_blocks,
                    "swap_in_blocks": engine.swap_in_blocks,
                    "swap_bytes": (engine.swap_out_blocks + engine.swap_in_blocks)
                    * self.scenario.instance_specs[engine.index].engine.kv_block_bytes,
                    "swap_fallbacks": engine.swap_fallbacks,
                    "swap_peak_blocks": engine.swap_peak,
                    "swap_used_blocks": engine.swap_used,
                    "swap_us": engine.swap_us_total,
                    "spec_verifications": getattr(engine, "verifications", 0),
                    "spec_accepted_tokens": getattr(engine, "accepted_tokens", 0),
                    "preemptions": engine.preemptions,
                    "total_input_tokens": engine.total_input_tokens,
                    "total_output_tokens": engine.total_output_tokens,
                    "max_model_len": engine.limits.max_model_len,
                    "latency": engine.latency.describe(),
                    "alpha2_us": engine.alpha2,
                    "gpu": scenario_spec_gpu(self.scenario, engine.index),
                }
            )
        queued_at_gateway = set()
        if self.gateway is not None:
            for req in self.gateway.waiting():
                queued_at_gateway.add(req.id)
                self._append(req, STATUS_GATEWAY, -1, -1, 0)
        for req in self.in_transit.values():
            if req.id not in queued_at_gateway:
                self._append(req, STATUS_NOT_ARRIVED, -1, -1, 0)
        if self.pd is not None:
            for req in self.transferring.values():
                self._append(req, STATUS_TRANSFERRING, _first(req, record), -1, 0)
            record.pd = dict(self.pd_counts)
            record.pd_decider = self.pd.decider.name
            # INV-PD-5: the pools seen at the end are the pools built at the start
            record.roles_at_end = tuple(
                "mixed"
                if i in self.decode_pool and i in self.prefill_pool
                else "decode"
                if i in self.decode_pool
                else "prefill"
                if i in self.prefill_pool
                else "none"
                for i in range(len(self.instances))
            )
            record.transfer_in_flight = sum(
                1 for r in self.transferring.values() if r.pd.transfer_start_us >= 0
            )
            record.transfers = self.transfer_log
            record.links = [
                {
                    "index": link.index,
                    "name": link.name,
                    "bandwidth": link.bandwidth,
                    "base_latency_us": link.base_latency_us,
                    "sharing": link.sharing,
                    "started": link.started,
                    "completed": link.completed,
                    "peak": link.peak,
                    "bytes_moved": link.bytes_moved,
                }
                for link in self.links.values()
            ]
        record.admission_rejections = self.admission_rejections
        if self.sessions is not None:
            # a session still active when the run ended was interrupted by the horizon
            record.session_rounds = self.sessions.rounds
            record.sessions = {
                sid: ("interrupted" if state == "active" else state)
                for sid, state in self.session_state.items()
            }
        record.decisions = self.decisions
        record.exported = self.exported
        record.snapshot_interval_us = self.scenario.cluster.snapshot_interval_us
        if self.gateway is not None:
            g = self.gateway
            record.gateway = {
                "enqueued": g.enqueued,
                "dispatched": g.dispatched,
                "rejected": g.rejected,
                "shed": g.shed,
                "expired": g.expired,
                "peak_depth": g.peak_depth,
            }
        # The run's duration: until the last step ended (or the last arrival), within the horizon.
        end = max(end, self.last_arrival_us)
        horizon = record.horizon_us
        record.end_us = min(end, horizon) if horizon is not None else end


def scenario_spec_gpu(scenario: Any, index: int) -> str:
    specs = scenario.instance_specs
    return specs[index].gpu.name if specs else scenario.gpu.name


def _first(req: Request, record: RunRecord) -> int:
    where = req.instance if req.pd is None else req.pd.prefill_instance
    alpha2 = record.instances_alpha2[where] if where >= 0 else 0
    return req.first_token_end_us + alpha2 if req.first_token_end_us >= 0 else -1


def _watch_kv(instance: Instance, record: RunRecord) -> None:
    """Audit mode: recount every KV block after every step (slow; for tests and debugging)."""
    engine = instance.engine
    original = engine.end_step

    def checked_end_step(end, steps=1, ends=None):
        original(end, steps, ends)
        problems = engine.kv.check(engine.kv_owners())
        if engine.limits.swap_blocks >= 0:
            problems.extend(engine.check_swap())
        if problems:
            record.kv_problems.extend(
                f"instance {engine.index} after step {engine.step - 1} at {end} µs: {p}"
                for p in problems
            )

    engine.end_step = checked_end_step


def simulate(scenario: Any, progress: Any = None) -> RunRecord:
    return Cluster(scenario, progress).run()
