"""Assemble a cluster from a Scenario and run it: instances, router, gateway and pools built
from the scenario, then the recorder that turns finished requests into table rows.

The request lifecycle (source, admission, gateway, routing, completion, sessions) is
:mod:`.lifecycle`; the split-request flow of disaggregated serving is :mod:`.disaggregation`.
"""

from __future__ import annotations

import time
from typing import Any

from servesim.components.autoscaler import Fleet, ReadyView, check_fleet_scenario
from servesim.components.disaggregation import Disaggregation
from servesim.components.engine import Engine, EngineLimits
from servesim.components.fleetmodels import fleet_models, lora_for
from servesim.components.gateway import COUNTERS as GATEWAY_COUNTERS
from servesim.components.gateway import SETTINGS as GATEWAY_SETTINGS
from servesim.components.gateway import Gateway
from servesim.components.instance import Instance
from servesim.components.kvcache import ContentIds
from servesim.components.lifecycle import Lifecycle
from servesim.components.lockstep import LockStepRank, lockstep_groups
from servesim.components.record import (
    STATUS_GATEWAY,
    STATUS_NOT_ARRIVED,
    STATUS_QUEUED,
    STATUS_RUNNING,
    STATUS_TRANSFERRING,
    PDTable,
    RequestTable,
    StepLog,
)
from servesim.components.request import (
    Request,
    finished,
)
from servesim.components.router import RouterProcess, SnapshotProvider
from servesim.components.sglang import sglang_engine
from servesim.components.speculative import SpeculativeEngine
from servesim.components.transfer import TransferLog
from servesim.policies.admission import AlwaysAdmit
from servesim.policies.snapshot import DEFAULT_SLO_PRIORITIES
from servesim.simcore import registry
from servesim.simcore.collector import collections_spaced
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
        self.fleet: dict[str, Any] | None = None  # autoscaling: the fleet's books (Fleet.close)
        # LoRA adapters / several models: per-request model and adapter codes, adapter books
        # (servesim.components.fleetmodels.FleetModels.close); None: the run used neither
        self.lora: dict[str, Any] | None = None


class Cluster(Lifecycle, Disaggregation):
    """N instances behind a router, fed by the scenario's workload."""

    def __init__(self, scenario: Any, progress: Any = None):
        self.scenario = scenario
        autoscaling = scenario.cluster.autoscaling
        if autoscaling is not None:
            check_fleet_scenario(scenario)
        # progress reporting: every `progress.every` finished requests (off: never)
        self.progress = progress
        self._finished = 0
        self._report_at = progress.every if progress is not None else 1 << 62
        self.env = SimEnvironment()
        self.streams = RandomStreams(scenario.seed)
        self.record = RunRecord()
        self.record.horizon_us = scenario.horizon_us
        # a long run moves its request rows to disk; the step logs go with them
        self.record.requests.on_spill = self._spill_step_logs
        self.content_ids = ContentIds()  # one table, so block ids mean the same on every instance
        grouped = len({spec.group for spec in scenario.instance_specs}) > 1
        self.instances = [
            self._build_instance(index, spec, grouped)
            for index, spec in enumerate(scenario.instance_specs)
        ]
        self.lockstep_groups = lockstep_groups(self.env, self.instances, scenario)
        e = scenario.engine
        self.router = registry.get("routing", scenario.routing.name).from_config(
            scenario.routing.params, registry.PluginContext("policies.routing")
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
            scenario.admission.params, registry.PluginContext("policies.admission")
        )
        c = scenario.cluster
        self.provider = (SnapshotProvider if autoscaling is None else ReadyView)(
            self.env,
            self.instances,
            snapshot_interval_us=c.snapshot_interval_us,
            cache_signal_delay_us=c.cache_signal_delay_us,
            reads_prefix_cache=self.reads_prefix_cache,
        )
        if self.pd is None:  # a pool's router sees its pool, which no index covers
            self.provider.attach(getattr(self.router, "index", None))
        self.fleet: Fleet | None = None
        if autoscaling is not None:
            self.fleet = Fleet(self, autoscaling, self._work_remains)
        self.router_process = RouterProcess(
            self.env,
            self._choose if self.fleet is None else self.fleet.watch(self._choose),
            latency_us=c.routing_latency_us,
            concurrency=c.routing_concurrency,
        )
        # an autoscaled cluster's candidates are its ready instances, read from the view
        self._routes_blind = not getattr(self.router, "needs_snapshots", True) and not autoscaling
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
                fc.detector.params, registry.PluginContext("policies.flow_control.detector")
            )
            slo = scenario.slo
            self.gateway = Gateway(
                self.env,
                detector,
                lambda: self.provider.state(self._max_num_seqs),
                self._on_refused,
                **{name: getattr(fc, name) for name in GATEWAY_SETTINGS},
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
        if self.gateway is None and self.sessions is None:
            if self.pd is None:
                # no completion can cause an enqueue in its own instant: an instance may form its
                # next batch straight after its step end (same order, one event less per step)
                for instance in self.instances:
                    instance.defer_forming = False
            else:
                for instance in self.instances:
                    instance.touched_by_own_step = self._own_step_touches(instance.index)
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
        self._source_process: Any = None
        if self.fleet is not None and self.fleet.policy.needs_ttft:
            self._append = self.fleet.counting(self._append)  # type: ignore[method-assign]
        self._setup_encode()  # multimodal: the encoders (servesim.components.encode)
        # LoRA adapters / several models (servesim.components.fleetmodels): None when neither
        self.fleet_models = fleet_models(self)

    def _build_instance(self, index: int, spec: Any, grouped: bool) -> Instance:
        """One instance from its spec: latency model, engine limits, per-instance policies."""
        from servesim.latency.expert_parallel import instance_latency
        from servesim.scenario import latency_context

        scenario = self.scenario
        e = spec.engine
        if scenario.pd is not None and spec.role != "none":
            where = f"cluster.pools.{spec.role}.latency"
        else:
            where = f"cluster.groups[{spec.group}].latency" if grouped else "latency"
        parallel = e.parallel
        latency = instance_latency(
            spec.latency.name,
            spec.latency.params,
            latency_context(spec.model or scenario.model, spec.gpu, spec.tp, parallel),
            where,
        )
        # policies are per instance, so a stateful one never mixes two instances' state
        preemption = registry.get("preemption", scenario.preemption.name).from_config(
            scenario.preemption.params, registry.PluginContext("policies.preemption")
        )
        scheduler = registry.get("scheduler", scenario.scheduler.name).from_config(
            scenario.scheduler.params, registry.PluginContext("policies.scheduler")
        )
        limits = EngineLimits(
            max_num_seqs=e.max_num_seqs,
            # one step is one pipeline round: pp scheduler batches in flight (vLLM)
            max_num_batched_tokens=e.max_num_batched_tokens * e.pp,
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
            kv_tiers=e.kv_tier_limits,
        )
        options = dict(
            index=index,
            on_finish=finished,
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
        elif e.profile == "sglang":
            engine = sglang_engine(e, limits, latency, **options)
        else:
            engine = Engine(limits, latency, **options)
        if e.lora is not None:  # LoRA adapters (servesim.components.adapters)
            lora_for(engine, spec)
        if parallel.lockstep(scenario.model.spec):
            return LockStepRank(self.env, engine)
        return Instance(self.env, engine, exact_steps=scenario.exact_steps)

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

    def _spill_step_logs(self, spill: Any) -> None:
        for instance in self.instances:
            instance.engine.log.spill(spill)

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
        self._source_process = env.process(
            self._source(self.scenario.workload.requests(self.streams))
        )
        if self._kv_every_step:
            for instance in self.instances:
                _watch_kv(instance, self.record)
        horizon = self.scenario.horizon_us
        try:
            with collections_spaced():  # the collector would walk the requests in flight
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
                    "kv_tiers": engine.kv.tier_stats(),
                    "kv_transfer_stall_us": engine.copy_us_total,
                    "swap_blocks": max(engine.limits.swap_blocks, 0),
                    "swap_outs": engine.swap_outs,
                    "swap_ins": engine.swap_ins,
                    "swap_out_blocks": engine.swap_out_blocks,
                    "swap_in_blocks": engine.swap_in_blocks,
                    "swap_bytes": (engine.swap_out_blocks + engine.swap_in_blocks)
                    * self.scenario.instance_specs[engine.index].engine.kv_block_bytes,
                    "swap_fallbacks": engine.swap_fallbacks,
                    "prefill_recomputes": engine.prefill_recomputes,
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
        self._record_encode(record)  # multimodal: the encode log (servesim.audit.encode)
        if self.pd is not None:
            for req in self.transferring.values():
                self._append(req, STATUS_TRANSFERRING, _first(req, record), -1, 0)
            self._record_pd(record)
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
            record.gateway = {name: getattr(g, name) for name in GATEWAY_COUNTERS}
        # The run's duration: until the last step ended (or the last arrival), within the horizon.
        end = max(end, self.last_arrival_us)
        horizon = record.horizon_us
        record.end_us = min(end, horizon) if horizon is not None else end
        if self.fleet is not None:
            record.fleet = self.fleet.close(record.end_us)
        if self.fleet_models is not None:  # LoRA / several models: their books
            self.fleet_models.close(record, self.instances)

    def _work_remains(self) -> bool:
        """Whether requests are still to arrive or still in the system (autoscaling samples
        only then)."""
        return (
            self._source_process.is_alive
            or self._finished < self.record.arrived
            or self._pending_rounds > 0
        )


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

