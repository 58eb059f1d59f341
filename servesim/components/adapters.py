"""LoRA adapters on an instance, as vLLM serves them: GPU slots, a CPU cache, loads in the step.

vLLM keeps adapters in two LRU caches: ``max_loras`` GPU slots (the batch computes with the
adapters in them) and ``max_cpu_loras`` adapters in CPU memory. An adapter a step needs that is
not in a GPU slot is copied in from CPU memory (read from disk first when it is not there), in
that step, before its forward pass; the least recently used slot whose adapter the batch does
not use is given up. The v1 scheduler never lets one batch hold more than ``max_loras`` distinct
adapters: a waiting request whose adapter would be one too many is skipped (it keeps its place
at the head of the queue) and the requests behind it are considered.

:class:`LoRAState` is that state for one engine. The engine calls :meth:`LoRAState.admit_waiting`
for its waiting-queue phase; the step's price (loads owed, punica kernels) is
:class:`~servesim.latency.lora.LoRALatency`'s, which reads :attr:`LoRAState.owed_us` and
:meth:`LoRAState.batch_adapters`. Load times (per GPU of the instance's tp group, which copy their
shards in parallel)::

    copy_us = shard_bytes / pcie_bandwidth x 1e6 + load_latency   (shard: each GPU's part)
    disk_us = adapter_bytes / disk_bandwidth x 1e6          (only when not in CPU memory)

The LRU order is the order of last use by a batch, refreshed each time the waiting queue is
scanned (the only moment an adapter is loaded or evicted).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from servesim.latency.lora import LoRALatency


class LoRAState:
    """One engine's adapters: GPU slots and CPU cache (LRU, oldest first), counters, load log."""

    def __init__(self, config: Any, index: int = 0):
        self.config = config
        self.index = index
        self.max_loras = config.max_loras
        self.max_cpu_loras = config.max_cpu_loras
        self.gpu: OrderedDict[str, None] = OrderedDict()
        self.cpu: OrderedDict[str, None] = OrderedDict()
        self.copy_us = {
            name: int(round(size / config.pcie_bytes_s * 1e6)) + config.load_latency_us
            for name, size in config.shard_bytes.items()
        }
        self.disk_us = {
            name: int(round(size / config.disk_bytes_s * 1e6))
            for name, size in config.adapter_bytes.items()
        }
        self.engine: Any = None
        self.owed_us = 0  # load time owed by the step being formed (LoRALatency takes it)
        # counters: loads (of them from disk), GPU and CPU evictions, load time, most resident
        self.loads = self.disk_loads = self.evictions = self.cpu_evictions = 0
        self.load_us_total = self.peak_resident = 0
        # (step start µs, adapter, load µs, adapters in GPU slots after it) per load, for the audit
        self.log: list[tuple[int, str, int, int]] = []

    # ------------------------------------------------------------------ the batch's adapters
    def batch_adapters(self) -> int:
        """Distinct adapters the running batch uses."""
        return len(self._active())

    def _active(self) -> set[str]:
        active = {r.adapter for r in self.engine.running}
        active.discard("")
        return active

    # ------------------------------------------------------------------ loading
    def acquire(self, adapter: str, active: set[str], now: int) -> int:
        """Make ``adapter`` resident in a GPU slot for the step formed at ``now``; return the
        load time it owes (0 when it already was). ``active``: the batch's other adapters."""
        gpu = self.gpu
        if adapter in gpu:
            gpu.move_to_end(adapter)
            self.cpu.move_to_end(adapter)
            return 0
        if len(gpu) >= self.max_loras:
            victim = next(name for name in gpu if name not in active)
            del gpu[victim]
            self.evictions += 1
        gpu[adapter] = None
        cost = self.copy_us[adapter]
        cpu = self.cpu
        if adapter in cpu:
            cpu.move_to_end(adapter)
        else:
            cost += self.disk_us[adapter]
            self.disk_loads += 1
            cpu[adapter] = None
            if len(cpu) > self.max_cpu_loras:
                victim = next(name for name in cpu if name not in gpu)
                del cpu[victim]
                self.cpu_evictions += 1
        self.loads += 1
        self.load_us_total += cost
        if len(gpu) > self.peak_resident:
            self.peak_resident = len(gpu)
        self.log.append((now, adapter, cost, len(gpu)))
        return cost

    # ------------------------------------------------------------------ the waiting queue
    def admit_waiting(self, engine: Any, budget: int, preempted: bool, now: int) -> None:
        """The engine's phase 2 with vLLM v1's adapter rule (module docstring): like
        ``Engine._admit_waiting``, but a request whose adapter would be one distinct adapter
        too many is skipped, and the adapter of each admitted request is made resident."""
        waiting = engine.waiting
        if not waiting or preempted:
            engine._waiting_formed = len(waiting)
            return
        limits = engine.limits
        prefill = (limits.long_prefill_token_threshold, limits.enable_chunked_prefill)
        active = self._active()
        for name in [n for n in self.gpu if n in active]:  # the batch's are in use:
            self.gpu.move_to_end(name)  # most recently used (LRU order)
        skipped = []
        while waiting and budget > 0 and len(engine.running) < limits.max_num_seqs:
            adapter = waiting[0].adapter
            if adapter and adapter not in active and len(active) >= self.max_loras:
                skipped.append(waiting.popleft())  # would exceed max_loras: skip it
                continue
            n = engine._admit(waiting[0], budget, *prefill, now)
            if n == 0:
                break  # head-of-line blocking
            engine._scheduled.append((waiting.popleft(), n))
            budget -= n
            if adapter:
                self.owed_us += self.acquire(adapter, active, now)
                active.add(adapter)
        waiting.extendleft(reversed(skipped))
        engine._waiting_formed = len(waiting)

    def counters(self) -> dict[str, int]:
        """Per-instance figures for the run record."""
        return {
            "adapter_loads": self.loads,
            "adapter_disk_loads": self.disk_loads,
            "adapter_evictions": self.evictions,
            "adapter_cpu_evictions": self.cpu_evictions,
            "adapter_load_us": self.load_us_total,
            "adapter_peak_resident": self.peak_resident,
            "max_loras": self.max_loras,
        }


def attach_lora(engine: Any, config: Any, gpu: Any) -> LoRAState:
    """Give ``engine`` its adapter state and wrap its latency model in :class:`LoRALatency`
    (the config's sizes are per GPU, so are the GPU's peak rates)."""
    state = LoRAState(config, engine.index)
    state.engine = engine
    engine.latency = LoRALatency(
        engine.latency,
        state,
        flops_per_token=config.flops_per_token,
        adapter_bytes=config.slot_bytes,
        peak_flops=gpu.tflops_bf16 * 1e12,
        peak_bytes_s=gpu.bandwidth_tbs * 1e12,
    )
    engine._lora = state
    return state
