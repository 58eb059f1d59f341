"""Parallelism beyond tensor parallelism: data (``dp``), expert (``ep``), pipeline (``pp``) and
context (``cp``) parallelism of one serving engine, where its GPUs sit (nodes), and how a step
is priced under pipeline and context parallelism.

How servesim models each (docs/explanation/parallelism.md has the full account):

* **dp** — vLLM's data parallelism: ``dp`` ranks, each with its own scheduler, KV cache and
  batch (each rank is one servesim instance, routed to by the scenario's router). For a dense
  model the ranks are independent engines. For a mixture-of-experts model they share the MoE
  layers and step in **lock-step** (a rank without work runs a dummy batch): a group step lasts
  as long as its slowest rank's (:mod:`servesim.components.lockstep`).
* **ep** — expert parallelism over the ``dp × tp`` GPUs of such a group: each GPU holds
  ``E / (dp·tp)`` whole experts, and the MoE layers dispatch tokens to the experts' owners and
  combine them back with an all-to-all on the interconnect
  (:mod:`servesim.latency.expert_parallel`). Without ``ep`` vLLM shards every expert over the
  ``dp × tp`` GPUs instead (same weight bytes per GPU; all-gather/reduce-scatter traffic).
* **pp** — pipeline stages, each holding ``ceil(L/pp)`` layers or fewer. One engine step is one
  pipeline round: up to ``pp`` scheduler batches in flight, each filled greedily up to
  ``max_num_batched_tokens`` (:func:`split_batch`, :func:`pipeline_round_us`).
* **cp** — context parallelism: a prompt's tokens are split over ``cp`` ranks (ring attention,
  KV exchanged over the interconnect); the KV cache is sharded over them.

Placement: an engine's GPUs fill nodes of ``gpus_per_node`` in order (tensor and context ranks
inside a node); a pipeline boundary or an expert group that crosses nodes is priced on the
inter-node link (``internode_gbs`` per GPU, ``internode_latency_us`` per message).
"""

from __future__ import annotations

from typing import Any

import attrs

from servesim.latency.base import BatchSummary, LatencyModel
from servesim.simcore.errors import ScenarioError

DEFAULT_GPUS_PER_NODE = 8
"""GPUs in one node (an HGX/DGX board) unless the scenario says otherwise."""
DEFAULT_INTERNODE_GBS = 50.0
"""Per-GPU inter-node bandwidth, GB/s per direction: one 400 Gb/s NIC per GPU (InfiniBand NDR or
400G RoCE, the usual H100/H200 cluster build)."""
DEFAULT_INTERNODE_LATENCY_US = 10.0
"""Latency of one inter-node message (µs; RDMA over one switch hop, plus NCCL's proxy)."""
STAGE_TENSORS = 2
"""Tensors a pipeline stage hands the next per token: the hidden state and the residual
(vLLM's ``IntermediateTensors``)."""


@attrs.frozen
class Parallelism:
    """One engine's parallel layout beyond ``tp`` (all 1: a plain tensor-parallel instance)."""

    dp: int = 1
    ep: int = 1
    pp: int = 1
    cp: int = 1
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE
    internode_gbs: float = DEFAULT_INTERNODE_GBS
    internode_latency_us: float = DEFAULT_INTERNODE_LATENCY_US
    batch_tokens: int = 0
    """Token budget of one scheduler batch (``max_num_batched_tokens``): a pipeline round's
    micro-batches are filled up to it, in turn (0: one micro-batch per round)."""

    @property
    def plain(self) -> bool:
        """No parallelism beyond tp: steps priced exactly as before these fields existed."""
        return self.dp == 1 and self.ep == 1 and self.pp == 1 and self.cp == 1

    def lockstep(self, model: Any) -> bool:
        """Whether the dp ranks share MoE layers and step together (an MoE model, dp > 1)."""
        return self.dp > 1 and model is not None and model.is_moe

    def expert_shards(self, model: Any, tp: int) -> int:
        """GPUs the routed experts are split over: ``dp·tp`` for an MoE model with dp or ep
        (vLLM flattens the MoE layers' parallelism over the DP ranks), else ``tp``."""
        if model is not None and model.is_moe and (self.dp > 1 or self.ep > 1):
            return self.dp * tp
        return tp

    def layer_share(self, layers: int) -> float:
        """Share of the layers (and of each token's KV) on the largest pipeline stage."""
        return max(stage_layers(layers, self.pp)) / layers if self.pp > 1 else 1.0

    def group_gpus(self, model: Any, tp: int) -> int:
        """GPUs that talk to each other: one rank's, times dp for a lock-stepped MoE group."""
        return self.rank_gpus(tp) * (self.dp if self.lockstep(model) else 1)

    def label(self) -> str:
        """`` per rank (dp 2, ep 2, ...)``: the non-trivial fields, for messages ('' if plain)."""
        if self.plain:
            return ""
        fields = [
            f"{k} {v}"
            for k, v in (("dp", self.dp), ("ep", self.ep), ("pp", self.pp), ("cp", self.cp))
            if v > 1
        ]
        return f" per rank ({', '.join(fields)})"

    def rank_gpus(self, tp: int) -> int:
        """GPUs of one data-parallel rank."""
        return tp * self.pp * self.cp

    def crossing_boundaries(self, tp: int) -> int:
        """Pipeline stage boundaries (of ``pp − 1``) whose two stages sit on different nodes."""
        width = tp * self.cp
        return sum(1 for s in range(1, self.pp) if (s * width) % self.gpus_per_node == 0)

    def expert_group_spans_nodes(self, tp: int) -> bool:
        return self.dp * self.rank_gpus(tp) > self.gpus_per_node

    def describe(self) -> dict[str, Any]:
        """The layout's fields in declaration order, all but the scheduler's token budget
        ``batch_tokens``."""
        return attrs.asdict(self, filter=lambda field, _: field.name != "batch_tokens")


SERIAL = Parallelism()

_NOT_IN_LOCKSTEP = (("pp", "pipeline stages", "are"), ("cp", "context parallelism", "is"))
"""Splits a lock-stepped data-parallel MoE rank cannot have (its ranks step together through
the shared MoE layers): (field, what it is, verb of the refusal)."""


def check_parallelism(model: Any, tp: int, par: Parallelism, path: str = "engine") -> None:
    """Refuse combinations servesim cannot model or vLLM would refuse, naming the field."""
    spec = model
    if par.ep > 1:
        if spec is None or not spec.is_moe:
            name = "the model" if spec is None else spec.name
            raise ScenarioError(
                f"{path}.ep",
                par.ep,
                f"{name} has no experts: expert parallelism needs an MoE model",
            )
        if par.ep != par.dp * tp:
            raise ScenarioError(
                f"{path}.ep",
                par.ep,
                f"expert parallelism spans every GPU of the data-parallel group, dp × tp = "
                f"{par.dp} × {tp} = {par.dp * tp} (vLLM's --enable-expert-parallel); "
                f"set ep: {par.dp * tp} or remove it",
            )
        if spec.num_experts % par.ep:
            raise ScenarioError(
                f"{path}.ep",
                par.ep,
                f"{spec.name} has {spec.num_experts} experts, which ep={par.ep} does not split "
                "evenly; choose dp and tp so that dp × tp divides the expert count",
            )
    if par.pp > 1:
        layers = spec.num_layers if spec is not None else 0
        if spec is not None and par.pp > layers:
            raise ScenarioError(
                f"{path}.pp",
                par.pp,
                f"{spec.name} has {layers} layers: at most {layers} pipeline stages",
            )
    if par.lockstep(spec):
        for key, what, are in _NOT_IN_LOCKSTEP:
            if getattr(par, key) > 1:
                raise ScenarioError(
                    f"{path}.{key}",
                    getattr(par, key),
                    f"{what} inside lock-stepped data-parallel MoE ranks {are} not modelled; "
                    f"use {key}: 1 with dp, or dp: 1 with {key}",
                )
    if tp * par.cp > par.gpus_per_node:
        raise ScenarioError(
            f"{path}.gpus_per_node",
            par.gpus_per_node,
            f"tp × cp = {tp * par.cp} GPUs exchange data every layer and must share a node; "
            "use fewer GPUs per rank or a larger gpus_per_node",
        )


def stage_layers(layers: int, pp: int) -> list[int]:
    """Layers per pipeline stage: an even split, the remainder going to the stages before the
    last (vLLM's ``get_pp_indices``: the last stage also computes the logits)."""
    base, rest = divmod(layers, pp)
    counts = [base] * pp
    for i in range(rest):
        counts[-2 - i if pp > 1 else 0] += 1
    return counts


def split_batch(batch: BatchSummary, parts: int, budget: int) -> list[BatchSummary]:
    """``batch`` as the scheduler fills a pipeline's micro-batches: greedily, each up to
    ``budget`` tokens, decodes first, then the prompts in order (one that does not fit is
    chunked into the next). The scheduler does not balance them: a load that fits one budget
    is one micro-batch, and the other stages idle (the pipeline bubble). At most ``parts``."""
    if budget <= 0 or batch.prefill_tokens + batch.decode_requests <= budget:
        return [batch]
    out: list[BatchSummary] = []
    n, ctx = batch.decode_requests, batch.decode_context
    items = list(batch.prefill_items)
    while (n or items) and len(out) < parts:
        room = budget if len(out) < parts - 1 else 1 << 62
        share = min(n, room)
        context = ctx * share // n if n else 0
        n, ctx, room = n - share, ctx - context, room - share
        mine: list[tuple[int, int, int]] = []
        while items and room > 0:
            c, t, s = items[0]
            take = min(t, room)
            mine.append((c, take, s))
            room -= take
            if take == t:
                items.pop(0)
            else:
                items[0] = (c + take, t - take, s)
        out.append(BatchSummary(sum(t for _, t, _ in mine), mine, share, context))
    return out


def pipeline_round_us(
    stage_us: list[float], shares: list[float], transfer_us: float, stages: int
) -> float:
    """One pipeline round of micro-batches whose whole-model times are ``stage_us``.

    Micro-batch ``i`` spends ``share_j · t_i`` in stage ``j`` (its layer share), then waits
    ``transfer_us`` per boundary. The round ends when the first micro-batch is back (its
    latency: ``t_1 + (pp−1)·transfer``) or when the busiest stage has served every micro-batch
    (``max share · Σ t_i``), whichever is later: one request takes the sum of the stage times
    plus the transfers; a full pipeline is bound by its slowest stage.
    """
    latency = max(stage_us) + (stages - 1) * transfer_us
    occupancy = max(shares) * sum(stage_us)
    return max(latency, occupancy)


class ParallelLatency(LatencyModel):
    """A latency model's step under pipeline (``pp``) and context (``cp``) parallelism.

    ``base`` prices the whole model on one rank's ``tp`` GPUs; a step is one pipeline round
    (:func:`pipeline_round_us`) of the micro-batches the scheduler fills (:func:`split_batch`),
    each priced by ``base``
    with context parallelism's split applied: a prompt's new tokens over ``cp`` ranks (each rank
    attends over the whole context) plus the KV exchange, a decode's context over ``cp`` ranks
    plus the per-layer combine of partial attention outputs. Communication is physical time on
    the links (``link`` inside a node, ``internode`` between nodes), in µs without coefficient.
    """

    name = "parallel"

    def __init__(self, base: LatencyModel, model: Any, tp: int, par: Parallelism, link: Any):
        self.base = base
        self.par = par
        self.name = getattr(base, "name", "") or "parallel"
        self.output_token_time_us = base.output_token_time_us
        self.post_decode_overhead_us = base.post_decode_overhead_us
        layers = stage_layers(model.num_layers, par.pp)
        self.shares = [c / model.num_layers for c in layers]
        self._pp = par.pp
        self._cp = par.cp
        d = float(model.hidden_size)
        self._act_bytes = STAGE_TENSORS * d * float(model.bytes_per_param)
        if link is None:
            raise ScenarioError(
                "latency.interconnect_gbs",
                None,
                f"pipeline or context parallelism moves data between GPUs, but GPU "
                f"{getattr(base, 'hardware', None) and base.hardware.name or 'this GPU'} declares no "
                "interconnect; give latency.interconnect_gbs and latency.interconnect_latency_us",
            )
        self._link_us_per_byte = 1.0 / (link.gbs * 1e3)
        self._link_latency = link.latency_us
        self._net_us_per_byte = 1.0 / (par.internode_gbs * 1e3)
        self._net_latency = par.internode_latency_us
        self._crossing = par.crossing_boundaries(tp)
        from servesim.latency.kvcapacity import kv_bytes_per_token

        self._kv_token_bytes = kv_bytes_per_token(model, tp)
        # decode under cp: per layer, the partial attention outputs of each query are gathered
        self._combine_bytes = (
            float(model.num_layers) * float(model.q_dim) / tp * model.bytes_per_param
        )
        self._layers = float(model.num_layers)

    def _transfer_us(self, tokens: float) -> float:
        """Mean time of one stage-to-stage hand-over of ``tokens`` tokens' activations."""
        if self._pp == 1:
            return 0.0
        size = tokens * self._act_bytes
        inner = self._link_latency + size * self._link_us_per_byte
        outer = self._net_latency + size * self._net_us_per_byte
        crossing = self._crossing
        return ((self._pp - 1 - crossing) * inner + crossing * outer) / (self._pp - 1)

    def _cp_us(self, batch: BatchSummary) -> tuple[BatchSummary, float]:
        """The batch one context-parallel rank computes, and the exchange it pays (µs)."""
        cp = self._cp
        if cp == 1:
            return batch, 0.0
        share = (cp - 1) / cp
        items = [(c, -(-t // cp), s) for c, t, s in batch.prefill_items]
        new_tokens = sum(t for _, t, _ in batch.prefill_items)
        comm = 0.0
        if new_tokens:  # every rank gathers the KV of the others' token shares
            comm += (
                self._link_latency * (cp - 1)
                + share * new_tokens * self._kv_token_bytes * self._link_us_per_byte
            )
        if batch.decode_requests:
            comm += (
                self._layers * self._link_latency
                + share * batch.decode_requests * self._combine_bytes * self._link_us_per_byte
            )
        local = BatchSummary(
            sum(t for _, t, _ in items),
            items,
            batch.decode_requests,
            -(-batch.decode_context // cp),
        )
        return local, comm

    def step_time_us(self, batch: BatchSummary) -> int:
        if batch.batch_size == 0:
            return 1
        micro = split_batch(batch, self._pp, self.par.batch_tokens) if self._pp > 1 else [batch]
        times = []
        tokens = 0.0
        for mb in micro:
            local, comm = self._cp_us(mb)
            times.append(float(self.base.step_time_us(local)) + comm)
            tokens = max(tokens, float(mb.prefill_tokens + mb.decode_requests))
        if self._pp == 1:
            step = times[0]
        else:
            step = pipeline_round_us(times, self.shares, self._transfer_us(tokens), self._pp)
        steps = int(step)
        return steps if steps > 1 else 1

    def queueing_time_us(self, prompt_tokens: int) -> int:
        return self.base.queueing_time_us(prompt_tokens)

    def describe(self) -> dict[str, Any]:
        out = dict(self.base.describe())
        out["parallelism"] = {
            **self.par.describe(),
            "stage_layer_shares": self.shares,
            "pipeline_boundaries_across_nodes": self._crossing,
        }
        return out

    def __getattr__(self, name: str) -> Any:
        # attributes a caller reads off the base model (hardware, spec, tp, ...)
        if name == "base":
            raise AttributeError(name)
        return getattr(self.base, name)


def wrap(latency: LatencyModel, model: Any, tp: int, par: Parallelism, link: Any) -> LatencyModel:
    """``latency`` under ``par``'s pipeline/context parallelism; ``latency`` itself when both
    are 1 (then step times are bit-identical to a plain instance's)."""
    if par.pp == 1 and par.cp == 1:
        return latency
    return ParallelLatency(latency, model, tp, par, link)


def pp_round_budget(max_num_batched_tokens: int, pp: int) -> int:
    """Tokens one pipeline round may compute: vLLM keeps up to ``pp`` scheduler outputs in
    flight, each within ``max_num_batched_tokens``."""
    return max_num_batched_tokens * pp
