"""Disaggregated serving (prefill/decode pools): the pools and their routers, the decider, and the
flow of a split request's KV from its prefill instance to its decode instance — reserve room on
the decode instance, start the transfer, wait or retry when the decode instance is full
(back-pressure), hand the request to the decode queue when its KV has arrived.

The links themselves (processor-sharing bandwidth) are processes of :mod:`.transfer`. This is a
part of :class:`~servesim.components.cluster.Cluster` (a mixin over the cluster's state).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from servesim.components.encode import ColocatedEncoder, EncodeLog, EncodePool
from servesim.components.instance import Instance
from servesim.components.record import STATUS_COMPLETED, STATUS_DROPPED, PDTable
from servesim.components.request import (
    DROP_DECODE_KV_FULL,
    DROPPED,
    FINISH_LENGTH,
    FINISH_STOP,
    FINISHED,
    Request,
)
from servesim.components.transfer import TransferLink, TransferLog
from servesim.latency.encoder import EncoderTimer
from servesim.simcore import registry


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


class Disaggregation:
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
            router = registry.get("routing", choice.name).from_config(
                choice.params, registry.PluginContext(where)
            )
            router.bind(n, self.streams.stream(f"router/{role}"))
            routers[role] = router
        self.decode_router = routers["decode"]
        self.prefill_router = routers["prefill"]
        self.decider = registry.get("disaggregation", pd.decider.name).from_config(
            pd.decider.params, registry.PluginContext("policies.disaggregation")
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

    def _own_step_touches(self, index: int) -> Callable[[], bool]:
        """Whether the completions of a step of instance ``index`` can touch that instance in the
        step's own instant (no gateway, no sessions: nothing is routed in it). A finished prefill
        part starts its transfer to another instance (a split request never decodes where it
        was prefilled); its prefill instance is touched only when it holds the KV for the transfer
        (back-pressure: released when the transfer ends or is refused). A finished request frees
        its decode instance for the transfers waiting for KV there: those are reserved at once."""
        if self._hold_kv[index]:
            return lambda: True
        return partial(bool, self.awaiting_kv[index])

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
        req.instance = d
        p = -1
        if self.prefill_pool and self.decider.disaggregate(req, snapshots[d]):
            p = self.prefill_router.route(req, self._prefill_snaps)
            self.prefill_router.observe(req, p)
            if p == d:
                p = -1  # a mixed instance chosen for both phases serves the request itself
        # the decode instance is committed (decode-first); the decider and the prefill router
        # saw the snapshots of this decision's view, without it
        self.provider.add_in_flight(d, 1)
        if decisions is not None:
            decisions[-1][2] = d
            decisions[-1].extend(("split" if p >= 0 else "local", p))
        if p < 0:
            self.pd_counts["local"] += 1
            return self._entry(d)
        self.pd_counts["split"] += 1
        self.provider.add_in_flight(p, 1)
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
        return self._entry(p)

    def _entry(self, index: int) -> Any:
        """Where a routed request goes: instance ``index``, or with an encode pool the gate that
        sends a request with media through the encode stage first."""
        if self.encode_pool is None:
            return self.instances[index]
        return self.encode_pool.gate(self.instances[index])

    # ------------------------------------------------------------------ multimodal encode stage
    def _setup_encode(self) -> None:
        """The scenario's encoder: on every LLM instance (colocated), or the encode pool."""
        scenario = self.scenario
        self.encode_log = self.encode_pool = None
        if scenario.encoder is None:
            return
        self.encode_log = log = EncodeLog()
        pool = scenario.encode_pool
        if pool is None:
            for index, (instance, spec) in enumerate(zip(self.instances, scenario.instance_specs)):
                timer = EncoderTimer(scenario.encoder, spec.gpu, spec.tp)
                instance.engine.encoder = ColocatedEncoder(timer, index, log)
            return
        timer = EncoderTimer(scenario.encoder, pool.gpu, pool.tp)
        self.encode_pool = EncodePool(
            self.env,
            pool,
            [timer] * pool.instances,
            self.in_transit,
            log,
            # one embedding token: the language model's hidden size x 2 bytes (bf16)
            int(scenario.model.spec.hidden_size) * 2,
        )

    def _record_encode(self, record: Any) -> None:
        """The end-of-run books of the encode stage (None when there is no encoder)."""
        if self.encode_log is None:
            record.encode = None
            return
        book = getattr(self.scenario.workload, "book", None)
        record.encode = {
            "mode": "colocated" if self.encode_pool is None else "pool",
            "log": {
                name: np.asarray(col, dtype=np.int64)
                for name, col in self.encode_log.columns.items()
            },
            "media_ids": np.asarray(book.ids if book else (), dtype=np.int64),
            "media_tokens": np.asarray(book.tokens if book else (), dtype=np.int64),
            "encoder_us": [i.engine.encode_us_total for i in self.instances],
            "bytes_per_token": self.encode_pool.embed_bytes_per_token if self.encode_pool else 0,
            "batches": self.encode_pool.batches if self.encode_pool else 0,
            "links": self.encode_pool.describe() if self.encode_pool else [],
        }

    def _on_prefill_done(self, sub: Request) -> None:
        """A split request's prefill finished (or was refused): complete it if its first token
        was its last, else reserve KV on the decode instance and start the transfer."""
        pd = sub.pd
        parent = pd.parent
        now = self.env.now
        counts = self.pd_counts
        self.provider.add_in_flight(pd.prefill_instance, -1)
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
            self.provider.add_in_flight(d, -1)
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
            self.provider.add_in_flight(d, -1)
            engine = self.instances[pd.prefill_instance].engine
            parent.instance = pd.prefill_instance
            parent.state = FINISHED
            parent.finish_reason = FINISH_LENGTH if parent.length_capped else FINISH_STOP
            parent.finish_us = now
            first = parent.first_token_end_us + engine.alpha2
            self._append(parent, STATUS_COMPLETED, first, first + engine.post_decode, 0)
            if parent.session_id >= 0:
                self._end_of_round(parent, True, first + engine.post_decode)
            parent.done.succeed(False)  # its lifecycle ends here, its row recorded
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
            self.provider.add_in_flight(d, -1)
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
        parent.done.succeed(False)  # its lifecycle ends here, its row recorded

    def _record_pd(self, record: Any) -> None:
        """The end-of-run books of disaggregated serving: counters, pools, links."""
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
