"""The request lifecycle: the workload source, admission → (gateway queue) → router → α
queueing delay → an instance's wait queue, completion, and session rounds.

This is a part of :class:`~servesim.components.cluster.Cluster` (a mixin over the cluster's
state); the split-request path lives in :mod:`.disaggregation`.
"""

from __future__ import annotations

from simpy.events import NORMAL, Event

from servesim.components.instance import Instance
from servesim.components.record import (
    STATUS_COMPLETED,
    STATUS_DROPPED,
    STATUS_EXPIRED,
    STATUS_REJECTED,
    STATUS_SHED,
)
from servesim.components.request import DROPPED, Request
from servesim.components.sessions import SessionRounds
from servesim.simcore.env import StartedProcess
from servesim.workloads.base import RecordedSessions


class QueueingDelay(Event):
    """The α queueing delay of a routed request: when it ends, the request joins its instance's
    wait queue. A timer with the enqueue as its callback, not a wake-up of the request's process:
    the process is already waiting on its completion event (one process resume less per request;
    the enqueue happens at the same place in the event order as a resume would run it)."""

    def __init__(self, env, delay: int, req: Request, instance: Instance, reach) -> None:
        self.env = env
        self.callbacks = [self._expire]
        self._ok = True
        self._value = None
        self.req = req
        self.instance = instance
        self.reach = reach
        env.schedule(self, NORMAL, delay)

    def _expire(self, _event: Event) -> None:
        self.reach(self.req, self.instance)


class Lifecycle(SessionRounds):
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
        record = self.record
        tag = self.fleet_models  # LoRA / several models: None, or what names a request's model
        # Each request is its own process, started without an Initialize event: its first
        # segment (admission, routing...) runs in the source's step, once the source has made
        # every request of this instant and scheduled its wake-up for the next arrival — where
        # env.process would have run it (the source's events keep their place before the
        # requests' in the event order, and each request sees the same-instant ones made).
        made: list[Request] = []
        for spec in specs:
            arrival = spec.arrival_us
            if horizon is not None and arrival >= horizon:
                break
            wait = arrival - env.now
            if wait > 0:
                timer = env.timeout(wait)
                for req in made:
                    StartedProcess(env, lifecycle(req))
                made.clear()
                yield timer
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
            if tag is not None:
                tag.tag(req, spec)
            if self.exported is not None:
                self._export(req, spec.segments)
            if sessions is not None:
                self._open_session(req, spec)
            in_transit[req.id] = req
            made.append(req)
        for req in made:
            StartedProcess(env, lifecycle(req))

    def _lifecycle(self, req: Request):
        """The request's process: admission → (gateway queue) → router → α queueing delay → an
        instance's wait queue → its completion."""
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
            release = self.gateway.enqueue(req)  # released when the cluster has room, or refused
            if not (yield release):
                return  # refused (rejected, shed, expired): its row is recorded
            req.gateway_wait_us = env.now - self.gateway.enqueue_us.pop(req.id)
        router = self.router_process
        instance = router.decide_now(req)
        if instance is None:
            instance = yield router.route(req)
        if req.gateway_wait_us >= 0:
            # the cluster state now counts it: the gateway may release the next one
            self.gateway.routed(c.routing_latency_us > 0)
        # α queueing delay, then the instance's wait queue; then wait for the request's end. A
        # split request's prefill part goes first; when it is done the disaggregation flow moves
        # the KV and enqueues the request on its decode instance (or ends it there: then its
        # completion event carries False, its row already recorded).
        req.done = done = Event(env)
        pd = req.pd
        if pd is not None:
            pd.prefill.done = Event(env)
        delay = instance.engine.latency.queueing_time_us(req.prompt_tokens)
        if delay > 0:
            QueueingDelay(env, delay, req, instance, self._reach_instance)
        else:
            self._reach_instance(req, instance)
        if pd is not None:
            yield pd.prefill.done
            self._on_prefill_done(pd.prefill)
        if (yield done):
            self._on_finish(req)

    def _reach_instance(self, req: Request, instance: Instance) -> None:
        """The request reaches its instance's wait queue (a split request: its prefill part)."""
        del self.in_transit[req.id]
        pd = req.pd
        instance.enqueue(req if pd is None else pd.prefill)

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
        self.provider.add_in_flight(index, 1)
        req.instance = index
        return self.instances[index]

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

    def _end_of_round(self, req: Request, completed: bool, completion_us: int) -> None:
        """Sessions: start the next round after the think time, or close the session (a round
        that did not complete cancels the rest of its session)."""
        if not completed:
            self.session_state[req.session_id] = "cancelled"
            return
        think = self._think_before_next(req)
        if think is not None:
            self._pending_rounds += 1
            self.env.process(self._next_round(req, completion_us + think))

    def _next_round(self, prev: Request, arrival: int):
        """The session's next request (see :mod:`.sessions`), sent at ``arrival``."""
        env = self.env
        horizon = self.scenario.horizon_us
        if horizon is not None and arrival >= horizon:
            self._pending_rounds -= 1
            self.session_state[prev.session_id] = "interrupted"
            return
        recorded = isinstance(self.sessions, RecordedSessions)
        workload = self.scenario.workload
        if (
            not recorded
            and workload.duration_us is not None
            and arrival > workload.start_us + workload.duration_us
        ):
            # the workload's duration is over: no more rounds (closed-loop users stop here); a
            # recorded session's rounds were selected by their recorded times
            self._pending_rounds -= 1
            self.session_state[prev.session_id] = "exhausted"
            return
        if arrival > env.now:
            yield env.timeout(arrival - env.now)
        self._pending_rounds -= 1
        rid = self._next_id
        self._next_id += 1
        make = self._recorded_round if recorded else self._generated_round
        req, segments = make(prev, arrival, rid)
        req.session_id = prev.session_id
        req.round_index = prev.round_index + 1
        if self.exported is not None:
            self._export(req, segments)
        self.record.arrived += 1
        self.last_arrival_us = arrival
        self.in_transit[rid] = req
        yield from self._lifecycle(req)

    def _on_finish(self, req: Request) -> None:
        pd = req.pd
        engine = self.instances[req.instance].engine
        alpha2 = engine.alpha2
        self.provider.add_in_flight(req.instance, -1)
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
